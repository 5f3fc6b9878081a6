//! Pod start with a CSI volume against the same pods with an emptyDir, on the node rig (root;
//! prints figures, asserts nothing about time; issue 28's benchmark).
//!
//! ```text
//! cargo build -p kubelet --bins && cargo build -p node-tests --bin csi-start-bench
//! sudo target/debug/csi-start-bench [--pods N] [--rounds R]
//! ```
//!
//! One rig, one control plane in its netns, one joined agent (`target/<profile>/kubelet` or
//! `$KUBELET_BIN`) and the harness's CSI driver (`node_tests::csi_driver`, registered through
//! `plugins_registry`; STAGE_UNSTAGE_VOLUME, each volume a directory it bind-mounts: no real
//! I/O). After a warm-up pod, each round creates N busybox pods at once with an emptyDir at
//! /data and waits for all of them to be Running on the apiserver, deletes them, then does the
//! same with N pods each on its own bound claim (a CSI PV, staged and published per pod).
//! Start-to-Running is measured from each pod's create call to the first poll that sees
//! `Running`. Prints p50/p90/max per kind over all rounds and the CSI / emptyDir p50 ratio
//! (issue 28's bar: at most 1.3).

use node_tests::controlplane::Options;
use node_tests::csi_driver::{DriverOptions, TestCsiDriver};
use node_tests::joined::NODE;
use node_tests::{NetnsControlPlane, wait_for};
use serde_json::{Value, json};
use std::path::Path;
use std::time::{Duration, Instant};

const BUSYBOX: &str = "docker.io/library/busybox:1.35";
const DRIVER: &str = "csi.bench.example.com";
/// How long one round may take before the bench gives up.
const ROUND_TIMEOUT: Duration = Duration::from_secs(300);

struct Opts {
    pods: usize,
    rounds: usize,
}

fn usage() -> ! {
    eprintln!("usage: csi-start-bench [--pods N (1..=100, default 50)] [--rounds R (default 1)]");
    std::process::exit(2)
}

fn parse() -> Opts {
    let mut o = Opts {
        pods: 50,
        rounds: 1,
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut num = || -> usize {
            args.next()
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| usage())
        };
        match a.as_str() {
            "--pods" => o.pods = num(),
            "--rounds" => o.rounds = num(),
            // `cargo bench`-style flags passed through are ignored.
            "--bench" => {}
            _ => usage(),
        }
    }
    if o.pods == 0 || o.pods > 100 || o.rounds == 0 {
        usage()
    }
    o
}

fn pod(name: &str, volume: Value) -> Value {
    json!({"metadata": {"name": name, "namespace": "default"},
        "spec": {"nodeName": NODE, "terminationGracePeriodSeconds": 0,
            "containers": [{"name": "main", "image": BUSYBOX, "command": ["sleep", "3600"],
                "volumeMounts": [{"name": "data", "mountPath": "/data"}]}],
            "volumes": [volume]}})
}

