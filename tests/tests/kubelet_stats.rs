//! `/stats/summary` and `/metrics/resource` on real containerd: a busy pod's CPU and memory
//! match its cgroup files; the ignored bench prints the summary's latency at 110 pods and the
//! CRI calls one request costs.

use node_tests::require_rig;
use node_tests::{Kubelet, Rig, wait_for};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

const BUSY: &str = r#"apiVersion: v1
kind: Pod
metadata:
  name: busy
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: spin
    image: docker.io/library/busybox:1.35
    command: ["sh", "-c", "while :; do :; done"]
    resources:
      limits: {cpu: 300m, memory: 64Mi}
"#;

/// The directory named `name` below `dir` (the container's cgroup), searched breadth-first.
fn find_dir(dir: &Path, name: &str) -> Option<PathBuf> {
    let mut queue = vec![dir.to_path_buf()];
    while let Some(d) = queue.pop() {
        for e in std::fs::read_dir(&d).ok()?.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                if e.file_name() == name {
                    return Some(e.path());
                }
                queue.push(e.path());
            }
        }
    }
    None
}

fn read_u64(p: &Path) -> u64 {
    std::fs::read_to_string(p)
        .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
        .trim()
        .parse()
        .unwrap()
}

fn stat(p: &Path, key: &str) -> u64 {
    std::fs::read_to_string(p)
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or(0)
}

fn summary(agent: &Kubelet) -> Value {
    serde_json::from_str(&agent.curl("https://127.0.0.1:10250/stats/summary"))
        .expect("summary is JSON")
}

fn pod_of<'a>(s: &'a Value, name: &str) -> Option<&'a Value> {
    s["pods"]
        .as_array()?
        .iter()
        .find(|p| p["podRef"]["name"] == name)
}

