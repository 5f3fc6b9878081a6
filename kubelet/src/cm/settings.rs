//! How the container manager names cgroups: the cgroup driver. How pod and container cgroups
//! are limited (`cpuCFSQuota`, `cpuCFSQuotaPeriod`, `podPidsLimit`, `memorySwap.swapBehavior`,
//! `singleProcessOOMKill`, the `PodLevelResources` gate) is part of the node-wide settings
//! pods are rendered with (`node_settings`), re-exported here. [`resolve`] reads them with the
//! cgroup driver and root, `cgroupsPerQOS`, the reservations and eviction thresholds
//! (`node_resources`) from the flags over the config file, validated as upstream.

use crate::settings::resolve::invalid;
use crate::settings::{ConfigError, Flags, KubeletConfiguration};
use serde::Serialize;

pub mod node_resources;
pub mod pod_limits;

/// Which cgroup manager names pod cgroups: `cgroupfs` paths or `systemd` slices.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum CgroupDriver {
    Cgroupfs,
    Systemd,
}

pub use crate::node_settings::{DEFAULT_CFS_PERIOD_US, PodLimits, SwapBehavior};

/// The container manager's settings, validated: the cgroup driver and root, the QoS tiers,
/// reservations and eviction thresholds, pod and container limits.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Settings {
    pub cgroup_driver: CgroupDriver,
    pub cgroup_root: String,
    pub cgroups_per_qos: bool,
    /// Reservations, node allocatable enforcement and eviction thresholds.
    pub resources: super::NodeResources,
    /// cpuCFSQuota, cpuCFSQuotaPeriod, podPidsLimit, memorySwap.swapBehavior.
    pub pod_limits: PodLimits,
}

/// Flags over the file over upstream's defaults.
pub fn resolve(flags: &Flags, file: &KubeletConfiguration) -> Result<Settings, ConfigError> {
    let cgroup_driver = match (flags.cgroup_driver.clone())
        .or(file.cgroup_driver.clone())
        .as_deref()
        .unwrap_or("cgroupfs")
    {
        "cgroupfs" => CgroupDriver::Cgroupfs,
        "systemd" => CgroupDriver::Systemd,
        other => {
            return Err(invalid(format!(
                "cgroupDriver: {other:?} is not supported: want \"cgroupfs\" or \"systemd\""
            )));
        }
    };
    let cgroup_root = (flags.cgroup_root.clone())
        .or(file.cgroup_root.clone())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "/".into());
    if !cgroup_root.starts_with('/') {
        return Err(invalid(format!(
            "cgroupRoot: {cgroup_root:?} must be an absolute path"
        )));
    }
    Ok(Settings {
        cgroup_driver,
        cgroup_root,
        cgroups_per_qos: flags
            .cgroups_per_qos
            .or(file.cgroups_per_qos)
            .unwrap_or(true),
        resources: node_resources::parse(flags, file)?,
        pod_limits: pod_limits::parse(flags, file)?,
    })
}
