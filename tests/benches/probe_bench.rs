//! Probe overhead bench on the node rig (root; prints figures, asserts nothing about time).
//!
//! ```text
//! cargo bench --profile dev -p node-tests --bench probe_bench -- [--pods N] [--measure SECS] [--settle SECS] [--phase idle|probes|both] [--no-exec]
//! ```
//!
//! For each phase a fresh rig (`pe2e-bench-idle`, `pe2e-bench-probes`) and a fresh kubelet run
//! N static pods of two busybox containers each (`web`: httpd; `side`: sleep). In the `probes`
//! phase every pod has three probes at periodSeconds 1: liveness exec `true` (CRI ExecSync) and
//! readiness httpGet on `web`, readiness tcpSocket on `side`. Once every pod runs (and, with
//! probes, is ready) and a settle time has passed, CPU is sampled from /proc/PID/stat over the
//! measure window for the kubelet, containerd (`CONTAINERD_PID`) and the rig's shims (with
//! their reaped children: runc exec and the probe processes), plus the kubelet's VmRSS/VmHWM.
//!
//! The kubelet is `target/<profile>/kubelet` (or `$KUBELET_BIN`): build it first with
//! `cargo build --bins` (plus `--release` and a plain `cargo bench` for optimised figures).

use std::process::Command;
use std::time::{Duration, Instant};

#[derive(Debug, Clone)]
struct Opts {
    pods: usize,
    measure: u64,
    settle: u64,
    phases: Vec<&'static str>,
    /// Liveness by tcpSocket instead of exec: the kubelet's own probing cost without ExecSync.
    no_exec: bool,
}

fn usage() -> ! {
    eprintln!(
        "usage: probe_bench -- [--pods N] [--measure SECS] [--settle SECS] [--phase idle|probes|both] [--no-exec]"
    );
    std::process::exit(2)
}

fn parse() -> Opts {
    let mut o = Opts {
        pods: 110,
        measure: 30,
        settle: 10,
        phases: vec!["idle", "probes"],
        no_exec: false,
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut v = || args.next().unwrap_or_else(|| usage());
        match a.as_str() {
            // `cargo bench` passes --bench to harness = false targets.
            "--bench" => {}
            "--no-exec" => o.no_exec = true,
            "--pods" => o.pods = v().parse().unwrap_or_else(|_| usage()),
            "--measure" => o.measure = v().parse().unwrap_or_else(|_| usage()),
            "--settle" => o.settle = v().parse().unwrap_or_else(|_| usage()),
            "--phase" => {
                o.phases = match v().as_str() {
                    "idle" => vec!["idle"],
                    "probes" => vec!["probes"],
                    "both" => vec!["idle", "probes"],
                    _ => usage(),
                }
            }
            _ => usage(),
        }
    }
    if o.pods == 0 || o.pods > 500 || o.measure == 0 {
        usage();
    }
    o
}

fn manifest(i: usize, probes: bool, no_exec: bool) -> String {
    let liveness = if no_exec {
        r#"
    livenessProbe:
      tcpSocket:
        port: 8080
      periodSeconds: 1"#
    } else {
        r#"
    livenessProbe:
      exec:
        command: ["true"]
      periodSeconds: 1
      timeoutSeconds: 5"#
    };
    let (web_probes, side_probes) = if probes {
        (
            format!(
                r#"{liveness}
    readinessProbe:
      httpGet:
        path: /healthz
        port: 8080
      periodSeconds: 1"#
            ),
            r#"
    readinessProbe:
      tcpSocket:
        port: 8080
      periodSeconds: 1"#,
        )
    } else {
        (String::new(), "")
    };
    format!(
        r#"apiVersion: v1
kind: Pod
metadata:
  name: bench-{i:04}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: web
    image: docker.io/library/busybox:1.35
    command: ["sh", "-c", "mkdir -p /www; echo ok > /www/healthz; trap 'exit 0' TERM; httpd -f -p 8080 -h /www & wait"]{web_probes}
  - name: side
    image: docker.io/library/busybox:1.35
    command: ["sh", "-c", "trap 'exit 0' TERM; sleep 1000000 & wait"]{side_probes}
"#
    )
}

fn clk_tck() -> f64 {
    Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok())
        .unwrap_or(100.0)
}

/// utime+stime (and, with `children`, cutime+cstime) of a process, in ticks.
fn cpu_ticks(pid: u32, children: bool) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after "(comm)": state is field 3; utime 14, stime 15, cutime 16, cstime 17.
    let rest = &s[s.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let n = |i: usize| f.get(i - 3).and_then(|v| v.parse::<u64>().ok());
    let mut t = n(14)? + n(15)?;
    if children {
        t += n(16)? + n(17)?;
    }
    Some(t)
}

