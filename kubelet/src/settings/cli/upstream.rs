//! Upstream v1.36's kubelet flags on Linux (a fact list, names only), and the test that every
//! one of them is in the registry ([`crate::settings::FLAGS`]) and in the parser.
//!
//! Sources: `cmd/kubelet/app/options/options.go` (`KubeletFlags.AddFlags`,
//! `AddKubeletConfigFlags`), `globalflags.go` and `globalflags_linux.go` (the cAdvisor flags,
//! underscores as dashes), component-base's `logs/api/v1` (the logging flags, the JSON format
//! registered). `--help` is left out: every parser has it.

use crate::settings::{FLAGS, Findings, check};
use clap::CommandFactory;

pub const UPSTREAM_KUBELET_FLAGS: &[&str] = &[
    "address",
    "allowed-unsafe-sysctls",
    "anonymous-auth",
    "application-metrics-count-limit",
    "authentication-token-webhook",
    "authentication-token-webhook-cache-ttl",
    "authorization-mode",
    "authorization-webhook-cache-authorized-ttl",
    "authorization-webhook-cache-unauthorized-ttl",
    "boot-id-file",
    "bootstrap-kubeconfig",
    "cert-dir",
    "cgroup-driver",
    "cgroup-root",
    "cgroups-per-qos",
    "client-ca-file",
    "cloud-provider",
    "cluster-dns",
    "cluster-domain",
    "config",
    "config-dir",
    "container-hints",
    "container-log-max-files",
    "container-log-max-size",
    "container-runtime-endpoint",
    "containerd",
    "containerd-namespace",
    "contention-profiling",
    "cpu-cfs-quota",
    "cpu-cfs-quota-period",
    "cpu-manager-policy",
    "cpu-manager-policy-options",
    "cpu-manager-reconcile-period",
    "enable-controller-attach-detach",
    "enable-debugging-handlers",
    "enable-load-reader",
    "enable-server",
    "enforce-node-allocatable",
    "event-burst",
    "event-qps",
    "event-storage-age-limit",
    "event-storage-event-limit",
    "eviction-hard",
    "eviction-max-pod-grace-period",
    "eviction-minimum-reclaim",
    "eviction-pressure-transition-period",
    "eviction-soft",
    "eviction-soft-grace-period",
    "exit-on-lock-contention",
    "experimental-allocatable-ignore-eviction",
    "experimental-mounter-path",
    "fail-cgroupv1",
    "fail-swap-on",
    "feature-gates",
    "file-check-frequency",
    "global-housekeeping-interval",
    "hairpin-mode",
    "healthz-bind-address",
    "healthz-port",
    "hostname-override",
    "housekeeping-interval",
    "http-check-frequency",
    "image-credential-provider-bin-dir",
    "image-credential-provider-config",
    "image-gc-high-threshold",
    "image-gc-low-threshold",
    "image-service-endpoint",
    "kernel-memcg-notification",
    "kube-api-burst",
    "kube-api-content-type",
    "kube-api-qps",
    "kube-reserved",
    "kube-reserved-cgroup",
    "kubeconfig",
    "kubelet-cgroups",
    "local-storage-capacity-isolation",
    "lock-file",
    "log-cadvisor-usage",
    "log-flush-frequency",
    "log-json-info-buffer-size",
    "log-json-split-stream",
    "log-text-info-buffer-size",
    "log-text-split-stream",
    "logging-format",
    "machine-id-file",
    "make-iptables-util-chains",
    "manifest-url",
    "manifest-url-header",
    "max-open-files",
    "max-pods",
    "maximum-dead-containers",
    "maximum-dead-containers-per-container",
    "memory-manager-policy",
    "minimum-container-ttl-duration",
    "minimum-image-ttl-duration",
    "node-ip",
    "node-labels",
    "node-status-max-images",
    "node-status-update-frequency",
    "oom-score-adj",
    "pod-cidr",
    "pod-infra-container-image",
    "pod-manifest-path",
    "pod-max-pids",
    "pods-per-core",
    "port",
    "protect-kernel-defaults",
    "provider-id",
    "qos-reserved",
    "read-only-port",
    "register-node",
    "register-with-taints",
    "registry-burst",
    "registry-qps",
    "reserved-cpus",
    "reserved-memory",
    "resolv-conf",
    "root-dir",
    "rotate-certificates",
    "rotate-server-certificates",
    "runonce",
    "runtime-cgroups",
    "runtime-request-timeout",
    "seccomp-default",
    "serialize-image-pulls",
    "storage-driver-buffer-duration",
    "storage-driver-db",
    "storage-driver-host",
    "storage-driver-password",
    "storage-driver-secure",
    "storage-driver-table",
    "storage-driver-user",
    "streaming-connection-idle-timeout",
    "sync-frequency",
    "system-cgroups",
    "system-reserved",
    "system-reserved-cgroup",
    "tls-cert-file",
    "tls-cipher-suites",
    "tls-min-version",
    "tls-private-key-file",
    "topology-manager-policy",
    "topology-manager-policy-options",
    "topology-manager-scope",
    "v",
    "version",
    "vmodule",
    "volume-plugin-dir",
    "volume-stats-agg-period",
];

fn parser_longs() -> Vec<String> {
    crate::settings::cli::Flags::command()
        .get_arguments()
        .filter_map(|a| a.get_long().map(|l| format!("--{l}")))
        .collect()
}

#[test]
fn every_upstream_flag_is_registered_and_parsed() {
    assert_eq!(UPSTREAM_KUBELET_FLAGS.len(), 149);
    let longs = parser_longs();
    let missing: Vec<&str> = UPSTREAM_KUBELET_FLAGS
        .iter()
        .copied()
        .filter(|f| {
            let dashed = format!("--{f}");
            !FLAGS.iter().any(|s| s.name == dashed) || !longs.contains(&dashed)
        })
        .collect();
    assert!(
        missing.is_empty(),
        "upstream flags not accepted: {missing:?}"
    );
}

/// Each flag given at upstream's default (the registry's first no-warning value) parses and
/// draws neither a warning nor a refusal.
#[test]
fn every_registered_default_parses_without_findings() {
    use clap::Parser;
    for s in FLAGS.iter().filter(|s| !s.ok.is_empty()) {
        let arg = format!("{}={}", s.name, s.ok[0]);
        let parsed = crate::settings::cli::Flags::try_parse_from(["kubelet", arg.as_str()]);
        assert!(parsed.is_ok(), "{arg}: {}", parsed.unwrap_err());
        let cmd = crate::settings::cli::Flags::command();
        let m = cmd
            .clone()
            .try_get_matches_from(["kubelet", arg.as_str()])
            .unwrap();
        let given = plumbing::settings::given_flags(&cmd, &m);
        assert_eq!(check(&given, None), Findings::default(), "{arg}");
    }
}
