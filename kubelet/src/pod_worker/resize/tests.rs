use super::*;
use crate::allocation::from_spec;
use crate::runtime::fake::FakeRuntime;

const IMAGE: &str = "docker.io/library/busybox:1.35";

fn pod(cpu: &str, memory: &str, policy: serde_json::Value) -> Pod {
    let mut p: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "web", "namespace": "default", "uid": "uid-r", "generation": 2},
        "spec": {
            "containers": [{
                "name": "app", "image": IMAGE, "command": ["sleep", "3600"],
                "resizePolicy": policy,
                "resources": {
                    "requests": {"cpu": cpu, "memory": memory},
                    "limits": {"cpu": cpu, "memory": memory}
                }
            }]
        }
    }))
    .unwrap();
    crate::podspec::apply_defaults(&mut p);
    p
}

struct Rig {
    rt: Arc<FakeRuntime>,
    env: Arc<Deps>,
    events: Arc<crate::events::FakeRecorder>,
    _dir: tempfile::TempDir,
}

fn rig() -> Rig {
    let dir = tempfile::tempdir().unwrap();
    let rt = Arc::new(FakeRuntime::new());
    rt.add_image(IMAGE);
    let events = Arc::new(crate::events::FakeRecorder::default());
    let env = Arc::new(Deps {
        events: events.clone(),
        ..Deps::for_test(rt.clone(), dir.path())
    });
    Rig {
        rt,
        env,
        events,
        _dir: dir,
    }
}

fn status(r: &Rig) -> PodStatus {
    r.env.statuses.get("uid-r").unwrap().status.unwrap()
}

fn cond<'a>(st: &'a PodStatus, t: &str) -> Option<&'a k8s_openapi::api::core::v1::PodCondition> {
    st.conditions.as_ref()?.iter().find(|c| c.type_ == t)
}

/// Admission allocated 500m where the container runs with 250m: one UpdateContainerResources
/// with the new quota and shares for the same container (no restart), the status shows
/// the new allocation and resources, and no resize condition stays.
#[tokio::test(start_paused = true)]
async fn an_allocated_resize_updates_the_running_container_in_place() {
    let r = rig();
    let first = pod("250m", "64Mi", serde_json::json!([]));
    r.env.allocations.set("uid-r", from_spec(&first));
    let mut w = Worker::new(r.env.clone(), first, None);
    w.sync().await;
    let id = r.rt.running("app")[0].clone();
    assert_eq!(
        r.rt.created_config(&id).unwrap().resources.cpu_quota,
        25_000
    );
    // The spec asks for more; until admission allocates it, nothing changes.
    w.desired = pod("500m", "64Mi", serde_json::json!([]));
    w.sync().await;
    assert!(r.rt.resource_updates().is_empty());
    let cs = status(&r).container_statuses.unwrap().remove(0);
    assert_eq!(cs.allocated_resources.unwrap()["cpu"].0, "250m");
    // Allocated: resized in place.
    r.env.allocations.set("uid-r", from_spec(&w.desired));
    w.sync().await;
    let updates = r.rt.resource_updates();
    assert_eq!(updates.len(), 1, "{updates:?}");
    assert_eq!(updates[0].0, id);
    assert_eq!(updates[0].1.cpu_quota, 50_000);
    assert_eq!(updates[0].1.cpu_period, 100_000);
    assert_eq!(updates[0].1.cpu_shares, 512);
    assert_eq!(updates[0].1.memory_limit_in_bytes, 64 << 20);
    assert_eq!(r.rt.running("app"), std::slice::from_ref(&id), "no restart");
    assert_eq!(r.rt.count("UpdatePodSandboxResources"), 1);
    let st = status(&r);
    let cs = st.container_statuses.clone().unwrap().remove(0);
    assert_eq!(cs.restart_count, 0);
    assert_eq!(cs.allocated_resources.unwrap()["cpu"].0, "500m");
    assert_eq!(cs.resources.unwrap().limits.unwrap()["cpu"].0, "500m");
    assert!(cond(&st, "PodResizeInProgress").is_none());
    assert!(cond(&st, "PodResizePending").is_none());
    // Nothing left to do: no further update.
    w.sync().await;
    assert_eq!(r.rt.resource_updates().len(), 1);
}

