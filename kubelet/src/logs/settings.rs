//! The log rotation settings: `containerLogMaxSize`, `containerLogMaxFiles`,
//! `containerLogMaxWorkers`, `containerLogMonitorInterval`, the flags over the config file,
//! with upstream's validation.

use super::Settings;
use crate::settings::resolve::invalid;
use crate::settings::{ConfigError, Flags, KubeletConfiguration};
use plumbing::duration;

/// The log rotation settings: flags over the file, then upstream's validation.
pub fn resolve(flags: &Flags, file: &KubeletConfiguration) -> Result<Settings, ConfigError> {
    let set = |v: &Option<serde_json::Value>| v.clone().filter(|v| !v.is_null());
    let int = |name: &str, v: Option<serde_json::Value>| -> Result<Option<i64>, ConfigError> {
        v.map(|v| {
            v.as_i64()
                .ok_or_else(|| invalid(format!("{name}: {v} is not an integer")))
        })
        .transpose()
    };
    let size = match (
        &flags.container_log_max_size,
        set(&file.container_log_max_size),
    ) {
        (Some(s), _) => Some(s.clone()),
        (None, Some(serde_json::Value::String(s))) => Some(s),
        (None, Some(v)) => Some(v.to_string()),
        (None, None) => None,
    };
    let files = match flags.container_log_max_files {
        Some(n) => Some(i64::from(n)),
        None => int("containerLogMaxFiles", set(&file.container_log_max_files))?,
    };
    let workers = int(
        "containerLogMaxWorkers",
        set(&file.container_log_max_workers),
    )?;
    // `0s` (as kubeadm writes unset durations) means the default, as for the other periods.
    let interval = match set(&file.container_log_monitor_interval) {
        None => None,
        Some(serde_json::Value::String(t)) => Some(
            duration::parse(&t)
                .map_err(|e| invalid(format!("containerLogMonitorInterval: {e}")))?,
        )
        .filter(|d| !d.is_zero()),
        Some(v) => {
            return Err(invalid(format!(
                "containerLogMonitorInterval: {v} is not a duration"
            )));
        }
    };
    Settings::new(size.as_deref(), files, workers, interval).map_err(invalid)
}

#[cfg(test)]
mod tests;
