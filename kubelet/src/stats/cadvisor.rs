//! `/metrics/cadvisor`: the series cAdvisor exposes through the kubelet (the metric sets the
//! kubelet enables), with cAdvisor's names, help texts, types and units and the labels the
//! kubelet's handler sets (`container`, `id`, `image`, `name`, `namespace`, `pod`; label
//! names sorted, as the Go client prints them; families in name order). Rendered from the
//! same snapshot as `/stats/summary`.
//!
//! Each series exists for the root cgroup (`id="/"`, other labels empty), each pod cgroup
//! (`container=""`, `image=""`, `name=""`) and each running container (`name` = the runtime's
//! container ID), where its source was read:
//! - CPU: `container_cpu_usage_seconds_total` (`cpu="total"`),
//!   `container_cpu_{user,system}_seconds_total`, and with a CFS quota
//!   `container_cpu_cfs_{periods,throttled_periods,throttled_seconds,burst_periods,
//!   burst_seconds}_total`; `container_cpu_load_average_10s`,
//!   `container_cpu_load_d_average_10s` and `container_tasks_state` (`state`) are 0, as the
//!   kubelet's cAdvisor serves them without its load reader;
//! - memory: `container_memory_{usage_bytes,working_set_bytes,rss,cache,swap,mapped_file,
//!   max_usage_bytes,failcnt,kernel_usage,total_active_file_bytes,
//!   total_inactive_file_bytes}`, `container_memory_failures_total` (`failure_type`
//!   `pgfault`/`pgmajfault`, `scope` `container`/`hierarchy`: the same `memory.stat` figure,
//!   as cAdvisor); `container_oom_events_total` (the cgroup's `oom_kill` counter);
//! - processes: `container_{processes,file_descriptors,sockets,threads,threads_max}`,
//!   `container_ulimits_soft` (`ulimit="max_open_files"`, containers only), see
//!   [`super::procs`];
//! - `container_last_seen`, `container_health_state` (-1: no health check);
//! - limits: `container_spec_cpu_{period,quota,shares}`,
//!   `container_spec_memory_{limit,reservation_limit,swap_limit}_bytes` (unlimited is 0);
//! - block I/O per `device`: `container_fs_{reads,writes}_bytes_total`,
//!   `container_fs_{reads,writes}_total`; filesystems of the root cgroup (the node's and the
//!   image filesystem) per `device`: `container_fs_{usage,limit}_bytes`,
//!   `container_fs_inodes_{free,total}`;
//! - network per `interface` on the pod's series: `container_network_{receive,transmit}_
//!   {bytes,packets,packets_dropped,errors}_total`;
//! - PSI (cgroup v2 only; absent where the kernel has no pressure files):
//!   `container_pressure_{cpu,memory,io}_{stalled,waiting}_seconds_total`;
//! - `container_start_time_seconds`, `container_scrape_error`;
//! - the machine: `machine_cpu_cores`, `machine_cpu_physical_cores`, `machine_cpu_sockets`,
//!   `machine_memory_bytes`, `machine_swap_bytes`, `machine_scrape_error`.
//!
//! Usage samples carry the millisecond timestamp of their reading; spec, start and machine
//! samples none, as cAdvisor's. Not served: per-CPU usage (the kubelet does not enable it),
//! the block device series beyond bytes and operations (`container_fs_sector_*`,
//! `container_fs_*_merged_total`, `container_fs_*_seconds_total`, `container_fs_io_*`,
//! `container_blkio_device_usage_total`), NVM/DIMM machine series, and the pause
//! containers' own series.

use super::cgroups::Ids;
use super::detail::{Detail, IfaceCounters};
use super::node::FsInfo;
pub use super::node::Machine;
use super::resource::Family;
use super::summary::{CpuStats, MemoryStats, NetworkStats, PsiStats, StatTime, Summary};
use std::collections::{BTreeMap, HashMap};

/// What the series need beyond the Summary.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Meta {
    /// Container ID → its image (as the runtime lists it).
    pub images: HashMap<String, String>,
    /// Pods' and containers' cgroup names (the `id` label).
    pub cgroups: Ids,
    /// cgroup name (`/` for the root) → what was read of it beyond usage (read when the
    /// series are first asked for, see [`super::Snapshot::cadvisor_meta`]).
    pub details: HashMap<String, Detail>,
    /// When `details` were read, if not at `time`.
    pub details_time: Option<StatTime>,
    /// Pod UID → its interfaces' counters.
    pub network: HashMap<String, Vec<IfaceCounters>>,
    /// The root cgroup's filesystems: (device, figures).
    pub fs: Vec<(String, FsInfo)>,
    /// When `details`, `network` and `fs` were read.
    pub time: StatTime,
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
        self.with_all(extra.as_slice())
    }

    /// The base labels with each of `extra` inserted at its sorted place.
    fn with_all(&self, extra: &[(&'a str, &'a str)]) -> Vec<(&'a str, &'a str)> {
        let mut v = vec![
            ("container", self.container),
            ("id", self.id),
            ("image", self.image),
            ("name", self.name),
            ("namespace", self.namespace),
            ("pod", self.pod),
        ];
        for e in extra {
            let at = v.iter().position(|(k, _)| *k > e.0).unwrap_or(v.len());
            v.insert(at, *e);
        }
        v
    }
}

