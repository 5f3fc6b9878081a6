//! The settings the container manager writes pod and container limits with: `cpuCFSQuota`,
//! `cpuCFSQuotaPeriod` (only with the `CustomCPUCFSQuotaPeriod` feature gate, as upstream),
//! `podPidsLimit`, `memorySwap.swapBehavior`, `singleProcessOOMKill` and the
//! `PodLevelResources` gate. Pure; validated as upstream's ValidateKubeletConfiguration.

use crate::node_settings::{DEFAULT_CFS_PERIOD_US, PodLimits, SwapBehavior};
use crate::settings::resolve::{gate_or, invalid};
use crate::settings::{ConfigError, Flags, KubeletConfiguration};
use plumbing::duration;
use std::time::Duration;

fn gate(flags: &Flags, file: &KubeletConfiguration, name: &str) -> bool {
    gate_or(flags, file, name, false)
}

/// Reads the four settings: the deprecated flags `--cpu-cfs-quota`, `--cpu-cfs-quota-period`
/// and `--pod-max-pids` over the file's fields, as upstream (flag values are already parsed
/// with pflag's syntax).
pub fn parse(flags: &Flags, file: &KubeletConfiguration) -> Result<PodLimits, ConfigError> {
    let mut out = PodLimits {
        pod_level_resources: gate_or(flags, file, crate::podspec::POD_LEVEL_RESOURCES_GATE, true),
        ..PodLimits::default()
    };
    match (&flags.cpu_cfs_quota, &file.cpu_cfs_quota) {
        (Some(b), _) => out.cpu_cfs_quota = *b,
        (None, None | Some(serde_json::Value::Null)) => {}
        (None, Some(serde_json::Value::Bool(b))) => out.cpu_cfs_quota = *b,
        (None, Some(other)) => {
            return Err(invalid(format!("cpuCFSQuota: {other} is not a boolean")));
        }
    }
    let period = match (&flags.cpu_cfs_quota_period, &file.cpu_cfs_quota_period) {
        (Some(d), _) => Some(*d),
        (None, None | Some(serde_json::Value::Null)) => None,
        (None, Some(serde_json::Value::String(s))) => Some(
            duration::parse(s).map_err(|e| invalid(format!("cpuCFSQuotaPeriod: {s:?}: {e}")))?,
        ),
        (None, Some(other)) => {
            return Err(invalid(format!(
                "cpuCFSQuotaPeriod: {other} is not a duration"
            )));
        }
    };
    if let Some(d) = period {
        let text = duration::format(d);
        if d != Duration::from_micros(DEFAULT_CFS_PERIOD_US)
            && !gate(flags, file, "CustomCPUCFSQuotaPeriod")
        {
            return Err(invalid(format!(
                "cpuCFSQuotaPeriod (--cpu-cfs-quota-period) {{{text}}} requires feature gate CustomCPUCFSQuotaPeriod"
            )));
        }
        if d < Duration::from_millis(1) || d > Duration::from_secs(1) {
            return Err(invalid(format!(
                "cpuCFSQuotaPeriod (--cpu-cfs-quota-period) {{{text}}} must be between 1ms and 1sec, inclusive"
            )));
        }
        out.cpu_cfs_period_us = d.as_micros() as u64;
    }
    match (flags.pod_max_pids, &file.pod_pids_limit) {
        (Some(n), _) => out.pod_pids_limit = n,
        (None, None | Some(serde_json::Value::Null)) => {}
        (None, Some(v)) => {
            out.pod_pids_limit = v
                .as_i64()
                .ok_or_else(|| invalid(format!("podPidsLimit: {v} is not an integer")))?;
        }
    }
    out.single_process_oom_kill = match &file.single_process_oom_kill {
        None | Some(serde_json::Value::Null) => None,
        Some(serde_json::Value::Bool(b)) => Some(*b),
        Some(other) => {
            return Err(invalid(format!(
                "singleProcessOOMKill: {other} is not a boolean"
            )));
        }
    };
    let behavior = file
        .memory_swap
        .as_ref()
        .and_then(|m| m.get("swapBehavior"))
        .filter(|v| !v.is_null());
    out.swap_behavior = match behavior {
        None => SwapBehavior::NoSwap,
        Some(serde_json::Value::String(s)) => match s.as_str() {
            "" | "NoSwap" => SwapBehavior::NoSwap,
            "LimitedSwap" => SwapBehavior::LimitedSwap,
            other => {
                return Err(invalid(format!(
                    "memorySwap.swapBehavior {other:?} must be one of: \"\", \"LimitedSwap\" or \"NoSwap\""
                )));
            }
        },
        Some(other) => {
            return Err(invalid(format!(
                "memorySwap.swapBehavior: {other} is not a string"
            )));
        }
    };
    Ok(out)
}

#[cfg(test)]
mod tests;
