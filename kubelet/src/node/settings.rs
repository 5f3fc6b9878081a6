//! The Node's settings: its name and addresses, registration (`registerNode`,
//! `--register-with-taints`, `--node-labels`, `--cloud-provider`, `providerID`), its pod
//! capacity (`maxPods`, `podsPerCore`) and the status and lease cadence, resolved from the
//! flags over the config file over upstream's defaults.

use super::CloudSettings;
use crate::settings::resolve::{dur, invalid, ip};
use crate::settings::{ConfigError, Flags, KubeletConfiguration};
use k8s_openapi::api::core::v1::Taint;
use plumbing::duration;
use serde::Serialize;
use std::collections::BTreeMap;
use std::net::IpAddr;
use std::time::Duration;

/// The Node's settings, validated.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Settings {
    /// `--hostname-override` or the hostname, lower-cased.
    pub node_name: String,
    /// `--node-ip` (one per family for dual-stack; empty: detected).
    pub node_ips: Vec<IpAddr>,
    pub node_labels: BTreeMap<String, String>,
    /// `maxPods`, capped by `podsPerCore` × the CPU count.
    pub max_pods: u32,
    /// `nodeStatusMaxImages`: how many images the Node's status lists (-1: all).
    pub node_status_max_images: i32,
    /// Cluster mode: `registerNode` (default true).
    pub register_node: bool,
    /// Cluster mode: taints to register the Node with (`--register-with-taints` or the file's list).
    pub register_with_taints: Vec<Taint>,
    #[serde(with = "duration::serde_opt_plain")]
    pub node_status_update_frequency: Duration,
    /// Cluster mode: `nodeStatusReportFrequency` (default 5m).
    #[serde(with = "duration::serde_opt_plain")]
    pub node_status_report_frequency: Duration,
    /// Cluster mode: `nodeLeaseDurationSeconds` (default 40).
    pub node_lease_duration_seconds: i32,
    /// `--cloud-provider` (empty or `external`) and `--provider-id` / `providerID`.
    pub cloud: CloudSettings,
}

/// Flags over the file over upstream's defaults; `hostname` is the machine's.
pub fn resolve(
    flags: &Flags,
    file: &KubeletConfiguration,
    hostname: &str,
) -> Result<Settings, ConfigError> {
    let node_name = flags
        .hostname_override
        .clone()
        .unwrap_or_else(|| hostname.to_string())
        .trim()
        .to_lowercase();
    if node_name.is_empty() {
        return Err(invalid("node name is empty: set --hostname-override"));
    }
    let node_ips = match &flags.node_ip {
        Some(list) => list
            .split(',')
            .filter(|s| !s.trim().is_empty())
            .map(|s| ip("--node-ip", s))
            .collect::<Result<Vec<_>, _>>()?,
        None => Vec::new(),
    };
    let node_status_max_images = flags
        .node_status_max_images
        .or(file.node_status_max_images)
        .unwrap_or(50);
    if node_status_max_images < -1 {
        return Err(invalid(format!(
            "nodeStatusMaxImages (--node-status-max-images) {node_status_max_images} must be -1 or greater"
        )));
    }
    Ok(Settings {
        node_name,
        node_ips,
        node_labels: flags.node_labels.clone().unwrap_or_default(),
        max_pods: max_pods(flags, file)?,
        node_status_max_images,
        register_node: flags.register_node.or(file.register_node).unwrap_or(true),
        register_with_taints: register_taints(flags, file)?,
        node_status_update_frequency: dur(
            "nodeStatusUpdateFrequency",
            &flags.node_status_update_frequency,
            file.node_status_update_frequency,
            Duration::from_secs(10),
        )?,
        node_status_report_frequency: dur(
            "nodeStatusReportFrequency",
            &None,
            file.node_status_report_frequency,
            Duration::from_secs(300),
        )?,
        node_lease_duration_seconds: file
            .node_lease_duration_seconds
            .filter(|d| *d > 0)
            .unwrap_or(40),
        cloud: cloud(flags, file)?,
    })
}

