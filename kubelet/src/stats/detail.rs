//! What cAdvisor reads of a cgroup beyond its usage (the `cgroups` module): CFS throttling,
//! the limits it runs under (cAdvisor's container "spec"), memory details, OOM kills, block
//! I/O per device and pressure stall information (PSI). Read from the same cgroup files
//! libcontainer reads, for cgroup v1 and v2; a file the kernel does not offer leaves its
//! figure out (PSI exists on cgroup v2 only, as upstream reads it). Blocking: call on the
//! blocking pool.

use super::node::{Layout, stat_value, v1_cpu_dir};
use super::summary::{PsiData, PsiStats};
use std::path::Path;

/// CFS bandwidth control (`cpu.stat`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Cfs {
    pub periods: u64,
    pub throttled_periods: u64,
    pub throttled_ns: u64,
    /// Periods in which the cgroup used its burst allowance, and the time it bursted (0 on a
    /// kernel without CFS burst, as libcontainer reads it).
    pub burst_periods: u64,
    pub burst_ns: u64,
}

/// The limits of a cgroup, as cAdvisor's container spec: `None` where the file is missing;
/// an unlimited memory figure is `u64::MAX` (cAdvisor serves it as 0).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Spec {
    pub cpu_period: Option<u64>,
    /// 0: no quota.
    pub cpu_quota: Option<u64>,
    pub cpu_shares: Option<u64>,
    pub memory_limit: Option<u64>,
    pub memory_reservation: Option<u64>,
    pub memory_swap_limit: Option<u64>,
}

/// Memory figures beyond usage and working set.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MemoryDetail {
    pub cache: Option<u64>,
    pub swap: Option<u64>,
    pub failcnt: Option<u64>,
    pub mapped_file: Option<u64>,
    pub max_usage: Option<u64>,
    /// `pgfault` / `pgmajfault` of `memory.stat` (cAdvisor serves the same figure for its
    /// `container` and `hierarchy` scopes).
    pub pgfault: Option<u64>,
    pub pgmajfault: Option<u64>,
    /// `memory.kmem.usage_in_bytes` (cgroup v1; cgroup v2 has no such counter: 0).
    pub kernel_usage: Option<u64>,
    /// `total_active_file` / `total_inactive_file` (v1), `active_file` / `inactive_file` (v2).
    pub active_file: Option<u64>,
    pub inactive_file: Option<u64>,
}

/// One block device's I/O (`major:minor`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeviceIo {
    pub device: String,
    pub read_bytes: u64,
    pub write_bytes: u64,
    pub reads: u64,
    pub writes: u64,
}

/// Pressure stall information of the cgroup, per resource.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Psi {
    pub cpu: Option<PsiStats>,
    pub memory: Option<PsiStats>,
    pub io: Option<PsiStats>,
}

/// Everything [`read`] found for one cgroup.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Detail {
    pub cfs: Option<Cfs>,
    /// CPU time in user and in kernel mode, nanoseconds (`cpuacct.stat` / `cpu.stat`).
    pub cpu_user_ns: Option<u64>,
    pub cpu_system_ns: Option<u64>,
    pub spec: Spec,
    pub memory: MemoryDetail,
    /// The cgroup's `oom_kill` counter.
    pub oom_kills: Option<u64>,
    /// By `major:minor`, in the order the kernel lists them.
    pub io: Vec<DeviceIo>,
    pub psi: Psi,
    /// Processes, descriptors and threads: read beside the rest by the caller, which knows
    /// the cgroup's kind (see [`super::procs`]).
    pub processes: super::procs::Processes,
}

/// libcontainer's clock ticks per second for `cpuacct.stat` (USER_HZ, 100 on Linux).
const CLOCK_TICKS: u64 = 100;

fn read(p: &Path) -> Option<String> {
    std::fs::read_to_string(p).ok()
}

fn read_u64(p: &Path) -> Option<u64> {
    read(p)?.trim().parse().ok()
}

/// A v2 limit file: `max` is unlimited.
fn read_limit(p: &Path) -> Option<u64> {
    let s = read(p)?;
    match s.trim() {
        "max" => Some(u64::MAX),
        v => v.parse().ok(),
    }
}