#[test]
fn busy_pod_cpu_and_memory_match_its_cgroup() {
    require_rig!();
    if !Path::new("/sys/fs/cgroup/cpuacct/cpuacct.usage").exists() {
        eprintln!("SKIPPED: this test reads cgroup v1 cpuacct/memory files; none here");
        return;
    }
    let rig = Rig::up("e2e-stats");
    let agent = Kubelet::builder(&rig).start();
    agent.write_manifest("busy.yaml", BUSY);
    let pod = wait_for("busy pod Running", Duration::from_secs(60), || {
        agent
            .pod("busy-")
            .filter(|p| p["status"]["phase"] == "Running")
    });
    let cid = node_tests::container(&pod, "spin")["containerID"]
        .as_str()
        .unwrap()
        .trim_start_matches("containerd://")
        .to_string();
    let root = rig
        .get("RIG_CGROUP_ROOT")
        .trim_start_matches('/')
        .to_string();
    let cpu_dir = find_dir(&Path::new("/sys/fs/cgroup/cpuacct").join(&root), &cid)
        .expect("the container's cpuacct cgroup");
    let mem_dir = find_dir(&Path::new("/sys/fs/cgroup/memory").join(&root), &cid)
        .expect("the container's memory cgroup");
    // Let it spin a while, so the figures are well above zero.
    std::thread::sleep(Duration::from_secs(2));

    // The agent refreshes in the background (every 10 s): wait for a snapshot whose readings
    // were taken after `before`; any such snapshot, read before `after`, lies between both.
    let before = read_u64(&cpu_dir.join("cpuacct.usage"));
    let since_ms = now_ms();
    wait_for(
        "a stats refresh after the first cgroup reading",
        Duration::from_secs(30),
        || (node_cpu_ms(&agent.curl(RESOURCE)) > since_ms).then_some(()),
    );
    // The three endpoints from one snapshot (no refresh between the first and last request).
    let (s, text, cad) = wait_for("one snapshot", Duration::from_secs(30), || {
        let s = summary(&agent);
        let text = agent.curl(RESOURCE);
        let cad = agent.curl(CADVISOR);
        (summary(&agent)["pods"] == s["pods"]).then_some((s, text, cad))
    });
    let after = read_u64(&cpu_dir.join("cpuacct.usage"));
    let usage = read_u64(&mem_dir.join("memory.usage_in_bytes"));
    let inactive = stat(&mem_dir.join("memory.stat"), "total_inactive_file");
    let rss = stat(&mem_dir.join("memory.stat"), "total_rss");
    let working_set = usage.saturating_sub(inactive);

    let p = pod_of(&s, "busy-rig-node").unwrap_or_else(|| panic!("busy pod in summary: {s}"));
    let c = p["containers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "spin")
        .expect("spin container");
    let cpu_ns = c["cpu"]["usageCoreNanoSeconds"]
        .as_u64()
        .expect("cpu figure");
    assert!(
        cpu_ns > 100_000_000,
        "a spinning container used CPU: {cpu_ns}"
    );
    assert!(
        before <= cpu_ns && cpu_ns <= after,
        "container CPU {cpu_ns} ns lies between the cgroup's {before} and {after}"
    );
    let ws = c["memory"]["workingSetBytes"]
        .as_u64()
        .expect("memory figure");
    assert!(ws > 0);
    assert!(
        ws.abs_diff(working_set) <= 1 << 20,
        "container working set {ws} ≈ cgroup usage - inactive_file {working_set}"
    );
    // The pod's own figures cover its container.
    let pod_cpu = p["cpu"]["usageCoreNanoSeconds"].as_u64().expect("pod cpu");
    assert!(
        pod_cpu >= cpu_ns / 2 && pod_cpu > 0,
        "pod {pod_cpu} vs container {cpu_ns}"
    );
    assert!(p["memory"]["workingSetBytes"].as_u64().unwrap() > 0);
    // Node figures.
    assert!(s["node"]["cpu"]["usageCoreNanoSeconds"].as_u64().unwrap() > cpu_ns);
    assert!(s["node"]["memory"]["workingSetBytes"].as_u64().unwrap() > ws);
    assert!(s["node"]["fs"]["capacityBytes"].as_u64().unwrap() > 0);
    assert_eq!(s["node"]["nodeName"], "rig-node");
    // The system containers: the agent's own cgroup and the pod cgroup root, with CPU and
    // memory (the pods' root holds the busy pod, so at least its CPU); no filesystem figures.
    let sys = s["node"]["systemContainers"]
        .as_array()
        .unwrap_or_else(|| panic!("node.systemContainers: {}", s["node"]));
    let named = |n: &str| {
        sys.iter()
            .find(|c| c["name"] == n)
            .unwrap_or_else(|| panic!("no system container {n}: {sys:?}"))
    };
    for n in ["kubelet", "pods"] {
        let c = named(n);
        assert!(
            c["cpu"]["usageCoreNanoSeconds"].as_u64().unwrap_or(0) > 0,
            "{c}"
        );
        assert!(
            c["memory"]["workingSetBytes"].as_u64().unwrap_or(0) > 0,
            "{c}"
        );
        assert!(
            c["startTime"].is_string() && c.get("rootfs").is_none(),
            "{c}"
        );
    }
    assert!(
        named("pods")["cpu"]["usageCoreNanoSeconds"]
            .as_u64()
            .unwrap()
            >= pod_cpu,
        "the pods' root covers the busy pod"
    );

    // /metrics/resource carries the same figures in seconds with a millisecond timestamp.
    let line = text
        .lines()
        .find(|l| {
            l.starts_with("container_cpu_usage_seconds_total{container=\"spin\",namespace=\"default\",pod=\"busy-rig-node\"}")
        })
        .unwrap_or_else(|| panic!("container cpu sample in:\n{text}"));
    let fields: Vec<&str> = line.rsplitn(3, ' ').collect();
    let secs: f64 = fields[1].parse().unwrap();
    let ts: i64 = fields[0].parse().unwrap();
    assert!((secs - cpu_ns as f64 / 1e9).abs() < 1e-6, "{line}");
    assert!(ts > 1_600_000_000_000, "millisecond timestamp: {line}");
    assert!(text.contains("\nscrape_error 0\n"), "{text}");

    // /metrics/cadvisor: cAdvisor's series for the container, labelled as the kubelet labels
    // them, with the cgroup's figures.
    let sample = |name: &str| -> (String, f64) {
        let line = cad
            .lines()
            .find(|l| {
                l.starts_with(&format!("{name}{{container=\"spin\","))
                    && l.contains("pod=\"busy-rig-node\"")
            })
            .unwrap_or_else(|| panic!("{name} for spin in:\n{cad}"));
        // `name{labels} value [timestamp]` (spec samples carry no timestamp).
        let value = line.rsplit_once('}').unwrap().1.split_whitespace().next();
        (line.to_string(), value.unwrap().parse().unwrap())
    };
    let (line, secs) = sample("container_cpu_usage_seconds_total");
    assert!(line.contains("cpu=\"total\""), "{line}");
    assert!(line.contains(&format!("name=\"{cid}\"")), "{line}");
    assert!(
        line.contains("image=\"docker.io/library/busybox:1.35\""),
        "{line}"
    );
    assert!(line.contains("namespace=\"default\""), "{line}");
    let id = line
        .split("id=\"")
        .nth(1)
        .and_then(|r| r.split('"').next())
        .unwrap()
        .to_string();
    assert!(id.ends_with(&cid), "id is the container's cgroup: {line}");
    assert!(
        Path::new("/sys/fs/cgroup/cpuacct")
            .join(id.trim_start_matches('/'))
            .join("cpuacct.usage")
            .exists(),
        "{id} names a cgroup"
    );
    assert!(
        (secs - cpu_ns as f64 / 1e9).abs() < 1e-6,
        "{line} vs {cpu_ns}"
    );
    let (line, ws_c) = sample("container_memory_working_set_bytes");
    assert!(
        (ws_c as u64).abs_diff(working_set) <= 1 << 20,
        "{line} ≈ cgroup {working_set}"
    );
    let (line, usage_c) = sample("container_memory_usage_bytes");
    assert!(
        (usage_c as u64).abs_diff(usage) <= 1 << 20,
        "{line} ≈ cgroup {usage}"
    );
    let (line, rss_c) = sample("container_memory_rss");
    assert!(
        (rss_c as u64).abs_diff(rss) <= 1 << 20,
        "{line} ≈ cgroup {rss}"
    );
    // The pod's own series (container="") carries its network.
    assert!(
        cad.lines().any(
            |l| l.starts_with("container_network_receive_bytes_total{container=\"\",")
                && l.contains("interface=\"eth0\"")
                && l.contains("pod=\"busy-rig-node\"")
        ),
        "{cad}"
    );
    let cores = std::thread::available_parallelism().unwrap().get();
    assert!(
        cad.lines()
            .any(|l| l.starts_with("machine_cpu_cores{") && l.ends_with(&format!(" {cores}"))),
        "{cad}"
    );
    assert!(cad.contains("\ncontainer_scrape_error 0\n"), "{cad}");

    // The limits the container runs under, as cAdvisor's spec series: 300m is a 30 ms quota
    // per 100 ms period; 64 MiB.
    let cpu_cg = Path::new("/sys/fs/cgroup/cpu").join(id.trim_start_matches('/'));
    assert_eq!(sample("container_spec_cpu_quota").1, 30_000.0);
    assert_eq!(
        sample("container_spec_cpu_period").1,
        read_u64(&cpu_cg.join("cpu.cfs_period_us")) as f64
    );
    assert_eq!(sample("container_spec_memory_limit_bytes").1, 67_108_864.0);
    // A spinning container under a quota is throttled (CPUThrottlingHigh's series), and the
    // figures are the cgroup's cpu.stat at the snapshot (never past the later reading).
    let (line, periods) = sample("container_cpu_cfs_periods_total");
    let (_, throttled) = sample("container_cpu_cfs_throttled_periods_total");
    let (_, throttled_s) = sample("container_cpu_cfs_throttled_seconds_total");
    let cpu_stat = cpu_cg.join("cpu.stat");
    assert!(
        periods > 0.0 && throttled > 0.0 && throttled_s > 0.0,
        "{line}"
    );
    assert!(
        periods <= stat(&cpu_stat, "nr_periods") as f64
            && throttled <= stat(&cpu_stat, "nr_throttled") as f64
            && throttled_s * 1e9 <= stat(&cpu_stat, "throttled_time") as f64 + 1.0,
        "{line} vs {}",
        std::fs::read_to_string(&cpu_stat).unwrap()
    );
    // Memory details and the OOM counter of the container's own cgroup.
    for family in [
        "container_memory_failcnt",
        "container_memory_mapped_file",
        "container_memory_max_usage_bytes",
        "container_memory_swap",
    ] {
        let (_, v) = sample(family);
        assert!(v >= 0.0, "{family}");
    }
    assert_eq!(sample("container_oom_events_total").1, 0.0);
    // The CPU split, page faults and the process series of the spinning shell: one process
    // with its standard descriptors, one thread, its open-files limit; last seen just now.
    let (line, user) = sample("container_cpu_user_seconds_total");
    let (_, system) = sample("container_cpu_system_seconds_total");
    assert!(
        user > 0.05 && system >= 0.0 && user + system <= after as f64 / 1e9 + 1.0,
        "{line}, system {system}, cgroup {after} ns"
    );
    let faults = cad
        .lines()
        .find(|l| {
            l.starts_with(
                "container_memory_failures_total{container=\"spin\",failure_type=\"pgfault\"",
            ) && l.contains("scope=\"container\"")
        })
        .unwrap_or_else(|| panic!("page faults of spin in:\n{cad}"));
    assert!(
        !faults.contains("} 0 "),
        "a running shell faulted pages: {faults}"
    );
    assert_eq!(sample("container_processes").1, 1.0);
    assert!(sample("container_file_descriptors").1 >= 3.0);
    assert!(sample("container_threads").1 >= 1.0);
    let (line, nofile) = sample("container_ulimits_soft");
    assert!(
        line.contains("ulimit=\"max_open_files\"") && (nofile > 0.0 || nofile == -1.0),
        "{line}"
    );
    let (line, seen) = sample("container_last_seen");
    assert!((seen - now_ms() as f64 / 1000.0).abs() < 120.0, "{line}");
    assert_eq!(sample("container_health_state").1, -1.0);
    // Packets per interface on the pod's series, and the root cgroup's filesystems.
    assert!(
        cad.lines().any(|l| l
            .starts_with("container_network_receive_packets_total{container=\"\",")
            && l.contains("interface=\"eth0\"")
            && l.contains("pod=\"busy-rig-node\"")),
        "{cad}"
    );
    assert!(
        cad.lines().any(
            |l| l.starts_with("container_fs_limit_bytes{container=\"\",device=\"")
                && l.contains("id=\"/\"")
        ),
        "{cad}"
    );
    assert!(
        cad.lines()
            .any(|l| l.starts_with("machine_cpu_physical_cores{") && !l.ends_with(" 0")),
        "{cad}"
    );
    // cgroup v1 has no pressure files: no PSI series and no psi in the summary, as upstream.
    assert!(!cad.contains("container_pressure_"), "{cad}");
    assert!(c["cpu"].get("psi").is_none(), "{c}");
}

const RESOURCE: &str = "https://127.0.0.1:10250/metrics/resource";
const CADVISOR: &str = "https://127.0.0.1:10250/metrics/cadvisor";

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

/// The timestamp of `node_cpu_usage_seconds_total` in /metrics/resource text (0 if none).
fn node_cpu_ms(text: &str) -> i64 {
    text.lines()
        .find_map(|l| l.strip_prefix("node_cpu_usage_seconds_total "))
        .and_then(|rest| rest.rsplit(' ').next()?.parse().ok())
        .unwrap_or(0)
}

fn counter(metrics: &str, op: &str) -> u64 {
    let prefix = format!("kubelet_runtime_operations_total{{operation_type=\"{op}\"}} ");
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(&prefix)?.trim().parse::<f64>().ok())
        .unwrap_or(0.0) as u64
}

