//! Pod start latency of the agent next to the raw CRI cost, measured in one run on the node
//! rig (real containerd in a network namespace), plus the agent's memory.
//!
//! `cargo bench -p kubelet --bench pod_start [-- N[xROUNDS]...]` (root; default `1 30`, e.g.
//! `1x100 30x4 110x2`). Each round starts N pods at once. Prints per N:
//! - raw: RunPodSandbox + CreateContainer + StartContainer per pod, issued directly with the
//!   leanest configs (no seccomp profile, no mounts);
//! - raw, agent's configs: the same three calls with the configs the agent's own builders
//!   (`spec::sandbox_config`, `spec::container_config`) make for the bench's manifest: the
//!   runtime work the agent must ask for as upstream does (the sandbox's `RuntimeDefault`
//!   seccomp profile, the /etc/hosts and termination-log mounts, the CFS period), without
//!   any step of the agent's own;
//! - agent: manifest seen → every container running, as the agent reports it
//!   (`pod_start_ms` in its log; the same value feeds kubelet_pod_start_duration_seconds);
//! - p50 and p99 of each (nearest rank over every pod of every round), the ratios, and the
//!   agent's RSS (and its anonymous part) idle and with N pods.
//!
//! `KUBELET_BIN=PATH` runs that kubelet binary instead of the one built with the bench.
//!
//! Raw and agent rounds alternate, so that both see the same machine; the agent is stopped
//! during raw rounds and restarted on its own state after. Without xROUNDS a size gets enough
//! rounds for at least 100 pod starts per side (and at least 2), so that p99 is a real tail.

use kubelet::runtime::Runtime;
use kubelet::runtime::cri::CriRuntime;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use kubelet::runtime::raw::{self, IMAGE};

fn rig_sh() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/rig/rig.sh")
}

struct Rig {
    name: String,
    env: BTreeMap<String, String>,
}

impl Rig {
    fn up(name: &str) -> Rig {
        let _ = Command::new(rig_sh()).args(["down", name]).output();
        let out = Command::new(rig_sh())
            .args(["up", name])
            .output()
            .expect("rig.sh");
        assert!(
            out.status.success(),
            "rig up: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let env = String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| l.split_once('='))
            .map(|(k, v)| (k.into(), v.into()))
            .collect();
        Rig {
            name: name.into(),
            env,
        }
    }
}

impl Drop for Rig {
    fn drop(&mut self) {
        let _ = Command::new(rig_sh()).args(["down", &self.name]).output();
    }
}

/// The `p`-th percentile (0 < p ≤ 100) by nearest rank.
fn percentile(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    if v.is_empty() {
        return f64::NAN;
    }
    let rank = ((p / 100.0) * v.len() as f64).ceil() as usize;
    v[rank.clamp(1, v.len()) - 1]
}

/// A field of /proc/PID/status in KiB (`VmRSS`, `RssAnon`, ...).
fn status_kib(pid: u32, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.split(':').next() == Some(field))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0)
}

/// `N` or `NxROUNDS`; without rounds, enough for ≥ 100 pod starts (and at least 2 rounds).
fn size_arg(a: &str) -> Option<(usize, usize)> {
    let (n, r) = match a.split_once('x') {
        Some((n, r)) => (n.parse().ok()?, Some(r.parse().ok()?)),
        None => (a.parse().ok()?, None),
    };
    if n == 0 {
        return None;
    }
    Some((n, r.unwrap_or_else(|| 100usize.div_ceil(n).max(2))))
}

/// The 1-minute load average (the machine may be shared: say how busy it was).
fn load() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next().map(str::to_string))
        .unwrap_or_else(|| "?".into())
}

fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

struct Agent {
    child: Child,
    dir: Option<tempfile::TempDir>,
}

impl Agent {
    /// Stops the agent (its pods, if any, keep running) and hands back its directory.
    fn stop(mut self) -> tempfile::TempDir {
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.dir
            .take()
            .expect("an agent has its directory until stopped")
    }

