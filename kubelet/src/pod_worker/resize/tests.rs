use super::*;
use crate::allocation::from_spec;
use crate::runtime::fake::FakeRuntime;
use std::sync::Mutex;

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

/// A cgroup v1 kernel's view of the pod: its pod cgroup's values and its containers' CFS
/// quotas (the runtime's), refusing with EINVAL any write that would put a child's quota
/// above its parent's. Every write that lands is logged, pod and containers in one order.
struct Kernel {
    rt: Arc<FakeRuntime>,
    pod: Mutex<Option<crate::cm::PodCgroupValues>>,
    log: Mutex<Vec<String>>,
    /// How many pod cgroup writes fail next (EBUSY).
    fail_pod_writes: Mutex<u32>,
}

fn wanted(pod: &Pod) -> crate::cm::PodCgroupValues {
    let l = crate::cm::limits::pod_limits(pod, &Default::default(), &[]);
    crate::cm::PodCgroupValues {
        cpu_quota: l.cpu_quota,
        cpu_shares: l.cpu_shares,
        memory: l.memory,
    }
}

fn einval(what: &str) -> crate::cm::CgroupError {
    crate::cm::CgroupError {
        path: what.into(),
        source: std::io::Error::from_raw_os_error(22),
    }
}

impl Kernel {
    fn new(rt: Arc<FakeRuntime>) -> Arc<Self> {
        let k = Arc::new(Kernel {
            rt: rt.clone(),
            pod: Mutex::new(None),
            log: Mutex::new(Vec::new()),
            fail_pod_writes: Mutex::new(0),
        });
        let kernel = k.clone();
        rt.check_updates(crate::runtime::fake::UpdateCheck(Arc::new(move |_, r| {
            let parent = kernel.pod.lock().unwrap().and_then(|p| p.cpu_quota);
            if parent.is_some_and(|p| p >= 0 && r.cpu_quota > p) {
                return Err("write cpu.cfs_quota_us: invalid argument".into());
            }
            let mi = r.memory_limit_in_bytes >> 20;
            kernel
                .log
                .lock()
                .unwrap()
                .push(format!("app cpu={} memory={mi}", r.cpu_quota));
            Ok(())
        })));
        k
    }

    fn log(&self) -> Vec<String> {
        std::mem::take(&mut *self.log.lock().unwrap())
    }

    fn highest_child_quota(&self) -> i64 {
        let ids = self.rt.running("app");
        ids.iter()
            .filter_map(|id| self.rt.created_config(id))
            .map(|c| c.resources.cpu_quota)
            .max()
            .unwrap_or(-1)
    }
}

impl PodCgroups for Kernel {
    fn pod_parent(&self, _qos: Qos, uid: &str) -> String {
        format!("/kubepods/pod{uid}")
    }

    fn ensure_pod(&self, pod: &Pod) -> Result<(), crate::cm::CgroupError> {
        let w = wanted(pod);
        if w.cpu_quota
            .is_some_and(|q| q >= 0 && q < self.highest_child_quota())
        {
            return Err(einval("pod cpu.cfs_quota_us"));
        }
        *self.pod.lock().unwrap() = Some(w);
        Ok(())
    }

    fn remove_pod(&self, _uid: &str) -> Result<(), crate::cm::CgroupError> {
        Ok(())
    }

    fn pod_values(
        &self,
        _pod: &Pod,
    ) -> Result<Option<crate::cm::PodCgroupValues>, crate::cm::CgroupError> {
        Ok(*self.pod.lock().unwrap())
    }

    fn wanted_pod_values(&self, pod: &Pod) -> crate::cm::PodCgroupValues {
        wanted(pod)
    }

