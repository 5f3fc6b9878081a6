//! In-place pod resize on containerd (InPlacePodVerticalScaling, GA): a resize through the
//! `pods/resize` subresource changes the running container's CPU quota in its cgroup without
//! a restart, the status shows the new allocation; a resize beyond the node's allocatable is
//! `PodResizePending`/`Infeasible` and changes nothing; and after an agent restart the
//! checkpointed allocation, not the infeasible spec, is what the container keeps. A Burstable
//! pod resized up, down and both ways at once has its container and pod cgroups follow.

use node_tests::controlplane::Options;
use node_tests::joined::NODE;
use node_tests::require_rig;
use node_tests::{Kubelet, NetnsControlPlane, wait_for};
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::time::Duration;

const BUSYBOX: &str = "docker.io/library/busybox:1.35";
const SMP: &str = "application/strategic-merge-patch+json";

/// The container prints its own CFS quota every half second (cgroup v1 or v2 layout).
const SCRIPT: &str = r#"while true; do
  q=$(cat /sys/fs/cgroup/cpu/cpu.cfs_quota_us 2>/dev/null || cut -d' ' -f1 /sys/fs/cgroup/cpu.max)
  echo "quota=$q"
  sleep 0.5
done"#;

fn last_quota(log: &str) -> Option<String> {
    log.lines()
        .rev()
        .find_map(|l| l.strip_prefix("quota="))
        .map(str::to_string)
}

fn cpu(v: &str) -> Value {
    json!({"requests": {"cpu": v, "memory": "32Mi"}, "limits": {"cpu": v, "memory": "32Mi"}})
}

fn pod_now(cp: &NetnsControlPlane, kubelet: &mut Kubelet) -> Value {
    if let Some(st) = kubelet.exited() {
        panic!("kubelet exited: {st}\n{}", kubelet.log_text());
    }
    cp.get("pods", "default", "resize").expect("pod exists")
}

