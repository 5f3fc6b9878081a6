//! What every subsystem's `settings::resolve` uses to read a flag over the config file over
//! upstream's default: the validation helpers with upstream's messages and the feature gates.

use super::{ConfigError, Flags, KubeletConfiguration};
use plumbing::duration;
use std::net::IpAddr;
use std::time::Duration;

/// An invalid value, with upstream's message.
pub fn invalid(msg: impl Into<String>) -> ConfigError {
    ConfigError::Invalid(msg.into())
}

/// A port: 1-65535, or 0 as well when `allow_zero` (the server is off).
pub fn port(name: &str, v: i32, allow_zero: bool) -> Result<u16, ConfigError> {
    match u16::try_from(v) {
        Ok(0) if allow_zero => Ok(0),
        Ok(p) if p > 0 => Ok(p),
        _ => Err(invalid(format!(
            "{name}: {v} must be between {} and 65535, inclusive",
            if allow_zero { 0 } else { 1 }
        ))),
    }
}

/// An IP address.
pub fn ip(name: &str, v: &str) -> Result<IpAddr, ConfigError> {
    v.trim()
        .parse()
        .map_err(|_| invalid(format!("{name}: {v:?} is not a valid IP address")))
}

/// A duration: the flag's text, else the file's (a zero one means unset), else `default`.
pub fn dur(
    name: &str,
    flag: &Option<String>,
    file: Option<Duration>,
    default: Duration,
) -> Result<Duration, ConfigError> {
    match flag {
        Some(s) => duration::parse(s).map_err(|e| invalid(format!("{name}: {e}"))),
        // A zero duration in the file means "unset" (kubeadm writes `0s` for defaults).
        None => Ok(file.filter(|d| !d.is_zero()).unwrap_or(default)),
    }
}

/// Whether the feature gate `name` is on: `--feature-gates` over the file's `featureGates`
/// over upstream's `default`.
pub fn gate_or(flags: &Flags, file: &KubeletConfiguration, name: &str, default: bool) -> bool {
    if let Some(v) = flags.feature_gates.as_ref().and_then(|m| m.get(name)) {
        return v.eq_ignore_ascii_case("true");
    }
    file.feature_gates
        .as_ref()
        .and_then(|g| g.get(name))
        .and_then(|v| v.as_bool())
        .unwrap_or(default)
}