    fn set_pod_value(
        &self,
        pod: &Pod,
        part: crate::cm::PodCgroupPart,
    ) -> Result<(), crate::cm::CgroupError> {
        use crate::cm::PodCgroupPart::*;
        let mut fail = self.fail_pod_writes.lock().unwrap();
        if *fail > 0 {
            *fail -= 1;
            return Err(crate::cm::CgroupError {
                path: "pod".into(),
                source: std::io::Error::from_raw_os_error(16),
            });
        }
        let w = wanted(pod);
        let mut held = self.pod.lock().unwrap();
        let now = held.as_mut().expect("pod cgroup created");
        let line = match part {
            CpuLimit => {
                let q = w.cpu_quota.unwrap();
                if q >= 0 && q < self.highest_child_quota() {
                    return Err(einval("pod cpu.cfs_quota_us"));
                }
                now.cpu_quota = Some(q);
                format!("pod cpu={q}")
            }
            CpuRequest => {
                now.cpu_shares = w.cpu_shares;
                format!("pod shares={}", w.cpu_shares.unwrap())
            }
            MemoryLimit => {
                now.memory = w.memory;
                format!("pod memory={}", w.memory.unwrap() >> 20)
            }
        };
        self.log.lock().unwrap().push(line);
        Ok(())
    }
}

/// A worker over a [`Kernel`], its pod started at `cpu`/`memory`.
fn kernel_rig(cpu: &str, memory: &str) -> (Rig, Arc<Kernel>, Worker) {
    let dir = tempfile::tempdir().unwrap();
    let rt = Arc::new(FakeRuntime::new());
    rt.add_image(IMAGE);
    let kernel = Kernel::new(rt.clone());
    let events = Arc::new(crate::events::FakeRecorder::default());
    let env = Arc::new(Deps {
        events: events.clone(),
        cgroups: kernel.clone(),
        ..Deps::for_test(rt.clone(), dir.path())
    });
    let first = pod(cpu, memory, serde_json::json!([]));
    env.allocations.set("uid-r", from_spec(&first));
    let w = Worker::new(env.clone(), first, None);
    let r = Rig {
        rt,
        env,
        events,
        _dir: dir,
    };
    (r, kernel, w)
}

/// Allocates `cpu`/`memory` and runs one pass.
async fn resize_to(r: &Rig, w: &mut Worker, cpu: &str, memory: &str) {
    w.desired = pod(cpu, memory, serde_json::json!([]));
    r.env.allocations.set("uid-r", from_spec(&w.desired));
    w.sync().await;
}

/// Issue 43.1: growing, the pod cgroup is raised before the container, memory first, then
/// the CPU limit and request; shrinking, the container goes first and the pod cgroup after,
/// requests before limits. No write is refused, and nothing is left in progress.
#[tokio::test(start_paused = true)]
async fn the_pod_cgroup_grows_first_and_shrinks_last() {
    let (r, kernel, mut w) = kernel_rig("100m", "64Mi");
    w.sync().await;
    kernel.log();
    resize_to(&r, &mut w, "200m", "128Mi").await;
    assert_eq!(
        kernel.log(),
        [
            "pod memory=128",
            "app cpu=10000 memory=128",
            "pod cpu=20000",
            "pod shares=204",
            "app cpu=20000 memory=128",
        ]
    );
    assert!(cond(&status(&r), "PodResizeInProgress").is_none());
    resize_to(&r, &mut w, "100m", "64Mi").await;
    assert_eq!(
        kernel.log(),
        [
            "app cpu=20000 memory=64",
            "pod memory=64",
            "app cpu=10000 memory=64",
            "pod shares=102",
            "pod cpu=10000",
        ]
    );
    let st = status(&r);
    assert!(cond(&st, "PodResizeInProgress").is_none());
    let cs = st.container_statuses.unwrap().remove(0);
    assert_eq!(cs.resources.unwrap().limits.unwrap()["memory"].0, "64Mi");
    assert_eq!(*kernel.pod.lock().unwrap(), Some(wanted(&w.desired)));
}

