use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    PersistentVolumeClaimCondition, PersistentVolumeClaimStatus, PersistentVolumeSpec,
};

use super::*;

fn pv(cap: &str) -> PersistentVolume {
    PersistentVolume {
        spec: Some(PersistentVolumeSpec {
            capacity: Some(BTreeMap::from([(STORAGE.into(), Quantity(cap.into()))])),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn pvc(cap: &str, resize: Option<&str>) -> PersistentVolumeClaim {
    PersistentVolumeClaim {
        status: Some(PersistentVolumeClaimStatus {
            capacity: Some(BTreeMap::from([(STORAGE.into(), Quantity(cap.into()))])),
            allocated_resource_statuses: resize
                .map(|r| BTreeMap::from([(STORAGE.to_string(), r.to_string())])),
            conditions: Some(vec![
                PersistentVolumeClaimCondition {
                    type_: "FileSystemResizePending".into(),
                    status: "True".into(),
                    ..Default::default()
                },
                PersistentVolumeClaimCondition {
                    type_: "ModifyingVolume".into(),
                    status: "True".into(),
                    ..Default::default()
                },
            ]),
            ..Default::default()
        }),
        ..Default::default()
    }
}

#[test]
fn a_grown_pv_with_a_pending_claim_is_due_at_the_pvs_size() {
    assert_eq!(
        due(&pvc("1Gi", Some(NODE_RESIZE_PENDING)), &pv("2Gi")),
        Some(Due {
            new_size: Quantity("2Gi".into()),
            new_bytes: 2 << 30,
        })
    );
    // An interrupted try is taken up again.
    assert!(due(&pvc("1Gi", Some(NODE_RESIZE_IN_PROGRESS)), &pv("2Gi")).is_some());
}

#[test]
fn nothing_is_due_when_the_claim_is_not_marked_or_already_big_enough() {
    // No resize status: the controller's business (upstream's pre-check).
    assert_eq!(due(&pvc("1Gi", None), &pv("2Gi")), None);
    // A failed or infeasible expansion is not retried by the node.
    assert_eq!(
        due(&pvc("1Gi", Some("NodeResizeInfeasible")), &pv("2Gi")),
        None
    );
    assert_eq!(
        due(&pvc("2Gi", Some(NODE_RESIZE_PENDING)), &pv("2Gi")),
        None
    );
    assert_eq!(
        due(&pvc("2048Mi", Some(NODE_RESIZE_PENDING)), &pv("2Gi")),
        None
    );
    // A PV without a capacity, or a hostile one, asks nothing.
    assert_eq!(
        due(&pvc("1Gi", Some(NODE_RESIZE_PENDING)), &pv("lots")),
        None
    );
    assert_eq!(
        due(&pvc("1Gi", Some(NODE_RESIZE_PENDING)), &pv("1E999")),
        None
    );
}

#[test]
fn the_finished_patch_sets_capacity_and_clears_resize_status_and_conditions() {
    let p = finished_patch(
        &pvc("1Gi", Some(NODE_RESIZE_PENDING)),
        &Quantity("2Gi".into()),
    );
    assert_eq!(p["status"]["capacity"]["storage"], "2Gi");
    assert_eq!(p["status"]["allocatedResourceStatuses"], Value::Null);
    let conds = p["status"]["conditions"].as_array().unwrap();
    assert_eq!(conds.len(), 1);
    assert_eq!(conds[0]["type"], "ModifyingVolume");
    // Other resources' statuses stay.
    let mut c = pvc("1Gi", Some(NODE_RESIZE_PENDING));
    let st = c.status.as_mut().unwrap();
    st.allocated_resource_statuses.as_mut().unwrap().insert(
        "example.com/iops".into(),
        "ControllerResizeInProgress".into(),
    );
    st.conditions = None;
    let p = finished_patch(&c, &Quantity("2Gi".into()));
    assert_eq!(
        p["status"]["allocatedResourceStatuses"],
        json!({"storage": null})
    );
    assert_eq!(p["status"]["conditions"], Value::Null);
    assert_eq!(
        in_progress_patch(),
        json!({"status": {"allocatedResourceStatuses": {"storage": "NodeResizeInProgress"}}})
    );
}

#[test]
fn the_finished_patch_clears_every_resize_condition_upstream_knows() {
    // A NodeResizeError from an earlier failed try, and the resizer's ControllerResizeError,
    // go with the success (upstream's knownResizeConditions); other conditions stay.
    let mut c = pvc("1Gi", Some(NODE_RESIZE_IN_PROGRESS));
    let conds = c.status.as_mut().unwrap().conditions.as_mut().unwrap();
    for kind in [NODE_RESIZE_ERROR, "ControllerResizeError"] {
        conds.push(PersistentVolumeClaimCondition {
            type_: kind.into(),
            status: "True".into(),
            ..Default::default()
        });
    }
    let p = finished_patch(&c, &Quantity("2Gi".into()));
    let kinds: Vec<_> = p["status"]["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["type"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(kinds, ["ModifyingVolume"]);
}

#[test]
fn failures_are_classified_by_their_grpc_code_as_upstream() {
    for code in [
        "Canceled",
        "DeadlineExceeded",
        "Unavailable",
        "ResourceExhausted",
        "Aborted",
    ] {
        assert_eq!(Failure::of(code), Failure::Uncertain, "{code}");
    }
    assert_eq!(Failure::of("FailedPrecondition"), Failure::InUse);
    for code in [
        "Internal",
        "InvalidArgument",
        "OutOfRange",
        "NotFound",
        "Unknown",
    ] {
        assert_eq!(Failure::of(code), Failure::Final, "{code}");
    }
}

#[test]
fn the_failed_patch_adds_one_error_condition_and_infeasible_only_when_asked() {
    let c = pvc("1Gi", Some(NODE_RESIZE_IN_PROGRESS));
    let p = failed_patch(&c, "boom", false, "2026-11-28T07:00:00Z");
    assert_eq!(p["status"].get("allocatedResourceStatuses"), None);
    let conds = p["status"]["conditions"].as_array().unwrap();
    // The old conditions stay (a merge patch replaces the list: they are sent again).
    assert_eq!(conds.len(), 3);
    assert_eq!(
        conds[2],
        json!({"type": "NodeResizeError", "status": "True",
               "lastTransitionTime": "2026-11-28T07:00:00Z",
               "message": "failed to expand pvc with boom"})
    );
    let p = failed_patch(&c, "boom", true, "2026-11-28T07:00:00Z");
    assert_eq!(
        p["status"]["allocatedResourceStatuses"],
        json!({"storage": "NodeResizeInfeasible"})
    );
}
