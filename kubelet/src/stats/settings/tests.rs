use super::*;
use crate::settings::parse_file;
use clap::Parser;
use std::time::Duration;

fn flags(args: &[&str]) -> Flags {
    Flags::try_parse_from(std::iter::once("kubelet").chain(args.iter().copied())).unwrap()
}

/// The stats part of the configuration, as `config::merge` assembles it (cgroups per QoS
/// under `/`).
fn merge(
    flags: &Flags,
    file: KubeletConfiguration,
    _hostname: &str,
) -> Result<Settings, ConfigError> {
    resolve(flags, &file, "/", true)
}

/// `volumeStatsAggPeriod` is read; `0s` (what kubeadm writes) and no value mean upstream's
/// default of a minute; a value that is no duration refuses the start.
#[test]
fn volume_stats_agg_period_is_read_and_0s_means_the_default() {
    let period = |yaml: &str| {
        merge(&flags(&[]), parse_file("c", yaml).unwrap(), "n")
            .unwrap()
            .volume_stats_agg_period
    };
    assert_eq!(
        period("volumeStatsAggPeriod: 30s\n"),
        Duration::from_secs(30)
    );
    assert_eq!(
        period("volumeStatsAggPeriod: 2m\n"),
        Duration::from_secs(120)
    );
    assert_eq!(
        period("volumeStatsAggPeriod: 0s\n"),
        Duration::from_secs(60)
    );
    assert_eq!(period("{}\n"), Duration::from_secs(60));
    let err = parse_file("c", "volumeStatsAggPeriod: often\n")
        .unwrap_err()
        .to_string();
    assert!(err.contains("often"), "{err}");
}
