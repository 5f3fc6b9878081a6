//! Cluster-mode figures on real containerd (ignored by default; run with
//! `cargo test -p node-tests --test kubelet_cluster_bench -- --ignored --nocapture`):
//! pod created on the apiserver → `Running` status written back, for 100 pods created at once,
//! next to 100 raw CRI pod starts (RunPodSandbox + CreateContainer + StartContainer, issued
//! at once) on the same containerd in the same run, and the agent's RSS with 110 pods
//! (maxPods). `kube_api_access_cost` compares 110 pods with ServiceAccount admission's
//! `kube-api-access-*` volume against 110 without (`automountServiceAccountToken: false`).
//! `steady_state_at_110_pods` samples an idle agent for 60 s, then the same agent with 110
//! running pods for 60 s: its CPU (cores) and RSS, the stats refresh's cost per pod (from its
//! debug log), CRI calls per second (`kubelet_runtime_operations_total`) and containerd's CPU
//! (daemon and shims) next to them, printed as busy / idle ratios.

use kubelet::runtime::raw;
use node_tests::controlplane::Options;
use node_tests::require_rig;
use node_tests::{Kubelet, NetnsControlPlane, Rig, wait_for};
use serde_json::json;
use std::time::{Duration, Instant};

const NODE: &str = "bench-node";

fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1).and_then(|v| v.parse().ok()))
        })
        .unwrap_or(0)
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

