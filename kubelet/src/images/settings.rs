//! The image manager's settings: pulls (`serializeImagePulls`, `maxParallelImagePulls`,
//! `registryPullQPS`, `registryBurst`), the pulled-image records
//! (`imagePullCredentialsVerificationPolicy`, `preloadedImagesVerificationAllowlist`), image
//! garbage collection (`imageGCHighThresholdPercent`, `imageGCLowThresholdPercent`,
//! `imageMinimumGCAge`, `imageMaximumGCAge`) and credential provider plugins, resolved from
//! the flags over the config file with upstream's defaults and validation messages.

use super::{ImageGcPolicy, PullRecordsSettings, PullSettings};
use crate::settings::resolve::{gate_or, invalid};
use crate::settings::{ConfigError, Flags, KubeletConfiguration};
use plumbing::duration;
use serde::Serialize;
use std::path::PathBuf;
use std::time::Duration;

/// The image manager's settings, validated.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Settings {
    /// `serializeImagePulls` and `maxParallelImagePulls`.
    pub pull_gate: PullSettings,
    /// `registryPullQPS` / `registryBurst` (default 5 / 10; 0 QPS: no limit): the image pull
    /// token bucket.
    #[serde(rename = "registryPullQPS")]
    pub registry_pull_qps: i32,
    pub registry_burst: i32,
    /// Image garbage collection.
    pub image_gc: ImageGcPolicy,
    /// `imagePullCredentialsVerificationPolicy`, `preloadedImagesVerificationAllowlist` and
    /// the `KubeletEnsureSecretPulledImages` gate.
    #[serde(flatten)]
    pub image_pulls: PullRecordsSettings,
    /// `--image-credential-provider-config` (a file or a directory) and
    /// `--image-credential-provider-bin-dir`: credential provider plugins.
    pub image_credential_provider_config: Option<PathBuf>,
    pub image_credential_provider_bin_dir: Option<PathBuf>,
    /// `--pod-infra-container-image`: the sandbox image kept from garbage collection.
    pub pod_infra_container_image: Option<String>,
}

/// Flags over the file over upstream's defaults.
pub fn resolve(flags: &Flags, file: &KubeletConfiguration) -> Result<Settings, ConfigError> {
    use super::throttle::{DEFAULT_BURST, DEFAULT_QPS};
    Ok(Settings {
        pull_gate: PullSettings::parse(
            flags.serialize_image_pulls,
            file.serialize_image_pulls,
            file.max_parallel_image_pulls.as_ref(),
        )
        .map_err(invalid)?,
        registry_pull_qps: rate(
            flags.registry_qps,
            file.registry_pull_qps,
            DEFAULT_QPS,
            "registryPullQPS (--registry-qps)",
        )?,
        registry_burst: rate(
            flags.registry_burst,
            file.registry_burst,
            DEFAULT_BURST,
            "registryBurst (--registry-burst)",
        )?,
        image_gc: image_policy(flags, file)?,
        image_pulls: PullRecordsSettings::parse(
            gate_or(flags, file, super::PULL_RECORDS_GATE, true),
            file.image_pull_credentials_verification_policy.as_ref(),
            file.preloaded_images_verification_allowlist.as_ref(),
        )
        .map_err(invalid)?,
        image_credential_provider_config: (flags.image_credential_provider_config.as_ref())
            .filter(|p| !p.is_empty())
            .map(PathBuf::from),
        image_credential_provider_bin_dir: (flags.image_credential_provider_bin_dir.as_ref())
            .map(PathBuf::from),
        pod_infra_container_image: flags.pod_infra_container_image.clone(),
    })
}

/// A rate limit (QPS or burst): the flag over the file over upstream's default, refused when
/// negative with upstream's message.
pub fn rate(
    flag: Option<i32>,
    file: Option<i32>,
    default: i32,
    name: &str,
) -> Result<i32, ConfigError> {
    let v = flag.or(file).unwrap_or(default);
    if v < 0 {
        return Err(invalid(format!("{name} {v} must not be a negative number")));
    }
    Ok(v)
}

fn int(name: &str, v: Option<&serde_json::Value>) -> Result<Option<i32>, ConfigError> {
    match v {
        None | Some(serde_json::Value::Null) => Ok(None),
        Some(serde_json::Value::Number(n)) => n
            .as_i64()
            .and_then(|n| i32::try_from(n).ok())
            .map(Some)
            .ok_or_else(|| invalid(format!("{name}: {n} is not an int32"))),
        Some(other) => Err(invalid(format!("{name}: {other} is not a number"))),
    }
}

fn dur(name: &str, v: Option<&serde_json::Value>) -> Result<Option<Duration>, ConfigError> {
    match v {
        None | Some(serde_json::Value::Null) => Ok(None),
        Some(serde_json::Value::String(s)) => duration::parse(s)
            .map(Some)
            .map_err(|e| invalid(format!("{name}: {e}"))),
        Some(other) => Err(invalid(format!("{name}: {other} is not a duration"))),
    }
}

/// The image GC policy from flags over the file, with upstream's validation messages.
pub fn image_policy(
    flags: &Flags,
    file: &KubeletConfiguration,
) -> Result<ImageGcPolicy, ConfigError> {
    let d = ImageGcPolicy::default();
    let high = match flags.image_gc_high_threshold {
        Some(v) => v,
        None => int(
            "imageGCHighThresholdPercent",
            file.image_gc_high_threshold_percent.as_ref(),
        )?
        .unwrap_or(d.high_threshold_percent),
    };
    let low = match flags.image_gc_low_threshold {
        Some(v) => v,
        None => int(
            "imageGCLowThresholdPercent",
            file.image_gc_low_threshold_percent.as_ref(),
        )?
        .unwrap_or(d.low_threshold_percent),
    };
    let min_age = match &flags.minimum_image_ttl_duration {
        Some(s) => Some(
            duration::parse(s)
                .map_err(|e| invalid(format!("--minimum-image-ttl-duration: {e}")))?,
        ),
        // A zero in the file is upstream's "unset" (SetDefaults_KubeletConfiguration), as
        // kubeadm writes it.
        None => {
            dur("imageMinimumGCAge", file.image_minimum_gc_age.as_ref())?.filter(|d| !d.is_zero())
        }
    }
    .unwrap_or(d.min_age);
    let max_age =
        dur("imageMaximumGCAge", file.image_maximum_gc_age.as_ref())?.unwrap_or(d.max_age);
    if !(0..=100).contains(&high) {
        return Err(invalid(format!(
            "imageGCHighThresholdPercent (--image-gc-high-threshold) {high} must be between 0 and 100, inclusive"
        )));
    }
    if !(0..=100).contains(&low) {
        return Err(invalid(format!(
            "imageGCLowThresholdPercent (--image-gc-low-threshold) {low} must be between 0 and 100, inclusive"
        )));
    }
    if low >= high {
        return Err(invalid(format!(
            "imageGCLowThresholdPercent (--image-gc-low-threshold) {low} must be less than imageGCHighThresholdPercent (--image-gc-high-threshold) {high}"
        )));
    }
    if !max_age.is_zero() && max_age <= min_age {
        return Err(invalid(format!(
            "imageMaximumGCAge {} must be greater than imageMinimumGCAge {}",
            duration::format(max_age),
            duration::format(min_age)
        )));
    }
    Ok(ImageGcPolicy {
        high_threshold_percent: high,
        low_threshold_percent: low,
        min_age,
        max_age,
    })
}

#[cfg(test)]
mod tests;