/// The figures of the cgroup at `rel` (a path like `/kubepods/pod<uid>`; `/` for the root).
pub fn read_detail(layout: &Layout, rel: &str) -> Detail {
    let rel = rel.trim_start_matches('/');
    match layout {
        Layout::V1 { memory, cpuacct } => {
            let cpu = v1_cpu_dir(cpuacct, rel);
            let mem = memory.join(rel);
            let stat = read(&mem.join("memory.stat")).unwrap_or_default();
            let cfs = read(&cpu.join("cpu.stat")).and_then(|s| {
                Some(Cfs {
                    periods: stat_value(&s, "nr_periods")?,
                    throttled_periods: stat_value(&s, "nr_throttled")?,
                    throttled_ns: stat_value(&s, "throttled_time")?,
                    burst_periods: stat_value(&s, "nr_bursts").unwrap_or(0),
                    burst_ns: stat_value(&s, "burst_time").unwrap_or(0),
                })
            });
            // `-1`: no quota (cAdvisor's 0).
            let quota =
                read(&cpu.join("cpu.cfs_quota_us")).map(|s| s.trim().parse::<u64>().unwrap_or(0));
            let usage = read_u64(&mem.join("memory.usage_in_bytes"));
            let memsw = read_u64(&mem.join("memory.memsw.usage_in_bytes"));
            let swap = match (memsw, usage) {
                (Some(sw), Some(u)) => Some(sw.saturating_sub(u)),
                _ => stat_value(&stat, "total_swap"),
            };
            let blkio = memory
                .parent()
                .map(|p| p.join("blkio").join(rel))
                .unwrap_or_default();
            let ticks = read(&cpuacct.join(rel).join("cpuacct.stat")).unwrap_or_default();
            let ticks_ns = |key| stat_value(&ticks, key).map(|t| t * 1_000_000_000 / CLOCK_TICKS);
            Detail {
                cfs,
                cpu_user_ns: ticks_ns("user"),
                cpu_system_ns: ticks_ns("system"),
                spec: Spec {
                    cpu_period: read_u64(&cpu.join("cpu.cfs_period_us")),
                    cpu_quota: quota,
                    cpu_shares: read_u64(&cpu.join("cpu.shares")),
                    memory_limit: read_u64(&mem.join("memory.limit_in_bytes")),
                    memory_reservation: read_u64(&mem.join("memory.soft_limit_in_bytes")),
                    memory_swap_limit: read_u64(&mem.join("memory.memsw.limit_in_bytes")),
                },
                memory: MemoryDetail {
                    cache: stat_value(&stat, "total_cache"),
                    swap,
                    failcnt: read_u64(&mem.join("memory.failcnt")),
                    mapped_file: stat_value(&stat, "total_mapped_file"),
                    max_usage: read_u64(&mem.join("memory.max_usage_in_bytes")),
                    pgfault: stat_value(&stat, "pgfault"),
                    pgmajfault: stat_value(&stat, "pgmajfault"),
                    kernel_usage: read_u64(&mem.join("memory.kmem.usage_in_bytes")),
                    active_file: stat_value(&stat, "total_active_file"),
                    inactive_file: stat_value(&stat, "total_inactive_file"),
                },
                oom_kills: read(&mem.join("memory.oom_control"))
                    .and_then(|s| stat_value(&s, "oom_kill")),
                io: v1_io(&blkio),
                // cgroup v1 has no pressure files upstream reads.
                psi: Psi::default(),
                processes: Default::default(),
            }
        }
        Layout::V2 { root } => {
            let dir = root.join(rel);
            let stat = read(&dir.join("memory.stat")).unwrap_or_default();
            let events = read(&dir.join("memory.events")).unwrap_or_default();
            let cpu_stat = read(&dir.join("cpu.stat")).unwrap_or_default();
            let usec_ns = |key| stat_value(&cpu_stat, key).map(|us| us.saturating_mul(1000));
            let cfs = Some(cpu_stat.as_str()).and_then(|s| {
                Some(Cfs {
                    periods: stat_value(s, "nr_periods")?,
                    throttled_periods: stat_value(s, "nr_throttled")?,
                    throttled_ns: stat_value(s, "throttled_usec")?.saturating_mul(1000),
                    burst_periods: stat_value(s, "nr_bursts").unwrap_or(0),
                    burst_ns: stat_value(s, "burst_usec")
                        .unwrap_or(0)
                        .saturating_mul(1000),
                })
            });
            let (quota, period) = read(&dir.join("cpu.max"))
                .map(|s| cpu_max(&s))
                .unwrap_or((None, None));
            // The root cgroup has no memory.max: cAdvisor reads its limits as absent.
            Detail {
                cfs,
                cpu_user_ns: usec_ns("user_usec"),
                cpu_system_ns: usec_ns("system_usec"),
                spec: Spec {
                    cpu_period: period,
                    cpu_quota: quota,
                    cpu_shares: read_u64(&dir.join("cpu.weight")).map(weight_to_shares),
                    memory_limit: read_limit(&dir.join("memory.max")),
                    memory_reservation: read_limit(&dir.join("memory.min")),
                    memory_swap_limit: read_limit(&dir.join("memory.swap.max")),
                },
                memory: MemoryDetail {
                    cache: stat_value(&stat, "file"),
                    swap: read_u64(&dir.join("memory.swap.current")),
                    failcnt: stat_value(&events, "max"),
                    mapped_file: stat_value(&stat, "file_mapped"),
                    max_usage: read_u64(&dir.join("memory.peak")),
                    pgfault: stat_value(&stat, "pgfault"),
                    pgmajfault: stat_value(&stat, "pgmajfault"),
                    kernel_usage: None,
                    active_file: stat_value(&stat, "active_file"),
                    inactive_file: stat_value(&stat, "inactive_file"),
                },
                oom_kills: stat_value(&events, "oom_kill"),
                io: read(&dir.join("io.stat"))
                    .map(|s| io_stat(&s))
                    .unwrap_or_default(),
                psi: psi_of(&dir),
                processes: Default::default(),
            }
        }
    }
}

