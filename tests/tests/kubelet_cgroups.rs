//! The cgroup tree on real containerd: a Guaranteed pod's cgroup holds its memory limit and
//! CFS quota, a Burstable pod sits under kubepods/burstable with the tier's shares raised by
//! its request, podPidsLimit lands in pids.max, and the pod cgroup goes with the pod; a pod
//! with only pod-level limits (`spec.resources`) gets them on its pod cgroup and containers;
//! a `kubepods` that cannot be created stops the start, as upstream's container manager.

use node_tests::require_rig;
use node_tests::{Kubelet, Rig, wait_for};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const PODS: &str = r#"apiVersion: v1
kind: Pod
metadata:
  name: guaranteed
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: c
    image: docker.io/library/busybox:1.35
    command: ["sleep", "3600"]
    resources:
      limits: {cpu: 250m, memory: 48Mi}
"#;

const BURSTABLE: &str = r#"apiVersion: v1
kind: Pod
metadata:
  name: burstable
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: c
    image: docker.io/library/busybox:1.35
    command: ["sleep", "3600"]
    resources:
      requests: {cpu: 100m, memory: 16Mi}
      limits: {memory: 64Mi}
"#;

/// Where the v1 hierarchy holding `controller` is mounted (cgroup v2: None).
fn v1_mount(controller: &str) -> Option<PathBuf> {
    let text = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    text.lines().find_map(|l| {
        let (left, right) = l.split_once(" - ")?;
        let mut r = right.split(' ');
        let (fstype, _, opts) = (r.next()?, r.next()?, r.next()?);
        let mount = left.split(' ').nth(4)?;
        (fstype == "cgroup" && opts.split(',').any(|o| o == controller))
            .then(|| PathBuf::from(mount))
    })
}

fn read(p: &Path) -> String {
    std::fs::read_to_string(p)
        .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
        .trim()
        .to_string()
}

fn uid(agent: &Kubelet, prefix: &str) -> String {
    let pod = wait_for(
        &format!("{prefix} pod Running"),
        Duration::from_secs(90),
        || {
            agent
                .pod(prefix)
                .filter(|p| p["status"]["phase"] == "Running")
        },
    );
    pod["metadata"]["uid"].as_str().unwrap().to_string()
}

#[test]
fn pod_cgroups_hold_upstreams_limits() {
    require_rig!();
    let Some((memory, cpu, pids)) = v1_mount("memory")
        .zip(v1_mount("cpu"))
        .zip(v1_mount("pids"))
        .map(|((m, c), p)| (m, c, p))
    else {
        if Path::new("/sys/fs/cgroup/cgroup.controllers").exists() {
            eprintln!(
                "SKIPPED: this node has cgroup v2 only; the rig's containerd runs the v1 layout here (memory.max/cpu.max are covered by the unit tables)"
            );
        } else {
            eprintln!("SKIPPED: no cgroup v1 memory, cpu and pids hierarchies here");
        }
        return;
    };
    let rig = Rig::up("e2e-cgroups");
    let agent = Kubelet::builder(&rig).config("podPidsLimit: 321\n").start();
    agent.write_manifest("guaranteed.yaml", PODS);
    agent.write_manifest("burstable.yaml", BURSTABLE);
    let g = uid(&agent, "guaranteed-");
    let b = uid(&agent, "burstable-");
    let root = rig
        .get("RIG_CGROUP_ROOT")
        .trim_start_matches('/')
        .to_string();
    let kubepods = |m: &Path| m.join(&root).join("kubepods");

    // Guaranteed: directly under kubepods; 48Mi, 250m → quota 25000 per 100000, 256 shares.
    let g_mem = kubepods(&memory).join(format!("pod{g}"));
    let g_cpu = kubepods(&cpu).join(format!("pod{g}"));
    assert_eq!(
        read(&g_mem.join("memory.limit_in_bytes")),
        (48u64 << 20).to_string()
    );
    assert_eq!(read(&g_cpu.join("cpu.cfs_quota_us")), "25000");
    assert_eq!(read(&g_cpu.join("cpu.cfs_period_us")), "100000");
    assert_eq!(read(&g_cpu.join("cpu.shares")), "256");
    assert_eq!(
        read(&kubepods(&pids).join(format!("pod{g}")).join("pids.max")),
        "321"
    );
    // The runtime put the container inside the pod cgroup.
    let in_pod = std::fs::read_dir(&g_mem)
        .unwrap()
        .flatten()
        .any(|e| e.path().join("memory.limit_in_bytes").exists());
    assert!(in_pod, "a container cgroup below {}", g_mem.display());

    // Burstable: under kubepods/burstable with its memory limit and request shares; the
    // tier's shares are the Burstable pods' requests (100m → 102).
    let b_mem = kubepods(&memory).join("burstable").join(format!("pod{b}"));
    let b_cpu = kubepods(&cpu).join("burstable").join(format!("pod{b}"));
    assert_eq!(
        read(&b_mem.join("memory.limit_in_bytes")),
        (64u64 << 20).to_string()
    );
    assert_eq!(read(&b_cpu.join("cpu.shares")), "102");
    assert_eq!(
        read(&b_cpu.join("cpu.cfs_quota_us")),
        "-1",
        "no CPU limit, no quota"
    );
    assert_eq!(read(&kubepods(&cpu).join("burstable/cpu.shares")), "102");
    assert_eq!(read(&kubepods(&cpu).join("besteffort/cpu.shares")), "2");

    // The pod goes: its cgroup goes, and the tier's shares fall back to the minimum.
    std::fs::remove_file(agent.manifests().join("burstable.yaml")).unwrap();
    wait_for(
        "burstable pod cgroup removed",
        Duration::from_secs(90),
        || (!b_mem.exists() && !b_cpu.exists()).then_some(()),
    );
    assert_eq!(read(&kubepods(&cpu).join("burstable/cpu.shares")), "2");
}

