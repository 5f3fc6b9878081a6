//! proxy-bench: the proxier's sync times against raw `iptables-restore` of its own output.
//!
//! For each iptables backend installed (nft, legacy): synthetic Services × 2 endpoints, a fresh
//! network namespace for the proxier (first full sync, then partial syncs after one changed
//! EndpointSlice and one new Service) and two more fresh namespaces for raw
//! `iptables-restore --noflush` loads of the same rendered text, one before and one after
//! the proxier's (their mean is the baseline). Also prints the CPU cost of
//! computing one partial-sync delta, incremental (`Rendered::update`) vs the whole render +
//! `render::delta` it replaces (no root needed for that line). Prints figures; asserts nothing.
//!
//! With `--mode nftables`, the nftables proxier instead (see `nft.rs`);
//! `--services` then takes a list (`--services 1000,5000,10000`).
//!
//! Usage: proxy-bench [--services N] (default 1000) [--backend nft|legacy]
//! [--mode iptables|nftables]. Needs root;
//! touches only namespaces it creates and deletes. `PROXY_BENCH_DUMP=FILE` writes the full
//! restore text there (for experiments with the raw tools); `PROXY_BENCH_VERBOSE` prints the
//! deltas.

use std::collections::BTreeMap;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use k8s_openapi::api::core::v1::{Service, ServicePort, ServiceSpec};
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointPort, EndpointSlice};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use prometheus::Registry;
use proxy::iptables::render::{self, Rendered};
use proxy::iptables::{ExecRunner, IptablesRunner, Variant};
use proxy::iptables::{IptablesVersion, Position};
use proxy::iptables::{Proxier, TableName};
use proxy::model::{IpFamily, SERVICE_NAME_LABEL, ServiceState};
use proxy::render_config::RenderConfig;
use proxy::sync_loop::SyncConfig;
use proxy::tracker::ProxyHandle;

mod nft;

struct Netns(String);

impl Netns {
    fn new(name: String) -> anyhow::Result<Netns> {
        let st = Command::new("ip").args(["netns", "add", &name]).status()?;
        if !st.success() {
            bail!("ip netns add {name} failed");
        }
        Ok(Netns(name))
    }

    fn prefix(&self) -> Vec<String> {
        ["ip", "netns", "exec", &self.0]
            .iter()
            .map(|s| s.to_string())
            .collect()
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "delete", &self.0])
            .status();
    }
}

/// The proxier's jumps from the built-in chains (its `ensure_jumps`), for the raw namespace:
/// loaded before the raw restore, so that both namespaces' loads are checked by the kernel
/// against the same hooked-up chains.
const RAW_JUMPS: &str = "*filter
:KUBE-PROXY-FIREWALL - [0:0]
:KUBE-FORWARD - [0:0]
:KUBE-SERVICES - [0:0]
:KUBE-NODEPORTS - [0:0]
:KUBE-EXTERNAL-SERVICES - [0:0]
-I INPUT -j KUBE-PROXY-FIREWALL
-I OUTPUT -j KUBE-PROXY-FIREWALL
-I FORWARD -j KUBE-PROXY-FIREWALL
-I FORWARD -j KUBE-FORWARD
-I OUTPUT -j KUBE-SERVICES
-I FORWARD -j KUBE-SERVICES
-I INPUT -j KUBE-NODEPORTS
-I FORWARD -j KUBE-EXTERNAL-SERVICES
-I INPUT -j KUBE-EXTERNAL-SERVICES
COMMIT
*nat
:KUBE-SERVICES - [0:0]
:KUBE-POSTROUTING - [0:0]
-I OUTPUT -j KUBE-SERVICES
-I PREROUTING -j KUBE-SERVICES
-I POSTROUTING -j KUBE-POSTROUTING
COMMIT
";

/// Passes everything to `ExecRunner`, remembering the last restore text.
struct Recording {
    inner: ExecRunner,
    last: Arc<Mutex<String>>,
}

impl Recording {
    fn new(inner: ExecRunner) -> Self {
        Recording {
            inner,
            last: Arc::default(),
        }
    }

    fn last_restore(&self) -> String {
        self.last.lock().map(|s| s.clone()).unwrap_or_default()
    }
}

impl IptablesRunner for Recording {
    fn family(&self) -> IpFamily {
        self.inner.family()
    }

    async fn version(&self) -> proxy::iptables::Result<IptablesVersion> {
        self.inner.version().await
    }

    async fn restore(&self, data: &str, noflush: bool) -> proxy::iptables::Result<()> {
        if let Ok(mut last) = self.last.lock() {
            *last = data.to_owned();
        }
        self.inner.restore(data, noflush).await
    }