/// `maxPods` (default 110) and `podsPerCore` (default 0: no cap), validated as upstream.
fn max_pods(flags: &Flags, file: &KubeletConfiguration) -> Result<u32, ConfigError> {
    let max_pods = flags.max_pods.or(file.max_pods).unwrap_or(110);
    if max_pods < 0 {
        return Err(invalid(format!("maxPods: {max_pods} must not be negative")));
    }
    let pods_per_core = match (flags.pods_per_core, &file.pods_per_core) {
        (Some(n), _) => n,
        (None, None | Some(serde_json::Value::Null)) => 0,
        (None, Some(v)) => v
            .as_i64()
            .and_then(|n| i32::try_from(n).ok())
            .ok_or_else(|| invalid(format!("podsPerCore: {v} is not an integer")))?,
    };
    if pods_per_core < 0 {
        return Err(invalid(format!(
            "podsPerCore (--pods-per-core) {pods_per_core} must not be a negative number"
        )));
    }
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    Ok(pod_capacity(max_pods as u32, pods_per_core as u32, cores))
}

/// The node's pod capacity, as upstream's node status computes it: `maxPods`, or with
/// `podsPerCore` set, `podsPerCore` × the CPU count when that is lower.
pub fn pod_capacity(max_pods: u32, pods_per_core: u32, cores: usize) -> u32 {
    if pods_per_core == 0 {
        return max_pods;
    }
    let per_core = u64::from(pods_per_core).saturating_mul(cores as u64);
    per_core.min(u64::from(max_pods)) as u32
}

/// `--register-with-taints=k=v:Effect,k2:Effect` or the file's `registerWithTaints` list.
fn register_taints(flags: &Flags, file: &KubeletConfiguration) -> Result<Vec<Taint>, ConfigError> {
    if let Some(list) = &flags.register_with_taints {
        return list
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(taint_flag)
            .collect();
    }
    file.register_with_taints
        .iter()
        .flatten()
        .map(|v| {
            serde_json::from_value::<Taint>(v.clone())
                .map_err(|e| invalid(format!("registerWithTaints: {e}")))
        })
        .collect()
}

/// One `key=value:Effect` of `--register-with-taints`.
fn taint_flag(spec: &str) -> Result<Taint, ConfigError> {
    let (kv, effect) = spec.rsplit_once(':').ok_or_else(|| {
        invalid(format!(
            "--register-with-taints: {spec:?} has no effect (key=value:Effect)"
        ))
    })?;
    if !matches!(effect, "NoSchedule" | "PreferNoSchedule" | "NoExecute") {
        return Err(invalid(format!(
            "--register-with-taints: invalid taint effect {effect:?}"
        )));
    }
    let (key, value) = match kv.split_once('=') {
        Some((k, v)) => (k.to_string(), Some(v.to_string()).filter(|v| !v.is_empty())),
        None => (kv.to_string(), None),
    };
    if key.is_empty() {
        return Err(invalid(format!(
            "--register-with-taints: {spec:?} has an empty key"
        )));
    }
    Ok(Taint {
        key,
        value,
        effect: effect.to_string(),
        time_added: None,
    })
}

/// `--cloud-provider` and `--provider-id` / `providerID`, flags over the file, as upstream.
/// Upstream's built-in cloud providers are gone: the flag is empty or `external` (a cloud
/// controller manager initialises the Node: the kubelet registers it with the
/// `node.cloudprovider.kubernetes.io/uninitialized` taint and leaves addresses the cloud set
/// alone). `providerID` becomes the Node's `spec.providerID` at registration.
pub fn cloud(flags: &Flags, file: &KubeletConfiguration) -> Result<CloudSettings, ConfigError> {
    let external = match flags.cloud_provider.as_deref().unwrap_or("") {
        "" => false,
        "external" => true,
        other => {
            return Err(invalid(format!(
                "cloud provider {other:?} was specified, but built-in cloud providers are disabled. Please set --cloud-provider=external and migrate to an external cloud provider"
            )));
        }
    };
    let provider_id = match (&flags.provider_id, &file.provider_id) {
        (Some(f), _) => f.clone(),
        (None, None | Some(serde_json::Value::Null)) => String::new(),
        (None, Some(serde_json::Value::String(s))) => s.clone(),
        (None, Some(other)) => {
            return Err(invalid(format!("providerID: {other} is not a string")));
        }
    };
    Ok(CloudSettings {
        external,
        provider_id,
    })
}

#[cfg(test)]
mod tests;
