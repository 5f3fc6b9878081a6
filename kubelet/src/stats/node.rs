//! The node's own figures: CPU and memory of the root cgroup (cgroup v1 `cpuacct`/`memory`, or
//! the v2 root's `cpu.stat` and /proc/meminfo), boot time, and statvfs(2) of a directory. A
//! narrow blocking edge ([`NodeSource`]) with a fake beside it.

use std::path::{Path, PathBuf};

/// The machine's static facts (`machine_*` series and their labels).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Machine {
    pub cores: u64,
    /// Distinct (package, core) pairs of the online CPUs; 0 when sysfs does not say.
    pub physical_cores: u64,
    /// Distinct physical packages; 0 when sysfs does not say.
    pub sockets: u64,
    pub memory_bytes: u64,
    /// `SwapTotal` of /proc/meminfo.
    pub swap_bytes: u64,
    pub machine_id: String,
    pub system_uuid: String,
    pub boot_id: String,
    /// Block devices by `major:minor` → `/dev/<name>` (the `device` label of I/O series).
    pub disks: std::collections::BTreeMap<String, String>,
}

/// The CPU topology under `sys_cpu` (`/sys/devices/system/cpu`): (physical cores, sockets).
pub fn cpu_topology(sys_cpu: &Path) -> (u64, u64) {
    let mut cores = std::collections::BTreeSet::new();
    let mut sockets = std::collections::BTreeSet::new();
    let Ok(rd) = std::fs::read_dir(sys_cpu) else {
        return (0, 0);
    };
    for e in rd.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if !name
            .strip_prefix("cpu")
            .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
        {
            continue;
        }
        let topo = e.path().join("topology");
        let get = |f: &str| {
            std::fs::read_to_string(topo.join(f))
                .ok()
                .map(|s| s.trim().to_string())
        };
        if let (Some(pkg), Some(core)) = (get("physical_package_id"), get("core_id")) {
            sockets.insert(pkg.clone());
            cores.insert((pkg, core));
        }
    }
    (cores.len() as u64, sockets.len() as u64)
}

/// Whole disks under `sys_block` (`/sys/block`): `major:minor` → `/dev/<name>`, as cAdvisor
/// names the devices of its I/O series (partitions stay unnamed).
pub fn block_devices(sys_block: &Path) -> std::collections::BTreeMap<String, String> {
    let Ok(rd) = std::fs::read_dir(sys_block) else {
        return Default::default();
    };
    rd.flatten()
        .filter_map(|e| {
            let dev = std::fs::read_to_string(e.path().join("dev")).ok()?;
            let name = e.file_name().to_string_lossy().into_owned();
            Some((dev.trim().to_string(), format!("/dev/{name}")))
        })
        .collect()
}

/// The mount source (`/dev/vda1`) of the filesystem holding `path`, from a mountinfo text:
/// the mount point that is the longest prefix of `path`.
pub fn mount_source(mountinfo: &str, path: &Path) -> Option<String> {
    mountinfo
        .lines()
        .filter_map(|l| {
            let (left, right) = l.split_once(" - ")?;
            let point = left.split_whitespace().nth(4)?;
            let source = right.split_whitespace().nth(1)?;
            path.starts_with(point)
                .then(|| (point.len(), source.to_string()))
        })
        .max_by_key(|(n, _)| *n)
        .map(|(_, s)| s)
}

/// Where the cgroup hierarchies are mounted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Layout {
    /// cgroup v1: separate `memory` and `cpuacct` hierarchies (pod paths are the same in both).
    V1 { memory: PathBuf, cpuacct: PathBuf },
    /// cgroup v2: one unified hierarchy.
    V2 { root: PathBuf },
}

impl Layout {
    /// The host's layout, if a memory controller is mounted where runc puts it.
    pub fn discover() -> Option<Layout> {
        let base = Path::new("/sys/fs/cgroup");
        if base.join("memory/memory.stat").exists() {
            let cpuacct = ["cpuacct", "cpu,cpuacct"]
                .iter()
                .map(|d| base.join(d))
                .find(|p| p.join("cpuacct.usage").exists())?;
            return Some(Layout::V1 {
                memory: base.join("memory"),
                cpuacct,
            });
        }
        base.join("cgroup.controllers")
            .exists()
            .then(|| Layout::V2 { root: base.into() })
    }

    /// The hierarchy pod directories are searched in.
    pub(super) fn search_root(&self) -> &Path {
        match self {
            Layout::V1 { memory, .. } => memory,
            Layout::V2 { root } => root,
        }
    }
}

