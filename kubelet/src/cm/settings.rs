//! How the container manager names and limits cgroups: the cgroup driver, `cpuCFSQuota`,
//! `cpuCFSQuotaPeriod`, `podPidsLimit`, `memorySwap.swapBehavior`, `singleProcessOOMKill` and
//! the `PodLevelResources` gate (`config` parses and validates them).

use serde::Serialize;

/// Which cgroup manager names pod cgroups: `cgroupfs` paths or `systemd` slices.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum CgroupDriver {
    Cgroupfs,
    Systemd,
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
