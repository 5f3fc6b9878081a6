//! `proxy-bench --mode nftables`: the nftables proxier against raw `nft -f` of its own
//! transactions, in namespaces the bench creates and deletes.
//!
//! For each size: a namespace for the proxier (first sync = the whole table, in steps above
//! 2000 service ports), two more for raw loads of the same text as one transaction after
//! it (their mean is the raw figure), and one for raw loads of the proxier's own steps.
//! Then, at that size, one changed EndpointSlice and one new Service (median of 5 each, one
//! at a time), each from the event to the kernel, next to raw `nft -f` of the same minimal
//! delta in the raw namespace (which holds the same rules). RSS after the run. Last, a restart: a new
//! proxier over the table the first one left, with what changed while it was down (one
//! Service gone, one EndpointSlice back to its first endpoints): it reads the table once and
//! writes only the difference. Next to it: the raw `nft list table` of that table (the
//! read's floor), and what a restart did before, one transaction replacing the whole
//! table, raw over the same rules.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use prometheus::Registry;
use proxy::model::{IpFamily, ServiceState};
use proxy::nftables::runner::{NftRunner, Result as NftResult};
use proxy::nftables::{ExecNft, NftProxier, check_support};
use proxy::render_config::RenderConfig;
use proxy::sync_loop::SyncConfig;
use proxy::tracker::ProxyHandle;

use super::{Netns, rss_kib, service, slice};

/// New Services added one at a time after the first sync; their median is the figure.
const NEW_SERVICES: usize = 5;

/// Passes everything to `ExecNft` (nothing without one), remembering the transactions.
#[derive(Clone)]
struct Recording {
    inner: Option<ExecNft>,
    all: Arc<Mutex<Vec<String>>>,
}

impl Recording {
    fn last(&self) -> String {
        self.all
            .lock()
            .ok()
            .and_then(|a| a.last().cloned())
            .unwrap_or_default()
    }

    /// The transactions recorded so far (the record is emptied).
    fn take(&self) -> Vec<String> {
        self.all
            .lock()
            .map(|mut a| std::mem::take(&mut *a))
            .unwrap_or_default()
    }
}

impl NftRunner for Recording {
    async fn apply(&self, text: &str) -> NftResult<()> {
        if let Ok(mut a) = self.all.lock() {
            a.push(text.to_owned());
        }
        match &self.inner {
            Some(r) => r.apply(text).await,
            None => Ok(()),
        }
    }

    async fn check(&self, text: &str) -> NftResult<()> {
        match &self.inner {
            Some(r) => r.check(text).await,
            None => Ok(()),
        }
    }

    async fn list(&self, what: &[&str]) -> NftResult<String> {
        match &self.inner {
            Some(r) => r.list(what).await,
            None => Ok(String::new()),
        }
    }
}

#[derive(Default)]
pub struct Row {
    n: usize,
    full: Duration,
    raw: Duration,
    raw_first: Duration,
    raw_second: Duration,
    /// The proxier's own transactions (when it wrote the table in steps), raw.
    raw_steps: Option<(Duration, usize)>,
    bytes: usize,
    ep_change: Duration,
    raw_ep_change: Duration,
    new_svc: Duration,
    raw_new_svc: Duration,
    /// A new proxier's first sync over the existing table, and its transactions.
    restart: Duration,
    restart_steps: usize,
    restart_bytes: usize,
    /// `nft list table ip kube-proxy` of the table after the restart, raw.
    raw_list: Duration,
    /// One transaction replacing the existing table (the restart before the rewrite).
    raw_restart: Duration,
    rss_kib: u64,
}

async fn timed_apply(r: &ExecNft, text: &str) -> anyhow::Result<Duration> {
    let t = Instant::now();
    r.apply(text).await.context("raw nft -f")?;
    Ok(t.elapsed())
}

fn exec(ns: &Netns) -> ExecNft {
    ExecNft::new().with_prefix(ns.prefix())
}

/// A proxier writing through `runner` over the services numbered `services`, each with
/// its first EndpointSlice, both synced; and its handle for later changes.
fn proxier(
    runner: &Recording,
    services: std::ops::Range<usize>,
) -> anyhow::Result<(NftProxier<Recording>, ProxyHandle)> {
    let mut cfg = RenderConfig::new(IpFamily::V4, "node0");
    cfg.cluster_cidr = Some("10.128.0.0/9".parse()?);
    cfg.node_ips = vec!["192.168.0.2".parse()?];
    let handle = ProxyHandle::new(ServiceState::new(IpFamily::V4, "node0"));
    for i in services {
        handle.on_service_upsert(&service(i));
        handle.on_endpoint_slice_upsert(&slice(i, 0));
    }
    handle.on_services_synced();
    handle.on_endpoint_slices_synced();
    let p = NftProxier::new(
        runner.clone(),
        cfg,
        handle.clone(),
        SyncConfig::default(),
        &Registry::new(),
    )?;
    Ok((p, handle))
}