#[test]
#[ignore = "benchmark: run explicitly"]
fn pod_start_latency_and_rss() {
    require_rig!();
    let rig = Rig::up("e2e-cbench");
    let out = rig.sh("ip addr add 10.250.0.7/32 dev lo");
    assert!(out.status.success());
    let cp = NetnsControlPlane::start(&rig, Options::default());
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubelet.conf");
    cp.node_kubeconfig(&kubeconfig, NODE, Duration::from_secs(3600))
        .unwrap();
    std::fs::write(
        dir.path().join("config.yaml"),
        format!(
            "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\npodLogsDir: {}\ncgroupRoot: {}\n{}",
            dir.path().join("logs").display(),
            rig.get("RIG_CGROUP_ROOT"),
            node_tests::TEST_EVICTION_HARD
        ),
    )
    .unwrap();
    let args = vec![
        format!("--kubeconfig={}", kubeconfig.display()),
        format!("--config={}", dir.path().join("config.yaml").display()),
        format!("--root-dir={}", dir.path().join("root").display()),
        format!("--container-runtime-endpoint={}", rig.get("CRI_ENDPOINT")),
        format!("--hostname-override={NODE}"),
        "--node-ip=10.250.0.7".to_string(),
    ];
    // The raw baseline first, while no agent runs (it would stop these sandboxes as orphans).
    let n = 100;
    let raw_p50 = {
        let rt = tokio::runtime::Runtime::new().unwrap();
        let cgroup_root = rig.get("RIG_CGROUP_ROOT").to_string();
        let logs = dir.path().join("raw-logs");
        rt.block_on(async {
            let ch = cri_proto::connect(rig.get("CRI_ENDPOINT"), Duration::from_secs(5))
                .await
                .expect("connect to containerd");
            let cri: std::sync::Arc<dyn kubelet::runtime::Runtime> = std::sync::Arc::new(
                kubelet::runtime::cri::CriRuntime::new(ch.clone(), ch, Duration::from_secs(120)),
            );
            // Warm-up, as for the agent below.
            raw::pod_starts(cri.clone(), 1, "warm", &logs, &cgroup_root).await;
            let mut ms = raw::pod_starts(cri, n, "raw", &logs, &cgroup_root).await;
            ms.sort_by(f64::total_cmp);
            Duration::from_secs_f64(ms[ms.len() / 2] / 1000.0)
        })
    };
    let kubelet = Kubelet::builder(&rig)
        .args(args)
        .log(dir.path().join("kubelet.log"))
        .start();
    wait_for("node registered", Duration::from_secs(30), || {
        cp.get("nodes", "", NODE)
    });
    let pid = kubelet.pid().unwrap();
    let idle_rss = rss_kib(pid);

    let pod = |name: &str| {
        json!({
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"nodeName": NODE, "terminationGracePeriodSeconds": 1,
                     "containers": [{"name": "main", "image": "docker.io/library/busybox:1.35",
                                     "command": ["sleep", "3600"]}]}
        })
    };
    // Warm-up: one pod, so image and CNI first-use costs are not counted.
    cp.create("pods", pod("warm")).unwrap();
    wait_for("warm-up pod Running", Duration::from_secs(60), || {
        let p = cp.get("pods", "default", "warm")?;
        (p["status"]["phase"] == "Running").then_some(())
    });

    let mut created = Vec::new();
    let start = Instant::now();
    for i in 0..n {
        let name = format!("p{i:03}");
        cp.create("pods", pod(&name)).unwrap();
        created.push((name, Instant::now()));
    }
    let mut latencies: Vec<Option<Duration>> = vec![None; n];
    let deadline = Instant::now() + Duration::from_secs(300);
    while latencies.iter().any(Option::is_none) && Instant::now() < deadline {
        for (i, (name, at)) in created.iter().enumerate() {
            if latencies[i].is_none()
                && cp
                    .get("pods", "default", name)
                    .is_some_and(|p| p["status"]["phase"] == "Running")
            {
                latencies[i] = Some(at.elapsed());
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let total = start.elapsed();
    let mut lat: Vec<Duration> = latencies.into_iter().flatten().collect();
    assert_eq!(lat.len(), n, "not every pod reached Running within 300 s");
    lat.sort();
    // Up to maxPods (110) for the RSS figure.
    for i in n..109 {
        cp.create("pods", pod(&format!("q{i:03}"))).unwrap();
    }
    wait_for("110 pods Running", Duration::from_secs(120), || {
        let running = cp
            .list("pods", Some("default"))
            .iter()
            .filter(|p| p["status"]["phase"] == "Running")
            .count();
        (running >= 110).then_some(())
    });
    std::thread::sleep(Duration::from_secs(5));
    let rss = rss_kib(pid);
    eprintln!(
        "cluster bench: {n} pods created at once → Running on the apiserver: p50 {:?}, p90 {:?}, max {:?}, all in {total:?}",
        percentile(&lat, 0.5),
        percentile(&lat, 0.9),
        lat[n - 1]
    );
    eprintln!(
        "cluster bench: {n} raw CRI pod starts at once: p50 {raw_p50:?}; agent p50 / raw p50 = {:.2}",
        percentile(&lat, 0.5).as_secs_f64() / raw_p50.as_secs_f64()
    );
    eprintln!("cluster bench: agent RSS idle {idle_rss} KiB, with 110 pods {rss} KiB");
}

/// Starts the agent on its own node against `cp`; returns it with its temp dir.
fn start_agent(
    rig: &Rig,
    cp: &NetnsControlPlane,
    node: &str,
    ip: &str,
) -> (Kubelet, tempfile::TempDir) {
    start_agent_logging(rig, cp, node, ip, None)
}

/// [`start_agent`] with the agent's `RUST_LOG`.
fn start_agent_logging(
    rig: &Rig,
    cp: &NetnsControlPlane,
    node: &str,
    ip: &str,
    rust_log: Option<&str>,
) -> (Kubelet, tempfile::TempDir) {
    let out = rig.sh(&format!("ip addr add {ip}/32 dev lo"));
    assert!(out.status.success());
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubelet.conf");
    cp.node_kubeconfig(&kubeconfig, node, Duration::from_secs(3600))
        .unwrap();
    std::fs::write(
        dir.path().join("config.yaml"),
        format!(
            "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\npodLogsDir: {}\ncgroupRoot: {}\n\
             authentication:\n  anonymous:\n    enabled: true\n  webhook:\n    enabled: false\n\
             authorization:\n  mode: AlwaysAllow\n{}",
            dir.path().join("logs").display(),
            rig.get("RIG_CGROUP_ROOT"),
            node_tests::TEST_EVICTION_HARD
        ),
    )
    .unwrap();
    let args = vec![
        format!("--kubeconfig={}", kubeconfig.display()),
        format!("--config={}", dir.path().join("config.yaml").display()),
        format!("--root-dir={}", dir.path().join("root").display()),
        format!("--container-runtime-endpoint={}", rig.get("CRI_ENDPOINT")),
        format!("--hostname-override={node}"),
        format!("--node-ip={ip}"),
    ];
    let mut kubelet = Kubelet::builder(rig)
        .args(args)
        .log(dir.path().join("kubelet.log"));
    if let Some(filter) = rust_log {
        kubelet = kubelet.rust_log(filter);
    }
    let kubelet = kubelet.start();
    wait_for("node registered", Duration::from_secs(30), || {
        cp.get("nodes", "", node)
    });
    (kubelet, dir)
}

/// Creates `n` pods at once in `ns` and returns (p50, all Running) from creation.
fn start_round(
    cp: &NetnsControlPlane,
    node: &str,
    ns: &str,
    n: usize,
    automount: bool,
) -> (Duration, Duration) {
    let start = Instant::now();
    let mut created = Vec::new();
    for i in 0..n {
        let name = format!("p{i:03}");
        cp.create(
            "pods",
            json!({"metadata": {"name": name, "namespace": ns},
                "spec": {"nodeName": node, "terminationGracePeriodSeconds": 1,
                         "automountServiceAccountToken": automount,
                         "containers": [{"name": "main", "image": "docker.io/library/busybox:1.35",
                                         "command": ["sleep", "3600"]}]}}),
        )
        .unwrap();
        created.push((name, Instant::now()));
    }
    let mut latencies: Vec<Option<Duration>> = vec![None; n];
    let deadline = Instant::now() + Duration::from_secs(300);
    while latencies.iter().any(Option::is_none) && Instant::now() < deadline {
        for (i, (name, at)) in created.iter().enumerate() {
            if latencies[i].is_none()
                && cp
                    .get("pods", ns, name)
                    .is_some_and(|p| p["status"]["phase"] == "Running")
            {
                latencies[i] = Some(at.elapsed());
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let total = start.elapsed();
    let mut lat: Vec<Duration> = latencies.into_iter().flatten().collect();
    assert_eq!(lat.len(), n, "not every pod reached Running within 300 s");
    lat.sort();
    (percentile(&lat, 0.5), total)
}

/// Deletes the round's pods and waits until the agent has removed them.
fn clear_round(cp: &NetnsControlPlane, ns: &str, n: usize) {
    for i in 0..n {
        let _ = cp.delete("pods", ns, &format!("p{i:03}"), None);
    }
    wait_for("round's pods gone", Duration::from_secs(300), || {
        cp.list("pods", Some(ns)).is_empty().then_some(())
    });
}

#[test]
#[ignore = "benchmark: run explicitly"]
fn kube_api_access_cost() {
    require_rig!();
    let rig = Rig::up("e2e-sabench");
    let cp = NetnsControlPlane::start(&rig, Options::default());
    let node = "sa-bench-node";
    let (kubelet, _dir) = start_agent(&rig, &cp, node, "10.250.0.8");
    for ns in ["plain", "sa"] {
        cp.create("namespaces", json!({"metadata": {"name": ns}}))
            .unwrap();
    }
    // Warm-up: image, CNI and a first token.
    let (_, _) = start_round(&cp, node, "sa", 1, true);
    clear_round(&cp, "sa", 1);
    let before = cp.token_requests().len();
    let n: usize = std::env::var("BENCH_PODS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(110);
    let mut rounds = Vec::new();
    // plain, volumes, plain, volumes: drift on the machine shows up in both.
    for (ns, automount) in [
        ("plain", false),
        ("sa", true),
        ("plain", false),
        ("sa", true),
    ] {
        let r = start_round(&cp, node, ns, n, automount);
        eprintln!(
            "kube-api-access bench: {n} pods in {ns:5}: p50 {:?}, all Running after {:?}",
            r.0, r.1
        );
        rounds.push(r);
        if automount {
            scrape_figures(&rig, n);
        }
        clear_round(&cp, ns, n);
    }
    let requests = cp.token_requests().len() - before;
    let mean = |a: (Duration, Duration), b: (Duration, Duration)| {
        (
            (a.0 + b.0).as_secs_f64() / 2.0,
            (a.1 + b.1).as_secs_f64() / 2.0,
        )
    };
    let plain = mean(rounds[0], rounds[2]);
    let sa = mean(rounds[1], rounds[3]);
    eprintln!(
        "kube-api-access bench: with the volume / without: p50 {:.2}, all Running {:.2}; TokenRequests {requests} for {} pods",
        sa.0 / plain.0,
        sa.1 / plain.1,
        2 * n
    );
    // One per pod unless a request failed (its retry is another); the unit tests and the
    // cluster-pods e2e assert the exact count. With AGENT_RUST_LOG=info,kubelet::objects=debug
    // the agent logs each request: pods asked for more than once are listed.
    let log = kubelet.log_text();
    let mut per_pod: std::collections::BTreeMap<&str, usize> = Default::default();
    for l in log
        .lines()
        .filter(|l| l.contains("requesting a ServiceAccount token"))
    {
        if let Some(uid) = l
            .split("pod_uid=")
            .nth(1)
            .and_then(|r| r.split_whitespace().next())
        {
            *per_pod.entry(uid).or_default() += 1;
        }
    }
    for (uid, count) in per_pod.iter().filter(|(_, c)| **c > 1) {
        eprintln!("kube-api-access bench: pod {uid}: {count} TokenRequests");
        for l in log.lines().filter(|l| l.contains(uid)).take(12) {
            eprintln!("  {l}");
        }
    }
    drop(kubelet);
}

/// `/metrics` on :10250 with `pods` running: median of 5 scrapes (curl's time, bytes).
fn scrape_figures(rig: &Rig, pods: usize) {
    let mut runs: Vec<(f64, u64)> = (0..5)
        .filter_map(|_| {
            let out = rig.sh(
                "curl -sk -o /dev/null -w '%{http_code} %{time_total} %{size_download}' https://127.0.0.1:10250/metrics",
            );
            let text = String::from_utf8_lossy(&out.stdout).to_string();
            let mut f = text.split_whitespace();
            (f.next() == Some("200")).then_some(())?;
            Some((f.next()?.parse().ok()?, f.next()?.parse().ok()?))
        })
        .collect();
    assert_eq!(runs.len(), 5, "every scrape answered 200");
    runs.sort_by(|a, b| a.0.total_cmp(&b.0));
    let (secs, bytes) = runs[2];
    eprintln!(
        "kube-api-access bench: /metrics with {pods} pods: {:.1} ms (HTTPS, handshake included), {bytes} bytes",
        secs * 1000.0
    );
}

/// utime + stime of a process, in clock ticks (USER_HZ, 100 a second); 0 when gone.
fn cpu_ticks(pid: u32) -> u64 {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return 0;
    };
    let Some(i) = stat.rfind(')') else { return 0 };
    let f: Vec<&str> = stat[i + 2..].split(' ').collect();
    f.get(11).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0)
        + f.get(12).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0)
}

/// The shims of this rig's containerd (their argv holds `-address <socket>`).
fn shim_pids(socket: &str) -> Vec<u32> {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| {
                let args: Vec<&[u8]> = c.split(|b| *b == 0).collect();
                args.iter().any(|a| a.ends_with(b"containerd-shim-runc-v2"))
                    && args.contains(&socket.as_bytes())
            })
        })
        .collect()
}

