//! `/metrics/cadvisor`: a documented subset of the series cAdvisor exposes through the kubelet,
//! with cAdvisor's names, help texts, units and the labels the kubelet's handler sets
//! (`container`, `id`, `image`, `name`, `namespace`, `pod`; label names sorted, as the Go
//! client prints them). Rendered from the same snapshot as `/stats/summary`.
//!
//! Series: `container_cpu_usage_seconds_total` (`cpu="total"`), `container_memory_usage_bytes`,
//! `container_memory_working_set_bytes`, `container_memory_rss`, `container_memory_cache`,
//! `container_network_{receive,transmit}_{bytes,errors}_total` (per `interface`, on the pod's
//! series), `container_start_time_seconds`, `container_scrape_error`, `machine_cpu_cores`,
//! `machine_memory_bytes`. Each exists for the root cgroup (`id="/"`, other labels empty), each
//! pod cgroup (`container=""`, `image=""`, `name=""`) and each running container (`name` = the
//! runtime's container ID). Usage samples carry the millisecond timestamp of their reading.
//! Not served: per-CPU, throttling, fs/disk I/O, `container_fs_*`, `container_spec_*`,
//! tasks/process series, and the pause container's own series.

use super::cgroups::Ids;
pub use super::node::Machine;
use super::resource::Family;
use super::summary::{CpuStats, MemoryStats, NetworkStats, Summary};
use std::collections::HashMap;
use std::fmt::Write;

/// What the series need beyond the Summary.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Meta {
    /// Container ID → its image (as the runtime lists it).
    pub images: HashMap<String, String>,
    /// Pods' and containers' cgroup names (the `id` label).
    pub cgroups: Ids,
    /// cgroup name → page cache bytes (`container_memory_cache`).
    pub memory_cache: HashMap<String, u64>,
    pub machine: Machine,
}

/// The label set of one cgroup's series, in the Go client's (sorted) order.
struct Labels<'a> {
    container: &'a str,
    id: &'a str,
    image: &'a str,
    name: &'a str,
    namespace: &'a str,
    pod: &'a str,
}

impl<'a> Labels<'a> {
    /// The base labels with `extra` (one label) inserted at its sorted place.
    fn with(&self, extra: Option<(&'a str, &'a str)>) -> Vec<(&'a str, &'a str)> {
        let mut v = vec![
            ("container", self.container),
            ("id", self.id),
            ("image", self.image),
            ("name", self.name),
            ("namespace", self.namespace),
            ("pod", self.pod),
        ];
        if let Some(e) = extra {
            let at = v.iter().position(|(k, _)| *k > e.0).unwrap_or(v.len());
            v.insert(at, e);
        }
        v
    }
}

struct Families {
    cpu: Family,
    cache: Family,
    rss: Family,
    usage: Family,
    working_set: Family,
    rx_bytes: Family,
    rx_errors: Family,
    tx_bytes: Family,
    tx_errors: Family,
    start: Family,
}

impl Families {
    fn new() -> Self {
        let c = "counter";
        let g = "gauge";
        Self {
            cpu: Family::new(
                "container_cpu_usage_seconds_total",
                c,
                "Cumulative cpu time consumed in seconds.",
            ),
            cache: Family::new(
                "container_memory_cache",
                g,
                "Number of bytes of page cache memory.",
            ),
            rss: Family::new("container_memory_rss", g, "Size of RSS in bytes."),
            usage: Family::new(
                "container_memory_usage_bytes",
                g,
                "Current memory usage in bytes, including all memory regardless of when it was accessed",
            ),
            working_set: Family::new(
                "container_memory_working_set_bytes",
                g,
                "Current working set in bytes.",
            ),
            rx_bytes: Family::new(
                "container_network_receive_bytes_total",
                c,
                "Cumulative count of bytes received",
            ),
            rx_errors: Family::new(
                "container_network_receive_errors_total",
                c,
                "Cumulative count of errors encountered while receiving",
            ),
            tx_bytes: Family::new(
                "container_network_transmit_bytes_total",
                c,
                "Cumulative count of bytes transmitted",
            ),
            tx_errors: Family::new(
                "container_network_transmit_errors_total",
                c,
                "Cumulative count of errors encountered while transmitting",
            ),
            start: Family::new(
                "container_start_time_seconds",
                g,
                "Start time of the container since unix epoch in seconds.",
            ),
        }
    }