mod families;
use families::FAMILIES;

/// The names of every family `/metrics/cadvisor` can serve (for the docs' test).
pub fn family_names() -> impl Iterator<Item = &'static str> {
    FAMILIES.iter().map(|(n, _, _)| *n)
}

/// A memory figure cAdvisor calls unlimited (above 2^62, the kernel's rounding of "max").
fn spec_memory(v: u64) -> f64 {
    if v > 1 << 62 { 0.0 } else { v as f64 }
}

/// The families being filled, by name (rendered in name order, as the Go registry gathers).
struct Out {
    fams: BTreeMap<&'static str, Family>,
    /// The network and filesystem readings' time (ms).
    ts: Option<i64>,
    /// The detail readings' time (ms).
    detail_ts: Option<i64>,
}

impl Out {
    fn new(ts: Option<i64>, detail_ts: Option<i64>) -> Self {
        Self {
            fams: FAMILIES
                .iter()
                .map(|&(n, k, h)| (n, Family::new(n, k, h)))
                .collect(),
            ts,
            detail_ts,
        }
    }

    fn push(&mut self, name: &str, labels: &[(&str, &str)], v: f64, ts: Option<i64>) {
        if let Some(f) = self.fams.get_mut(name) {
            f.push(labels, v, ts);
        }
    }

    fn cpu_mem(&mut self, l: &Labels, cpu: Option<&CpuStats>, mem: Option<&MemoryStats>) {
        if let Some(c) = cpu
            && let Some(ns) = c.usage_core_nano_seconds
        {
            let ts = Some(c.time.millis());
            self.push(
                "container_cpu_usage_seconds_total",
                &l.with(Some(("cpu", "total"))),
                ns as f64 / 1e9,
                ts,
            );
        }
        if let Some(m) = mem {
            let ts = Some(m.time.millis());
            for (f, v) in [
                ("container_memory_usage_bytes", m.usage_bytes),
                ("container_memory_working_set_bytes", m.working_set_bytes),
                ("container_memory_rss", m.rss_bytes),
            ] {
                if let Some(v) = v {
                    self.push(f, &l.with(None), v as f64, ts);
                }
            }
        }
    }

    /// The cgroup's figures beyond usage; `disks` names I/O devices (unnamed ones are left
    /// out: their series would not be told apart).
    fn detail(&mut self, l: &Labels, d: &Detail, disks: &BTreeMap<String, String>) {
        let ts = self.detail_ts;
        let base = l.with(None);
        let s = &d.spec;
        let quota = s.cpu_quota.filter(|q| *q != 0);
        if let (Some(_), Some(c)) = (quota, d.cfs) {
            self.push(
                "container_cpu_cfs_periods_total",
                &base,
                c.periods as f64,
                ts,
            );
            self.push(
                "container_cpu_cfs_throttled_periods_total",
                &base,
                c.throttled_periods as f64,
                ts,
            );
            self.push(
                "container_cpu_cfs_throttled_seconds_total",
                &base,
                c.throttled_ns as f64 / 1e9,
                ts,
            );
            self.push(
                "container_cpu_cfs_burst_periods_total",
                &base,
                c.burst_periods as f64,
                ts,
            );
            self.push(
                "container_cpu_cfs_burst_seconds_total",
                &base,
                c.burst_ns as f64 / 1e9,
                ts,
            );
        }
        self.seen(l, d);
        let m = &d.memory;
        for (f, v) in [
            ("container_memory_cache", m.cache),
            ("container_memory_swap", m.swap),
            ("container_memory_mapped_file", m.mapped_file),
            ("container_memory_max_usage_bytes", m.max_usage),
            ("container_memory_failcnt", m.failcnt),
            ("container_oom_events_total", d.oom_kills),
        ] {
            if let Some(v) = v {
                self.push(f, &base, v as f64, ts);
            }
        }
        // The spec: no timestamp, as cAdvisor's.
        if let Some(p) = s.cpu_period {
            self.push("container_spec_cpu_period", &base, p as f64, None);
            if let Some(q) = quota {
                self.push("container_spec_cpu_quota", &base, q as f64, None);
            }
            if let Some(sh) = s.cpu_shares {
                self.push("container_spec_cpu_shares", &base, sh as f64, None);
            }
        }
        if let Some(limit) = s.memory_limit {
            for (f, v) in [
                ("container_spec_memory_limit_bytes", limit),
                (
                    "container_spec_memory_reservation_limit_bytes",
                    s.memory_reservation.unwrap_or(0),
                ),
                (
                    "container_spec_memory_swap_limit_bytes",
                    s.memory_swap_limit.unwrap_or(0),
                ),
            ] {
                self.push(f, &base, spec_memory(v), None);
            }
        }
        for io in &d.io {
            let Some(dev) = disks.get(&io.device) else {
                continue;
            };
            let labels = l.with(Some(("device", dev.as_str())));
            for (f, v) in [
                ("container_fs_reads_bytes_total", io.read_bytes),
                ("container_fs_writes_bytes_total", io.write_bytes),
                ("container_fs_reads_total", io.reads),
                ("container_fs_writes_total", io.writes),
            ] {
                self.push(f, &labels, v as f64, ts);
            }
        }
        for (kind, psi) in [
            ("cpu", &d.psi.cpu),
            ("memory", &d.psi.memory),
            ("io", &d.psi.io),
        ] {
            let Some(PsiStats { full, some }) = psi else {
                continue;
            };
            // The kernel's totals are microseconds.
            self.push(
                &format!("container_pressure_{kind}_stalled_seconds_total"),
                &base,
                full.total as f64 / 1e6,
                ts,
            );
            self.push(
                &format!("container_pressure_{kind}_waiting_seconds_total"),
                &base,
                some.total as f64 / 1e6,
                ts,
            );
        }
    }