/// `cargo build -p kubelet --bins && STATS_PODS=110 cargo test -p node-tests --test kubelet_stats -- --ignored --nocapture`
///
/// Requests read the background refresh's last snapshot: "cold" is the first request after
/// the pods run (no longer a refresh of its own). The refresh's own cost is measured by a
/// provider in this process over the same runtime and directories.
#[test]
#[ignore = "bench: starts 110 pods; prints figures"]
fn summary_latency_at_110_pods() {
    require_rig!();
    let n: usize = std::env::var("STATS_PODS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(110);
    let rig = Rig::up("bench-stats");
    let agent = Kubelet::builder(&rig).start();
    for i in 0..n {
        agent.write_manifest(
            &format!("p{i}.yaml"),
            &format!(
                "apiVersion: v1\nkind: Pod\nmetadata:\n  name: p{i}\nspec:\n  terminationGracePeriodSeconds: 1\n  containers:\n  - name: main\n    image: docker.io/library/busybox:1.35\n    command: [\"sleep\", \"3600\"]\n"
            ),
        );
    }
    wait_for("all pods Running", Duration::from_secs(600), || {
        let running = agent
            .pods()
            .iter()
            .filter(|p| p["status"]["phase"] == "Running")
            .count();
        (running >= n).then_some(())
    });
    std::thread::sleep(Duration::from_secs(11));
    let metrics = || agent.curl("https://127.0.0.1:10250/metrics");
    let m0 = metrics();
    let t = Instant::now();
    let s = summary(&agent);
    let cold = t.elapsed();
    assert_eq!(
        s["pods"].as_array().map(Vec::len),
        Some(n),
        "every pod in the summary"
    );
    let m1 = metrics();
    let mut warm = Vec::new();
    // curl's own time (connect, TLS, request, body): the server's latency without the cost
    // of starting a process on a busy machine.
    // Per request: (total, from the end of the TLS handshake to the last byte).
    let server = |url: &str| -> (Vec<f64>, Vec<f64>) {
        let (mut total, mut served): (Vec<f64>, Vec<f64>) = (0..20)
            .map(|_| {
                let out = std::process::Command::new("nsenter")
                    .arg(format!("--net={}", agent.netns()))
                    .args(["curl", "-sk", "--max-time", "5", "-o", "/dev/null"])
                    .args(["-w", "%{time_total} %{time_appconnect}", url])
                    .output()
                    .expect("curl");
                let f: Vec<f64> = String::from_utf8_lossy(&out.stdout)
                    .split_whitespace()
                    .map(|v| v.parse::<f64>().unwrap_or(f64::NAN) * 1000.0)
                    .collect();
                (f[0], f[0] - f[1])
            })
            .unzip();
        total.sort_by(f64::total_cmp);
        served.sort_by(f64::total_cmp);
        (total, served)
    };
    let summary_server = server("https://127.0.0.1:10250/stats/summary");
    let healthz_server = server("https://127.0.0.1:10250/healthz");
    for _ in 0..20 {
        let t = Instant::now();
        let _ = agent.curl("https://127.0.0.1:10250/stats/summary");
        warm.push(t.elapsed());
    }
    warm.sort();
    // The same curl against /healthz: the cost of the process, TLS and HTTP alone.
    let mut healthz = Vec::new();
    for _ in 0..20 {
        let t = Instant::now();
        let _ = agent.curl("https://127.0.0.1:10250/healthz");
        healthz.push(t.elapsed());
    }
    healthz.sort();
    let m2 = metrics();
    let ops = [
        "list_podsandbox_stats",
        "list_container_stats",
        "container_stats",
        "container_status",
        "podsandbox_status",
    ];
    let cold_calls: Vec<(&str, u64)> = ops
        .iter()
        .map(|o| (*o, counter(&m1, o) - counter(&m0, o)))
        .collect();
    let warm_calls: Vec<(&str, u64)> = ops
        .iter()
        .map(|o| (*o, counter(&m2, o) - counter(&m1, o)))
        .collect();

    // Baseline: one direct ListPodSandboxStats from this process, same pods; then the
    // refresh itself, by phase: a provider in this process over the same runtime, cgroups
    // and directories as the agent's.
    let agent_dir = agent.manifests().parent().unwrap().to_path_buf();
    let (direct, first, steady, first_json, request, details) =
        tokio::runtime::Runtime::new().unwrap().block_on(async {
            use kubelet::runtime::Runtime;
            let ch = cri_proto::connect(rig.get("CRI_ENDPOINT"), Duration::from_secs(5))
                .await
                .expect("connect to containerd");
            let cri =
                kubelet::runtime::cri::CriRuntime::new(ch.clone(), ch, Duration::from_secs(60));
            let mut d = Vec::new();
            for _ in 0..5 {
                let t = Instant::now();
                cri.list_sandbox_stats().await.expect("ListPodSandboxStats");
                d.push(t.elapsed());
            }
            d.sort();
            let provider = kubelet::stats::Provider::new(
                std::sync::Arc::new(cri),
                std::sync::Arc::new(kubelet::stats::node::LinuxNode),
                kubelet::stats::ProviderConfig::new(
                    "rig-node".into(),
                    agent_dir.join("root"),
                    agent_dir.join("logs"),
                ),
            );
            // The first refresh asks the runtime's stats and walks every pod's directories.
            let first = provider.refresh().await.expect("refresh").cost;
            let mut steady = Vec::new();
            for _ in 0..5 {
                let s = provider.refresh().await.expect("refresh");
                assert_eq!(s.summary.pods.len(), n, "every pod in the refresh");
                steady.push(s.cost);
            }
            steady.sort_by_key(|c| c.total);
            // What a request costs the agent: read the last snapshot and its JSON (the first
            // request after a refresh serializes it, the others share it).
            let s = provider.refresh().await.expect("refresh");
            let t = Instant::now();
            let _ = s.summary_json();
            let first_json = t.elapsed();
            // What the first /metrics/cadvisor scrape of a snapshot adds: the cgroup details
            // the refresh no longer reads.
            let t = Instant::now();
            let _ = s.cadvisor_meta().await;
            let details = t.elapsed();
            let mut req = Vec::new();
            for _ in 0..20 {
                let t = Instant::now();
                let s = provider.snapshot().await.expect("snapshot");
                let body = s.summary_json();
                assert!(body.len() > 1000);
                req.push(t.elapsed());
            }
            req.sort();
            (
                d[d.len() / 2],
                first,
                steady[steady.len() / 2],
                first_json,
                req[req.len() / 2],
                details,
            )
        });
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    let warm_p50 = warm[warm.len() / 2];
    println!("stats bench: {n} pods");
    println!("  /stats/summary first request: {:.1} ms", ms(cold));
    println!(
        "  /stats/summary warm (cached) p50: {:.1} ms, max {:.1} ms (curl included)",
        ms(warm_p50),
        ms(*warm.last().unwrap())
    );
    println!(
        "  /healthz by the same curl p50: {:.1} ms",
        ms(healthz[healthz.len() / 2])
    );
    println!(
        "  curl time_total p50: /stats/summary {:.1} ms (max {:.1}), /healthz {:.1} ms",
        summary_server.0[10], summary_server.0[19], healthz_server.0[10]
    );
    println!(
        "  after the TLS handshake p50: /stats/summary {:.1} ms (max {:.1}), /healthz {:.1} ms",
        summary_server.1[10], summary_server.1[19], healthz_server.1[10]
    );
    println!(
        "  in-process request (snapshot + JSON): first after a refresh {:.2} ms, then p50 {:.3} ms",
        ms(first_json),
        ms(request)
    );
    println!(
        "  first /metrics/cadvisor scrape of a snapshot reads the cgroup details: {:.1} ms",
        ms(details)
    );
    println!("  direct ListPodSandboxStats p50: {:.1} ms", ms(direct));
    println!(
        "  ratio cold/direct: {:.2}, warm/direct: {:.2}",
        ms(cold) / ms(direct),
        ms(warm_p50) / ms(direct)
    );
    let cost = |c: &kubelet::stats::RefreshCost| {
        format!(
            "total {:.1} ms (CRI {:.1}, blocking {:.1} [node {:.1}, disk walks {:.1}, cgroups {:.1}, net/dev {:.1}], build {:.1}; {} pods walked) = {:.3} of a direct ListPodSandboxStats",
            ms(c.total),
            ms(c.cri),
            ms(c.blocking),
            ms(c.phases.node),
            ms(c.phases.disk),
            ms(c.phases.cgroups),
            ms(c.phases.network),
            ms(c.build),
            c.pods_walked,
            ms(c.total) / ms(direct)
        )
    };
    println!(
        "  refresh with the runtime's stats and disk walks: {}",
        cost(&first)
    );
    println!("  steady refresh (every 10 s) p50: {}", cost(&steady));
    println!(
        "  load average: {}",
        std::fs::read_to_string("/proc/loadavg")
            .unwrap_or_default()
            .trim()
    );
    println!("  CRI calls for the cold request: {cold_calls:?}");
    println!("  CRI calls for 20 warm requests: {warm_calls:?}");
    for (op, c) in &cold_calls {
        if *op != "list_podsandbox_stats" {
            assert_eq!(*c, 0, "no per-container or per-pod CRI call ({op})");
        }
    }
    assert!(counter(&m1, "list_podsandbox_stats") - counter(&m0, "list_podsandbox_stats") <= 1);
}
