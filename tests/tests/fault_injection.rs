//! Fault injection under pod churn, on the node rig: the standalone kubelet with
//! `FAULT_PODS` static pods (default 12 in CI; 50 for the long run) while a churn thread adds
//! and removes another pod every few seconds. Faults, in order:
//!
//! 1. kill -9 the agent and start it again: no container is restarted (same IDs, restart
//!    count 0) and every pod reports Running again;
//! 2. restart containerd: no pod is lost (same IDs), the agent reconnects and starts a new pod;
//! 3. the disk under the pods' directories fills up (a small tmpfs this test mounts): a new
//!    pod waits with a clear error, the others run on, and it starts once space is back;
//! 4. a corrupt state file (the serving key): after a crash the agent regenerates the pair
//!    and serves :10250 again; pods untouched.
//!
//! The apiserver outage (60 s, status and lease converging after it) is the cluster e2e test
//! `apiserver_outage_*` in `kubelet_cluster.rs`. Prints how long each recovery took; asserts
//! only bounded waits.

use node_tests::require_rig;
use node_tests::{Kubelet, Rig, container, wait_for};
use std::collections::BTreeMap;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

fn pods_wanted() -> usize {
    std::env::var("FAULT_PODS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(12)
}

fn sleeper(name: &str) -> String {
    format!(
        r#"apiVersion: v1
kind: Pod
metadata:
  name: {name}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: app
    image: docker.io/library/busybox:1.35
    command: ["sh", "-c", "trap 'exit 0' TERM; sleep 3600 & wait"]
"#
    )
}

/// Name → (containerID, restartCount) of every Running `sleeper-*` pod.
fn running_sleepers(agent: &Kubelet) -> BTreeMap<String, (String, i64)> {
    agent
        .pods()
        .into_iter()
        .filter(|p| {
            p["metadata"]["name"]
                .as_str()
                .is_some_and(|n| n.starts_with("sleeper-"))
                && p["status"]["phase"] == "Running"
        })
        .filter_map(|p| {
            let c = container(&p, "app");
            Some((
                p["metadata"]["name"].as_str()?.to_string(),
                (
                    c["containerID"].as_str()?.to_string(),
                    c["restartCount"].as_i64()?,
                ),
            ))
        })
        .collect()
}

/// Adds and removes `churn-<k>` every couple of seconds until stopped (bounded count).
struct Churn {
    stop: Arc<AtomicBool>,
    rounds: Arc<AtomicUsize>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Churn {
    fn start(manifests: std::path::PathBuf) -> Churn {
        let stop = Arc::new(AtomicBool::new(false));
        let rounds = Arc::new(AtomicUsize::new(0));
        let (s, r) = (stop.clone(), rounds.clone());
        let thread = std::thread::spawn(move || {
            for k in 0..500 {
                if s.load(Ordering::SeqCst) {
                    break;
                }
                let file = manifests.join(format!("churn-{}.yaml", k % 3));
                let tmp = manifests.join(format!(".churn-{k}.tmp"));
                let _ = std::fs::write(&tmp, sleeper(&format!("churn-{}", k % 3)));
                let _ = std::fs::rename(&tmp, &file);
                std::thread::sleep(Duration::from_secs(2));
                let _ = std::fs::remove_file(&file);
                std::thread::sleep(Duration::from_secs(1));
                r.fetch_add(1, Ordering::SeqCst);
            }
        });
        Churn {
            stop,
            rounds,
            thread: Some(thread),
        }
    }
}

impl Drop for Churn {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Unmounts a tmpfs this test mounted, on drop.
struct TmpfsMount(std::path::PathBuf);

impl Drop for TmpfsMount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

#[test]
fn faults_under_churn() {
    require_rig!();
    let n = pods_wanted();
    let mut rig = Rig::up("e2e-fault");
    let mut agent = Kubelet::builder(&rig).start();
    for i in 0..n {
        agent.write_manifest(
            &format!("sleeper-{i}.yaml"),
            &sleeper(&format!("sleeper-{i}")),
        );
    }
    let started = Instant::now();
    let before = wait_for("every sleeper Running", Duration::from_secs(300), || {
        let r = running_sleepers(&agent);
        (r.len() == n).then_some(r)
    });
    println!("{n} pods Running in {:?}", started.elapsed());
    let churn = Churn::start(agent.manifests());
    let unchanged = |agent: &Kubelet, what: &str| {
        let t = Instant::now();
        let after = wait_for(what, Duration::from_secs(120), || {
            let r = running_sleepers(agent);
            (r.len() == n).then_some(r)
        });
        assert_eq!(
            after, before,
            "{what}: containers were replaced or restarted"
        );
        t.elapsed()
    };

    // 1. kill -9 and start again.
    agent.kill();
    agent.restart();
    let t = unchanged(&agent, "pods after kill -9");
    println!("after kill -9: every pod reported Running, unchanged, in {t:?}");

    // 2. Restart containerd.
    rig.restart_containerd();
    let t = unchanged(&agent, "pods after a containerd restart");
    agent.write_manifest("fresh.yaml", &sleeper("fresh"));
    wait_for(
        "a new pod after the restart",
        Duration::from_secs(60),
        || {
            agent
                .pod("fresh-")
                .filter(|p| p["status"]["phase"] == "Running")
        },
    );
    println!("after containerd restart: pods unchanged in {t:?}, new pod started");

    // 3. Disk full under the pods' directories.
    let pods_dir = agent.dir().join("root/pods");
    std::fs::create_dir_all(&pods_dir).unwrap();
    let st = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=512k", "fault-tmpfs"])
        .arg(&pods_dir)
        .status()
        .unwrap();
    assert!(st.success(), "mount tmpfs");
    let mount = TmpfsMount(pods_dir.clone());
    // Fill it: the filler file grows until ENOSPC.
    let filler = pods_dir.join("filler");
    let _ = std::fs::write(&filler, vec![0u8; 1 << 20]);
    agent.write_manifest("full.yaml", &sleeper("full"));
    let waiting = wait_for("the new pod's disk error", Duration::from_secs(60), || {
        agent.pod("full-").filter(|p| {
            let w = &container(p, "app")["state"]["waiting"];
            w["reason"] == "CreateContainerConfigError"
        })
    });
    let message = container(&waiting, "app")["state"]["waiting"]["message"].clone();
    assert!(
        message.as_str().unwrap_or("").contains("No space left"),
        "the error says why: {message}"
    );
    assert_eq!(running_sleepers(&agent), before, "others untouched");
    std::fs::remove_file(&filler).unwrap();
    wait_for(
        "the new pod once space is back",
        Duration::from_secs(60),
        || {
            agent
                .pod("full-")
                .filter(|p| p["status"]["phase"] == "Running")
        },
    );
    println!("disk full: clear error ({message}); pod started once space was back");

    // 4. A corrupt state file: the serving key.
    let key = agent.dir().join("root/pki/kubelet.key");
    assert!(
        key.exists(),
        "the self-signed serving key is at {}",
        key.display()
    );
    std::fs::write(&key, "-----BEGIN PRIVATE KEY-----\ngarbage\n").unwrap();
    agent.kill();
    agent.restart();
    let t = unchanged(&agent, "pods after a corrupt serving key");
    assert!(
        agent.log_text().contains("kubelet.key"),
        "the log names the file it replaced"
    );
    println!("corrupt serving key: regenerated, :10250 serving, pods unchanged in {t:?}");

    let rounds = churn.rounds.load(Ordering::SeqCst);
    drop(churn);
    assert!(rounds > 0, "the churn thread ran");
    println!("churn rounds meanwhile: {rounds}");
    // Remove everything and let the agent tear it down before the rig goes.
    for e in std::fs::read_dir(agent.manifests()).unwrap().flatten() {
        let _ = std::fs::remove_file(e.path());
    }
    wait_for("every pod removed", Duration::from_secs(120), || {
        agent.pods().is_empty().then_some(())
    });
    drop(mount);
}