/// The root cgroup's usage at one instant.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeUsage {
    /// Cumulative CPU time of every task, nanoseconds.
    pub cpu_core_nano_seconds: Option<u64>,
    pub memory_usage_bytes: Option<u64>,
    /// Usage minus inactive file pages (cAdvisor's working set).
    pub memory_working_set_bytes: Option<u64>,
    pub memory_rss_bytes: Option<u64>,
    pub page_faults: Option<u64>,
    pub major_page_faults: Option<u64>,
    /// Total memory of the machine.
    pub memory_capacity_bytes: Option<u64>,
}

/// statvfs(2) of one filesystem.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FsInfo {
    pub capacity_bytes: u64,
    pub available_bytes: u64,
    pub used_bytes: u64,
    pub inodes: u64,
    pub inodes_free: u64,
}

/// Blocking reads of node figures (call them on the blocking pool).
pub trait NodeSource: Send + Sync + 'static {
    fn usage(&self) -> NodeUsage;
    /// Boot time, seconds since the epoch (the node's `startTime`).
    fn boot_time(&self) -> Option<i64>;
    fn fs_info(&self, path: &Path) -> Option<FsInfo>;
    /// `kernel.pid_max` and the number of processes (`rlimit`).
    fn pids(&self) -> (Option<i64>, Option<i64>);
    /// Where pods' cgroups are read; `None`: take every figure from the runtime.
    fn cgroup_layout(&self) -> Option<Layout>;
    /// `/proc` (sandboxes' network counters are read below it).
    fn proc_root(&self) -> std::path::PathBuf;
    /// The machine's static facts (read once).
    fn machine(&self) -> Machine;
}

/// The real host under `/sys/fs/cgroup` and `/proc`.
#[derive(Debug, Clone, Default)]
pub struct LinuxNode;

fn read(path: &str) -> Option<String> {
    std::fs::read_to_string(path).ok()
}

/// `key value` lines (memory.stat, cpu.stat) → the value of `key`.
pub fn stat_value(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let (k, v) = l.split_once(' ')?;
        (k == key).then(|| v.trim().parse().ok()).flatten()
    })
}

/// The cgroup v1 `cpu` controller's directory for `rel`: the `cpuacct` hierarchy when it is
/// mounted together with `cpu` (it then holds `cpu.stat`), else the sibling `cpu` hierarchy.
pub(super) fn v1_cpu_dir(cpuacct: &Path, rel: &str) -> PathBuf {
    let joined = cpuacct.join(rel);
    if joined.join("cpu.cfs_period_us").exists() {
        return joined;
    }
    cpuacct
        .parent()
        .map(|p| p.join("cpu").join(rel))
        .unwrap_or(joined)
}

/// `Key:   123 kB` lines of /proc/meminfo → bytes.
pub fn meminfo_bytes(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let rest = l.strip_prefix(key)?.strip_prefix(':')?;
        let kb: u64 = rest.split_whitespace().next()?.parse().ok()?;
        Some(kb * 1024)
    })
}

/// cgroup v1 root memory: usage, and the working set as cAdvisor computes it (usage minus
/// `total_inactive_file`, never below 0).
pub fn v1_memory(usage: u64, stat: &str) -> NodeUsage {
    let inactive = stat_value(stat, "total_inactive_file").unwrap_or(0);
    NodeUsage {
        memory_usage_bytes: Some(usage),
        memory_working_set_bytes: Some(usage.saturating_sub(inactive)),
        memory_rss_bytes: stat_value(stat, "total_rss"),
        page_faults: stat_value(stat, "total_pgfault"),
        major_page_faults: stat_value(stat, "total_pgmajfault"),
        ..NodeUsage::default()
    }
}

/// Without a root memory cgroup (v2): usage = MemTotal - MemFree, working set = usage minus
/// inactive file pages.
pub fn meminfo_memory(meminfo: &str) -> NodeUsage {
    let total = meminfo_bytes(meminfo, "MemTotal");
    let free = meminfo_bytes(meminfo, "MemFree");
    let inactive = meminfo_bytes(meminfo, "Inactive(file)").unwrap_or(0);
    let usage = total.zip(free).map(|(t, f)| t.saturating_sub(f));
    NodeUsage {
        memory_usage_bytes: usage,
        memory_working_set_bytes: usage.map(|u| u.saturating_sub(inactive)),
        ..NodeUsage::default()
    }
}