fn condition(pod: &Value, t: &str) -> Option<Value> {
    pod["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == t)
        .cloned()
}

#[test]
fn resize_changes_the_cpu_quota_in_place_and_survives_an_agent_restart() {
    require_rig!();
    let (_rig, cp, node, mut kubelet) =
        node_tests::joined::up("e2e-resize", Options::default(), false);
    wait_for("node registered", Duration::from_secs(60), || {
        if let Some(st) = kubelet.exited() {
            panic!("kubelet exited: {st}\n{}", kubelet.log_text());
        }
        cp.get("nodes", "", NODE)
            .filter(|n| n["status"]["allocatable"]["cpu"].is_string())
    });
    cp.create(
        "pods",
        json!({"metadata": {"name": "resize", "namespace": "default"},
               "spec": {"nodeName": NODE, "terminationGracePeriodSeconds": 1,
                        "containers": [{"name": "main", "image": BUSYBOX,
                                        "command": ["sh", "-c", SCRIPT],
                                        "resources": cpu("100m")}]}}),
    )
    .unwrap();
    let pod = wait_for("pod Running", Duration::from_secs(90), || {
        Some(pod_now(&cp, &mut kubelet)).filter(|p| p["status"]["phase"] == "Running")
    });
    wait_for("quota 10000 (100m)", Duration::from_secs(30), || {
        (last_quota(&node.container_log(&pod, "main")).as_deref() == Some("10000")).then_some(())
    });
    let id = pod["status"]["containerStatuses"][0]["containerID"].clone();

    // 100m → 200m through pods/resize: the same container now has 20 ms per 100 ms.
    let out = cp
        .patch_resize(
            "default",
            "resize",
            SMP,
            &json!({"spec": {"containers": [{"name": "main", "resources": cpu("200m")}]}}),
        )
        .unwrap();
    assert_eq!(out["metadata"]["generation"], 2);
    wait_for(
        "quota 20000 (200m) in place",
        Duration::from_secs(60),
        || {
            (last_quota(&node.container_log(&pod, "main")).as_deref() == Some("20000"))
                .then_some(())
        },
    );
    let resized = wait_for("status shows the resize", Duration::from_secs(30), || {
        Some(pod_now(&cp, &mut kubelet)).filter(|p| {
            let cs = &p["status"]["containerStatuses"][0];
            cs["allocatedResources"]["cpu"] == "200m" && cs["resources"]["limits"]["cpu"] == "200m"
        })
    });
    let cs = &resized["status"]["containerStatuses"][0];
    assert_eq!(cs["containerID"], id, "the container was not replaced");
    assert_eq!(cs["restartCount"], 0);
    assert!(condition(&resized, "PodResizePending").is_none());
    assert!(condition(&resized, "PodResizeInProgress").is_none());

    // More than the node has: Infeasible, and the container keeps 200m.
    cp.patch_resize(
        "default",
        "resize",
        SMP,
        &json!({"spec": {"containers": [{"name": "main", "resources": cpu("1000")}]}}),
    )
    .unwrap();
    let pending = wait_for(
        "PodResizePending Infeasible",
        Duration::from_secs(30),
        || condition(&pod_now(&cp, &mut kubelet), "PodResizePending"),
    );
    assert_eq!(pending["status"], "True");
    assert_eq!(pending["reason"], "Infeasible");
    let message = pending["message"].as_str().unwrap_or("");
    assert!(
        message
            .starts_with("Node didn't have enough capacity: cpu, requested: 1000000, capacity: "),
        "{message}"
    );
    assert_eq!(pending["observedGeneration"], 3);
    let checkpoint =
        std::fs::read_to_string(node.p("var/lib/kubelet/allocated_pods_state")).unwrap();
    assert!(
        checkpoint.contains("200m") && !checkpoint.contains("\\\"1000\\\""),
        "{checkpoint}"
    );

    // An agent restart reads the allocation back: the infeasible spec is not taken for the
    // pod's size, the container is neither restarted nor resized.
    kubelet.restart();
    std::thread::sleep(Duration::from_secs(5));
    let after = wait_for("status after restart", Duration::from_secs(60), || {
        Some(pod_now(&cp, &mut kubelet)).filter(|p| {
            condition(p, "PodResizePending").is_some()
                && p["status"]["containerStatuses"][0]["state"]["running"].is_object()
        })
    });
    let cs = &after["status"]["containerStatuses"][0];
    assert_eq!(cs["containerID"], id);
    assert_eq!(cs["restartCount"], 0);
    assert_eq!(cs["allocatedResources"]["cpu"], "200m");
    assert_eq!(
        last_quota(&node.container_log(&pod, "main")).as_deref(),
        Some("20000")
    );
}

/// Where a cgroup's cpu and memory limits are read on this host: the v1 hierarchies of `cpu`
/// and `memory`, or the v2 unified tree.
struct Cgroups {
    cpu: PathBuf,
    memory: PathBuf,
    v2: bool,
}

impl Cgroups {
    fn detect() -> Option<Cgroups> {
        let v1 = |controller: &str| {
            let text = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
            text.lines().find_map(|l| {
                let (left, right) = l.split_once(" - ")?;
                let mut r = right.split(' ');
                let (fstype, _, opts) = (r.next()?, r.next()?, r.next()?);
                let mount = left.split(' ').nth(4)?;
                (fstype == "cgroup" && opts.split(',').any(|o| o == controller))
                    .then(|| PathBuf::from(mount))
            })
        };
        if let (Some(cpu), Some(memory)) = (v1("cpu"), v1("memory")) {
            return Some(Cgroups {
                cpu,
                memory,
                v2: false,
            });
        }
        let root = PathBuf::from("/sys/fs/cgroup");
        root.join("cgroup.controllers").exists().then(|| Cgroups {
            cpu: root.clone(),
            memory: root,
            v2: true,
        })
    }

    fn read(dir: &Path, file: &str) -> String {
        std::fs::read_to_string(dir.join(file))
            .map(|s| s.trim().to_string())
            .unwrap_or_default()
    }

    /// (CFS quota, memory limit) of the cgroup at `rel`: `10000`, `67108864`; v2's `max`
    /// reads as `-1`.
    fn limits(&self, rel: &str) -> (String, String) {
        let rel = rel.trim_start_matches('/');
        let (cpu, mem) = (self.cpu.join(rel), self.memory.join(rel));
        if self.v2 {
            let quota = Self::read(&cpu, "cpu.max");
            let quota = quota.split(' ').next().unwrap_or("").replace("max", "-1");
            (quota, Self::read(&mem, "memory.max"))
        } else {
            (
                Self::read(&cpu, "cpu.cfs_quota_us"),
                Self::read(&mem, "memory.limit_in_bytes"),
            )
        }
    }
}

fn burstable(cpu_limit: &str, memory_limit: &str) -> Value {
    json!({"requests": {"cpu": "50m", "memory": "32Mi"},
           "limits": {"cpu": cpu_limit, "memory": memory_limit}})
}

const MI: u64 = 1 << 20;

/// Issue 43.1: a Burstable pod resized up, down, then CPU down with memory up through
/// `pods/resize`. Each step reaches the container's own cgroup (its CFS quota and memory
/// limit, read from the host) and the pod cgroup above it, without a restart, and the status
/// shows the new `resources`. On cgroup v1 the kernel refuses a child quota above its
/// parent's (and a parent's below a child's), so this holds only when the pod cgroup grows
/// before its containers and shrinks after them, per resource.
#[test]
fn resize_up_and_down_reaches_the_container_and_pod_cgroups() {
    require_rig!();
    let Some(cg) = Cgroups::detect() else {
        eprintln!("SKIPPED: neither cgroup v1 cpu+memory hierarchies nor cgroup v2 here");
        return;
    };
    let (rig, cp, _node, mut kubelet) =
        node_tests::joined::up("e2e-resize-ud", Options::default(), false);
    wait_for("node registered", Duration::from_secs(60), || {
        if let Some(st) = kubelet.exited() {
            panic!("kubelet exited: {st}\n{}", kubelet.log_text());
        }
        cp.get("nodes", "", NODE)
            .filter(|n| n["status"]["allocatable"]["cpu"].is_string())
    });
    cp.create(
        "pods",
        json!({"metadata": {"name": "resize", "namespace": "default"},
               "spec": {"nodeName": NODE, "terminationGracePeriodSeconds": 1,
                        "containers": [{"name": "main", "image": BUSYBOX,
                                        "command": ["sleep", "3600"],
                                        "resources": burstable("100m", "64Mi")}]}}),
    )
    .unwrap();
    let pod = wait_for("pod Running", Duration::from_secs(90), || {
        Some(pod_now(&cp, &mut kubelet)).filter(|p| p["status"]["phase"] == "Running")
    });
    assert_eq!(pod["status"]["qosClass"], "Burstable");
    let uid = pod["metadata"]["uid"].as_str().unwrap().to_string();
    let id = pod["status"]["containerStatuses"][0]["containerID"].clone();
    let pod_cg = format!(
        "{}/kubepods/burstable/pod{uid}",
        rig.get("RIG_CGROUP_ROOT").trim_end_matches('/')
    );
    let ctr_cg = format!(
        "{pod_cg}/{}",
        id.as_str().unwrap().trim_start_matches("containerd://")
    );
    let both = |quota: u64, mem: u64| (quota.to_string(), (mem * MI).to_string());
    assert_eq!(cg.limits(&ctr_cg), both(10_000, 64), "container at start");
    assert_eq!(cg.limits(&pod_cg), both(10_000, 64), "pod at start");

    // (cpu limit, memory limit, quota, MiB): up, down, then cpu down with memory up.
    let steps = [
        ("200m", "128Mi", 20_000, 128),
        ("100m", "48Mi", 10_000, 48),
        ("60m", "96Mi", 6_000, 96),
    ];
    for (generation, (cpu, memory, quota, mib)) in (2..).zip(steps) {
        let out = cp
            .patch_resize(
                "default",
                "resize",
                SMP,
                &json!({"spec": {"containers": [{"name": "main",
                                                  "resources": burstable(cpu, memory)}]}}),
            )
            .unwrap();
        assert_eq!(out["metadata"]["generation"], generation);
        let want = both(quota, mib);
        let done = wait_for(
            &format!("{cpu}/{memory} in the status"),
            Duration::from_secs(60),
            || {
                Some(pod_now(&cp, &mut kubelet)).filter(|p| {
                    let lim = &p["status"]["containerStatuses"][0]["resources"]["limits"];
                    lim["cpu"] == cpu
                        && lim["memory"] == memory
                        && condition(p, "PodResizeInProgress").is_none()
                })
            },
        );
        let ctr = wait_for(
            &format!("container cgroup at {want:?}"),
            Duration::from_secs(30),
            || Some(cg.limits(&ctr_cg)).filter(|l| *l == want),
        );
        assert_eq!(ctr, want);
        assert_eq!(
            cg.limits(&pod_cg),
            want,
            "pod cgroup after {cpu}/{memory}\n{}",
            kubelet.log_text()
        );
        let cs = &done["status"]["containerStatuses"][0];
        assert_eq!(cs["containerID"], id, "the container was not replaced");
        assert_eq!(cs["restartCount"], 0);
        assert_eq!(cs["allocatedResources"]["cpu"], "50m");
        assert_eq!(cs["resources"]["requests"]["memory"], "32Mi");
    }
}