    fn dir(&self) -> &Path {
        self.dir.as_ref().expect("running agent").path()
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts the agent in `dir` (a fresh one when `None`; reusing one keeps its state, as a
/// restarted agent on a node would).
/// The agent under test: `KUBELET_BIN` when set (to compare two builds with one bench
/// binary), else the kubelet built with this bench.
fn kubelet_bin() -> PathBuf {
    std::env::var_os("KUBELET_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_kubelet")))
}

fn start_agent(rig: &Rig, dir: Option<tempfile::TempDir>) -> Agent {
    let dir = dir.unwrap_or_else(|| tempfile::tempdir().unwrap());
    let d = dir.path();
    std::fs::create_dir_all(d.join("manifests")).unwrap();
    std::fs::write(
        d.join("config.yaml"),
        format!(
            "kind: KubeletConfiguration\napiVersion: kubelet.config.k8s.io/v1beta1\nstaticPodPath: {}\npodLogsDir: {}\ncgroupRoot: {}\n\
             authentication:\n  anonymous:\n    enabled: true\n  webhook:\n    enabled: false\nauthorization:\n  mode: AlwaysAllow\n",
            d.join("manifests").display(),
            d.join("logs").display(),
            rig.env["RIG_CGROUP_ROOT"]
        ),
    )
    .unwrap();
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(d.join("kubelet.log"))
        .unwrap();
    let child = Command::new("nsenter")
        .arg(format!("--net={}", rig.env["RIG_NETNS_PATH"]))
        .arg(kubelet_bin())
        .arg(format!("--config={}", d.join("config.yaml").display()))
        .arg(format!(
            "--container-runtime-endpoint={}",
            rig.env["CRI_ENDPOINT"]
        ))
        .arg(format!("--root-dir={}", d.join("root").display()))
        .arg("--hostname-override=bench")
        .env("NO_COLOR", "1")
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("kubelet");
    Agent {
        child,
        dir: Some(dir),
    }
}

fn agent_starts(agent: &Agent) -> Vec<f64> {
    let log = std::fs::read_to_string(agent.dir().join("kubelet.log")).unwrap_or_default();
    log.lines()
        .filter(|l| l.contains("all containers running"))
        .filter_map(|l| {
            l.split("pod_start_ms=")
                .nth(1)?
                .split_whitespace()
                .next()?
                .parse()
                .ok()
        })
        .collect()
}

fn manifest(i: usize, tag: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {tag}-{i}\nspec:\n  terminationGracePeriodSeconds: 1\n  containers:\n  - name: app\n    image: {IMAGE}\n    command: [sleep, \"3600\"]\n"
    )
}

/// The CRI configs the agent's builders make for pod `i` of the bench's manifest (the pod
/// as a static pod of a node with default settings): what "raw, agent's configs" replays.
fn agent_configs(
    i: usize,
    tag: &str,
    logs: &Path,
    cgroup_root: &str,
) -> (
    kubelet::runtime::SandboxConfig,
    kubelet::runtime::ContainerConfig,
) {
    let uid = format!("rawcfg-{tag}-{i}");
    let mut pod: k8s_openapi::api::core::v1::Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": format!("rawcfg-{tag}-{i}"), "namespace": "default", "uid": uid},
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "app", "image": IMAGE, "command": ["sleep", "3600"]}]
        }
    }))
    .unwrap();
    kubelet::podspec::apply_defaults(&mut pod);
    let node = kubelet::node_settings::NodeSettings {
        node_name: "bench".into(),
        pod_logs_dir: logs.to_path_buf(),
        root_dir: logs.to_path_buf(),
        hugepage_sizes: vec![2 << 20, 1 << 30],
        ..Default::default()
    };
    let parent = format!("{cgroup_root}/kubepods/besteffort/pod{uid}");
    let sb = kubelet::spec::sandbox_config(&node, &pod, 0, parent);
    // The two host files the agent mounts: /etc/hosts and the termination log.
    let files = logs.join(format!("{uid}-files"));
    std::fs::create_dir_all(&files).unwrap();
    let hosts = files.join("etc-hosts");
    std::fs::write(&hosts, "127.0.0.1\tlocalhost\n").unwrap();
    let term = files.join("termination-log");
    std::fs::write(&term, "").unwrap();
    let c = pod.spec.as_ref().unwrap().containers[0].clone();
    let paths = kubelet::spec::ContainerHostPaths {
        termination_log: Some(term),
        ..Default::default()
    };
    let cfg = kubelet::spec::container_config(
        &node,
        &pod,
        &c,
        0,
        &Default::default(),
        Some(&hosts),
        &paths,
        &Default::default(),
        "",
        Default::default(),
    )
    .expect("the agent's container config");
    (sb, cfg)
}