fn psi_of(dir: &Path) -> Psi {
    Psi {
        cpu: read(&dir.join("cpu.pressure")).and_then(|s| pressure(&s)),
        memory: read(&dir.join("memory.pressure")).and_then(|s| pressure(&s)),
        io: read(&dir.join("io.pressure")).and_then(|s| pressure(&s)),
    }
}

/// Only the pressure files of the cgroup at `rel` (what the Summary needs of [`read_detail`]
/// every refresh; cgroup v1 has none upstream reads).
pub fn read_psi(layout: &Layout, rel: &str) -> Psi {
    match layout {
        Layout::V1 { .. } => Psi::default(),
        Layout::V2 { root } => psi_of(&root.join(rel.trim_start_matches('/'))),
    }
}

/// `cpu.max` (`<quota|max> <period>`) → (quota, 0 when `max`; period).
pub fn cpu_max(s: &str) -> (Option<u64>, Option<u64>) {
    let mut f = s.split_whitespace();
    let quota = f.next().map(|q| q.parse().unwrap_or(0));
    let period = f.next().and_then(|p| p.parse().ok());
    (quota, period)
}

/// `cpu.weight` [1, 10000] → cgroup v1 shares [2, 262144] (the inverse of runc's conversion).
pub fn weight_to_shares(w: u64) -> u64 {
    2 + (w.clamp(1, 10_000) - 1) * 262_142 / 9_999
}

/// cgroup v1 blkio: bytes and operations per device, from the recursive files (the throttle
/// policy's when the CFQ/BFQ ones are absent or empty, as libcontainer falls back).
fn v1_io(dir: &Path) -> Vec<DeviceIo> {
    let pick = |name: &str| {
        read(&dir.join(format!("blkio.{name}")))
            .filter(|s| s.lines().any(|l| l.contains(':')))
            .or_else(|| read(&dir.join(format!("blkio.throttle.{name}"))))
            .unwrap_or_default()
    };
    blkio(
        &pick("io_service_bytes_recursive"),
        &pick("io_serviced_recursive"),
    )
}