/// A `cgroupRoot` below a file (every cgroup directory holds `cgroup.procs`, so
/// `/cgroup.procs/kubepods` fails with ENOTDIR in every hierarchy and nothing is created):
/// the agent exits non-zero within seconds of the runtime answering, naming the cgroup and
/// the cause, instead of running pods without their tree.
#[test]
fn uncreatable_kubepods_stops_the_start() {
    require_rig!();
    let rig = Rig::up("e2e-cgfail");
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::create_dir_all(d.join("manifests")).unwrap();
    let config = format!(
        "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nstaticPodPath: {}\n\
         podLogsDir: {}\ncgroupRoot: /cgroup.procs\nauthentication:\n  anonymous:\n    enabled: true\n\
         \x20 webhook:\n    enabled: false\nauthorization:\n  mode: AlwaysAllow\n",
        d.join("manifests").display(),
        d.join("logs").display(),
    );
    std::fs::write(d.join("config.yaml"), config).unwrap();
    let log = d.join("kubelet.log");
    let mut child = Command::new("nsenter")
        .arg(format!("--net={}", rig.netns_path()))
        .arg(node_tests::bin("kubelet"))
        .arg(format!("--config={}", d.join("config.yaml").display()))
        .arg(format!(
            "--container-runtime-endpoint={}",
            rig.get("CRI_ENDPOINT")
        ))
        .arg(format!("--root-dir={}", d.join("root").display()))
        .arg("--hostname-override=rig-node")
        .env("RUST_LOG", "info")
        .env("NO_COLOR", "1")
        .env(node_tests::LOG_LINKS_DIR_ENV, d.join("containers"))
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .expect("start kubelet");
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break Some(s);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    let status = status.unwrap_or_else(|| panic!("the agent still ran after 30 s:\n{text}"));
    assert!(!status.success(), "exit status {status}:\n{text}");
    assert!(
        text.contains(
            "Failed to start ContainerManager: failed to create the node allocatable cgroup /cgroup.procs/kubepods: cgroup "
        ) && text.contains("/cgroup.procs/kubepods: Not a directory (os error 20)"),
        "{text}"
    );
}

const POD_LEVEL: &str = r#"apiVersion: v1
kind: Pod
metadata:
  name: podlevel
