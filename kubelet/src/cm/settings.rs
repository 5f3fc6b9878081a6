//! How the container manager names cgroups: the cgroup driver. How pod and container cgroups
//! are limited (`cpuCFSQuota`, `cpuCFSQuotaPeriod`, `podPidsLimit`, `memorySwap.swapBehavior`,
//! `singleProcessOOMKill`, the `PodLevelResources` gate) is part of the node-wide settings
//! pods are rendered with (`node_settings`), re-exported here (`config` parses and validates
//! them).

use serde::Serialize;

/// Which cgroup manager names pod cgroups: `cgroupfs` paths or `systemd` slices.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum CgroupDriver {
    Cgroupfs,
    Systemd,
}

pub use crate::node_settings::{DEFAULT_CFS_PERIOD_US, PodLimits, SwapBehavior};