    /// What cAdvisor serves of every cgroup it knows beyond usage and limits: when it was
    /// last seen (the reading's time), its health (-1: no health check, as for every
    /// container the kubelet's cAdvisor watches), the CPU time split, the load figures (0:
    /// the kubelet runs cAdvisor without its load reader), memory details and the process
    /// figures (a figure the kernel does not offer is 0, as cAdvisor's).
    fn seen(&mut self, l: &Labels, d: &Detail) {
        let ts = self.detail_ts;
        let base = l.with(None);
        if let Some(ms) = ts {
            self.push("container_last_seen", &base, ms.div_euclid(1000) as f64, ts);
        }
        self.push("container_health_state", &base, -1.0, ts);
        for (f, v) in [
            ("container_cpu_user_seconds_total", d.cpu_user_ns),
            ("container_cpu_system_seconds_total", d.cpu_system_ns),
        ] {
            if let Some(ns) = v {
                self.push(f, &base, ns as f64 / 1e9, ts);
            }
        }
        self.push("container_cpu_load_average_10s", &base, 0.0, ts);
        self.push("container_cpu_load_d_average_10s", &base, 0.0, ts);
        for state in [
            "iowaiting",
            "running",
            "sleeping",
            "stopped",
            "uninterruptible",
        ] {
            self.push(
                "container_tasks_state",
                &l.with(Some(("state", state))),
                0.0,
                ts,
            );
        }
        let m = &d.memory;
        let stat_read = m.pgfault.is_some()
            || m.active_file.is_some()
            || m.inactive_file.is_some()
            || m.cache.is_some();
        if stat_read {
            for (f, v) in [
                ("container_memory_kernel_usage", m.kernel_usage),
                ("container_memory_total_active_file_bytes", m.active_file),
                (
                    "container_memory_total_inactive_file_bytes",
                    m.inactive_file,
                ),
            ] {
                self.push(f, &base, v.unwrap_or(0) as f64, ts);
            }
            for (kind, v) in [("pgfault", m.pgfault), ("pgmajfault", m.pgmajfault)] {
                for scope in ["container", "hierarchy"] {
                    self.push(
                        "container_memory_failures_total",
                        &l.with_all(&[("failure_type", kind), ("scope", scope)]),
                        v.unwrap_or(0) as f64,
                        ts,
                    );
                }
            }
        }
        let p = &d.processes;
        for (f, v) in [
            ("container_processes", p.processes),
            ("container_file_descriptors", p.fds),
            ("container_sockets", p.sockets),
            ("container_threads", p.threads),
            ("container_threads_max", p.threads_max),
        ] {
            self.push(f, &base, v as f64, ts);
        }
        if let Some(v) = p.max_open_files {
            self.push(
                "container_ulimits_soft",
                &l.with(Some(("ulimit", "max_open_files"))),
                v as f64,
                ts,
            );
        }
    }