    async fn save(&self, table: TableName) -> proxy::iptables::Result<String> {
        self.inner.save(table).await
    }

    async fn save_all(&self) -> proxy::iptables::Result<String> {
        self.inner.save_all().await
    }

    async fn ensure_chain(&self, table: TableName, chain: &str) -> proxy::iptables::Result<bool> {
        self.inner.ensure_chain(table, chain).await
    }

    async fn chain_exists(&self, table: TableName, chain: &str) -> proxy::iptables::Result<bool> {
        self.inner.chain_exists(table, chain).await
    }

    async fn ensure_rule(
        &self,
        position: Position,
        table: TableName,
        chain: &str,
        args: &[String],
    ) -> proxy::iptables::Result<bool> {
        self.inner.ensure_rule(position, table, chain, args).await
    }
}

fn ip_of(i: usize, base: [u8; 2]) -> String {
    format!("{}.{}.{}.{}", base[0], base[1], (i >> 8) & 0xff, i & 0xff)
}

fn service(i: usize) -> Service {
    Service {
        metadata: ObjectMeta {
            namespace: Some(format!("ns{}", i % 50)),
            name: Some(format!("svc{i}")),
            ..Default::default()
        },
        spec: Some(ServiceSpec {
            type_: Some("ClusterIP".into()),
            cluster_ip: Some(ip_of(i, [172, 30])),
            ports: Some(vec![ServicePort {
                name: Some("http".into()),
                protocol: Some("TCP".into()),
                port: 80,
                ..Default::default()
            }]),
            ..Default::default()
        }),
        status: None,
    }
}

fn slice(i: usize, generation: usize) -> EndpointSlice {
    let ep = |k: usize| Endpoint {
        addresses: vec![ip_of(2 * i + k + generation * 7919, [10, 128])],
        node_name: Some(format!("node{}", k)),
        ..Default::default()
    };
    EndpointSlice {
        metadata: ObjectMeta {
            namespace: Some(format!("ns{}", i % 50)),
            name: Some(format!("svc{i}-abcde")),
            labels: Some(BTreeMap::from([(
                SERVICE_NAME_LABEL.to_string(),
                format!("svc{i}"),
            )])),
            ..Default::default()
        },
        address_type: "IPv4".into(),
        endpoints: Some(vec![ep(0), ep(1)]),
        ports: Some(vec![EndpointPort {
            name: Some("http".into()),
            protocol: Some("TCP".into()),
            port: Some(8080),
            ..Default::default()
        }]),
    }
}

fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1).map(|v| v.parse().unwrap_or(0)))
        })
        .unwrap_or(0)
}

fn load_average() -> String {
    let l = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    format!(
        "load average (1/5/15 min): {}",
        l.split_whitespace().take(3).collect::<Vec<_>>().join(" ")
    )
}

fn have(bin: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {bin}")])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false)
}

struct Row {
    backend: Variant,
    full: Duration,
    /// Mean of the raw loads before and after the proxier's.
    raw: Duration,
    raw_before: Duration,
    raw_after: Duration,
    bytes: usize,
    partial_change: Duration,
    /// Raw `iptables-restore` of the first change's delta text alone (the floor for it).
    raw_change: Duration,
    partial_new: Duration,
    rss_kib: u64,
}