impl NodeSource for LinuxNode {
    fn usage(&self) -> NodeUsage {
        let meminfo = read("/proc/meminfo").unwrap_or_default();
        let v1_usage = read("/sys/fs/cgroup/memory/memory.usage_in_bytes")
            .and_then(|s| s.trim().parse::<u64>().ok());
        let mut u = match (v1_usage, read("/sys/fs/cgroup/memory/memory.stat")) {
            (Some(usage), Some(stat)) => v1_memory(usage, &stat),
            _ => meminfo_memory(&meminfo),
        };
        u.memory_capacity_bytes = meminfo_bytes(&meminfo, "MemTotal");
        u.cpu_core_nano_seconds = read("/sys/fs/cgroup/cpuacct/cpuacct.usage")
            .or_else(|| read("/sys/fs/cgroup/cpu,cpuacct/cpuacct.usage"))
            .and_then(|s| s.trim().parse().ok())
            .or_else(|| {
                read("/sys/fs/cgroup/cpu.stat")
                    .and_then(|s| stat_value(&s, "usage_usec"))
                    .map(|us| us * 1000)
            });
        u
    }

    fn boot_time(&self) -> Option<i64> {
        read("/proc/stat")?
            .lines()
            .find_map(|l| l.strip_prefix("btime ")?.trim().parse().ok())
    }

    fn fs_info(&self, path: &Path) -> Option<FsInfo> {
        let v = nix::sys::statvfs::statvfs(path).ok()?;
        let frag = v.fragment_size();
        let blocks = v.blocks();
        let free = v.blocks_free();
        Some(FsInfo {
            capacity_bytes: blocks * frag,
            available_bytes: v.blocks_available() * frag,
            used_bytes: blocks.saturating_sub(free) * frag,
            inodes: v.files(),
            inodes_free: v.files_free(),
        })
    }

    fn pids(&self) -> (Option<i64>, Option<i64>) {
        let max = read("/proc/sys/kernel/pid_max").and_then(|s| s.trim().parse().ok());
        let cur = read("/proc/loadavg")
            .and_then(|s| s.split_whitespace().nth(3).map(str::to_string))
            .and_then(|f| f.split_once('/').and_then(|(_, t)| t.parse().ok()));
        (max, cur)
    }

    fn cgroup_layout(&self) -> Option<Layout> {
        Layout::discover()
    }

    fn proc_root(&self) -> std::path::PathBuf {
        "/proc".into()
    }

    fn machine(&self) -> Machine {
        let h = crate::host::HostFacts::host_info(&crate::host::LinuxHost {
            root_dir: "/".into(),
        });
        let (physical_cores, sockets) = cpu_topology(Path::new("/sys/devices/system/cpu"));
        Machine {
            cores: u64::try_from(h.cpus).unwrap_or(0),
            physical_cores,
            sockets,
            memory_bytes: u64::try_from(h.memory_bytes).unwrap_or(0),
            swap_bytes: read("/proc/meminfo")
                .and_then(|m| meminfo_bytes(&m, "SwapTotal"))
                .unwrap_or(0),
            machine_id: h.machine_id,
            system_uuid: h.system_uuid,
            boot_id: h.boot_id,
            disks: block_devices(Path::new("/sys/block")),
        }
    }
}

/// A node whose figures tests set.
#[cfg(any(test, feature = "test-util"))]
#[derive(Debug, Default)]
pub struct FakeNode {
    pub usage: std::sync::Mutex<NodeUsage>,
    /// The filesystem of every path not below a key of `fs_at`.
    pub fs: FsInfo,
    /// Filesystems mounted at these paths (the longest matching key holds a path).
    pub fs_at: std::collections::HashMap<std::path::PathBuf, FsInfo>,
    pub boot_time: i64,
    /// A cgroup tree the test built (`None`: every figure from the runtime).
    pub cgroups: Option<Layout>,
    /// Where `<pid>/net/dev` files are.
    pub proc_root: std::path::PathBuf,
    pub machine: Machine,
}

#[cfg(any(test, feature = "test-util"))]
impl NodeSource for FakeNode {
    fn usage(&self) -> NodeUsage {
        self.usage.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
    fn boot_time(&self) -> Option<i64> {
        Some(self.boot_time)
    }
    fn fs_info(&self, path: &Path) -> Option<FsInfo> {
        let mount = self
            .fs_at
            .iter()
            .filter(|(m, _)| path.starts_with(m))
            .max_by_key(|(m, _)| m.as_os_str().len());
        Some(mount.map_or(self.fs, |(_, fs)| *fs))
    }
    fn pids(&self) -> (Option<i64>, Option<i64>) {
        (Some(4_194_304), Some(100))
    }
    fn cgroup_layout(&self) -> Option<Layout> {
        self.cgroups.clone()
    }
    fn proc_root(&self) -> std::path::PathBuf {
        self.proc_root.clone()
    }
    fn machine(&self) -> Machine {
        self.machine.clone()
    }
}