spec:
  terminationGracePeriodSeconds: 1
  resources:
    limits: {cpu: 500m, memory: 64Mi}
  containers:
  - name: c
    image: docker.io/library/busybox:1.35
    command: ["sleep", "3600"]
"#;

/// One limit of a cgroup below the hierarchy roots, on whichever layout the host has: the v1
/// file in its controller's hierarchy, else the v2 interface file under /sys/fs/cgroup.
struct Layout {
    v2: bool,
}

impl Layout {
    fn detect() -> Option<Layout> {
        if v1_mount("memory").is_some() && v1_mount("cpu").is_some() {
            return Some(Layout { v2: false });
        }
        Path::new("/sys/fs/cgroup/cgroup.controllers")
            .exists()
            .then_some(Layout { v2: true })
    }

    /// The directory of `rel` holding `controller`'s files.
    fn dir(&self, controller: &str, rel: &Path) -> PathBuf {
        if self.v2 {
            Path::new("/sys/fs/cgroup").join(rel)
        } else {
            v1_mount(controller).unwrap().join(rel)
        }
    }

    /// Memory limit in bytes (`memory.limit_in_bytes` / `memory.max`).
    fn memory(&self, rel: &Path) -> String {
        let f = if self.v2 {
            "memory.max"
        } else {
            "memory.limit_in_bytes"
        };
        read(&self.dir("memory", rel).join(f))
    }

    /// "quota period" (`cpu.cfs_quota_us` + `cpu.cfs_period_us` / `cpu.max`).
    fn cpu_max(&self, rel: &Path) -> String {
        let d = self.dir("cpu", rel);
        if self.v2 {
            read(&d.join("cpu.max"))
        } else {
            format!(
                "{} {}",
                read(&d.join("cpu.cfs_quota_us")),
                read(&d.join("cpu.cfs_period_us"))
            )
        }
    }

    /// `cpu.shares` (v1) or `cpu.weight` (v2).
    fn cpu_weight(&self, rel: &Path) -> String {
        let f = if self.v2 { "cpu.weight" } else { "cpu.shares" };
        read(&self.dir("cpu", rel).join(f))
    }
}

/// Upstream's PodLevelResources (on by default): limits set only on the pod make it
/// Guaranteed (its requests default to them), its cgroup directly under kubepods gets 64Mi
/// and 50ms of CPU per 100ms with the shares of 500m, and the container, which has no limits
/// of its own, is limited by the pod's.
#[test]
fn pod_level_limits_land_on_the_pod_cgroup() {
    require_rig!();
    let Some(layout) = Layout::detect() else {
        eprintln!("SKIPPED: neither cgroup v1 memory+cpu hierarchies nor cgroup v2 here");
        return;
    };
    let rig = Rig::up("e2e-podres");
    let agent = Kubelet::builder(&rig).start();
    agent.write_manifest("podlevel.yaml", POD_LEVEL);
    let uid = uid(&agent, "podlevel-");
    assert_eq!(
        agent.pod("podlevel-").unwrap()["status"]["qosClass"],
        "Guaranteed"
    );
    let root = rig
        .get("RIG_CGROUP_ROOT")
        .trim_start_matches('/')
        .to_string();
    let pod = Path::new(&root).join("kubepods").join(format!("pod{uid}"));
    assert_eq!(layout.memory(&pod), (64u64 << 20).to_string());
    assert_eq!(layout.cpu_max(&pod), "50000 100000");
    let weight = if layout.v2 { "20" } else { "512" };
    assert_eq!(layout.cpu_weight(&pod), weight);
    // The container's own cgroup (the sandbox's pause has none of these limits).
    let children: Vec<PathBuf> = std::fs::read_dir(layout.dir("memory", &pod))
        .unwrap()
        .flatten()
        .filter(|e| e.path().is_dir())
        .map(|e| pod.join(e.file_name()))
        .collect();
    let limited = children
        .iter()
        .find(|c| layout.memory(c) == (64u64 << 20).to_string())
        .unwrap_or_else(|| panic!("no container cgroup with the pod's 64Mi in {children:?}"));
    assert_eq!(layout.cpu_max(limited), "50000 100000");
}
