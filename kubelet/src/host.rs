//! Facts about the node itself: memory, CPUs, the OS, the filesystem under the root dir. One
//! place every subsystem reads them from (node status, capacity and allocatable, the container manager).

/// Total memory of the node in bytes, from /proc/meminfo.
pub fn memory_capacity() -> i64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find(|l| l.starts_with("MemTotal:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<i64>().ok())
        })
        .map(|kb| kb * 1024)
        .unwrap_or(0)
}

/// Page size in bytes → bytes of pre-allocated huge pages, from
/// `/sys/kernel/mm/hugepages/hugepages-<N>kB/nr_hugepages` (empty without huge pages).
pub fn hugepages() -> std::collections::BTreeMap<u64, i64> {
    hugepages_under(std::path::Path::new("/sys/kernel/mm/hugepages"))
}

pub fn hugepages_under(dir: &std::path::Path) -> std::collections::BTreeMap<u64, i64> {
    let mut out = std::collections::BTreeMap::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let name = e.file_name().to_string_lossy().to_string();
        let Some(kb) = name
            .strip_prefix("hugepages-")
            .and_then(|n| n.strip_suffix("kB"))
            .and_then(|n| n.parse::<u64>().ok())
        else {
            continue;
        };
        let pages = std::fs::read_to_string(e.path().join("nr_hugepages"))
            .ok()
            .and_then(|t| t.trim().parse::<i64>().ok())
            .unwrap_or(0);
        out.insert(kb * 1024, pages.saturating_mul(kb as i64 * 1024));
    }
    out
}

/// Whether SELinux is enabled on the host (its filesystem is mounted and the kernel reports
/// an enforcing mode), as upstream's `selinux.GetEnabled` decides whether mounts are relabeled.
pub fn selinux_enabled() -> bool {
    std::path::Path::new("/sys/fs/selinux/enforce").exists()
}

/// The node's huge page sizes in bytes.
pub fn hugepage_sizes() -> Vec<u64> {
    hugepages().into_keys().collect()
}

/// The node's process limit as upstream's pid limits: min(kernel.pid_max, kernel.threads-max).
pub fn pid_capacity() -> Option<i64> {
    let read = |p: &str| {
        std::fs::read_to_string(p)
            .ok()
            .and_then(|t| t.trim().parse::<i64>().ok())
    };
    match (
        read("/proc/sys/kernel/pid_max"),
        read("/proc/sys/kernel/threads-max"),
    ) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// SwapTotal from /proc/meminfo in bytes (0 without swap).
pub fn swap_capacity() -> i64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find(|l| l.starts_with("SwapTotal:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<i64>().ok())
        })
        .map(|kb| kb * 1024)
        .unwrap_or(0)
}

/// Facts about the host that go into the Node's status.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct HostInfo {
    pub machine_id: String,
    pub system_uuid: String,
    pub boot_id: String,
    pub kernel_version: String,
    pub os_image: String,
    pub cpus: i64,
    pub memory_bytes: i64,
    /// Capacity of the filesystem holding the kubelet's root dir.
    pub ephemeral_storage_bytes: Option<i64>,
    /// Page size → bytes of pre-allocated huge pages.
    pub hugepages: std::collections::BTreeMap<u64, i64>,
}

/// Where host facts come from (blocking reads: call it off the async workers).
pub trait HostFacts: Send + Sync + 'static {
    fn host_info(&self) -> HostInfo;
}

/// The real host: /etc, /proc, /sys and statvfs(2) for the root dir's filesystem.
#[derive(Debug, Clone)]
pub struct LinuxHost {
    pub root_dir: std::path::PathBuf,
}

fn read_trim(path: &str) -> String {
    std::fs::read_to_string(path)
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

/// `PRETTY_NAME` from os-release text (upstream's osImage).
pub fn os_image(os_release: &str) -> String {
    os_release
        .lines()
        .find_map(|l| l.strip_prefix("PRETTY_NAME="))
        .map(|v| v.trim().trim_matches('"').to_string())
        .unwrap_or_else(|| "Linux".into())
}

impl HostFacts for LinuxHost {
    fn host_info(&self) -> HostInfo {
        let os = std::fs::read_to_string("/etc/os-release")
            .or_else(|_| std::fs::read_to_string("/usr/lib/os-release"))
            .unwrap_or_default();
        let dir = if self.root_dir.exists() {
            self.root_dir.clone()
        } else {
            "/".into()
        };
        // statvfs(2) on the root dir's filesystem: its size, as upstream's capacity (no
        // child process).
        let storage = nix::sys::statvfs::statvfs(&dir).ok().and_then(|v| {
            let bytes = u128::from(v.blocks()) * u128::from(v.fragment_size());
            i64::try_from(bytes).ok()
        });
        HostInfo {
            machine_id: read_trim("/etc/machine-id"),
            system_uuid: read_trim("/sys/class/dmi/id/product_uuid"),
            boot_id: read_trim("/proc/sys/kernel/random/boot_id"),
            kernel_version: read_trim("/proc/sys/kernel/osrelease"),
            os_image: os_image(&os),
            cpus: std::thread::available_parallelism()
                .map(|n| n.get() as i64)
                .unwrap_or(1),
            memory_bytes: memory_capacity(),
            ephemeral_storage_bytes: storage,
            hugepages: hugepages(),
        }
    }
}