    /// Per interface: the full counters read in this refresh, else the Summary's (the
    /// runtime's: bytes and errors only).
    fn network(&mut self, l: &Labels, full: Option<&Vec<IfaceCounters>>, n: Option<&NetworkStats>) {
        if let Some(ifaces) = full {
            let ts = self.ts;
            for i in ifaces {
                let labels = l.with(Some(("interface", i.name.as_str())));
                for (f, v) in [
                    ("container_network_receive_bytes_total", i.rx_bytes),
                    ("container_network_receive_packets_total", i.rx_packets),
                    ("container_network_receive_errors_total", i.rx_errors),
                    (
                        "container_network_receive_packets_dropped_total",
                        i.rx_dropped,
                    ),
                    ("container_network_transmit_bytes_total", i.tx_bytes),
                    ("container_network_transmit_packets_total", i.tx_packets),
                    ("container_network_transmit_errors_total", i.tx_errors),
                    (
                        "container_network_transmit_packets_dropped_total",
                        i.tx_dropped,
                    ),
                ] {
                    self.push(f, &labels, v as f64, ts);
                }
            }
            return;
        }
        let Some(n) = n else { return };
        let ts = Some(n.time.millis());
        for i in &n.interfaces {
            let labels = l.with(Some(("interface", i.name.as_str())));
            for (f, v) in [
                ("container_network_receive_bytes_total", i.rx_bytes),
                ("container_network_receive_errors_total", i.rx_errors),
                ("container_network_transmit_bytes_total", i.tx_bytes),
                ("container_network_transmit_errors_total", i.tx_errors),
            ] {
                if let Some(v) = v {
                    self.push(f, &labels, v as f64, ts);
                }
            }
        }
    }

    fn start(&mut self, l: &Labels, ms: i64) {
        if ms > 0 {
            self.push(
                "container_start_time_seconds",
                &l.with(None),
                ms as f64 / 1000.0,
                None,
            );
        }
    }

    fn root_fs(&mut self, l: &Labels, fs: &[(String, FsInfo)]) {
        let ts = self.ts;
        for (dev, f) in fs {
            let labels = l.with(Some(("device", dev.as_str())));
            for (name, v) in [
                ("container_fs_inodes_free", f.inodes_free),
                ("container_fs_inodes_total", f.inodes),
                ("container_fs_limit_bytes", f.capacity_bytes),
                ("container_fs_usage_bytes", f.used_bytes),
            ] {
                self.push(name, &labels, v as f64, ts);
            }
        }
    }
}

/// The exposition text; `error`: the refresh failed (`container_scrape_error` 1, no series).
pub fn render(s: &Summary, meta: &Meta, error: bool) -> String {
    let ts = (meta.time.0 != 0).then(|| meta.time.millis());
    let detail_ts = meta.details_time.map(|t| t.millis()).or(ts);
    let mut out = Out::new(ts, detail_ts);
    let disks = &meta.machine.disks;
    if !error {
        let root = Labels {
            container: "",
            id: "/",
            image: "",
            name: "",
            namespace: "",
            pod: "",
        };
        out.cpu_mem(&root, s.node.cpu.as_ref(), s.node.memory.as_ref());
        if let Some(d) = meta.details.get("/") {
            out.detail(&root, d, disks);
        }
        out.root_fs(&root, &meta.fs);
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
            out.cpu_mem(&l, p.cpu.as_ref(), p.memory.as_ref());
            if let Some(d) = meta.details.get(pod_cg).filter(|_| !pod_cg.is_empty()) {
                out.detail(&l, d, disks);
            }
            out.network(&l, meta.network.get(&p.pod_ref.uid), p.network.as_ref());
            out.start(&l, p.start_time.millis());
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
                out.cpu_mem(&l, c.cpu.as_ref(), c.memory.as_ref());
                if let Some(d) = meta.details.get(cg).filter(|_| !cg.is_empty()) {
                    out.detail(&l, d, disks);
                }
                out.start(&l, c.start_time.millis());
            }
        }
        let m = &meta.machine;
        let labels = [
            ("boot_id", m.boot_id.as_str()),
            ("machine_id", m.machine_id.as_str()),
            ("system_uuid", m.system_uuid.as_str()),
        ];
        for (f, v) in [
            ("machine_cpu_cores", m.cores),
            ("machine_cpu_physical_cores", m.physical_cores),
            ("machine_cpu_sockets", m.sockets),
            ("machine_memory_bytes", m.memory_bytes),
            ("machine_swap_bytes", m.swap_bytes),
        ] {
            out.push(f, &labels, v as f64, None);
        }
        out.push("machine_scrape_error", &[], 0.0, None);
    }
    out.push(
        "container_scrape_error",
        &[],
        f64::from(u8::from(error)),
        None,
    );
    let mut text = String::new();
    for f in out.fams.values_mut() {
        f.sort();
        f.render(&mut text);
    }
    text
}

#[cfg(test)]
mod tests;
