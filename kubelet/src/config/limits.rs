//! The feature gates (checked as upstream's kubelet does at start, and the ones set that the
//! agent does not read) and `crashLoopBackOff.maxContainerRestartPeriod`.

use super::{ConfigError, KubeletConfiguration, invalid};
use crate::settings::cli::Flags;
pub(super) use crate::settings::resolve::gate_or;
use plumbing::duration;
use std::time::Duration;

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

#[cfg(test)]
mod tests {
    use super::*;

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
}
