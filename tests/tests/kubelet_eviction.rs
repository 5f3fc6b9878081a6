//! Node resource protection on real containerd: a pod writing past its emptyDir `sizeLimit` is
//! evicted (Failed, reason Evicted, upstream's message, the Evicted event), also when it
//! writes below 1,100 directories, also after pod
//! sandboxes were stopped behind the agent's back while it was down (issue 25: containerd 1.6
//! failed the node's whole ListPodSandboxStats over such a sandbox), and container GC
//! keeps one dead instance per container of a crash-looping pod while its restart count goes
//! on and removes old sandboxes left empty; image GC frees a small (tmpfs) image filesystem
//! filled past its high threshold, and through the eviction manager's reclaim.

use node_tests::controlplane::Options;
use node_tests::joined::NODE;
use node_tests::require_rig;
use node_tests::{Kubelet, Rig, container, wait_for};
use serde_json::json;
use std::time::Duration;

const BUSYBOX: &str = "docker.io/library/busybox:1.35";

/// Every container the runtime has (`cri ps -a -q`).
fn all_containers(rig: &Rig) -> Vec<String> {
    let out = std::process::Command::new(node_tests::bin("cri"))
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
        node_tests::joined::up("e2e-evict-emptydir", Options::default(), false);
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

/// Issue 37.3: 40 MiB written below a chain of 1,100 directories (built one `mkdir && cd`
/// at a time: the path is longer than PATH_MAX for `mkdir -p`) is counted; the usage walk
/// used to stop at 1,024 levels and measured the volume at a few KB, so its `sizeLimit` never
/// fired.
#[test]
fn data_below_eleven_hundred_directories_counts_against_the_size_limit() {
    require_rig!();
    let (_rig, cp, _node, mut kubelet) =
        node_tests::joined::up("e2e-evict-deep", Options::default(), false);
    wait_for("node registered", Duration::from_secs(60), || {
        if let Some(st) = kubelet.exited() {
            panic!("kubelet exited: {st}\n{}", kubelet.log_text());
        }
        cp.get("nodes", "", NODE)
    });
    let script = "cd /scratch && i=0; while [ $i -lt 1100 ]; do mkdir d && cd d || exit 1; \
        i=$((i+1)); done; dd if=/dev/zero of=fill bs=1048576 count=40 && sync; sleep 3600";
    cp.create(
        "pods",
        json!({"metadata": {"name": "deep", "namespace": "default"},
            "spec": {"nodeName": NODE, "terminationGracePeriodSeconds": 1,
                "containers": [{"name": "app", "image": BUSYBOX,
                    "command": ["sh", "-c", script],
                    "volumeMounts": [{"name": "scratch", "mountPath": "/scratch"}]}],
                "volumes": [{"name": "scratch", "emptyDir": {"sizeLimit": "10Mi"}}]}}),
    )
    .unwrap();
    // Measured when the pod is new and then once a minute (volumeStatsAggPeriod).
    let pod = wait_for("pod evicted", Duration::from_secs(150), || {
        if let Some(st) = kubelet.exited() {
            panic!("kubelet exited: {st}\n{}", kubelet.log_text());
        }
        cp.get("pods", "default", "deep")
            .filter(|p| p["status"]["phase"] == "Failed")
    });
    assert_eq!(pod["status"]["reason"], "Evicted", "{pod}");
    assert_eq!(
        pod["status"]["message"],
        "Usage of EmptyDir volume \"scratch\" exceeds the limit \"10Mi\". "
    );
}

/// The CRI as the test reaches it (the socket is a path: no netns needed).
fn cri(rig: &Rig) -> (tokio::runtime::Runtime, kubelet::runtime::cri::CriRuntime) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let ch = rt
        .block_on(cri_proto::connect(
            rig.get("CRI_ENDPOINT"),
            Duration::from_secs(5),
        ))
        .expect("connect to containerd");
    let cri = kubelet::runtime::cri::CriRuntime::new(ch.clone(), ch, Duration::from_secs(30));
    (rt, cri)
}

