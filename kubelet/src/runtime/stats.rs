//! Resource usage as the CRI reports it (`ListContainerStats`, `ListPodSandboxStats`,
//! `ImageFsInfo`), in plain types. Every figure is optional, as the CRI's `UInt64Value`s are.

/// CPU usage at one instant (`CpuUsage`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CpuUsage {
    /// Nanoseconds since the epoch.
    pub timestamp: i64,
    pub usage_core_nano_seconds: Option<u64>,
    pub usage_nano_cores: Option<u64>,
}

/// Memory usage at one instant (`MemoryUsage`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MemoryUsage {
    pub timestamp: i64,
    pub working_set_bytes: Option<u64>,
    pub available_bytes: Option<u64>,
    pub usage_bytes: Option<u64>,
    pub rss_bytes: Option<u64>,
    pub page_faults: Option<u64>,
    pub major_page_faults: Option<u64>,
}

/// Usage of one filesystem (`FilesystemUsage`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FsUsage {
    pub timestamp: i64,
    /// The filesystem's mountpoint (`FilesystemIdentifier.mountpoint`).
    pub mountpoint: String,
    pub used_bytes: Option<u64>,
    pub inodes_used: Option<u64>,
}

/// Traffic of one network interface (`NetworkInterfaceUsage`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct InterfaceUsage {
    pub name: String,
    pub rx_bytes: Option<u64>,
    pub rx_errors: Option<u64>,
    pub tx_bytes: Option<u64>,
    pub tx_errors: Option<u64>,
}

/// A sandbox's network usage (`NetworkUsage`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NetworkUsage {
    pub timestamp: i64,
    pub default_interface: Option<InterfaceUsage>,
    pub interfaces: Vec<InterfaceUsage>,
}

/// One container's usage (`ContainerStats`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ContainerStats {
    pub id: String,
    /// The container's name (its metadata).
    pub name: String,
    pub labels: std::collections::BTreeMap<String, String>,
    pub cpu: Option<CpuUsage>,
    pub memory: Option<MemoryUsage>,
    pub writable_layer: Option<FsUsage>,
}

/// One sandbox's usage (`PodSandboxStats`, Linux part).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SandboxStats {
    pub id: String,
    pub name: String,
    pub namespace: String,
    pub uid: String,
    pub cpu: Option<CpuUsage>,
    pub memory: Option<MemoryUsage>,
    pub network: Option<NetworkUsage>,
    pub process_count: Option<u64>,
    pub containers: Vec<ContainerStats>,
}

/// The runtime's image filesystems (`ImageFsInfoResponse`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ImageFsInfo {
    pub image_filesystems: Vec<FsUsage>,
    pub container_filesystems: Vec<FsUsage>,
}
