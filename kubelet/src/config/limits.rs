//! The settings the container manager writes pod and container limits with: `cpuCFSQuota`,
//! `cpuCFSQuotaPeriod` (only with the `CustomCPUCFSQuotaPeriod` feature gate, as upstream),
//! `podPidsLimit`, `memorySwap.swapBehavior` and the `PodLevelResources` gate; and the
//! agent's own process limit (`maxOpenFiles`). Pure; validated as upstream's
//! ValidateKubeletConfiguration.

use super::{ConfigError, KubeletConfiguration, invalid};
use crate::cm::{DEFAULT_CFS_PERIOD_US, PodLimits, SwapBehavior};
use crate::flags::Flags;
use plumbing::duration;
use std::time::Duration;

/// Whether a feature gate is on: the flag's `--feature-gates` over the file's `featureGates`.
/// Upstream's gate for `crashLoopBackOff.maxContainerRestartPeriod` (beta, on, since 1.35).
pub const CRASH_LOOP_MAX_GATE: &str = "KubeletCrashLoopBackOffMax";

/// `crashLoopBackOff.maxContainerRestartPeriod`: upstream's 5 minutes unless set; with the
/// gate on it must lie in 1s..=300s, with the gate off it must not be set.
pub fn crash_loop_max(flags: &Flags, file: &KubeletConfiguration) -> Result<Duration, ConfigError> {
    const MAX: Duration = Duration::from_secs(300);
    let set = match file
        .crash_loop_back_off
        .as_ref()
        .and_then(|c| c.get("maxContainerRestartPeriod"))
    {
        None | Some(serde_json::Value::Null) => None,
        Some(serde_json::Value::String(s)) => Some(duration::parse(s).map_err(|e| {
            invalid(format!(
                "crashLoopBackOff.maxContainerRestartPeriod: {s:?}: {e}"
            ))
        })?),
        Some(other) => {
            return Err(invalid(format!(
                "crashLoopBackOff.maxContainerRestartPeriod: {other} is not a duration"
            )));
        }
    };
    let Some(d) = set else { return Ok(MAX) };
    if !gate_or(flags, file, CRASH_LOOP_MAX_GATE, true) {
        return Err(invalid(
            "FeatureGate KubeletCrashLoopBackOffMax not enabled, CrashLoopBackOff.MaxContainerRestartPeriod must not be set",
        ));
    }
    if d < Duration::from_secs(1) || d > MAX {
        return Err(invalid(format!(
            "CrashLoopBackOff.MaxContainerRestartPeriod (got: {} seconds) must be set between 1s and 300s",
            d.as_secs_f64()
        )));
    }
    Ok(d)
}

fn gate(flags: &Flags, file: &KubeletConfiguration, name: &str) -> bool {
    gate_or(flags, file, name, false)
}

/// [`gate`] for a gate whose upstream default is `default`.
pub(super) fn gate_or(
    flags: &Flags,
    file: &KubeletConfiguration,
    name: &str,
    default: bool,
) -> bool {
    if let Some(v) = flags.feature_gates.as_ref().and_then(|m| m.get(name)) {
        return v.eq_ignore_ascii_case("true");
    }
    file.feature_gates
        .as_ref()
        .and_then(|g| g.get(name))
        .and_then(|v| v.as_bool())
        .unwrap_or(default)
}

/// The feature gates the agent reads; any other one set is named in a warning.
pub const READ_GATES: &[&str] = &[
    "CustomCPUCFSQuotaPeriod",
    crate::podspec::POD_LEVEL_RESOURCES_GATE,
    crate::images::PULL_RECORDS_GATE,
    crate::pleg::EVENTED_PLEG_GATE,
    crate::server::settings::ZPAGE_GATES[0].0,
    crate::server::settings::ZPAGE_GATES[1].0,
    crate::server::settings::NODE_LOG_QUERY_GATE,
    crate::volume::selinux::SELINUX_MOUNT_GATE,
    CRASH_LOOP_MAX_GATE,
    crate::devices::RESOURCE_HEALTH_STATUS_GATE,
    crate::certs::serving_files::RELOAD_GATE,
];

/// Refuses the start as upstream's kubelet does (it exits 1): a gate it does not know, or a
/// gate locked to its default set to the other value, in `--feature-gates` or `featureGates`
/// (the flag's value over the file's).
pub fn check_gates(flags: &Flags, file: &KubeletConfiguration) -> Result<(), ConfigError> {
    let failed = |e: plumbing::feature_gates::GateError| {
        invalid(format!(
            "failed to set feature gates from initial flags-based config: {e}"
        ))
    };
    let mut gates =
        plumbing::feature_gates::from_json(file.feature_gates.as_ref()).map_err(failed)?;
    for (k, v) in flags.feature_gates.iter().flatten() {
        gates.insert(k.clone(), v == "true");
    }
    plumbing::feature_gates::check(&gates).map_err(failed)
}