fn uid(pod: &serde_json::Value) -> String {
    pod["metadata"]["uid"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

/// Issue 25, on containerd 1.6: two Running pods lose their sandbox while the agent is down
/// (SIGKILL, then StopPodSandbox through the CRI; `idle`'s dead container is removed too).
/// After the restart both run again in new sandboxes; `idle`'s old sandbox, empty, is removed
/// by container GC, while `filler`'s keeps the dead instance GC keeps for `app` (upstream's
/// rule). That stopped sandbox blinds nothing: `filler`'s new container writes 40 MiB into
/// an emptyDir limited to 10Mi and is evicted within the eviction interval plus one stats
/// period; once its object is deleted nothing of it is left.
#[test]
fn sandboxes_stopped_behind_the_agents_back_blind_neither_stats_nor_eviction() {
    use kubelet::runtime::{Runtime, SandboxState};
    require_rig!();
    let t0 = std::time::Instant::now();
    let (rig, cp, _node, mut kubelet) = node_tests::joined::up_with_env(
        "e2e-stale-sandbox",
        Options::default(),
        true,
        &[("KUBELET_TEST_CONTAINER_GC_PERIOD", "2s")],
    );
    let alive = |k: &mut node_tests::Kubelet| {
        if let Some(st) = k.exited() {
            panic!("kubelet exited: {st}\n{}", k.log_text());
        }
    };
    wait_for("node registered", Duration::from_secs(60), || {
        alive(&mut kubelet);
        cp.get("nodes", "", NODE)
    });
    // The first run leaves a marker in its emptyDir; a run that finds it fills the volume.
    cp.create(
        "pods",
        json!({"metadata": {"name": "filler", "namespace": "default"},
            "spec": {"nodeName": NODE, "terminationGracePeriodSeconds": 1,
                "containers": [{"name": "app", "image": BUSYBOX,
                    "command": ["sh", "-c", "if [ -e /scratch/started ]; then dd if=/dev/zero of=/scratch/fill bs=1048576 count=40; else touch /scratch/started; fi; sleep 3600"],
                    "volumeMounts": [{"name": "scratch", "mountPath": "/scratch"}]}],
                "volumes": [{"name": "scratch", "emptyDir": {"sizeLimit": "10Mi"}}]}}),
    )
    .unwrap();
    cp.create(
        "pods",
        json!({"metadata": {"name": "idle", "namespace": "default"},
            "spec": {"nodeName": NODE, "terminationGracePeriodSeconds": 1,
                "containers": [{"name": "app", "image": BUSYBOX, "command": ["sleep", "3600"]}]}}),
    )
    .unwrap();
    let running = |name: &str, restarts: i64| {
        cp.get("pods", "default", name).filter(|p| {
            let c = container(p, "app");
            p["status"]["phase"] == "Running"
                && c["state"]["running"].is_object()
                && c["restartCount"] == restarts
        })
    };
    let (filler, idle) = wait_for("both pods running", Duration::from_secs(60), || {
        alive(&mut kubelet);
        Some((running("filler", 0)?, running("idle", 0)?))
    });
    let (filler_uid, idle_uid) = (uid(&filler), uid(&idle));

    // Behind the agent's back: it is killed, the sandboxes stopped through the CRI.
    kubelet.kill();
    let (tokio_rt, cri) = cri(&rig);
    let (filler_old, idle_old) = tokio_rt.block_on(async {
        let one = |uid: String| {
            let cri = &cri;
            async move {
                let mut s = cri.list_pod_sandboxes(&uid).await.unwrap();
                assert_eq!(s.len(), 1, "{s:?}");
                let id = s.remove(0).id;
                cri.stop_sandbox(&id).await.unwrap();
                id
            }
        };
        let filler_old = one(filler_uid.clone()).await;
        let idle_old = one(idle_uid.clone()).await;
        for c in cri.list_pod_containers(&idle_uid).await.unwrap() {
            cri.remove_container(&c.id).await.unwrap();
        }
        // The list the agent asks for answers despite the stopped sandboxes.
        let stats = cri.list_sandbox_stats().await;
        assert!(stats.is_ok(), "ListPodSandboxStats: {stats:?}");
        (filler_old, idle_old)
    });
    let restarted = std::time::Instant::now();
    kubelet.restart();

    // idle runs again in a new sandbox (restart count 0: its dead container is gone); the
    // old sandbox, holding nothing, is removed by container GC.
    let sandboxes = |uid: &str| tokio_rt.block_on(cri.list_pod_sandboxes(uid)).unwrap();
    wait_for(
        "idle's old sandbox removed",
        Duration::from_secs(30),
        || {
            alive(&mut kubelet);
            let s = sandboxes(&idle_uid);
            (!s.iter().any(|s| s.id == idle_old)
                && s.iter().any(|s| s.state == SandboxState::Ready))
            .then_some(())
        },
    );
    wait_for("idle running again", Duration::from_secs(30), || {
        alive(&mut kubelet);
        running("idle", 0)
    });

    // filler's new container fills its volume past the limit and the pod is evicted.
    let mut filling_since = None;
    let mut old_kept = false;
    let evicted = wait_for("filler evicted", Duration::from_secs(60), || {
        alive(&mut kubelet);
        let p = cp.get("pods", "default", "filler")?;
        if filling_since.is_none() && container(&p, "app")["restartCount"] == 1 {
            filling_since = Some(std::time::Instant::now());
            // The old sandbox still holds the dead instance kept for `app`.
            old_kept = sandboxes(&filler_uid)
                .iter()
                .any(|s| s.id == filler_old && s.state == SandboxState::NotReady);
        }
        (p["status"]["phase"] == "Failed").then_some(p)
    });
    let evicted_after = restarted.elapsed();
    let since_fill = filling_since.map(|t| t.elapsed());
    assert_eq!(evicted["status"]["reason"], "Evicted", "{evicted}");
    assert_eq!(
        evicted["status"]["message"],
        "Usage of EmptyDir volume \"scratch\" exceeds the limit \"10Mi\". "
    );
    let since_fill = since_fill.expect("filler ran again (restartCount 1) before its eviction");
    assert!(
        old_kept,
        "filler's old sandbox was NotReady beside the new one"
    );
    // Eviction interval (10 s) + one stats period (10 s), plus the 1 s grace and status write.
    assert!(
        since_fill <= Duration::from_secs(25),
        "evicted {since_fill:?} after its new container ran (restart → eviction {evicted_after:?})"
    );
    // The evicted pod keeps what it has until its object goes (container GC keeps a live
    // pod's newest dead instance); then nothing of it is left, its old sandbox included.
    cp.delete("pods", "default", "filler", Some(0)).unwrap();
    wait_for(
        "every sandbox of filler removed",
        Duration::from_secs(30),
        || {
            alive(&mut kubelet);
            sandboxes(&filler_uid).is_empty().then_some(())
        },
    );
    let log = kubelet.log_text();
    assert!(
        !log.contains("eviction manager: cannot see"),
        "no stats source went blind:\n{log}"
    );
    eprintln!(
        "stale sandboxes: evicted {since_fill:?} after the refill began, {evicted_after:?} after the restart; test took {:?}",
        t0.elapsed()
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
    let agent = Kubelet::builder(&rig).start();
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
    let out = std::process::Command::new(node_tests::bin("cri"))
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
    let unused = node_tests::import_grpc_health_image(&rig);
    assert!(images(&rig).contains(unused));
    // The pod runs first, under the default policy (nothing is collected: 85 % is far).
    let mut first = Kubelet::builder(&rig).start();
    first.write_manifest("sleeper.yaml", SLEEPER);
    wait_for("sleeper running", Duration::from_secs(60), || {
        first
            .pod("sleeper-")
            .filter(|p| p["status"]["phase"] == "Running")
    });
    assert!(images(&rig).contains(unused), "default policy keeps it");
    first.stop();
    let agent = Kubelet::builder(&rig)
        .config(
            "imageGCHighThresholdPercent: 1\nimageGCLowThresholdPercent: 0\nimageMinimumGCAge: 1s\n\
         evictionHard:\n  imagefs.available: \"99%\"\n",
        )
        .start();
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

/// statfs(2) of the filesystem holding a path, as the agent reads it (`stat -f`: fragment
/// size × blocks, available to unprivileged users, free).
#[derive(Debug, Clone, Copy)]
struct Statfs {
    capacity: u64,
    available: u64,
    free: u64,
}

impl Statfs {
    fn of(path: &std::path::Path) -> Statfs {
        let out = std::process::Command::new("stat")
            .args(["-f", "-c", "%S %b %a %f"])
            .arg(path)
            .output()
            .expect("stat -f");
        assert!(out.status.success(), "stat -f {}", path.display());
        let n: Vec<u64> = String::from_utf8_lossy(&out.stdout)
            .split_whitespace()
            .map(|w| w.parse().expect("a number"))
            .collect();
        Statfs {
            capacity: n[0] * n[1],
            available: n[0] * n[2],
            free: n[0] * n[3],
        }
    }

    fn used(&self) -> u64 {
        self.capacity - self.free
    }

    /// Upstream's image GC arithmetic: 100 − available × 100 / capacity.
    fn usage_percent(&self) -> u64 {
        100 - self.available * 100 / self.capacity
    }
}

/// The summary's `node.runtime.imageFs`.
fn summary_image_fs(agent: &Kubelet) -> serde_json::Value {
    let body = agent.curl("https://127.0.0.1:10250/stats/summary");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
    v["node"]["runtime"]["imageFs"].clone()
}

const IMAGEFS_SIZE: u64 = 96 << 20;

/// The real thing on a small image filesystem: containerd's root on a 96 MiB tmpfs (the rig's
/// `RIG_IMAGEFS_SIZE`), image GC at 60 % / 40 % and the eviction manager's disk thresholds off.
/// While the filesystem is below 60 % the unused image stays; a plain file pushes it past 60 %
/// and the next collection removes the unused image (and only it: busybox runs a container,
/// pause is the sandbox image), says so in the agent's log, and the filesystem's use drops.
/// `/stats/summary`'s `imageFs` is the tmpfs as statfs sees it.
#[test]
fn image_gc_frees_a_small_image_filesystem_filled_past_the_high_threshold() {
    require_rig!();
    let rig = match Rig::try_up_with_env("e2e-imagefs", &[("RIG_IMAGEFS_SIZE", "96m")]) {
        Ok(rig) => rig,
        Err(e) if e.contains("cannot mount a tmpfs") => {
            eprintln!("SKIPPED: no tmpfs for the image filesystem here: {e}");
            return;
        }
        Err(e) => panic!("{e}"),
    };
    let root = std::path::PathBuf::from(rig.get("RIG_CONTAINERD_ROOT"));
    let unused = node_tests::import_grpc_health_image(&rig);
    let unused_id = images(&rig)
        .lines()
        .find(|l| l.contains(unused))
        .and_then(|l| l.split('\t').next())
        .map(str::to_string)
        .unwrap_or_else(|| panic!("{unused} imported:\n{}", images(&rig)));
    // Upstream collects every 5 min; the hook makes it every 2 s so the test need not wait.
    let agent = Kubelet::builder(&rig)
        .env(&[("KUBELET_TEST_IMAGE_GC_PERIOD", "2s")])
        .config(
            "imageGCHighThresholdPercent: 60\nimageGCLowThresholdPercent: 40\nimageMinimumGCAge: 1s\n",
        )
        .start();
    agent.write_manifest("sleeper.yaml", SLEEPER);
    wait_for("sleeper running", Duration::from_secs(60), || {
        agent
            .pod("sleeper-")
            .filter(|p| p["status"]["phase"] == "Running")
    });

    let before = Statfs::of(&root);
    assert_eq!(before.capacity, IMAGEFS_SIZE, "the rig's tmpfs: {before:?}");
    assert!(
        before.usage_percent() < 60,
        "images alone stay below the threshold: {before:?}"
    );
    // The summary reports the filesystem under the snapshotter's mountpoint (a refresh every
    // 10 s, and each collection refreshes): capacity exactly, availability as statfs sees it.
    let fs = wait_for("imageFs in the summary", Duration::from_secs(30), || {
        let fs = summary_image_fs(&agent);
        fs["capacityBytes"].as_u64().is_some().then_some(fs)
    });
    assert_eq!(fs["capacityBytes"].as_u64(), Some(IMAGEFS_SIZE), "{fs}");
    let available = fs["availableBytes"].as_u64().unwrap();
    let now = Statfs::of(&root);
    assert!(
        available.abs_diff(now.available) <= 2 << 20,
        "availableBytes {available} vs statfs {now:?}"
    );
    // usedBytes is the runtime's own count of its snapshots (containerd updates it every
    // 10 s), not statfs.
    let used = wait_for("imageFs usedBytes", Duration::from_secs(40), || {
        summary_image_fs(&agent)["usedBytes"]
            .as_u64()
            .filter(|u| *u > 0)
    });
    assert!(
        used <= before.used(),
        "usedBytes {used} vs statfs {before:?}"
    );
    // Collections run every 2 s below the threshold: nothing goes.
    std::thread::sleep(Duration::from_secs(5));
    assert!(images(&rig).contains(unused), "below 60 %: kept");
    assert!(!agent.log_text().contains("removing image to free bytes"));

    // A plain file takes the tmpfs to about 70 %.
    let target = IMAGEFS_SIZE * 70 / 100;
    let fill = target.saturating_sub(Statfs::of(&root).used());
    {
        use std::io::Write;
        let mut f = std::fs::File::create(root.join("filler")).unwrap();
        let chunk = vec![0x5au8; 1 << 20];
        let mut left = fill;
        while left > 0 {
            let n = left.min(chunk.len() as u64) as usize;
            f.write_all(&chunk[..n]).unwrap();
            left -= n as u64;
        }
    }
    let full = Statfs::of(&root);
    assert!(full.usage_percent() >= 60, "filled: {full:?}");

    wait_for("unused image removed", Duration::from_secs(60), || {
        (!images(&rig).contains(unused)).then_some(())
    });
    let left = images(&rig);
    assert!(left.contains("busybox:1.35"), "in use: kept\n{left}");
    assert!(left.contains("pause:3.10"), "sandbox image: kept\n{left}");
    let log = agent.log_text();
    assert!(
        log.lines()
            .any(|l| l.contains("removing image to free bytes") && l.contains(&unused_id)),
        "the agent names the image it removed ({unused_id})"
    );
    // containerd deletes the content and the unpacked snapshot (the snapshot a moment later).
    let after = wait_for(
        "image filesystem use drops",
        Duration::from_secs(30),
        || {
            let now = Statfs::of(&root);
            (now.used() + (1 << 20) <= full.used()).then_some(now)
        },
    );
    eprintln!(
        "imagefs: {} KiB used before the fill, {} KiB filled, {} KiB after image GC",
        before.used() >> 10,
        full.used() >> 10,
        after.used() >> 10
    );
}