/// `kubelet_runtime_operations_total` per operation, from :10250/metrics.
fn cri_operations(rig: &Rig) -> std::collections::BTreeMap<String, f64> {
    let out = rig.sh("curl -sk --max-time 10 https://127.0.0.1:10250/metrics");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let rest = l.strip_prefix("kubelet_runtime_operations_total{")?;
            let op = rest.split("operation_type=\"").nth(1)?.split('"').next()?;
            let v = l.rsplit(' ').next()?.parse().ok()?;
            Some((op.to_string(), v))
        })
        .collect()
}

/// One sampling window's figures.
#[derive(Debug)]
struct Window {
    agent_cores: f64,
    agent_rss_mib: f64,
    containerd_cores: f64,
    shim_cores: f64,
    cri_per_s: f64,
    per_op: Vec<(String, f64)>,
    /// The agent's threads at the end (async workers + the blocking pool).
    threads: u64,
    /// Mean stats refresh time (ms) and the pods it covered.
    refresh_ms: Option<(f64, f64)>,
    /// Mean refresh phases (ms): CRI calls, blocking file reads, building the summary.
    refresh_phases: Option<(f64, f64, f64)>,
}

fn sample(rig: &Rig, agent: &Kubelet, window: Duration) -> Window {
    let pid = agent.pid().unwrap();
    let containerd: u32 = rig.get("CONTAINERD_PID").parse().unwrap();
    let socket = rig
        .get("CRI_ENDPOINT")
        .trim_start_matches("unix://")
        .to_string();
    let shims = shim_pids(&socket);
    let shim_ticks = |pids: &[u32]| pids.iter().map(|p| cpu_ticks(*p)).sum::<u64>();
    let log_before = agent.log_text().len();
    let ops0 = cri_operations(rig);
    let (a0, c0, s0) = (cpu_ticks(pid), cpu_ticks(containerd), shim_ticks(&shims));
    let started = Instant::now();
    let mut rss = Vec::new();
    while started.elapsed() < window {
        std::thread::sleep(Duration::from_secs(5));
        rss.push(rss_kib(pid));
    }
    let secs = started.elapsed().as_secs_f64();
    let (a1, c1, s1) = (cpu_ticks(pid), cpu_ticks(containerd), shim_ticks(&shims));
    let ops1 = cri_operations(rig);
    let mut per_op: Vec<(String, f64)> = ops1
        .iter()
        .map(|(op, v)| {
            (
                op.clone(),
                (v - ops0.get(op).copied().unwrap_or(0.0)) / secs,
            )
        })
        .filter(|(_, r)| *r > 0.0)
        .collect();
    per_op.sort_by(|a, b| b.1.total_cmp(&a.1));
    // The metrics scrapes themselves are not CRI calls; the two above are the only scrapes.
    let log = agent.log_text();
    let lines: Vec<&str> = log[log_before.min(log.len())..]
        .lines()
        .filter(|l| l.contains("stats refreshed"))
        .collect();
    let field = |l: &str, k: &str| -> Option<f64> {
        l.split(&format!(" {k}="))
            .nth(1)?
            .split([' ', ','])
            .next()?
            .parse()
            .ok()
    };
    let refreshes: Vec<(f64, f64)> = lines
        .iter()
        .filter_map(|l| Some((field(l, "total_ms")?, field(l, "pods")?)))
        .collect();
    let phases: Vec<(f64, f64, f64)> = lines
        .iter()
        .filter_map(|l| {
            Some((
                field(l, "cri_ms")?,
                field(l, "blocking_ms")?,
                field(l, "build_ms")?,
            ))
        })
        .collect();
    let n = refreshes.len() as f64;
    let m = phases.len().max(1) as f64;
    Window {
        agent_cores: (a1 - a0) as f64 / 100.0 / secs,
        agent_rss_mib: rss.iter().sum::<u64>() as f64 / rss.len().max(1) as f64 / 1024.0,
        containerd_cores: (c1 - c0) as f64 / 100.0 / secs,
        shim_cores: (s1.saturating_sub(s0)) as f64 / 100.0 / secs,
        cri_per_s: per_op.iter().map(|(_, r)| r).sum(),
        threads: std::fs::read_to_string(format!("/proc/{pid}/status"))
            .ok()
            .and_then(|t| {
                t.lines()
                    .find_map(|l| l.strip_prefix("Threads:"))?
                    .trim()
                    .parse()
                    .ok()
            })
            .unwrap_or(0),
        per_op,
        refresh_phases: (!phases.is_empty()).then(|| {
            (
                phases.iter().map(|p| p.0).sum::<f64>() / m,
                phases.iter().map(|p| p.1).sum::<f64>() / m,
                phases.iter().map(|p| p.2).sum::<f64>() / m,
            )
        }),
        refresh_ms: (n > 0.0).then(|| {
            (
                refreshes.iter().map(|r| r.0).sum::<f64>() / n,
                refreshes.iter().map(|r| r.1).sum::<f64>() / n,
            )
        }),
    }
}

