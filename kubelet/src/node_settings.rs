//! The node-wide settings pods are rendered with (node name and IPs, DNS, directories,
//! capacities, cgroup limits, runtime features), and the pod directories they place: one
//! value built at start (`app::pods`) and read by the CRI config builder (`spec`), pod
//! directories, volumes and the pod worker.

use serde::Serialize;
use std::collections::BTreeMap;
use std::path::PathBuf;

use k8s_openapi::api::core::v1::Pod;

/// The container restart back-off's cap (`crashLoopBackOff.maxContainerRestartPeriod`;
/// upstream's 5 minutes by default).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RestartBackoffMax(pub std::time::Duration);

impl Default for RestartBackoffMax {
    fn default() -> Self {
        Self(std::time::Duration::from_secs(300))
    }
}

/// Node-wide settings the specs are rendered with.
#[derive(Debug, Clone, Default)]
pub struct NodeSettings {
    pub node_name: String,
    pub host_ips: Vec<String>,
    pub cluster_dns: Vec<String>,
    pub cluster_domain: String,
    /// The host's resolv.conf, already parsed.
    pub host_dns: DnsConfig,
    pub pod_logs_dir: PathBuf,
    pub root_dir: PathBuf,
    pub memory_capacity: i64,
    /// `seccompDefault`: containers without a seccomp profile get `RuntimeDefault`.
    pub seccomp_default: bool,
    /// CFS quota and period, swap behaviour for container resources.
    pub pod_limits: PodLimits,
    /// The node's huge page sizes in bytes (each container gets a limit for every one).
    pub hugepage_sizes: Vec<u64>,
    /// The node uses the unified cgroup v2 hierarchy.
    pub cgroup_v2: bool,
    /// SwapTotal in bytes (LimitedSwap shares it out).
    pub swap_capacity: i64,
    /// How long a crashing container's restarts may be held back at most.
    pub restart_backoff_max: RestartBackoffMax,
    /// SELinux is enabled on the host: mounts of managed volumes ask the runtime to relabel.
    pub selinux_enabled: bool,
    /// The runtime mounts images as volumes (CRI `Mount.image`), so image volumes work.
    pub image_volumes: bool,
    /// The runtime's name and version, as its Version call gave them (for messages).
    pub runtime_version: String,
    /// The node's allocatable, as in its status: what a downward API `limits.*` of a
    /// container without that limit reads.
    pub allocatable: BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>,
}

/// The pod's log directory: `<podLogsDir>/<namespace>_<name>_<uid>`.
pub fn pod_log_dir(node: &NodeSettings, pod: &Pod) -> PathBuf {
    node.pod_logs_dir.join(format!(
        "{}_{}_{}",
        pod.metadata.namespace.as_deref().unwrap_or("default"),
        pod.metadata.name.as_deref().unwrap_or(""),
        pod.metadata.uid.as_deref().unwrap_or("")
    ))
}

/// The pod's state directory: `<root-dir>/pods/<uid>`.
pub fn pod_dir(node: &NodeSettings, uid: &str) -> PathBuf {
    node.root_dir.join("pods").join(uid)
}

/// DNS settings written into the sandbox's resolv.conf.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DnsConfig {
    pub servers: Vec<String>,
    pub searches: Vec<String>,
    pub options: Vec<String>,
}

/// Upstream's default CFS period (`cpuCFSQuotaPeriod` 100ms), in microseconds.
pub const DEFAULT_CFS_PERIOD_US: u64 = 100_000;

/// `memorySwap.swapBehavior`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub enum SwapBehavior {
    /// Containers get no swap (upstream's default).
    #[default]
    NoSwap,
    /// Burstable containers get swap in proportion to their memory request (cgroup v2 only).
    LimitedSwap,
}

/// How pod and container cgroups are limited.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PodLimits {
    /// `cpuCFSQuota`: CPU limits become CFS quota (default true).
    #[serde(rename = "cpuCFSQuota")]
    pub cpu_cfs_quota: bool,
    /// `cpuCFSQuotaPeriod` in microseconds (100000 unless the feature gate allows another).
    #[serde(rename = "cpuCFSQuotaPeriodMicros")]
    pub cpu_cfs_period_us: u64,
    /// `podPidsLimit`: a positive value becomes each pod cgroup's pids.max; 0 and -1 leave
    /// it unlimited.
    pub pod_pids_limit: i64,
    pub swap_behavior: SwapBehavior,
    /// The `PodLevelResources` feature gate (on unless set false): `spec.resources` counts
    /// for QoS, pod cgroups, container limits, admission and eviction.
    pub pod_level_resources: bool,
    /// `singleProcessOOMKill` as set (None: unset). On cgroup v2, unless it is true, each
    /// container cgroup gets `memory.oom.group` 1: an OOM kills the whole container, as
    /// upstream. Explicitly false on cgroup v1 stops the start.
    pub single_process_oom_kill: Option<bool>,
}

impl Default for PodLimits {
    fn default() -> Self {
        Self {
            cpu_cfs_quota: true,
            cpu_cfs_period_us: DEFAULT_CFS_PERIOD_US,
            pod_pids_limit: -1,
            swap_behavior: SwapBehavior::NoSwap,
            pod_level_resources: true,
            single_process_oom_kill: None,
        }
    }
}
