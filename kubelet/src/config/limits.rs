//! The settings the container manager writes pod and container limits with: `cpuCFSQuota`,
//! `cpuCFSQuotaPeriod` (only with the `CustomCPUCFSQuotaPeriod` feature gate, as upstream),
//! `podPidsLimit`, `memorySwap.swapBehavior` and the `PodLevelResources` gate. Pure;
//! validated as upstream's ValidateKubeletConfiguration.

use super::{ConfigError, KubeletConfiguration, invalid};
use crate::duration;
use crate::flags::Flags;
use serde::Serialize;
use std::time::Duration;

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
}

impl Default for PodLimits {
    fn default() -> Self {
        Self {
            cpu_cfs_quota: true,
            cpu_cfs_period_us: DEFAULT_CFS_PERIOD_US,
            pod_pids_limit: -1,
            swap_behavior: SwapBehavior::NoSwap,
            pod_level_resources: true,
        }
    }
}

/// Whether a feature gate is on: the flag's `--feature-gates` over the file's `featureGates`.
fn gate(flags: &Flags, file: &KubeletConfiguration, name: &str) -> bool {
    gate_or(flags, file, name, false)
}

/// [`gate`] for a gate whose upstream default is `default`.
fn gate_or(flags: &Flags, file: &KubeletConfiguration, name: &str, default: bool) -> bool {
    if let Some(v) = flags.feature_gates.as_ref().and_then(|m| m.get(name)) {
        return v.eq_ignore_ascii_case("true");
    }
    file.feature_gates
        .as_ref()
        .and_then(|g| g.get(name))
        .and_then(|v| v.as_bool())
        .unwrap_or(default)
}

/// Reads the four settings from the file (the flags only carry feature gates for them).
pub fn parse(flags: &Flags, file: &KubeletConfiguration) -> Result<PodLimits, ConfigError> {
    let mut out = PodLimits {
        pod_level_resources: gate_or(flags, file, crate::pod::resources::GATE, true),
        ..PodLimits::default()
    };
    match &file.cpu_cfs_quota {
        None | Some(serde_json::Value::Null) => {}
        Some(serde_json::Value::Bool(b)) => out.cpu_cfs_quota = *b,
        Some(other) => return Err(invalid(format!("cpuCFSQuota: {other} is not a boolean"))),
    }
    match &file.cpu_cfs_quota_period {
        None | Some(serde_json::Value::Null) => {}
        Some(serde_json::Value::String(s)) => {
            let d = duration::parse(s)
                .map_err(|e| invalid(format!("cpuCFSQuotaPeriod: {s:?}: {e}")))?;
            let text = duration::format(d);
            if d != Duration::from_micros(DEFAULT_CFS_PERIOD_US)
                && !gate(flags, file, "CustomCPUCFSQuotaPeriod")
            {
                return Err(invalid(format!(
                    "invalid configuration: cpuCFSQuotaPeriod (--cpu-cfs-quota-period) {{{text}}} requires feature gate CustomCPUCFSQuotaPeriod"
                )));
            }
            if d < Duration::from_millis(1) || d > Duration::from_secs(1) {
                return Err(invalid(format!(
                    "invalid configuration: cpuCFSQuotaPeriod (--cpu-cfs-quota-period) {{{text}}} must be between 1ms and 1sec, inclusive"
                )));
            }
            out.cpu_cfs_period_us = d.as_micros() as u64;
        }
        Some(other) => {
            return Err(invalid(format!(
                "cpuCFSQuotaPeriod: {other} is not a duration"
            )));
        }
    }
    match &file.pod_pids_limit {
        None | Some(serde_json::Value::Null) => {}
        Some(v) => {
            out.pod_pids_limit = v
                .as_i64()
                .ok_or_else(|| invalid(format!("podPidsLimit: {v} is not an integer")))?;
        }
    }
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
                    "invalid configuration: memorySwap.swapBehavior {other:?} must be one of: \"\", \"LimitedSwap\" or \"NoSwap\""
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
mod tests {
    use super::*;

    fn file(yaml: &str) -> KubeletConfiguration {
        super::super::parse_file("t.yaml", yaml).unwrap()
    }

    #[test]
    fn defaults_are_upstreams() {
        let p = parse(&Flags::default(), &KubeletConfiguration::default()).unwrap();
        assert_eq!(p, PodLimits::default());
        assert!(p.cpu_cfs_quota);
        assert_eq!(p.cpu_cfs_period_us, 100_000);
    }

    #[test]
    fn custom_period_needs_the_gate() {
        let e = parse(&Flags::default(), &file("cpuCFSQuotaPeriod: 50ms\n")).unwrap_err();
        assert!(
            e.to_string()
                .contains("{50ms} requires feature gate CustomCPUCFSQuotaPeriod"),
            "{e}"
        );
        let p = parse(
            &Flags::default(),
            &file("cpuCFSQuotaPeriod: 50ms\nfeatureGates: {CustomCPUCFSQuotaPeriod: true}\n"),
        )
        .unwrap();
        assert_eq!(p.cpu_cfs_period_us, 50_000);
        let e = parse(
            &Flags::default(),
            &file("cpuCFSQuotaPeriod: 2s\nfeatureGates: {CustomCPUCFSQuotaPeriod: true}\n"),
        )
        .unwrap_err();
        assert!(
            e.to_string().contains("must be between 1ms and 1sec"),
            "{e}"
        );
        // 100ms is the default and needs no gate.
        assert!(parse(&Flags::default(), &file("cpuCFSQuotaPeriod: 100ms\n")).is_ok());
    }

    /// `PodLevelResources` is on unless turned off, by the file or (over it) by the flag.
    #[test]
    fn pod_level_resources_gate() {
        assert!(
            parse(&Flags::default(), &file("{}\n"))
                .unwrap()
                .pod_level_resources
        );
        let off = file("featureGates: {PodLevelResources: false}\n");
        assert!(!parse(&Flags::default(), &off).unwrap().pod_level_resources);
        let flags = Flags {
            feature_gates: Some([("PodLevelResources".to_string(), "true".to_string())].into()),
            ..Flags::default()
        };
        assert!(parse(&flags, &off).unwrap().pod_level_resources);
    }

    #[test]
    fn pids_quota_and_swap() {
        let p = parse(
            &Flags::default(),
            &file(
                "podPidsLimit: 42\ncpuCFSQuota: false\nmemorySwap: {swapBehavior: LimitedSwap}\n",
            ),
        )
        .unwrap();
        assert_eq!(p.pod_pids_limit, 42);
        assert!(!p.cpu_cfs_quota);
        assert_eq!(p.swap_behavior, SwapBehavior::LimitedSwap);
        assert!(
            parse(
                &Flags::default(),
                &file("memorySwap: {swapBehavior: Unlimited}\n")
            )
            .is_err()
        );
    }
}
