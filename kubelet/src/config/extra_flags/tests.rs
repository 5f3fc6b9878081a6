use crate::config::{merge, parse_file};
use crate::settings::cli::Flags;
use clap::Parser;
use std::time::Duration;

fn load(args: &[&str], file: &str) -> Result<crate::config::Config, crate::config::ConfigError> {
    let flags = Flags::try_parse_from(std::iter::once("kubelet").chain(args.iter().copied()))
        .expect("flags parse");
    merge(&flags, parse_file("c", file).unwrap(), "n")
}

#[test]
fn field_flags_work_as_their_fields_and_win_over_the_file() {
    let file = "enableServer: true\nenableDebuggingHandlers: true\nmakeIPTablesUtilChains: true\n\
                serverTLSBootstrap: false\nvolumeStatsAggPeriod: 2m\n";
    let c = load(&[], file).unwrap();
    assert!(
        c.server.enable_server && c.server.enable_debugging_handlers && c.make_iptables_util_chains
    );
    assert!(!c.server.server_tls_bootstrap);
    assert_eq!(c.stats.volume_stats_agg_period, Duration::from_secs(120));
    let c = load(
        &[
            "--enable-server=false",
            "--enable-debugging-handlers=0",
            "--make-iptables-util-chains=F",
            "--rotate-server-certificates",
            "--volume-stats-agg-period=30s",
        ],
        file,
    )
    .unwrap();
    assert!(!c.server.enable_server, "--enable-server=false");
    assert!(
        !c.server.enable_debugging_handlers,
        "--enable-debugging-handlers=0"
    );
    assert!(
        !c.make_iptables_util_chains,
        "--make-iptables-util-chains=F"
    );
    assert!(
        c.server.server_tls_bootstrap,
        "--rotate-server-certificates"
    );
    assert_eq!(c.stats.volume_stats_agg_period, Duration::from_secs(30));
}

#[test]
fn negative_volume_stats_period_is_refused_by_name() {
    let err = load(&["--volume-stats-agg-period=-1s"], "{}\n")
        .unwrap_err()
        .to_string();
    assert!(err.contains("--volume-stats-agg-period"), "{err}");
    // 0s means the default, as in the file.
    let c = load(&["--volume-stats-agg-period=0s"], "{}\n").unwrap();
    assert_eq!(c.stats.volume_stats_agg_period, Duration::from_secs(60));
}