pub async fn bench(n: usize) -> anyhow::Result<Row> {
    let tag = format!("kpnft{}-{n}", std::process::id());
    let ns_proxy = Netns::new(format!("{tag}-p"))?;
    let ns_raw = Netns::new(format!("{tag}-r"))?;
    check_support(&exec(&ns_proxy), IpFamily::V4).await?;
    let mut row = Row {
        n,
        ..Row::default()
    };
    let runner = Recording {
        inner: Some(exec(&ns_proxy)),
        all: Arc::default(),
    };
    let (mut p, handle) = proxier(&runner, 0..n)?;

    // The proxier's first sync, then two raw loads of the text it wrote into fresh
    // namespaces (the later loads of a run tend to be the faster ones: this favours raw).
    // The text is taken from the proxier, not rendered again here, so that the RSS
    // figure is the proxier's.
    let t = Instant::now();
    p.sync(false).await.context("first sync")?;
    row.full = t.elapsed();
    let steps = runner.take();
    let text = steps.concat();
    // The restart as it was: `add table; delete table; …` of everything in one transaction
    // (kept in a file, not in this process's memory, so that the RSS figure is the
    // proxier's).
    let one_transaction_file = std::env::temp_dir().join(format!("{tag}-restart.nft"));
    std::fs::write(&one_transaction_file, &text)?;
    if let Some(path) = std::env::var_os("PROXY_BENCH_DUMP") {
        std::fs::write(path, &text)?;
    }
    let raw_runner = exec(&ns_raw);
    raw_loads(&mut row, &tag, &raw_runner, &text, &steps).await?;
    drop(steps);
    drop(text);

    deltas(&mut row, &mut p, &handle, &runner, &raw_runner).await?;
    row.rss_kib = rss_kib();
    drop(p);

    restart(&mut row, &runner, &ns_proxy).await?;
    // Before: the whole table replaced in one transaction over the existing rules.
    let one_transaction = std::fs::read_to_string(&one_transaction_file)?;
    let _ = std::fs::remove_file(&one_transaction_file);
    row.raw_restart = timed_apply(&raw_runner, &one_transaction).await?;
    Ok(row)
}

/// The first sync's `text` loaded raw into a fresh namespace and into `raw_runner`'s, and
/// the proxier's own `steps` raw into another.
async fn raw_loads(
    row: &mut Row,
    tag: &str,
    raw_runner: &ExecNft,
    text: &str,
    steps: &[String],
) -> anyhow::Result<()> {
    let raw_before = {
        let ns = Netns::new(format!("{tag}-b"))?;
        timed_apply(&exec(&ns), text).await?
    };
    let raw_after = timed_apply(raw_runner, text).await?;
    // The same transactions as the proxier's, raw (the floor of writing in steps).
    row.raw_steps = if steps.len() > 1 {
        let ns = Netns::new(format!("{tag}-s"))?;
        let r = exec(&ns);
        let t = Instant::now();
        for s in steps {
            r.apply(s).await.context("raw step")?;
        }
        Some((t.elapsed(), steps.len()))
    } else {
        None
    };
    row.raw = (raw_before + raw_after) / 2;
    row.raw_first = raw_before;
    row.raw_second = raw_after;
    row.bytes = text.len();
    Ok(())
}