fn main() {
    if Command::new("id")
        .arg("-u")
        .output()
        .map(|o| o.stdout != b"0\n")
        .unwrap_or(true)
    {
        println!("pod_start bench skipped: needs root (node rig)");
        return;
    }
    let sizes: Vec<(usize, usize)> = std::env::args()
        .skip(1)
        .filter_map(|a| size_arg(&a))
        .collect();
    let sizes = if sizes.is_empty() {
        vec![size_arg("1").unwrap(), size_arg("30").unwrap()]
    } else {
        sizes
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let rig = Rig::up("bench-podstart");
    let cgroup_root = rig.env["RIG_CGROUP_ROOT"].clone();
    let logs = tempfile::tempdir().unwrap();
    let cri: Arc<dyn Runtime> = rt.block_on(async {
        let ch = cri_proto::connect(&rig.env["CRI_ENDPOINT"], Duration::from_secs(5))
            .await
            .expect("connect");
        Arc::new(CriRuntime::new(ch.clone(), ch, Duration::from_secs(120)))
    });
    // Warm-up: the first sandbox after containerd starts is slower for everyone.
    rt.block_on(raw::pod_starts(
        cri.clone(),
        1,
        "warm",
        logs.path(),
        &cgroup_root,
    ));

    println!(
        "| pods | rounds | starts (raw/agent) | raw p50 (ms) | agent p50 (ms) | p50 agent/raw | raw p99 (ms) | agent p99 (ms) | p99 agent/raw | agent RSS (MiB) | of it anonymous (MiB) | load | raw, agent's configs: p50 (ms) | p50 agent/it | p99 (ms) | p99 agent/it |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    let agent = start_agent(&rig, None);
    std::thread::sleep(Duration::from_secs(3));
    let pid = agent.child.id();
    println!(
        "| 0 | - | - | - | - | - | - | - | - | {:.1} | {:.1} | {} | - | - | - | - |",
        mib(status_kib(pid, "VmRSS")),
        mib(status_kib(pid, "RssAnon")),
        load()
    );
    let mut agent_dir = Some(agent.stop());
    for &(n, rounds) in &sizes {
        // Raw and agent rounds alternate so that both see the same machine. The agent is
        // stopped during raw rounds: it would rightly stop sandboxes it does not own.
        let (mut raw_all, mut agent_all, mut rss, mut anon) = (Vec::new(), Vec::new(), 0, 0);
        let mut same_all = Vec::new();
        for round in 0..rounds {
            let tag = format!("n{n}r{round}");
            raw_all.extend(rt.block_on(raw::pod_starts(
                cri.clone(),
                n,
                &tag,
                logs.path(),
                &cgroup_root,
            )));
            let pods = (0..n)
                .map(|i| agent_configs(i, &tag, logs.path(), &cgroup_root))
                .collect();
            same_all.extend(rt.block_on(raw::pod_starts_of(cri.clone(), pods)));
            let agent = start_agent(&rig, agent_dir.take());
            std::thread::sleep(Duration::from_secs(2));
            let seen = agent_starts(&agent).len();
            let manifests = agent.dir().join("manifests");
            for i in 0..n {
                let tmp = agent.dir().join(format!(".{tag}-{i}"));
                std::fs::write(&tmp, manifest(i, &format!("pod{tag}"))).unwrap();
                std::fs::rename(&tmp, manifests.join(format!("{tag}-{i}.yaml"))).unwrap();
            }
            let deadline = Instant::now() + Duration::from_secs(120 + 4 * n as u64);
            let mut started = agent_starts(&agent);
            while started.len() < seen + n && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(200));
                started = agent_starts(&agent);
            }
            agent_all.extend_from_slice(&started[seen.min(started.len())..]);
            let pid = agent.child.id();
            let r = status_kib(pid, "VmRSS");
            if r > rss {
                (rss, anon) = (r, status_kib(pid, "RssAnon"));
            }
            // Remove this round's pods and wait until the runtime has none left.
            for i in 0..n {
                let _ = std::fs::remove_file(manifests.join(format!("{tag}-{i}.yaml")));
            }
            let t = Instant::now();
            while t.elapsed() < Duration::from_secs(60 + n as u64) {
                let listed = rt
                    .block_on(cri.list_sandboxes())
                    .map(|s| s.len())
                    .unwrap_or(0);
                if listed == 0 {
                    break;
                }
                std::thread::sleep(Duration::from_millis(500));
            }
            agent_dir = Some(agent.stop());
        }
        let (r50, a50) = (
            percentile(&mut raw_all, 50.0),
            percentile(&mut agent_all, 50.0),
        );
        let (r99, a99) = (
            percentile(&mut raw_all, 99.0),
            percentile(&mut agent_all, 99.0),
        );
        let (s50, s99) = (
            percentile(&mut same_all, 50.0),
            percentile(&mut same_all, 99.0),
        );
        println!(
            "| {n} | {rounds} | {}/{} | {r50:.0} | {a50:.0} | {:.2} | {r99:.0} | {a99:.0} | {:.2} | {:.1} | {:.1} | {} | {s50:.0} | {:.2} | {s99:.0} | {:.2} |",
            raw_all.len(),
            agent_all.len(),
            a50 / r50,
            a99 / r99,
            mib(rss),
            mib(anon),
            load(),
            a50 / s50,
            a99 / s99,
        );
    }
    // The agent makes its root directory a mount of its own (as upstream's kubelet does):
    // it is unmounted before the directory goes, so no run leaves a mount behind.
    if let Some(dir) = agent_dir {
        node_tests::util::unmount_below(dir.path());
    }
    drop(rig);
}