/// Two blkio files (`8:0 Read 123` lines) → per device figures.
pub fn blkio(bytes: &str, ops: &str) -> Vec<DeviceIo> {
    let mut out: Vec<DeviceIo> = Vec::new();
    let mut add = |text: &str, is_bytes: bool| {
        for l in text.lines() {
            let mut f = l.split_whitespace();
            let (Some(dev), Some(op), Some(v)) = (f.next(), f.next(), f.next()) else {
                continue;
            };
            let Ok(v) = v.parse::<u64>() else { continue };
            if !dev.contains(':') {
                continue;
            }
            let i = match out.iter().position(|d| d.device == dev) {
                Some(i) => i,
                None => {
                    out.push(DeviceIo {
                        device: dev.to_string(),
                        ..DeviceIo::default()
                    });
                    out.len() - 1
                }
            };
            let d = &mut out[i];
            match (op, is_bytes) {
                ("Read", true) => d.read_bytes = v,
                ("Write", true) => d.write_bytes = v,
                ("Read", false) => d.reads = v,
                ("Write", false) => d.writes = v,
                _ => {}
            }
        }
    };
    add(bytes, true);
    add(ops, false);
    out
}

/// cgroup v2 `io.stat` (`8:0 rbytes=1 wbytes=2 rios=3 wios=4 …`) → per device figures.
pub fn io_stat(text: &str) -> Vec<DeviceIo> {
    text.lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let dev = f.next().filter(|d| d.contains(':'))?;
            let mut d = DeviceIo {
                device: dev.to_string(),
                ..DeviceIo::default()
            };
            for kv in f {
                let Some((k, v)) = kv.split_once('=') else {
                    continue;
                };
                let v = v.parse().unwrap_or(0);
                match k {
                    "rbytes" => d.read_bytes = v,
                    "wbytes" => d.write_bytes = v,
                    "rios" => d.reads = v,
                    "wios" => d.writes = v,
                    _ => {}
                }
            }
            Some(d)
        })
        .collect()
}

/// A `*.pressure` file → its `some` and `full` lines (a kernel without `full` for CPU gives
/// zeros there, as libcontainer does); `None` when neither line parses.
pub fn pressure(text: &str) -> Option<PsiStats> {
    let line = |kind: &str| -> Option<PsiData> {
        let l = text
            .lines()
            .find_map(|l| l.strip_prefix(kind)?.strip_prefix(' '))?;
        let mut d = PsiData::default();
        for kv in l.split_whitespace() {
            let (k, v) = kv.split_once('=')?;
            match k {
                "avg10" => d.avg10 = v.parse().ok()?,
                "avg60" => d.avg60 = v.parse().ok()?,
                "avg300" => d.avg300 = v.parse().ok()?,
                "total" => d.total = v.parse().ok()?,
                _ => {}
            }
        }
        Some(d)
    };
    let some = line("some");
    let full = line("full");
    if some.is_none() && full.is_none() {
        return None;
    }
    Some(PsiStats {
        some: some.unwrap_or_default(),
        full: full.unwrap_or_default(),
    })
}

/// One interface's counters from `/proc/<pid>/net/dev`, as cAdvisor reports them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct IfaceCounters {
    pub name: String,
    pub rx_bytes: u64,
    pub rx_packets: u64,
    pub rx_errors: u64,
    pub rx_dropped: u64,
    pub tx_bytes: u64,
    pub tx_packets: u64,
    pub tx_errors: u64,
    pub tx_dropped: u64,
}

/// `/proc/<pid>/net/dev` → every interface but `lo`, every counter cAdvisor serves.
pub fn net_counters(text: &str) -> Vec<IfaceCounters> {
    text.lines()
        .skip(2)
        .filter_map(|l| {
            let (name, rest) = l.split_once(':')?;
            let name = name.trim();
            if name == "lo" || name.is_empty() {
                return None;
            }
            let f: Vec<u64> = rest
                .split_whitespace()
                .map(|v| v.parse().unwrap_or(0))
                .collect();
            (f.len() >= 12).then(|| IfaceCounters {
                name: name.to_string(),
                rx_bytes: f[0],
                rx_packets: f[1],
                rx_errors: f[2],
                rx_dropped: f[3],
                tx_bytes: f[8],
                tx_packets: f[9],
                tx_errors: f[10],
                tx_dropped: f[11],
            })
        })
        .collect()
}

#[cfg(test)]
mod tests;
