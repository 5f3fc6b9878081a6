//! Node resource protection on real containerd: a pod writing past its emptyDir `sizeLimit` is
//! evicted (Failed, reason Evicted, upstream's message, the Evicted event), and container GC
//! keeps one dead instance per container of a crash-looping pod while its restart count goes
//! on.

mod common;

use common::joined::NODE;
use common::{Agent, Rig, container, wait_for};
use node_tests::controlplane::Options;
use serde_json::json;
use std::time::Duration;

const BUSYBOX: &str = "docker.io/library/busybox:1.35";

/// Every container the runtime has (`cri ps -a -q`).
fn all_containers(rig: &Rig) -> Vec<String> {
    let out = std::process::Command::new(common::bin("cri"))
        .args(["--endpoint", rig.get("CRI_ENDPOINT"), "ps", "-a", "-q"])
        .output()
        .expect("cri ps");
    assert!(
        out.status.success(),
        "cri ps: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .collect()
}

#[test]
fn pod_over_its_empty_dir_size_limit_is_evicted() {
    require_rig!();
    let (_rig, cp, _node, mut kubelet) =
        common::joined::up("e2e-evict-emptydir", Options::default(), false);
    wait_for("node registered", Duration::from_secs(60), || {
        if let Some(st) = kubelet.exited() {
            panic!("kubelet exited: {st}\n{}", kubelet.log_text());
        }
        cp.get("nodes", "", NODE)
    });
    cp.create(
        "pods",
        json!({"metadata": {"name": "filler", "namespace": "default"},
            "spec": {"nodeName": NODE, "terminationGracePeriodSeconds": 1,
                "containers": [{"name": "app", "image": BUSYBOX,
                    "command": ["sh", "-c", "dd if=/dev/zero of=/scratch/fill bs=1024 count=4096; sleep 3600"],
                    "volumeMounts": [{"name": "scratch", "mountPath": "/scratch"}]}],
                "volumes": [{"name": "scratch", "emptyDir": {"sizeLimit": "1Mi"}}]}}),
    )
    .unwrap();
    // The volume is measured when the pod is new and then once a minute
    // (volumeStatsAggPeriod); the eviction manager looks every 10 s.
    let pod = wait_for("pod evicted", Duration::from_secs(150), || {
        if let Some(st) = kubelet.exited() {
            panic!("kubelet exited: {st}\n{}", kubelet.log_text());
        }
        cp.get("pods", "default", "filler")
            .filter(|p| p["status"]["phase"] == "Failed")
    });
    assert_eq!(pod["status"]["reason"], "Evicted", "{pod}");
    assert_eq!(
        pod["status"]["message"],
        "Usage of EmptyDir volume \"scratch\" exceeds the limit \"1Mi\". "
    );
    let events = cp.list("events", Some("default"));
    let evicted = events
        .iter()
        .find(|e| {
            e["reason"] == "Evicted"
                && e["type"] == "Warning"
                && e["involvedObject"]["name"] == "filler"
        })
        .unwrap_or_else(|| panic!("an Evicted event: {events:#?}"));
    // A local storage limit names no starved node resource: upstream records this Event
    // without the threshold evictions' offending_containers/starved_resource annotations.
    assert!(
        evicted["metadata"]["annotations"].is_null(),
        "no annotations: {evicted:#?}"
    );
}

const CRASHER: &str = r#"apiVersion: v1
kind: Pod
metadata:
  name: crasher
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: app
    image: docker.io/library/busybox:1.35
    command: ["sh", "-c", "exit 3"]
"#;

#[test]
fn container_gc_keeps_one_dead_container_per_container() {
    require_rig!();
    let rig = Rig::up("e2e-container-gc");
    let agent = Agent::start(&rig);
    agent.write_manifest("crasher.yaml", CRASHER);
    // Restarts at about 0, 10, 30 s (back-off): three dead instances pile up first.
    wait_for("three instances", Duration::from_secs(60), || {
        (all_containers(&rig).len() >= 3).then_some(())
    });
    let before = agent
        .pod("crasher-")
        .map(|p| container(&p, "app")["restartCount"].as_i64().unwrap_or(0))
        .unwrap_or(0);
    // Container GC runs every minute from the agent's start: then at most the newest dead
    // instance is left (plus one that may be starting).
    wait_for("dead instances collected", Duration::from_secs(60), || {
        (all_containers(&rig).len() <= 2).then_some(())
    });
    let after = agent
        .pod("crasher-")
        .map(|p| container(&p, "app")["restartCount"].as_i64().unwrap_or(0))
        .unwrap_or(0);
    assert!(
        after >= before && after >= 2,
        "restart count goes on: {before} → {after}"
    );
}

/// Every image the runtime has, one `id\ttags\tsize` line each (`cri images`).
fn images(rig: &Rig) -> String {
    let out = std::process::Command::new(common::bin("cri"))
        .args(["--endpoint", rig.get("CRI_ENDPOINT"), "images"])
        .output()
        .expect("cri images");
    assert!(
        out.status.success(),
        "cri images: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

const SLEEPER: &str = r#"apiVersion: v1
kind: Pod
metadata:
  name: sleeper
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: app
    image: docker.io/library/busybox:1.35
    command: ["sleep", "3600"]
"#;

/// The image filesystem is "full" for `imagefs.available<99%` (any use crosses it): the
/// eviction manager's node-level reclaim runs image GC, which removes the unused image (older
/// than `imageMinimumGCAge`) and keeps the one a container uses and the sandbox image (the
/// static pod is critical: never evicted).
#[test]
fn image_gc_removes_unused_images_above_the_high_threshold() {
    require_rig!();
    let rig = Rig::up("e2e-image-gc");
    let unused = common::import_grpc_health_image(&rig);
    assert!(images(&rig).contains(unused));
    // The pod runs first, under the default policy (nothing is collected: 85 % is far).
    let mut first = Agent::start(&rig);
    first.write_manifest("sleeper.yaml", SLEEPER);
    wait_for("sleeper running", Duration::from_secs(60), || {
        first
            .pod("sleeper-")
            .filter(|p| p["status"]["phase"] == "Running")
    });
    assert!(images(&rig).contains(unused), "default policy keeps it");
    first.stop();
    let agent = Agent::start_with(
        &rig,
        &[],
        "imageGCHighThresholdPercent: 1\nimageGCLowThresholdPercent: 0\nimageMinimumGCAge: 1s\n\
         evictionHard:\n  imagefs.available: \"99%\"\n",
    );
    agent.write_manifest("sleeper.yaml", SLEEPER);
    wait_for("unused image removed", Duration::from_secs(60), || {
        (!images(&rig).contains(unused)).then_some(())
    });
    let left = images(&rig);
    assert!(left.contains("busybox:1.35"), "in use: kept\n{left}");
    assert!(left.contains("pause"), "sandbox image: kept\n{left}");
    let log = agent.log_text();
    assert!(
        log.contains("removing image to free bytes"),
        "the agent says what it removed"
    );
}
