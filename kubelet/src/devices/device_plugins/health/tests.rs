use super::super::tests::{RES, plugin, rig_with, wait_for};
use super::*;
use k8s_openapi::api::core::v1::{ContainerStatus, Pod};
use std::time::Duration;

fn pod_with_init(uid: &str) -> Pod {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": uid, "namespace": "default", "uid": uid},
        "spec": {
            "initContainers": [{"name": "init", "image": "i",
                "resources": {"limits": {RES: "1"}, "requests": {RES: "1"}}}],
            "containers": [{"name": "c", "image": "i",
                "resources": {"limits": {RES: "1"}, "requests": {RES: "1"}}}]}
    }))
    .unwrap()
}

fn status() -> PodStatus {
    let cs = |name: &str| ContainerStatus {
        name: name.into(),
        ..Default::default()
    };
    PodStatus {
        container_statuses: Some(vec![cs("c")]),
        init_container_statuses: Some(vec![cs("init")]),
        ..Default::default()
    }
}

/// The (resourceID, health) pairs of `resource` in container `c`'s status.
fn health_of(st: &PodStatus, resource: &str) -> Option<Vec<(String, String)>> {
    let c = &st.container_statuses.as_ref()?[0];
    let e = c
        .allocated_resources_status
        .as_ref()?
        .iter()
        .find(|e| e.name == resource)?;
    Some(
        e.resources
            .iter()
            .flatten()
            .map(|h| (h.resource_id.clone(), h.health.clone().unwrap_or_default()))
            .collect(),
    )
}

/// Waits (bounded) for the next re-sync request.
async fn next_update(rx: &mut HealthUpdates) -> Vec<String> {
    tokio::time::timeout(Duration::from_secs(10), rx.recv())
        .await
        .expect("a re-sync request within 10 s")
        .expect("channel open")
}

#[tokio::test]
async fn an_unhealthy_device_shows_in_the_containers_status_and_resyncs_its_pod() {
    let r = rig_with(Duration::from_secs(300)).await;
    let mut updates = r.dm.enable_health_status();
    let p = plugin(&r).await;
    wait_for(&r.dm, ("2", "2")).await;
    let pod = pod_with_init("p1");
    r.dm.reserve(&pod).unwrap();
    assert!(r.dm.allocate_pending().await.is_empty());
    let held = r.dm.container_devices("p1", "c");
    assert_eq!(held.len(), 1);
    let id = held[0].id.clone();

    let mut st = status();
    r.dm.fill_allocated_resources_status("p1", &mut st);
    assert_eq!(
        health_of(&st, RES),
        Some(vec![(id.clone(), "Healthy".into())])
    );
    // Init containers are left alone, as upstream's device manager does.
    assert_eq!(
        st.init_container_statuses.as_ref().unwrap()[0].allocated_resources_status,
        None
    );

    // The plugin reports the held device unhealthy: the pod is sent for a re-sync and its
    // container's status says so.
    p.set_health(&id, false);
    assert_eq!(next_update(&mut updates).await, vec!["p1".to_string()]);
    let mut st = status();
    r.dm.fill_allocated_resources_status("p1", &mut st);
    assert_eq!(
        health_of(&st, RES),
        Some(vec![(id.clone(), "Unhealthy".into())])
    );

    // And back.
    p.set_health(&id, true);
    assert_eq!(next_update(&mut updates).await, vec!["p1".to_string()]);
    let mut st = status();
    r.dm.fill_allocated_resources_status("p1", &mut st);
    assert_eq!(
        health_of(&st, RES),
        Some(vec![(id.clone(), "Healthy".into())])
    );

    // A device no pod holds changing health re-syncs nobody.
    let free = if id == "Dev-1" { "Dev-2" } else { "Dev-1" };
    p.set_health(free, false);
    wait_for(&r.dm, ("2", "1")).await;
    assert!(updates.try_recv().is_err(), "no pod holds {free}");
    r.cancel.cancel();
}

#[tokio::test]
async fn with_the_gate_off_the_status_has_no_device_health() {
    let r = rig_with(Duration::from_secs(300)).await;
    let _p = plugin(&r).await;
    wait_for(&r.dm, ("2", "2")).await;
    r.dm.reserve(&pod_with_init("p1")).unwrap();
    assert!(r.dm.allocate_pending().await.is_empty());
    let mut st = status();
    r.dm.fill_allocated_resources_status("p1", &mut st);
    assert_eq!(st, status());
    r.cancel.cancel();
}

#[tokio::test]
async fn a_gone_plugin_leaves_the_last_reported_health_and_other_entries_stay() {
    let r = rig_with(Duration::from_secs(300)).await;
    let _updates = r.dm.enable_health_status();
    let p = plugin(&r).await;
    wait_for(&r.dm, ("2", "2")).await;
    r.dm.reserve(&pod_with_init("p1")).unwrap();
    assert!(r.dm.allocate_pending().await.is_empty());
    let id = r.dm.container_devices("p1", "c")[0].id.clone();
    // The plugin dies: allocatable drops to 0, but the status keeps what the plugin last
    // said (upstream reports neither Unhealthy nor Unknown for it).
    p.stop();
    drop(p);
    wait_for(&r.dm, ("2", "0")).await;
    let mut st = status();
    let other = ResourceStatus {
        name: "claim:c/r".into(),
        resources: Some(vec![]),
    };
    let stale = ResourceStatus {
        name: RES.into(),
        resources: Some(vec![]),
    };
    st.container_statuses.as_mut().unwrap()[0].allocated_resources_status =
        Some(vec![other.clone(), stale]);
    r.dm.fill_allocated_resources_status("p1", &mut st);
    let list = st.container_statuses.as_ref().unwrap()[0]
        .allocated_resources_status
        .clone()
        .unwrap();
    assert_eq!(
        list.len(),
        2,
        "the entry of the same name is replaced: {list:?}"
    );
    assert_eq!(list[0], other);
    assert_eq!(health_of(&st, RES), Some(vec![(id, "Healthy".into())]));
    // A pod without devices gets nothing.
    let mut st = status();
    r.dm.fill_allocated_resources_status("nobody", &mut st);
    assert_eq!(st, status());
    r.cancel.cancel();
}
