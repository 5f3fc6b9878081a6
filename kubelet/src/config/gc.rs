//! Garbage collection settings, validated as upstream: image GC (`imageGCHighThresholdPercent`,
//! `imageGCLowThresholdPercent`, `imageMinimumGCAge`, `imageMaximumGCAge`) and the deprecated
//! container GC flags (`--minimum-container-ttl-duration`,
//! `--maximum-dead-containers-per-container`, `--maximum-dead-containers`).

use super::{ConfigError, KubeletConfiguration, invalid};
use crate::settings::cli::Flags;
use crate::images::ImageGcPolicy;
use crate::runtime::ContainerGcPolicy;
use plumbing::duration;
use std::time::Duration;

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
mod tests {
    use super::*;
    use clap::Parser;

    fn file(text: &str) -> KubeletConfiguration {
        super::super::parse_file("t.yaml", text).unwrap()
    }

    fn flags(args: &[&str]) -> Flags {
        Flags::try_parse_from(std::iter::once("kubelet").chain(args.iter().copied())).unwrap()
    }

    #[test]
    fn image_gc_defaults_and_validation_as_upstream() {
        let none = KubeletConfiguration::default();
        assert_eq!(
            image_policy(&Flags::default(), &none).unwrap(),
            ImageGcPolicy::default()
        );
        let p = image_policy(
            &flags(&["--image-gc-high-threshold=90"]),
            &file("imageGCLowThresholdPercent: 50\nimageMinimumGCAge: 5m\nimageMaximumGCAge: 1h\n"),
        )
        .unwrap();
        assert_eq!(
            (p.high_threshold_percent, p.low_threshold_percent),
            (90, 50)
        );
        assert_eq!(p.min_age, Duration::from_secs(300));
        assert_eq!(p.max_age, Duration::from_secs(3600));
        // kubeadm's zero means the default.
        assert_eq!(
            image_policy(&Flags::default(), &file("imageMinimumGCAge: 0s\n"))
                .unwrap()
                .min_age,
            Duration::from_secs(120)
        );
        let err = |f: &Flags, k: &KubeletConfiguration| image_policy(f, k).unwrap_err().to_string();
        assert!(
            err(&flags(&["--image-gc-low-threshold=85"]), &none).contains(
                "imageGCLowThresholdPercent (--image-gc-low-threshold) 85 must be less than imageGCHighThresholdPercent (--image-gc-high-threshold) 85"
            )
        );
        assert!(
            err(&flags(&["--image-gc-high-threshold=101"]), &none)
                .contains("must be between 0 and 100")
        );
        assert!(
            err(&Flags::default(), &file("imageMaximumGCAge: 1m\n"))
                .contains("imageMaximumGCAge 1m0s must be greater than imageMinimumGCAge 2m0s")
        );
    }

    #[test]
    fn container_gc_flags() {
        assert_eq!(
            container_policy(&Flags::default()).unwrap(),
            ContainerGcPolicy::default()
        );
        let p = container_policy(&flags(&[
            "--maximum-dead-containers-per-container=3",
            "--maximum-dead-containers=-1",
            "--minimum-container-ttl-duration=1m",
        ]))
        .unwrap();
        assert_eq!(p.max_per_pod_container, 3);
        assert_eq!(p.max_containers, -1);
        assert_eq!(p.min_age, Duration::from_secs(60));
    }
}