#[test]
#[ignore = "benchmark: run explicitly"]
fn steady_state_at_110_pods() {
    require_rig!();
    let rig = Rig::up("e2e-steady");
    let cp = NetnsControlPlane::start(&rig, Options::default());
    let node = "steady-node";
    let (kubelet, _dir) = start_agent_logging(
        &rig,
        &cp,
        node,
        "10.250.0.9",
        Some("info,kube=warn,kubelet::stats=debug"),
    );
    let window = Duration::from_secs(
        std::env::var("BENCH_WINDOW_S")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(60),
    );
    let n: usize = std::env::var("BENCH_PODS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(110);
    // Registered, first status written, first refreshes done.
    std::thread::sleep(Duration::from_secs(15));
    let idle = sample(&rig, &kubelet, window);
    let (p50, all) = start_round(&cp, node, "default", n, true);
    eprintln!(
        "steady-state bench: {n} pods Running (p50 {p50:?}, all after {all:?}); settling 30 s"
    );
    std::thread::sleep(Duration::from_secs(30));
    let busy = sample(&rig, &kubelet, window);
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let ratio = |b: f64, i: f64| {
        if i > 0.0 {
            format!("x{:.1}", b / i)
        } else {
            "-".into()
        }
    };
    eprintln!(
        "steady-state bench ({window:?} windows, load average {}):",
        load.trim()
    );
    eprintln!(
        "  agent CPU      idle {:.4} cores | {n} pods {:.4} cores ({})",
        idle.agent_cores,
        busy.agent_cores,
        ratio(busy.agent_cores, idle.agent_cores)
    );
    eprintln!(
        "  agent RSS      idle {:.1} MiB | {n} pods {:.1} MiB ({})",
        idle.agent_rss_mib,
        busy.agent_rss_mib,
        ratio(busy.agent_rss_mib, idle.agent_rss_mib)
    );
    eprintln!(
        "  agent threads  idle {} | {n} pods {}",
        idle.threads, busy.threads
    );
    eprintln!(
        "  CRI calls/s    idle {:.2} | {n} pods {:.2} ({})",
        idle.cri_per_s,
        busy.cri_per_s,
        ratio(busy.cri_per_s, idle.cri_per_s)
    );
    eprintln!(
        "  containerd CPU idle {:.4} cores (shims {:.4}) | {n} pods {:.4} cores (shims {:.4}); agent / containerd with pods {:.2}",
        idle.containerd_cores,
        idle.shim_cores,
        busy.containerd_cores,
        busy.shim_cores,
        busy.agent_cores / busy.containerd_cores.max(1e-9)
    );
    if let (Some((im, ip)), Some((bm, bp))) = (idle.refresh_ms, busy.refresh_ms) {
        eprintln!(
            "  stats refresh  idle {im:.1} ms ({ip:.0} pods) | {bp:.0} pods {bm:.1} ms = {:.2} ms per pod ({})",
            bm / bp.max(1.0),
            ratio(bm, im)
        );
    } else {
        eprintln!(
            "  stats refresh  no 'stats refreshed' lines (idle {:?}, busy {:?})",
            idle.refresh_ms, busy.refresh_ms
        );
    }
    eprintln!(
        "  stats refresh phases (cri, blocking, build ms): idle {:?} | {n} pods {:?}",
        idle.refresh_phases, busy.refresh_phases
    );
    eprintln!(
        "  CRI calls/s by operation with {n} pods: {:?}",
        busy.per_op
    );
    eprintln!("  CRI calls/s by operation idle: {:?}", idle.per_op);
    // The rig's teardown stops the pods with containerd.
    drop(kubelet);
}
