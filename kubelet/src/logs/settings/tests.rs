use super::*;
use crate::settings::parse_file;
use clap::Parser;
use std::time::Duration;

fn flags(args: &[&str]) -> Flags {
    Flags::try_parse_from(std::iter::once("kubelet").chain(args.iter().copied())).unwrap()
}

/// The log rotation part of the configuration, as `config::merge` assembles it.
#[derive(Debug)]
struct Assembled {
    container_log: Settings,
}

fn merge(
    flags: &Flags,
    file: KubeletConfiguration,
    _hostname: &str,
) -> Result<Assembled, ConfigError> {
    resolve(flags, &file).map(|container_log| Assembled { container_log })
}

#[test]
fn container_log_settings_flags_over_file_and_invalid_ones_refuse_start() {
    // kubeadm's file sets none of them: upstream's defaults.
    let kubeadm = parse_file("c", crate::config::tests::KUBEADM_CONFIG).unwrap();
    let cfg = merge(
        &flags(&["--container-runtime-endpoint=unix:///run/containerd/containerd.sock"]),
        kubeadm,
        "n",
    )
    .unwrap();
    assert_eq!(cfg.container_log, crate::logs::Settings::default());
    let file = parse_file(
        "c",
        "containerLogMaxSize: 1Mi\ncontainerLogMaxFiles: 3\ncontainerLogMaxWorkers: 2\n\
         containerLogMonitorInterval: 5s\n",
    )
    .unwrap();
    let cfg = merge(&flags(&[]), file.clone(), "n").unwrap();
    assert_eq!(
        cfg.container_log,
        crate::logs::Settings {
            max_size: 1 << 20,
            max_files: 3,
            max_workers: 2,
            monitor_interval: Duration::from_secs(5),
        }
    );
    let cfg = merge(
        &flags(&[
            "--container-log-max-size=2Mi",
            "--container-log-max-files=4",
        ]),
        file,
        "n",
    )
    .unwrap();
    assert_eq!(
        (cfg.container_log.max_size, cfg.container_log.max_files),
        (2 << 20, 4)
    );
    for (text, want) in [
        (
            "containerLogMaxFiles: 1\n",
            "invalid MaxFiles 1, must be > 1",
        ),
        (
            "containerLogMaxSize: 10Mb\n",
            "failed to parse container log max size \"10Mb\"",
        ),
        (
            "containerLogMaxWorkers: 0\n",
            "containerLogMaxWorkers must be greater than or equal to 1",
        ),
        (
            "containerLogMonitorInterval: 1s\n",
            "greater than or equal to 3s",
        ),
    ] {
        let err = merge(&flags(&[]), parse_file("c", text).unwrap(), "n")
            .unwrap_err()
            .to_string();
        assert!(err.contains(want), "{text}: {err}");
    }
}