/// utime alone: the process's own code, without the kernel work (TCP handshakes, packets
/// into the pods' namespaces) its system calls cause.
fn user_ticks(pid: u32) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &s[s.rfind(')')? + 2..];
    rest.split_whitespace().nth(14 - 3)?.parse().ok()
}

fn status_kb(pid: u32, key: &str) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    s.lines()
        .find(|l| l.starts_with(key))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
}

/// PIDs of the shims serving this rig's containerd (their argv holds `-address SOCK`).
fn shim_pids(sock: &str) -> Vec<u32> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(cmd) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
            continue;
        };
        let args: Vec<&[u8]> = cmd.split(|b| *b == 0).collect();
        let is_shim = args
            .first()
            .is_some_and(|a| String::from_utf8_lossy(a).contains("containerd-shim"));
        if is_shim
            && args
                .windows(2)
                .any(|w| w[0] == b"-address" && w[1] == sock.as_bytes())
        {
            out.push(pid);
        }
    }
    out
}

/// Total of `prober_probe_total` on the kubelet's /metrics/probes (None if unavailable).
fn probes_done(agent: &node_tests::Kubelet) -> Option<f64> {
    let m = agent.curl("https://127.0.0.1:10250/metrics/probes");
    let mut total = None;
    for l in m.lines().filter(|l| l.starts_with("prober_probe_total{")) {
        let v: f64 = l.rsplit(' ').next()?.parse().ok()?;
        *total.get_or_insert(0.0) += v;
    }
    total
}

fn busy_cpu_ticks() -> Option<u64> {
    // First line of /proc/stat: cpu user nice system idle iowait irq softirq steal ... (all cores).
    let s = std::fs::read_to_string("/proc/stat").ok()?;
    let f: Vec<u64> = s
        .lines()
        .next()?
        .split_whitespace()
        .skip(1)
        .take(8)
        .filter_map(|v| v.parse().ok())
        .collect();
    (f.len() == 8).then(|| f.iter().sum::<u64>() - f[3] - f[4])
}

#[derive(Debug, Default, Clone)]
struct Figures {
    start_secs: f64,
    kubelet_cpu: f64,
    kubelet_user_cpu: f64,
    containerd_cpu: f64,
    shims_cpu: f64,
    machine_busy: f64,
    rss_kb: u64,
    hwm_kb: u64,
    probes_per_sec: Option<f64>,
}

fn run_phase(o: &Opts, phase: &str) -> Figures {
    let probes = phase == "probes";
    let rig = node_tests::Rig::up(&format!("pe2e-bench-{phase}"));
    let agent = node_tests::Kubelet::builder(&rig).start();
    let pid = agent.pid().expect("kubelet pid");
    let containerd: u32 = rig.get("CONTAINERD_PID").parse().expect("CONTAINERD_PID");
    let sock = rig.get("CONTAINERD_SOCK").to_string();
    eprintln!(
        "[{phase}] rig up, kubelet pid {pid}, containerd pid {containerd}; writing {} manifests",
        o.pods
    );
    let t0 = Instant::now();
    for i in 0..o.pods {
        agent.write_manifest(
            &format!("bench-{i:04}.yaml"),
            &manifest(i, probes, o.no_exec),
        );
    }
    let timeout = Duration::from_secs(60 + 4 * o.pods as u64);
    let mut last_report = Instant::now();
    node_tests::wait_for("every pod running", timeout, || {
        let pods = agent.pods();
        let ok = pods
            .iter()
            .filter(|p| {
                let name = p["metadata"]["name"].as_str().unwrap_or("");
                name.starts_with("bench-")
                    && ["web", "side"].iter().all(|c| {
                        let c = node_tests::container(p, c);
                        c["state"]["running"].is_object() && c["ready"] == true
                    })
            })
            .count();
        if last_report.elapsed() > Duration::from_secs(10) {
            eprintln!(
                "[{phase}] {ok}/{} pods running and ready after {:.0?}",
                o.pods,
                t0.elapsed()
            );
            last_report = Instant::now();
        }
        (ok == o.pods).then_some(())
    });
    let start_secs = t0.elapsed().as_secs_f64();
    eprintln!(
        "[{phase}] all {} pods running and ready in {start_secs:.1} s; settling {} s",
        o.pods, o.settle
    );
    std::thread::sleep(Duration::from_secs(o.settle));

    let tck = clk_tck();
    let shims = shim_pids(&sock);
    let sum_shims = || -> u64 {
        shims
            .iter()
            .filter_map(|p| cpu_ticks(*p, true))
            .sum::<u64>()
    };
    let u0 = user_ticks(pid).unwrap();
    let (k0, c0, s0, m0, p0) = (
        cpu_ticks(pid, true).unwrap(),
        cpu_ticks(containerd, true).unwrap(),
        sum_shims(),
        busy_cpu_ticks().unwrap(),
        probes_done(&agent),
    );
    let w0 = Instant::now();
    std::thread::sleep(Duration::from_secs(o.measure));
    let u1 = user_ticks(pid).unwrap();
    let (k1, c1, s1, m1, p1) = (
        cpu_ticks(pid, true).unwrap(),
        cpu_ticks(containerd, true).unwrap(),
        sum_shims(),
        busy_cpu_ticks().unwrap(),
        probes_done(&agent),
    );
    let secs = w0.elapsed().as_secs_f64();
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
    let pct = |a: u64, b: u64| (b.saturating_sub(a)) as f64 / tck / secs * 100.0;
    let f = Figures {
        start_secs,
        kubelet_cpu: pct(k0, k1),
        kubelet_user_cpu: pct(u0, u1),
        containerd_cpu: pct(c0, c1),
        shims_cpu: pct(s0, s1),
        machine_busy: (m1 - m0) as f64 / tck / secs / cores * 100.0,
        rss_kb: status_kb(pid, "VmRSS:").unwrap_or(0),
        hwm_kb: status_kb(pid, "VmHWM:").unwrap_or(0),
        probes_per_sec: match (p0, p1) {
            (Some(a), Some(b)) => Some((b - a) / secs),
            _ => None,
        },
    };
    eprintln!("[{phase}] {f:?} ({} shims)", shims.len());
    drop(agent);
    drop(rig);
    f
}