/// One changed EndpointSlice, event → kernel (median of 5), and the same delta raw; then
/// new Services with their slices, one at a time (median of NEW_SERVICES), each next to
/// the same delta raw.
async fn deltas(
    row: &mut Row,
    p: &mut NftProxier<Recording>,
    handle: &ProxyHandle,
    runner: &Recording,
    raw_runner: &ExecNft,
) -> anyhow::Result<()> {
    let n = row.n;
    let (mut changes, mut raw_changes) = (Vec::new(), Vec::new());
    for g in 1..=5 {
        let t = Instant::now();
        handle.on_endpoint_slice_upsert(&slice(n / 2, g));
        p.sync(false).await.context("partial sync")?;
        changes.push(t.elapsed());
        raw_changes.push(timed_apply(raw_runner, &runner.last()).await?);
    }
    changes.sort();
    raw_changes.sort();
    if std::env::var_os("PROXY_BENCH_VERBOSE").is_some() {
        println!("nftables ep change delta:\n{}", runner.last());
    }
    let (mut news, mut raw_news) = (Vec::new(), Vec::new());
    for k in 0..NEW_SERVICES {
        let t = Instant::now();
        handle.on_service_upsert(&service(n + k));
        handle.on_endpoint_slice_upsert(&slice(n + k, 0));
        p.sync(false).await.context("partial sync (new service)")?;
        news.push(t.elapsed());
        raw_news.push(timed_apply(raw_runner, &runner.last()).await?);
    }
    news.sort();
    raw_news.sort();
    row.ep_change = changes[2];
    row.raw_ep_change = raw_changes[2];
    row.new_svc = news[NEW_SERVICES / 2];
    row.raw_new_svc = raw_news[NEW_SERVICES / 2];
    Ok(())
}

/// A restart: a new proxier (no state) over the table in the proxier's namespace, with
/// what changed while it was down: service 0 gone, the slice of service n/2 back to its
/// first endpoints. Then the raw `nft list` of that table.
async fn restart(row: &mut Row, runner: &Recording, ns_proxy: &Netns) -> anyhow::Result<()> {
    let (mut p, _handle) = proxier(runner, 1..row.n + NEW_SERVICES)?;
    runner.take();
    let t = Instant::now();
    p.sync(false).await.context("sync after a restart")?;
    row.restart = t.elapsed();
    let restart_texts = runner.take();
    row.restart_steps = restart_texts.len();
    row.restart_bytes = restart_texts.iter().map(String::len).sum();
    if std::env::var_os("PROXY_BENCH_VERBOSE").is_some() {
        println!("nftables restart transactions:\n{}", restart_texts.concat());
    }
    drop(restart_texts);
    let proxy_ns = exec(ns_proxy);
    let t = Instant::now();
    proxy_ns
        .list(&["table", "ip", "kube-proxy"])
        .await
        .context("raw nft list table")?;
    row.raw_list = t.elapsed();
    Ok(())
}

pub fn print(rows: &[Row]) {
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    let ratio = |a: Duration, b: Duration| a.as_secs_f64() / b.as_secs_f64();
    println!(
        "\nnftables mode, services x 2 endpoints (raw = nft -f of the same text)\n{:>6} {:>10} {:>10} {:>6} {:>8} {:>10} {:>10} {:>6} {:>10} {:>10} {:>6} {:>7}",
        "svcs",
        "first",
        "raw",
        "ratio",
        "text",
        "ep change",
        "raw delta",
        "ratio",
        "new svc",
        "raw delta",
        "ratio",
        "RSS"
    );
    for r in rows {
        println!(
            "{:>6} {:>8.1}ms {:>8.1}ms {:>5.2}x {:>6}kB {:>8.1}ms {:>8.1}ms {:>5.2}x {:>8.1}ms {:>8.1}ms {:>5.2}x {:>5}MB",
            r.n,
            ms(r.full),
            ms(r.raw),
            ratio(r.full, r.raw),
            r.bytes / 1024,
            ms(r.ep_change),
            ms(r.raw_ep_change),
            ratio(r.ep_change, r.raw_ep_change),
            ms(r.new_svc),
            ms(r.raw_new_svc),
            ratio(r.new_svc, r.raw_new_svc),
            r.rss_kib / 1024
        );
    }
    for r in rows {
        println!(
            "{}: restart over the existing table: {:.1} ms ({} transactions, {} bytes) = {:.2}x the first sync ({:.1} ms); raw `nft list table` of it {:.1} ms; one transaction replacing it (the restart before) {:.1} ms raw",
            r.n,
            ms(r.restart),
            r.restart_steps,
            r.restart_bytes,
            ratio(r.restart, r.full),
            ms(r.full),
            ms(r.raw_list),
            ms(r.raw_restart),
        );
    }
    for r in rows {
        println!(
            "{}: raw loads {:.1} ms and {:.1} ms (raw = their mean)",
            r.n,
            ms(r.raw_first),
            ms(r.raw_second)
        );
        if let Some((d, n)) = r.raw_steps {
            println!(
                "{}: the proxier wrote the table in {n} transactions; the same {n} raw: {:.1} ms (proxier {:.2}x)",
                r.n,
                ms(d),
                ratio(r.full, d)
            );
        }
    }
}