/// A warning for each gate set in `--feature-gates` or `featureGates` that the agent does
/// not read.
pub fn unread_gates(flags: &Flags, file: &KubeletConfiguration) -> Vec<String> {
    let mut names: std::collections::BTreeSet<&str> = flags
        .feature_gates
        .iter()
        .flat_map(|m| m.keys().map(String::as_str))
        .collect();
    if let Some(m) = file.feature_gates.as_ref().and_then(|v| v.as_object()) {
        names.extend(m.keys().map(String::as_str));
    }
    names
        .into_iter()
        .filter(|n| !READ_GATES.contains(n))
        .map(|n| {
            format!(
                "feature gate {n} is set but has no effect in this agent (it reads only {})",
                READ_GATES.join(", ")
            )
        })
        .collect()
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
mod tests {
    use super::*;

    fn file(yaml: &str) -> KubeletConfiguration {
        super::super::parse_file("t.yaml", yaml).unwrap()
    }

    /// Every gate the agent reads is one upstream knows (else setting it would be refused).
    #[test]
    fn every_gate_read_is_known_upstream() {
        for name in READ_GATES {
            assert!(
                plumbing::feature_gates::lookup(name).is_some(),
                "{name} is not in plumbing's gate table"
            );
        }
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
        assert_eq!(p.single_process_oom_kill, None);
        let p = parse(
            &Flags::default(),
            &file(
                "singleProcessOOMKill: true
",
            ),
        )
        .unwrap();
        assert_eq!(p.single_process_oom_kill, Some(true));
        assert!(
            parse(
                &Flags::default(),
                &file(
                    "singleProcessOOMKill: yes-please
"
                )
            )
            .is_err()
        );
        assert!(
            parse(
                &Flags::default(),
                &file("memorySwap: {swapBehavior: Unlimited}\n")
            )
            .is_err()
        );
    }
    fn flags(args: &[&str]) -> Result<Flags, String> {
        use clap::Parser;
        Flags::try_parse_from(std::iter::once("kubelet").chain(args.iter().copied()))
            .map_err(|e| e.to_string())
    }

    #[test]
    fn deprecated_flags_set_the_limits_and_win_over_the_file() {
        let f = flags(&["--pod-max-pids=64", "--cpu-cfs-quota=false"]).unwrap();
        let p = parse(&f, &KubeletConfiguration::default()).unwrap();
        assert_eq!(p.pod_pids_limit, 64);
        assert!(!p.cpu_cfs_quota);
        // Flag over file, both ways.
        let f = flags(&["--pod-max-pids=-1", "--cpu-cfs-quota"]).unwrap();
        let p = parse(&f, &file("podPidsLimit: 42\ncpuCFSQuota: false\n")).unwrap();
        assert_eq!(p.pod_pids_limit, -1);
        assert!(p.cpu_cfs_quota);
        // pflag's space-separated integer and Go's base prefixes.
        let f = flags(&["--pod-max-pids", "0x40"]).unwrap();
        assert_eq!(
            parse(&f, &file("podPidsLimit: 7\n"))
                .unwrap()
                .pod_pids_limit,
            64
        );
        // Absent flags leave the file's values.
        let p = parse(&flags(&[]).unwrap(), &file("podPidsLimit: 42\n")).unwrap();
        assert_eq!(p.pod_pids_limit, 42);
    }

    #[test]
    fn cfs_period_flag_needs_the_gate_and_the_range() {
        let e = parse(
            &flags(&["--cpu-cfs-quota-period=50ms"]).unwrap(),
            &KubeletConfiguration::default(),
        )
        .unwrap_err();
        assert!(
            e.to_string().contains(
                "cpuCFSQuotaPeriod (--cpu-cfs-quota-period) {50ms} requires feature gate CustomCPUCFSQuotaPeriod"
            ),
            "{e}"
        );
        // The gate from the flag or the file; the flag's period wins over the file's.
        let f = flags(&[
            "--cpu-cfs-quota-period=50ms",
            "--feature-gates=CustomCPUCFSQuotaPeriod=true",
        ])
        .unwrap();
        let p = parse(&f, &file("cpuCFSQuotaPeriod: 20ms\n")).unwrap();
        assert_eq!(p.cpu_cfs_period_us, 50_000);
        let p = parse(
            &flags(&["--cpu-cfs-quota-period=250ms"]).unwrap(),
            &file("featureGates: {CustomCPUCFSQuotaPeriod: true}\n"),
        )
        .unwrap();
        assert_eq!(p.cpu_cfs_period_us, 250_000);
        let e = parse(
            &flags(&["--cpu-cfs-quota-period=1500ms"]).unwrap(),
            &file("featureGates: {CustomCPUCFSQuotaPeriod: true}\n"),
        )
        .unwrap_err();
        assert!(
            e.to_string()
                .contains("{1.5s} must be between 1ms and 1sec, inclusive"),
            "{e}"
        );
        // 100ms is the default: no gate needed, even when the file says otherwise.
        let p = parse(
            &flags(&["--cpu-cfs-quota-period=100ms"]).unwrap(),
            &KubeletConfiguration::default(),
        )
        .unwrap();
        assert_eq!(p.cpu_cfs_period_us, 100_000);
    }

    #[test]
    fn bad_flag_values_are_refused_with_pflags_reasons() {
        for (arg, want) in [
            (
                "--pod-max-pids=lots",
                "strconv.ParseInt: parsing \"lots\": invalid syntax",
            ),
            (
                "--pod-max-pids=99999999999999999999",
                "strconv.ParseInt: parsing \"99999999999999999999\": value out of range",
            ),
            (
                "--cpu-cfs-quota=maybe",
                "strconv.ParseBool: parsing \"maybe\": invalid syntax",
            ),
            ("--cpu-cfs-quota-period=50", "invalid duration \"50\""),
        ] {
            let e = flags(&[arg]).unwrap_err();
            assert!(e.contains(want), "{arg}: {e}");
            let name = arg.split('=').next().unwrap();
            assert!(e.contains(name), "{arg}: {e}");
        }
    }
}