/// CPU down and memory up at once: each resource in its own order. The old single "grows"
/// rule wrote the whole pod cgroup first: its quota below the container's was refused
/// (EINVAL, only logged) and the pod cgroup kept the old quota for good.
#[tokio::test(start_paused = true)]
async fn cpu_down_with_memory_up_keeps_every_child_under_its_parent() {
    let (r, kernel, mut w) = kernel_rig("250m", "64Mi");
    w.sync().await;
    kernel.log();
    resize_to(&r, &mut w, "100m", "128Mi").await;
    assert_eq!(
        kernel.log(),
        [
            "pod memory=128",
            "app cpu=25000 memory=128",
            "app cpu=10000 memory=128",
            "pod shares=102",
            "pod cpu=10000",
        ]
    );
    assert_eq!(*kernel.pod.lock().unwrap(), Some(wanted(&w.desired)));
    assert!(cond(&status(&r), "PodResizeInProgress").is_none());
}

/// A refused container update stops the pass where it is: growing, the pod cgroup stays
/// raised (above its child, which is safe) and the container at its old size; shrinking,
/// the pod cgroup is not lowered below a container that was not. The condition says
/// `Error` with the runtime's message, and the next pass finishes from there.
#[tokio::test(start_paused = true)]
async fn a_failed_update_leaves_the_pod_cgroup_above_its_containers() {
    let (r, kernel, mut w) = kernel_rig("100m", "64Mi");
    w.sync().await;
    kernel.log();
    let refused = || RuntimeError::Call {
        op: "UpdateContainerResources",
        message: "cgroup write refused".into(),
    };
    r.rt.fail_next("UpdateContainerResources", refused());
    resize_to(&r, &mut w, "200m", "64Mi").await;
    assert_eq!(kernel.log(), ["pod cpu=20000", "pod shares=204"]);
    let st = status(&r);
    let c = cond(&st, "PodResizeInProgress").expect("in progress");
    assert_eq!(c.reason.as_deref(), Some("Error"));
    assert!(
        c.message
            .as_deref()
            .unwrap()
            .contains("cgroup write refused")
    );
    w.sync().await;
    assert_eq!(kernel.log(), ["app cpu=20000 memory=64"]);
    assert!(cond(&status(&r), "PodResizeInProgress").is_none());

    r.rt.fail_next("UpdateContainerResources", refused());
    resize_to(&r, &mut w, "100m", "64Mi").await;
    assert!(
        kernel.log().is_empty(),
        "the pod cgroup waits for its container"
    );
    assert_eq!(kernel.pod.lock().unwrap().unwrap().cpu_quota, Some(20_000));
    assert!(cond(&status(&r), "PodResizeInProgress").is_some());
    w.sync().await;
    assert_eq!(
        kernel.log(),
        ["app cpu=10000 memory=64", "pod shares=102", "pod cpu=10000"]
    );
    assert!(cond(&status(&r), "PodResizeInProgress").is_none());
}

/// A pod cgroup write that fails after the containers shrank is retried by the next pass,
/// though no container is left to resize.
#[tokio::test(start_paused = true)]
async fn a_pod_cgroup_left_behind_is_finished_by_the_next_pass() {
    let (r, kernel, mut w) = kernel_rig("200m", "64Mi");
    w.sync().await;
    kernel.log();
    *kernel.fail_pod_writes.lock().unwrap() = 1;
    resize_to(&r, &mut w, "100m", "64Mi").await;
    assert_eq!(kernel.log(), ["app cpu=10000 memory=64"]);
    let st = status(&r);
    let c = cond(&st, "PodResizeInProgress").expect("in progress");
    assert!(
        c.message.as_deref().unwrap().contains("busy"),
        "the cgroup's error"
    );
    w.sync().await;
    assert_eq!(kernel.log(), ["pod shares=102", "pod cpu=10000"]);
    assert!(cond(&status(&r), "PodResizeInProgress").is_none());
    w.sync().await;
    assert!(kernel.log().is_empty(), "nothing more to write");
}
