//! The stats provider's settings: `volumeStatsAggPeriod` and the cgroups of the Summary's
//! `node.systemContainers` (`--kubelet-cgroups` / `kubeletCgroups`, `--runtime-cgroups`,
//! `--system-cgroups` / `systemCgroups`, the flag over the file, and where the pod cgroups
//! live).

use super::system::SystemCgroups;
use crate::settings::resolve::dur;
use crate::settings::{ConfigError, Flags, KubeletConfiguration};
use plumbing::duration;
use serde::Serialize;
use std::time::Duration;

/// The stats provider's settings, validated.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Settings {
    /// `volumeStatsAggPeriod` (default 1m; `0s` means the default, as upstream's defaulting):
    /// how often volumes' and log directories' usage is measured.
    #[serde(with = "duration::serde_opt_plain")]
    pub volume_stats_agg_period: Duration,
    /// The cgroups of the Summary's `node.systemContainers`.
    #[serde(skip)]
    pub system_cgroups: SystemCgroups,
}

/// Flags over the file over upstream's defaults; `cgroup_root` and `per_qos` (the container
/// manager's) place the pod cgroups.
pub fn resolve(
    flags: &Flags,
    file: &KubeletConfiguration,
    cgroup_root: &str,
    per_qos: bool,
) -> Result<Settings, ConfigError> {
    Ok(Settings {
        volume_stats_agg_period: dur(
            "volumeStatsAggPeriod",
            &None,
            file.volume_stats_agg_period,
            super::DEFAULT_VOLUME_STATS_AGG_PERIOD,
        )?,
        system_cgroups: system_cgroups(flags, file, cgroup_root, per_qos),
    })
}

/// The system containers' cgroups; `cgroup_root` and `per_qos` place the pod cgroup root.
pub fn system_cgroups(
    flags: &Flags,
    file: &KubeletConfiguration,
    cgroup_root: &str,
    per_qos: bool,
) -> SystemCgroups {
    let text = |v: &Option<serde_json::Value>| {
        v.as_ref()
            .and_then(|v| v.as_str())
            .map(str::to_string)
            .filter(|s| !s.is_empty())
    };
    let flag = |v: &Option<String>| v.clone().filter(|s| !s.is_empty());
    let root = cgroup_root.trim_end_matches('/');
    let pods = if per_qos {
        // cgroupfs: `<root>/kubepods`; systemd: `kubepods.slice` (the driver is known only
        // once the runtime answers: the one that exists is read).
        vec![format!("{root}/kubepods"), "/kubepods.slice".to_string()]
    } else {
        vec![if root.is_empty() {
            "/".into()
        } else {
            root.to_string()
        }]
    };
    SystemCgroups {
        kubelet: flag(&flags.kubelet_cgroups).or_else(|| text(&file.kubelet_cgroups)),
        runtime: flag(&flags.runtime_cgroups),
        misc: flag(&flags.extra.system_cgroups).or_else(|| text(&file.system_cgroups)),
        pods,
    }
}

#[cfg(test)]
mod tests;