async fn bench(backend: Variant, n: usize) -> anyhow::Result<Row> {
    let tag = format!("kpbench{}-{:?}", std::process::id(), backend).to_lowercase();
    let ns_proxy = Netns::new(format!("{tag}-p"))?;
    let ns_raw = Netns::new(format!("{tag}-r"))?;

    let runner = ExecRunner::new(IpFamily::V4)
        .with_variant(backend)
        .with_prefix(ns_proxy.prefix());
    let v = runner.version().await.context("iptables version")?;
    let runner = Recording::new(runner.with_version(&v));
    let mut cfg = RenderConfig::new(IpFamily::V4, "node0");
    cfg.random_fully = v.has_random_fully();
    cfg.cluster_cidr = Some("10.128.0.0/9".parse()?);

    let handle = ProxyHandle::new(ServiceState::new(IpFamily::V4, "node0"));
    for i in 0..n {
        handle.on_service_upsert(&service(i));
        handle.on_endpoint_slice_upsert(&slice(i, 0));
    }
    handle.on_services_synced();
    handle.on_endpoint_slices_synced();
    // The text the first sync will write, for the raw loads.
    let text = handle.with_state(|st| {
        Rendered::build(st.service_port_map(), st.endpoints_map(), &cfg).full_text(&[])
    });
    if let Some(path) = std::env::var_os("PROXY_BENCH_DUMP") {
        std::fs::write(path, &text)?;
    }
    let mut p = Proxier::new(
        runner,
        cfg,
        handle.clone(),
        SyncConfig::default(),
        &Registry::new(),
    )?;

    // Raw loads into fresh namespaces, hooked up as the proxier's, one before and one after
    // the proxier's first sync (the second load of a run tends to be the faster one).
    let raw_runner = |ns: &Netns| {
        ExecRunner::new(IpFamily::V4)
            .with_variant(backend)
            .with_prefix(ns.prefix())
            .with_version(&v)
    };
    let raw_load = async |runner: &ExecRunner| -> anyhow::Result<Duration> {
        runner
            .restore(RAW_JUMPS, true)
            .await
            .context("raw jump rules")?;
        let t = Instant::now();
        runner.restore(&text, true).await.context("raw restore")?;
        Ok(t.elapsed())
    };
    let raw_before = {
        let ns = Netns::new(format!("{tag}-b"))?;
        raw_load(&raw_runner(&ns)).await?
    };

    let t = Instant::now();
    p.sync(false).await.context("first full sync")?;
    let full = t.elapsed();
    let applied = p.applied().context("applied ruleset")?.full_text(&[]);
    anyhow::ensure!(
        applied == text,
        "the proxier wrote another text than rendered"
    );

    let raw_runner = raw_runner(&ns_raw);
    let raw_after = raw_load(&raw_runner).await?;
    let raw = (raw_before + raw_after) / 2;
    // The bench's copies of the text are not the proxier's memory.
    let bytes = text.len();
    drop((applied, text));

    // One changed EndpointSlice → rules in the kernel (median of 5).
    let mut changes = Vec::new();
    let mut deltas = Vec::new();
    for g in 1..=5 {
        let t = Instant::now();
        handle.on_endpoint_slice_upsert(&slice(n / 2, g));
        p.sync(false).await.context("partial sync")?;
        changes.push(t.elapsed());
        deltas.push(p.runner().last_restore());
    }
    changes.sort();
    // The raw namespace holds the same initial rules, hooked up as the proxier's: replay the
    // same deltas there.
    let mut raw_changes = Vec::new();
    for d in &deltas {
        let t = Instant::now();
        raw_runner
            .restore(d, true)
            .await
            .context("raw restore of a delta")?;
        raw_changes.push(t.elapsed());
    }
    raw_changes.sort();
    let raw_change = raw_changes[2];
    if std::env::var_os("PROXY_BENCH_VERBOSE").is_some() {
        println!(
            "{backend:?} ep change: proxier {changes:?}\n  raw {raw_changes:?}\n  delta:\n{}",
            deltas[0]
        );
    }
    // One new Service with its slice.
    let t = Instant::now();
    handle.on_service_upsert(&service(n));
    handle.on_endpoint_slice_upsert(&slice(n, 0));
    p.sync(false).await.context("partial sync (new service)")?;
    let partial_new = t.elapsed();

    Ok(Row {
        backend,
        full,
        raw,
        raw_before,
        raw_after,
        bytes,
        partial_change: changes[2],
        raw_change,
        partial_new,
        rss_kib: rss_kib(),
    })
}

/// CPU time to compute the delta for one changed EndpointSlice: the whole-render + diff path
/// and the incremental one (medians of 5).
fn delta_cpu(n: usize) -> (Duration, Duration) {
    let mut st = ServiceState::new(IpFamily::V4, "node0");
    for i in 0..n {
        st.upsert_service(&service(i));
        st.upsert_endpoint_slice(&slice(i, 0));
    }
    st.take_changes();
    let mut cfg = RenderConfig::new(IpFamily::V4, "node0");
    cfg.cluster_cidr = "10.128.0.0/9".parse().ok();
    let mut builds = Vec::new();
    for _ in 0..5 {
        let t = Instant::now();
        let r = Rendered::build(st.service_port_map(), st.endpoints_map(), &cfg);
        let b = t.elapsed();
        let t = Instant::now();
        let text = r.full_text(&[]);
        builds.push((b, t.elapsed(), text.len()));
    }
    let cold = builds[0];
    builds.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    println!(
        "full render CPU: build {:.1} ms (first {:.1} ms), text {:.1} ms ({} kB)",
        ms(builds[2].0),
        ms(cold.0),
        ms(builds[2].1),
        builds[2].2 / 1024
    );
    let mut rendered = Rendered::build(st.service_port_map(), st.endpoints_map(), &cfg);
    let mut applied = rendered.to_ruleset();
    let (mut whole, mut inc) = (Vec::new(), Vec::new());
    for g in 1..=5 {
        st.upsert_endpoint_slice(&slice(n / 2, g));
        let changed = st.take_changes();
        let t = Instant::now();
        let desired = render::render(st.service_port_map(), st.endpoints_map(), &cfg);
        let a = render::delta(&applied, &desired);
        whole.push(t.elapsed());
        let t = Instant::now();
        let b = rendered.update(st.service_port_map(), st.endpoints_map(), &changed, &cfg);
        inc.push(t.elapsed());
        assert_eq!(
            a, b,
            "incremental delta differs from the whole-render delta"
        );
        applied = desired;
    }
    whole.sort();
    inc.sort();
    (whole[2], inc[2])
}