/// `resizePolicy: RestartContainer` for memory: a memory limit change restarts the container
/// (restart count 1, upstream's Killing message); a cpu change alone does not.
#[tokio::test(start_paused = true)]
async fn restart_container_policy_restarts_for_its_resource_only() {
    let r = rig();
    let policy = serde_json::json!([
        {"resourceName": "memory", "restartPolicy": "RestartContainer"},
        {"resourceName": "cpu", "restartPolicy": "NotRequired"}
    ]);
    let first = pod("250m", "64Mi", policy.clone());
    r.env.allocations.set("uid-r", from_spec(&first));
    let mut w = Worker::new(r.env.clone(), first, None);
    w.sync().await;
    let id = r.rt.running("app")[0].clone();
    w.desired = pod("300m", "64Mi", policy.clone());
    r.env.allocations.set("uid-r", from_spec(&w.desired));
    w.sync().await;
    assert_eq!(
        r.rt.running("app"),
        std::slice::from_ref(&id),
        "cpu resizes in place"
    );
    assert_eq!(r.rt.resource_updates().len(), 1);
    w.desired = pod("300m", "128Mi", policy);
    r.env.allocations.set("uid-r", from_spec(&w.desired));
    w.sync().await;
    let now = r.rt.running("app");
    assert_eq!(now.len(), 1);
    assert_ne!(now[0], id, "a memory resize restarts the container");
    assert_eq!(
        r.rt.created_config(&now[0])
            .unwrap()
            .resources
            .memory_limit_in_bytes,
        128 << 20
    );
    assert_eq!(r.rt.resource_updates().len(), 1);
    let events = r.events.events();
    assert!(
        events.contains(&"Normal Killing Container app resize requires restart".to_string()),
        "{events:?}"
    );
    let cs = status(&r).container_statuses.unwrap().remove(0);
    assert_eq!(cs.restart_count, 1);
}

/// A failed UpdateContainerResources shows as PodResizeInProgress with reason Error and
/// the runtime's message; the next pass tries again and clears it.
#[tokio::test(start_paused = true)]
async fn a_failed_update_is_reported_and_retried() {
    let r = rig();
    let first = pod("250m", "64Mi", serde_json::json!([]));
    r.env.allocations.set("uid-r", from_spec(&first));
    let mut w = Worker::new(r.env.clone(), first, None);
    w.sync().await;
    w.desired = pod("500m", "64Mi", serde_json::json!([]));
    r.env.allocations.set("uid-r", from_spec(&w.desired));
    r.rt.fail_next(
        "UpdateContainerResources",
        RuntimeError::Call {
            op: "UpdateContainerResources",
            message: "cgroup write refused".into(),
        },
    );
    w.sync().await;
    let st = status(&r);
    let c = cond(&st, "PodResizeInProgress").expect("in progress");
    assert_eq!(c.reason.as_deref(), Some("Error"));
    assert!(
        c.message
            .as_deref()
            .unwrap()
            .contains("cgroup write refused")
    );
    assert_eq!(c.observed_generation, Some(2));
    let cs = st.container_statuses.unwrap().remove(0);
    assert_eq!(cs.resources.unwrap().limits.unwrap()["cpu"].0, "250m");
    w.sync().await;
    assert!(cond(&status(&r), "PodResizeInProgress").is_none());
    assert_eq!(r.rt.resource_updates().len(), 1);
}

#[test]
fn resize_decisions() {
    let c = |cpu: &str, mem: &str, policy: serde_json::Value| {
        pod(cpu, mem, policy).spec.unwrap().containers.remove(0)
    };
    let with = |cpu: &str, mem: &str| c(cpu, mem, serde_json::json!([])).resources.unwrap();
    let none = serde_json::json!([]);
    assert_eq!(
        resize_of(&c("1", "1Gi", none.clone()), &with("1000m", "1024Mi")),
        Resize::None
    );
    assert_eq!(
        resize_of(&c("2", "1Gi", none.clone()), &with("1", "1Gi")),
        Resize::InPlace
    );
    let restart_cpu =
        serde_json::json!([{"resourceName": "cpu", "restartPolicy": "RestartContainer"}]);
    assert_eq!(
        resize_of(&c("2", "1Gi", restart_cpu.clone()), &with("1", "1Gi")),
        Resize::Restart
    );
    assert_eq!(
        resize_of(&c("1", "2Gi", restart_cpu), &with("1", "1Gi")),
        Resize::InPlace
    );
}
