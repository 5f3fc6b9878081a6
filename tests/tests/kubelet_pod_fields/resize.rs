//! In-place pod resize on containerd (InPlacePodVerticalScaling, GA): a resize through the
//! `pods/resize` subresource changes the running container's CPU quota in its cgroup without
//! a restart, the status shows the new allocation; a resize beyond the node's allocatable is
//! `PodResizePending`/`Infeasible` and changes nothing; and after an agent restart the
//! checkpointed allocation, not the infeasible spec, is what the container keeps.

use node_tests::controlplane::Options;
use node_tests::joined::NODE;
use node_tests::require_rig;
use node_tests::{Kubelet, NetnsControlPlane, wait_for};
use serde_json::{Value, json};
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