    fn cpu_mem(
        &mut self,
        l: &Labels,
        cpu: Option<&CpuStats>,
        mem: Option<&MemoryStats>,
        cache: Option<u64>,
    ) {
        if let Some(c) = cpu
            && let Some(ns) = c.usage_core_nano_seconds
        {
            let ts = Some(c.time.millis());
            self.cpu
                .push(&l.with(Some(("cpu", "total"))), ns as f64 / 1e9, ts);
        }
        if let Some(m) = mem {
            let ts = Some(m.time.millis());
            for (f, v) in [
                (&mut self.usage, m.usage_bytes),
                (&mut self.working_set, m.working_set_bytes),
                (&mut self.rss, m.rss_bytes),
                (&mut self.cache, cache),
            ] {
                if let Some(v) = v {
                    f.push(&l.with(None), v as f64, ts);
                }
            }
        }
    }

    fn network(&mut self, l: &Labels, n: Option<&NetworkStats>) {
        let Some(n) = n else { return };
        let ts = Some(n.time.millis());
        for i in &n.interfaces {
            let labels = l.with(Some(("interface", i.name.as_str())));
            for (f, v) in [
                (&mut self.rx_bytes, i.rx_bytes),
                (&mut self.rx_errors, i.rx_errors),
                (&mut self.tx_bytes, i.tx_bytes),
                (&mut self.tx_errors, i.tx_errors),
            ] {
                if let Some(v) = v {
                    f.push(&labels, v as f64, ts);
                }
            }
        }
    }

    fn start(&mut self, l: &Labels, ms: i64) {
        if ms > 0 {
            self.start.push(&l.with(None), ms as f64 / 1000.0, None);
        }
    }
}

/// The exposition text; `error`: the refresh failed (`container_scrape_error` 1, no series).
pub fn render(s: &Summary, meta: &Meta, error: bool) -> String {
    let mut f = Families::new();
    if !error {
        let root = Labels {
            container: "",
            id: "/",
            image: "",
            name: "",
            namespace: "",
            pod: "",
        };
        f.cpu_mem(&root, s.node.cpu.as_ref(), s.node.memory.as_ref(), None);
        for p in &s.pods {
            let (ns, pod) = (p.pod_ref.namespace.as_str(), p.pod_ref.name.as_str());
            let pod_cg = meta
                .cgroups
                .pods
                .get(&p.pod_ref.uid)
                .map(String::as_str)
                .unwrap_or("");
            let l = Labels {
                container: "",
                id: pod_cg,
                image: "",
                name: "",
                namespace: ns,
                pod,
            };
            let cache = meta.memory_cache.get(pod_cg).copied();
            f.cpu_mem(&l, p.cpu.as_ref(), p.memory.as_ref(), cache);
            f.network(&l, p.network.as_ref());
            f.start(&l, p.start_time.millis());
            for c in &p.containers {
                let cg = meta
                    .cgroups
                    .containers
                    .get(&c.id)
                    .map(String::as_str)
                    .unwrap_or("");
                let l = Labels {
                    container: &c.name,
                    id: cg,
                    image: meta.images.get(&c.id).map(String::as_str).unwrap_or(""),
                    name: &c.id,
                    namespace: ns,
                    pod,
                };
                let cache = meta.memory_cache.get(cg).copied();
                f.cpu_mem(&l, c.cpu.as_ref(), c.memory.as_ref(), cache);
                f.start(&l, c.start_time.millis());
            }
        }
    }
    let mut out = String::new();
    for fam in [
        &mut f.cpu,
        &mut f.cache,
        &mut f.rss,
        &mut f.usage,
        &mut f.working_set,
        &mut f.rx_bytes,
        &mut f.rx_errors,
        &mut f.tx_bytes,
        &mut f.tx_errors,
    ] {
        fam.sort();
        fam.render(&mut out);
    }
    let _ = writeln!(
        out,
        "# HELP container_scrape_error 1 if there was an error while getting container metrics, 0 otherwise\n# TYPE container_scrape_error gauge\ncontainer_scrape_error {}",
        u8::from(error)
    );
    f.start.sort();
    f.start.render(&mut out);
    if !error {
        let m = &meta.machine;
        let labels = [
            ("boot_id", m.boot_id.as_str()),
            ("machine_id", m.machine_id.as_str()),
            ("system_uuid", m.system_uuid.as_str()),
        ];
        let mut cores = Family::new("machine_cpu_cores", "gauge", "Number of logical CPU cores.");
        cores.push(&labels, m.cores as f64, None);
        cores.render(&mut out);
        let mut mem = Family::new(
            "machine_memory_bytes",
            "gauge",
            "Amount of memory installed on the machine.",
        );
        mem.push(&labels, m.memory_bytes as f64, None);
        mem.render(&mut out);
    }
    out
}
