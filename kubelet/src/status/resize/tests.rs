use super::*;
use k8s_openapi::api::core::v1::{ContainerState, ContainerStateRunning, ContainerStatus};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

fn rr(cpu: &str) -> ResourceRequirements {
    let l: BTreeMap<String, Quantity> = [("cpu".to_string(), Quantity(cpu.into()))].into();
    ResourceRequirements {
        requests: Some(l.clone()),
        limits: Some(l),
        claims: None,
    }
}

fn running(name: &str) -> ContainerStatus {
    ContainerStatus {
        name: name.into(),
        state: Some(ContainerState {
            running: Some(ContainerStateRunning::default()),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// While a resize is being applied the status shows the new allocation and the resources
/// the container still runs with, and PodResizeInProgress; a pending resize shows upstream's
/// reason and message with the generation it was about. Cleared conditions disappear.
#[test]
fn resize_fields_and_conditions() {
    let alloc: PodAllocation = [("c".to_string(), rr("500m"))].into();
    let with: BTreeMap<String, ResourceRequirements> = [("c".to_string(), rr("250m"))].into();
    let pending = Pending {
        reason: "Infeasible".into(),
        message: "Node didn't have enough capacity: cpu, requested: 64000, capacity: 4000".into(),
        generation: Some(3),
    };
    let mut st = PodStatus {
        container_statuses: Some(vec![
            running("c"),
            ContainerStatus {
                name: "other".into(),
                ..Default::default()
            },
        ]),
        conditions: Some(vec![PodCondition {
            type_: "Ready".into(),
            status: "True".into(),
            ..Default::default()
        }]),
        ..Default::default()
    };
    let view = ResizeView {
        allocated: Some(&alloc),
        running_with: with,
        pending: Some(&pending),
        in_progress: Some(None),
        generation: Some(3),
    };
    apply(&mut st, &view, None);
    let c = &st.container_statuses.as_ref().unwrap()[0];
    assert_eq!(c.allocated_resources.as_ref().unwrap()["cpu"].0, "500m");
    assert_eq!(
        c.resources.as_ref().unwrap().limits.as_ref().unwrap()["cpu"].0,
        "250m"
    );
    assert!(
        st.container_statuses.as_ref().unwrap()[1]
            .allocated_resources
            .is_none()
    );
    let conds = st.conditions.clone().unwrap();
    let types: Vec<&str> = conds.iter().map(|c| c.type_.as_str()).collect();
    assert_eq!(types, ["Ready", PENDING, IN_PROGRESS]);
    assert_eq!(conds[1].reason.as_deref(), Some("Infeasible"));
    assert_eq!(conds[1].observed_generation, Some(3));
    assert_eq!(conds[2].reason, None);
    let since = conds[2].last_transition_time.clone();
    // Applied: both conditions go; the transition time of one that stays is kept.
    let prev = st.clone();
    let done = ResizeView {
        allocated: Some(&alloc),
        running_with: [("c".to_string(), rr("500m"))].into(),
        in_progress: Some(Some("UpdateContainerResources failed".into())),
        ..Default::default()
    };
    apply(&mut st, &done, Some(&prev));
    let conds = st.conditions.clone().unwrap();
    assert_eq!(conds.len(), 2);
    assert_eq!(conds[1].reason.as_deref(), Some(REASON_ERROR));
    assert_eq!(conds[1].last_transition_time, since);
    apply(
        &mut st,
        &ResizeView {
            allocated: Some(&alloc),
            running_with: BTreeMap::new(),
            ..Default::default()
        },
        Some(&prev),
    );
    assert_eq!(st.conditions.as_ref().unwrap().len(), 1);
}
