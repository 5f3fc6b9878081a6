//! The runtime's settings: the CRI endpoints (`containerRuntimeEndpoint`,
//! `imageServiceEndpoint`), `runtimeRequestTimeout` and the deprecated container GC flags
//! (`--minimum-container-ttl-duration`, `--maximum-dead-containers-per-container`,
//! `--maximum-dead-containers`), resolved from the flags over the config file.

use super::ContainerGcPolicy;
use crate::settings::resolve::{dur, invalid};
use crate::settings::{ConfigError, Flags, KubeletConfiguration};
use plumbing::duration;
use serde::Serialize;
use std::time::Duration;

/// Upstream's default CRI endpoint on Linux.
pub const DEFAULT_RUNTIME_ENDPOINT: &str = "unix:///run/containerd/containerd.sock";

/// The runtime's settings, validated.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Settings {
    pub container_runtime_endpoint: String,
    /// `imageServiceEndpoint` (default: the runtime's).
    pub image_service_endpoint: String,
    #[serde(with = "duration::serde_opt_plain")]
    pub runtime_request_timeout: Duration,
    /// Container garbage collection (deprecated flags only).
    pub container_gc: ContainerGcPolicy,
}

/// Flags over the file over upstream's defaults.
pub fn resolve(flags: &Flags, file: &KubeletConfiguration) -> Result<Settings, ConfigError> {
    let runtime_endpoint = (flags.container_runtime_endpoint.clone())
        .or(file.container_runtime_endpoint.clone())
        .unwrap_or_else(|| DEFAULT_RUNTIME_ENDPOINT.into());
    if runtime_endpoint.is_empty() {
        return Err(invalid("containerRuntimeEndpoint must not be empty"));
    }
    let image_endpoint = (flags.image_service_endpoint.clone())
        .or(file.image_service_endpoint.clone())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| runtime_endpoint.clone());
    Ok(Settings {
        container_runtime_endpoint: runtime_endpoint,
        image_service_endpoint: image_endpoint,
        runtime_request_timeout: dur(
            "runtimeRequestTimeout",
            &flags.runtime_request_timeout,
            file.runtime_request_timeout,
            Duration::from_secs(120),
        )?,
        container_gc: container_policy(flags)?,
    })
}

/// The container GC policy from its (deprecated, flag-only) settings.
pub fn container_policy(flags: &Flags) -> Result<ContainerGcPolicy, ConfigError> {
    let d = ContainerGcPolicy::default();
    let min_age = match &flags.minimum_container_ttl_duration {
        Some(s) => duration::parse(s)
            .map_err(|e| invalid(format!("--minimum-container-ttl-duration: {e}")))?,
        None => d.min_age,
    };
    Ok(ContainerGcPolicy {
        min_age,
        max_per_pod_container: flags
            .maximum_dead_containers_per_container
            .unwrap_or(d.max_per_pod_container),
        max_containers: flags.maximum_dead_containers.unwrap_or(d.max_containers),
    })
}

#[cfg(test)]
mod tests;
