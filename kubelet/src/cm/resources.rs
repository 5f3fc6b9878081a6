//! Node resource settings: `kubeReserved`, `systemReserved`, `reservedSystemCPUs`,
//! `enforceNodeAllocatable` with its cgroups, and the eviction thresholds. The container manager
//! computes allocatable from them and the eviction manager acts on the thresholds; `config`
//! parses and validates them.

use plumbing::duration;
use serde::Serialize;
use std::time::Duration;

/// Amounts held back from pods (`kubeReserved` / `systemReserved`); absent keys are 0.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Reserved {
    pub cpu_millis: i64,
    pub memory_bytes: i64,
    pub ephemeral_storage_bytes: i64,
    pub pids: i64,
}

/// An eviction signal, by upstream's name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub enum Signal {
    #[serde(rename = "memory.available")]
    MemoryAvailable,
    #[serde(rename = "allocatableMemory.available")]
    AllocatableMemoryAvailable,
    #[serde(rename = "nodefs.available")]
    NodeFsAvailable,
    #[serde(rename = "nodefs.inodesFree")]
    NodeFsInodesFree,
    #[serde(rename = "imagefs.available")]
    ImageFsAvailable,
    #[serde(rename = "imagefs.inodesFree")]
    ImageFsInodesFree,
    #[serde(rename = "containerfs.available")]
    ContainerFsAvailable,
    #[serde(rename = "containerfs.inodesFree")]
    ContainerFsInodesFree,
    #[serde(rename = "pid.available")]
    PidAvailable,
}

impl Signal {
    pub const ALL: [Signal; 9] = [
        Signal::MemoryAvailable,
        Signal::AllocatableMemoryAvailable,
        Signal::NodeFsAvailable,
        Signal::NodeFsInodesFree,
        Signal::ImageFsAvailable,
        Signal::ImageFsInodesFree,
        Signal::ContainerFsAvailable,
        Signal::ContainerFsInodesFree,
        Signal::PidAvailable,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Signal::MemoryAvailable => "memory.available",
            Signal::AllocatableMemoryAvailable => "allocatableMemory.available",
            Signal::NodeFsAvailable => "nodefs.available",
            Signal::NodeFsInodesFree => "nodefs.inodesFree",
            Signal::ImageFsAvailable => "imagefs.available",
            Signal::ImageFsInodesFree => "imagefs.inodesFree",
            Signal::ContainerFsAvailable => "containerfs.available",
            Signal::ContainerFsInodesFree => "containerfs.inodesFree",
            Signal::PidAvailable => "pid.available",
        }
    }
}

/// A threshold's amount: a quantity in the signal's unit (bytes, inodes, pids) or a fraction
/// of capacity (`10%` → 0.1).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub enum Amount {
    Quantity(i128),
    Fraction(f32),
}

impl Amount {
    /// The amount in the signal's unit for a resource of this capacity.
    pub fn of_capacity(self, capacity: i128) -> i128 {
        match self {
            Amount::Quantity(q) => q,
            Amount::Fraction(f) => (f64::from(f) * capacity as f64) as i128,
        }
    }
}

/// One eviction threshold: the signal is met when what is available falls below `value`.
/// A zero `grace_period` makes it a hard threshold.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Threshold {
    pub signal: Signal,
    pub value: Amount,
    #[serde(with = "duration::serde_opt_plain")]
    pub grace_period: Duration,
    pub min_reclaim: Option<Amount>,
}

impl Threshold {
    pub fn is_hard(&self) -> bool {
        self.grace_period.is_zero()
    }
}

/// The eviction manager's settings.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Eviction {
    /// Hard thresholds first, then soft ones, then the allocatable copy of a hard
    /// memory.available (upstream's ParseThresholdConfig order).
    pub thresholds: Vec<Threshold>,
    #[serde(with = "duration::serde_opt_plain")]
    pub pressure_transition_period: Duration,
    /// `evictionMaxPodGracePeriod` in seconds (0: soft evictions use the pod's own period,
    /// capped by nothing; upstream's behaviour).
    pub max_pod_grace_period: i64,
}

/// Upstream's `evictionHard` default on Linux.
pub const DEFAULT_EVICTION_HARD: [(&str, &str); 5] = [
    ("memory.available", "100Mi"),
    ("nodefs.available", "10%"),
    ("nodefs.inodesFree", "5%"),
    ("imagefs.available", "15%"),
    ("imagefs.inodesFree", "5%"),
];

/// What `enforceNodeAllocatable` may name.
pub const ENFORCE_KEYS: [&str; 6] = [
    "pods",
    "system-reserved",
    "kube-reserved",
    "system-reserved-compressible",
    "kube-reserved-compressible",
    "none",
];

/// Every node resource setting.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeResources {
    pub kube_reserved: Reserved,
    /// With `reservedSystemCPUs` set, its CPU count replaces `systemReserved.cpu` (upstream).
    pub system_reserved: Reserved,
    /// `reservedSystemCPUs` as given (a cpuset list such as `0-1,6`).
    #[serde(rename = "reservedSystemCPUs")]
    pub reserved_system_cpus: Option<String>,
    pub enforce_node_allocatable: Vec<String>,
    pub kube_reserved_cgroup: Option<String>,
    pub system_reserved_cgroup: Option<String>,
    pub eviction: Eviction,
}

impl NodeResources {
    /// Whether `enforceNodeAllocatable` names `key`.
    pub fn enforces(&self, key: &str) -> bool {
        self.enforce_node_allocatable.iter().any(|k| k == key)
    }
}