fn main() {
    if let Some(reason) = node_tests::skip_reason() {
        eprintln!("SKIPPED: {reason}");
        return;
    }
    let o = parse();
    eprintln!(
        "probe-bench: {o:?}, kubelet {:?}",
        node_tests::bin("kubelet")
    );
    let mut results = Vec::new();
    for phase in &o.phases {
        results.push((*phase, run_phase(&o, phase)));
    }
    println!(
        "pods={} probes/pod={} periodSeconds=1 measure={}s cores={}",
        o.pods,
        3,
        o.measure,
        std::thread::available_parallelism().map_or(1, |n| n.get())
    );
    println!(
        "{:<7} {:>9} {:>13} {:>11} {:>11} {:>12} {:>10} {:>12} {:>9} {:>11}",
        "phase",
        "start(s)",
        "kubelet %cpu",
        "(user)",
        "containerd",
        "shims+runc",
        "machine %",
        "kubelet RSS",
        "peak RSS",
        "probes/s"
    );
    for (phase, f) in &results {
        println!(
            "{:<7} {:>9.1} {:>13.1} {:>11.1} {:>11.1} {:>12.1} {:>10.1} {:>9.1} MB {:>6.1} MB {:>11}",
            phase,
            f.start_secs,
            f.kubelet_cpu,
            f.kubelet_user_cpu,
            f.containerd_cpu,
            f.shims_cpu,
            f.machine_busy,
            f.rss_kb as f64 / 1024.0,
            f.hwm_kb as f64 / 1024.0,
            f.probes_per_sec
                .map_or("-".to_string(), |p| format!("{p:.1}")),
        );
    }
    if let (Some((_, i)), Some((_, p))) = (
        results.iter().find(|(n, _)| *n == "idle"),
        results.iter().find(|(n, _)| *n == "probes"),
    ) {
        let r = |a: f64, b: f64| {
            if a > 0.0 {
                format!("{:.1}x", b / a)
            } else {
                "n/a (idle 0)".into()
            }
        };
        println!(
            "ratios probes/idle: kubelet cpu {} | kubelet RSS {} | containerd cpu {} | shims+runc cpu {}",
            r(i.kubelet_cpu, p.kubelet_cpu),
            r(i.rss_kb as f64, p.rss_kb as f64),
            r(i.containerd_cpu, p.containerd_cpu),
            r(i.shims_cpu, p.shims_cpu),
        );
        println!(
            "kubelet cpu per probe: {:.3} ms",
            p.probes_per_sec.filter(|r| *r > 0.0).map_or(f64::NAN, |r| {
                (p.kubelet_cpu - i.kubelet_cpu) / 100.0 * 1000.0 / r
            })
        );
    }
}