fn print_delta_cpu(n: usize) {
    let (whole, inc) = delta_cpu(n);
    println!(
        "one-slice delta CPU: whole render + delta {:.2} ms, incremental {:.3} ms",
        whole.as_secs_f64() * 1000.0,
        inc.as_secs_f64() * 1000.0
    );
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let mut sizes = vec![1000usize];
    let mut only: Option<Variant> = None;
    let mut nftables = false;
    let mut args = std::env::args().skip(1);
    let list = |s: &str| -> anyhow::Result<Vec<usize>> {
        s.split(',')
            .map(|x| x.trim().parse().context("--services N[,N…]"))
            .collect()
    };
    while let Some(a) = args.next() {
        match a.as_str() {
            "--services" => sizes = list(&args.next().context("--services N")?)?,
            s if s.starts_with("--services=") => sizes = list(&s["--services=".len()..])?,
            "--mode" => {
                nftables = match args.next().as_deref() {
                    Some("nftables") => true,
                    Some("iptables") => false,
                    other => bail!("--mode iptables|nftables, got {other:?}"),
                }
            }
            "--backend" => {
                only = match args.next().as_deref() {
                    Some("nft") => Some(Variant::Nft),
                    Some("legacy") => Some(Variant::Legacy),
                    other => bail!("--backend nft|legacy, got {other:?}"),
                }
            }
            other => bail!(
                "unknown argument {other:?} (usage: proxy-bench [--services N] [--backend nft|legacy] [--mode iptables|nftables])"
            ),
        }
    }
    let n = sizes[0];
    let uid = Command::new("id").arg("-u").output()?;
    if String::from_utf8_lossy(&uid.stdout).trim() != "0" {
        println!("proxy-bench needs root (network namespaces); only the CPU figures follow");
        if nftables {
            return Ok(());
        }
        print_delta_cpu(n);
        return Ok(());
    }
    if nftables {
        let mut rows = Vec::new();
        for &n in &sizes {
            match nft::bench(n).await {
                Ok(r) => rows.push(r),
                Err(e) => println!("nftables at {n}: {e:#}"),
            }
        }
        nft::print(&rows);
        println!("{}", load_average());
        return Ok(());
    }
    let mut rows = Vec::new();
    for (backend, bin) in [
        (Variant::Nft, "iptables-nft-restore"),
        (Variant::Legacy, "iptables-legacy-restore"),
    ] {
        if only.is_some_and(|o| o != backend) {
            continue;
        }
        if !have(bin) {
            println!("{bin} not installed: {backend:?} skipped");
            continue;
        }
        match bench(backend, n).await {
            Ok(r) => rows.push(r),
            Err(e) => println!("{backend:?}: {e:#}"),
        }
    }
    println!(
        "\n{n} services x 2 endpoints\n{:<8} {:>10} {:>10} {:>7} {:>9} {:>12} {:>12} {:>12} {:>9}",
        "backend", "full", "raw", "ratio", "text", "ep change", "(raw delta)", "new svc", "RSS"
    );
    for r in &rows {
        println!(
            "{:<8} {:>9.3}s {:>9.3}s {:>6.2}x {:>7}kB {:>11.1}ms {:>11.1}ms {:>11.1}ms {:>7}MB",
            format!("{:?}", r.backend),
            r.full.as_secs_f64(),
            r.raw.as_secs_f64(),
            r.full.as_secs_f64() / r.raw.as_secs_f64(),
            r.bytes / 1024,
            r.partial_change.as_secs_f64() * 1000.0,
            r.raw_change.as_secs_f64() * 1000.0,
            r.partial_new.as_secs_f64() * 1000.0,
            r.rss_kib / 1024,
        );
    }
    for r in &rows {
        println!(
            "{:?}: raw load before the proxier's {:.3}s, after {:.3}s (raw = their mean)",
            r.backend,
            r.raw_before.as_secs_f64(),
            r.raw_after.as_secs_f64()
        );
    }
    // Last, so that its extra copies of the state do not count in the RSS figures above.
    print_delta_cpu(n);
    Ok(())
}