/// Claim `claim` bound to PV `pv` on the driver's volume `handle` (the binder's work).
fn bound_claim(cp: &NetnsControlPlane, claim: &str, pv: &str, handle: &str) {
    let c = cp
        .create(
            "persistentvolumeclaims",
            json!({"metadata": {"name": claim, "namespace": "default"},
                "spec": {"accessModes": ["ReadWriteOnce"], "volumeName": pv,
                    "resources": {"requests": {"storage": "1Gi"}}}}),
        )
        .expect("create the claim");
    cp.create(
        "persistentvolumes",
        json!({"metadata": {"name": pv}, "spec": {
            "capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
            "claimRef": {"namespace": "default", "name": claim, "uid": c["metadata"]["uid"]},
            "csi": {"driver": DRIVER, "volumeHandle": handle}}}),
    )
    .expect("create the PV");
    let mut c = cp
        .get("persistentvolumeclaims", "default", claim)
        .expect("the claim");
    c["status"] = json!({"phase": "Bound"});
    cp.update_status("persistentvolumeclaims", c)
        .expect("bind the claim");
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

/// Creates the pods at once; each one's create-to-Running time. Deletes them after, and
/// waits until the agent has torn them down (their directories are gone), so that one round's
/// teardown does not slow the next one's starts.
fn start_all(cp: &NetnsControlPlane, pods_dir: &Path, pods: Vec<Value>) -> Vec<Duration> {
    let mut created = Vec::new();
    for p in pods {
        let name = p["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        cp.create("pods", p).expect("create the pod");
        created.push((name, Instant::now()));
    }
    let mut latencies: Vec<Option<Duration>> = vec![None; created.len()];
    let deadline = Instant::now() + ROUND_TIMEOUT;
    while latencies.iter().any(Option::is_none) {
        assert!(
            Instant::now() < deadline,
            "not every pod reached Running within {ROUND_TIMEOUT:?}"
        );
        let running: std::collections::BTreeSet<String> = cp
            .list("pods", Some("default"))
            .iter()
            .filter(|p| p["status"]["phase"] == "Running")
            .filter_map(|p| p["metadata"]["name"].as_str().map(String::from))
            .collect();
        for (i, (name, at)) in created.iter().enumerate() {
            if latencies[i].is_none() && running.contains(name) {
                latencies[i] = Some(at.elapsed());
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    for (name, _) in &created {
        let _ = cp.delete("pods", "default", name, Some(0));
    }
    wait_for("the round's pods gone", Duration::from_secs(120), || {
        created
            .iter()
            .all(|(n, _)| cp.get("pods", "default", n).is_none())
            .then_some(())
    });
    wait_for(
        "the round's pods torn down",
        Duration::from_secs(180),
        || {
            std::fs::read_dir(pods_dir)
                .map(|d| d.count() == 0)
                .unwrap_or(true)
                .then_some(())
        },
    );
    latencies.into_iter().flatten().collect()
}

fn report(kind: &str, lat: &mut [Duration]) -> Duration {
    lat.sort();
    let p50 = percentile(lat, 0.5);
    println!(
        "csi-start-bench: {kind:8} {} pods: p50 {:.0} ms, p90 {:.0} ms, max {:.0} ms",
        lat.len(),
        p50.as_secs_f64() * 1e3,
        percentile(lat, 0.9).as_secs_f64() * 1e3,
        lat[lat.len() - 1].as_secs_f64() * 1e3
    );
    p50
}

fn main() {
    let o = parse();
    if let Some(reason) = node_tests::skip_reason() {
        eprintln!("SKIPPED: {reason}");
        std::process::exit(0);
    }
    let (_rig, cp, node, mut kubelet) =
        node_tests::joined::up("bench-csi", Options::default(), false);
    wait_for("node registered", Duration::from_secs(60), || {
        if let Some(st) = kubelet.exited() {
            panic!("kubelet exited: {st}\n{}", kubelet.log_text());
        }
        cp.get("nodes", "", NODE)
    });
    let data = tempfile::tempdir().expect("a data dir");
    let driver = TestCsiDriver::start(
        &node.p("var/lib/kubelet"),
        data.path(),
        DriverOptions::new(DRIVER),
    );
    wait_for("driver registered", Duration::from_secs(30), || {
        driver
            .statuses()
            .iter()
            .any(|s| s.plugin_registered)
            .then_some(())
    });
    // No attach step: a driver object that says so (upstream attaches without one).
    cp.create(
        "csidrivers.storage.k8s.io",
        json!({"metadata": {"name": DRIVER}, "spec": {"attachRequired": false}}),
    )
    .expect("create the CSIDriver");
    // Warm-up: image, CNI and first-use costs, one pod of each kind.
    bound_claim(&cp, "warm", "pv-warm", "vol-warm");
    let pods_dir = node.p("var/lib/kubelet/pods");
    start_all(
        &cp,
        &pods_dir,
        vec![
            pod("warm-e", json!({"name": "data", "emptyDir": {}})),
            pod(
                "warm-c",
                json!({"name": "data", "persistentVolumeClaim": {"claimName": "warm"}}),
            ),
        ],
    );
    let mut empty = Vec::new();
    let mut csi = Vec::new();
    for round in 0..o.rounds {
        for i in 0..o.pods {
            bound_claim(
                &cp,
                &format!("c{round}-{i}"),
                &format!("pv-{round}-{i}"),
                &format!("vol-{round}-{i}"),
            );
        }
        let pods = (0..o.pods)
            .map(|i| {
                pod(
                    &format!("e{round}-{i}"),
                    json!({"name": "data", "emptyDir": {}}),
                )
            })
            .collect();
        empty.extend(start_all(&cp, &pods_dir, pods));
        let pods = (0..o.pods)
            .map(|i| {
                pod(
                    &format!("c{round}-{i}"),
                    json!({"name": "data", "persistentVolumeClaim": {"claimName": format!("c{round}-{i}")}}),
                )
            })
            .collect();
        csi.extend(start_all(&cp, &pods_dir, pods));
    }
    let stages = driver
        .calls()
        .iter()
        .filter(|c| c.starts_with("NodeStageVolume"))
        .count();
    println!(
        "csi-start-bench: {} rounds of {} pods created at once, create -> Running on the apiserver",
        o.rounds, o.pods
    );
    let e50 = report("emptyDir", &mut empty);
    let c50 = report("csi", &mut csi);
    println!(
        "csi-start-bench: csi p50 / emptyDir p50 = {:.2} (issue 28: <= 1.3); NodeStageVolume calls: {stages}",
        c50.as_secs_f64() / e50.as_secs_f64()
    );
    drop(driver);
    kubelet.stop();
}
