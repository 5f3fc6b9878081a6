use super::*;
use crate::settings::parse_file;
use clap::Parser;

/// The image manager's part of the configuration, as `config::merge` assembles it.
fn merge(
    flags: &Flags,
    file: KubeletConfiguration,
    _hostname: &str,
) -> Result<Settings, ConfigError> {
    resolve(flags, &file)
}

fn file(text: &str) -> KubeletConfiguration {
    crate::settings::parse_file("t.yaml", text).unwrap()
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
fn parallel_image_pulls_are_read_and_validated_as_upstream() {
    let file = parse_file("c", "maxParallelImagePulls: 4\n").unwrap();
    let cfg = merge(&flags(&[]), file, "n").unwrap();
    assert_eq!(cfg.pull_gate.limit(), Some(4));
    let file = parse_file(
        "c",
        "serializeImagePulls: false\nmaxParallelImagePulls: 0\n",
    )
    .unwrap();
    let err = merge(&flags(&[]), file, "n").unwrap_err().to_string();
    assert_eq!(
        err,
        "invalid configuration: maxParallelImagePulls 0 must be a positive number"
    );
    let file = parse_file("c", "maxParallelImagePulls: 4\n").unwrap();
    let err = merge(&flags(&["--serialize-image-pulls=true"]), file, "n")
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("cannot be larger than 1 unless SerializeImagePulls"),
        "{err}"
    );
}
