//! The kubelet's command line: upstream's flag names, pflag-style booleans (`--x`, `--x=false`).
//!
//! Flags only carry what the operator typed; the config module's `load` merges them over the
//! `--config` file and validates the result.

use clap::Parser;
use std::collections::BTreeMap;

mod extra;
#[cfg(test)]
mod upstream;
pub use extra::{CadvisorFlags, ExtraFlags};

/// Parses a boolean the way Go's `strconv.ParseBool` does (pflag uses it).
pub fn parse_go_bool(s: &str) -> Result<bool, String> {
    plumbing::go::flag_bool(s)
}

/// Parses a 64-bit integer the way pflag's Int64 flags do: Go's `strconv.ParseInt(s, 0, 64)`
/// (optional sign; `0x`, `0o`, `0b` or a leading `0` pick the base; `_` between digits).
pub fn parse_go_int64(s: &str) -> Result<i64, String> {
    let syntax = || format!("strconv.ParseInt: parsing {s:?}: invalid syntax");
    let (neg, body) = match s.as_bytes().first() {
        Some(b'-') => (true, &s[1..]),
        Some(b'+') => (false, &s[1..]),
        _ => (false, s),
    };
    let lower = body.to_ascii_lowercase();
    let (radix, digits, prefixed) = if let Some(d) = lower.strip_prefix("0x") {
        (16, d, true)
    } else if let Some(d) = lower.strip_prefix("0b") {
        (2, d, true)
    } else if let Some(d) = lower.strip_prefix("0o") {
        (8, d, true)
    } else if lower.len() > 1 && lower.starts_with('0') {
        (8, &lower[1..], true)
    } else {
        (10, lower.as_str(), false)
    };
    // Go's underscoreOK: each `_` sits between digits (a base prefix counts as one).
    let mut after_digit = prefixed;
    for c in digits.chars() {
        if c == '_' {
            if !after_digit {
                return Err(syntax());
            }
            after_digit = false;
        } else {
            after_digit = true;
        }
    }
    let clean: String = digits.chars().filter(|c| *c != '_').collect();
    if clean.is_empty() || !after_digit {
        return Err(syntax());
    }
    if !clean.chars().all(|c| c.is_digit(radix)) {
        return Err(syntax());
    }
    let range = || format!("strconv.ParseInt: parsing {s:?}: value out of range");
    let magnitude = u128::from_str_radix(&clean, radix).map_err(|_| range())?;
    let v = if neg {
        -i128::try_from(magnitude).map_err(|_| range())?
    } else {
        i128::try_from(magnitude).map_err(|_| range())?
    };
    i64::try_from(v).map_err(|_| range())
}

/// Parses a Go duration the way pflag's Duration flags do (`time.ParseDuration`).
pub fn parse_go_duration_flag(s: &str) -> Result<std::time::Duration, String> {
    plumbing::duration::parse(s).map_err(|e| e.to_string())
}

/// Checks a Go duration the way pflag's Duration flags do (`time.ParseDuration`, a sign
/// allowed) and keeps the text; for flags whose value the agent only reports.
pub fn go_duration_text(s: &str) -> Result<String, String> {
    let body = s.strip_prefix(['-', '+']).unwrap_or(s);
    match plumbing::duration::parse_go_duration(body) {
        Some(_) if !body.starts_with(['-', '+']) => Ok(s.to_string()),
        _ => Err(format!("time: invalid duration {s:?}")),
    }
}

/// Checks a resource quantity the way pflag's quantity flags do and keeps the text.
pub fn quantity_text(s: &str) -> Result<String, String> {
    plumbing::quantity::parse_value(s)
        .map(|_| s.to_string())
        .map_err(|e| e.to_string())
}

/// Parses `--feature-gates` as upstream's `MapStringBool`: `Name=bool,...`, each value read
/// with Go's `strconv.ParseBool`; values come back as `true`/`false`.
pub fn parse_feature_gates(s: &str) -> Result<BTreeMap<String, String>, String> {
    Ok(plumbing::go::parse_map_string_bool(s)?
        .into_iter()
        .map(|(k, v)| (k, v.to_string()))
        .collect())
}

/// Parses `k1=v1,k2=v2` (the form of `--node-labels`).
pub fn parse_map(s: &str) -> Result<BTreeMap<String, String>, String> {
    let mut out = BTreeMap::new();
    for item in s.split(',').map(str::trim).filter(|i| !i.is_empty()) {
        let (k, v) = item
            .split_once('=')
            .ok_or_else(|| format!("{item:?} is not of the form key=value"))?;
        out.insert(k.trim().to_string(), v.trim().to_string());
    }
    Ok(out)
}

/// Parses `k1<v1,k2<v2` (the form of `--eviction-hard`).
pub fn parse_langle_map(s: &str) -> Result<BTreeMap<String, String>, String> {
    let mut out = BTreeMap::new();
    for item in s.split(',').map(str::trim).filter(|i| !i.is_empty()) {
        let (k, v) = item
            .split_once('<')
            .ok_or_else(|| format!("{item:?} is not of the form key<value"))?;
        out.insert(k.trim().to_string(), v.trim().to_string());
    }
    Ok(out)
}

/// Every flag kubeadm, systemd drop-ins and common installers pass to upstream's kubelet.
/// What each does here is in the settings registry (`FLAGS`): flags the agent accepts but does not act
/// on are warned about at start when set to a non-default value, and security-relevant ones it
/// does not provide refuse the start.
#[derive(Debug, Parser, Default, Clone)]
#[command(
    name = "kubelet",
    about = "The node agent: runs the pods bound to this node on a CRI runtime.",
    long_about = None,
    disable_version_flag = true,
    args_override_self = true
)]
pub struct Flags {
    /// Print version information and quit (`--version=raw` prints the full build info).
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    pub version: Option<String>,

    /// Path to a KubeletConfiguration (kubelet.config.k8s.io/v1beta1) file.
    #[arg(long)]
    pub config: Option<String>,
    /// A directory of KubeletConfiguration drop-ins (`*.conf`), applied over --config in
    /// lexical order.
    #[arg(long = "config-dir")]
    pub config_dir: Option<String>,
    /// Path to a kubeconfig for the apiserver; absent means standalone mode.
    #[arg(long)]
    pub kubeconfig: Option<String>,
    /// Kubeconfig used to get a client certificate when --kubeconfig does not exist yet.
    #[arg(long = "bootstrap-kubeconfig")]
    pub bootstrap_kubeconfig: Option<String>,
    /// Directory holding TLS certificates (default /var/lib/kubelet/pki).
    #[arg(long = "cert-dir")]
    pub cert_dir: Option<String>,
    /// Directory for kubelet state (default /var/lib/kubelet).
    #[arg(long = "root-dir")]
    pub root_dir: Option<String>,
    /// The CRI endpoint, e.g. unix:///run/containerd/containerd.sock.
    #[arg(long = "container-runtime-endpoint")]
    pub container_runtime_endpoint: Option<String>,
    /// The CRI image endpoint (defaults to the runtime endpoint).
    #[arg(long = "image-service-endpoint")]
    pub image_service_endpoint: Option<String>,
    /// IP address(es) of the node (comma-separated for dual-stack).
    #[arg(long = "node-ip")]
    pub node_ip: Option<String>,
    /// Use this name instead of the hostname.
    #[arg(long = "hostname-override")]
    pub hostname_override: Option<String>,
    /// Taints to register the node with: key=value:Effect,...
    #[arg(long = "register-with-taints")]
    pub register_with_taints: Option<String>,
    /// Labels to register the node with: key=value,...
    #[arg(long = "node-labels", value_parser = parse_map)]
    pub node_labels: Option<BTreeMap<String, String>>,
    /// Sandbox image; the runtime's own setting wins (deprecated upstream, still accepted).
    #[arg(long = "pod-infra-container-image")]
    pub pod_infra_container_image: Option<String>,
    /// Static pod manifest directory (deprecated: use staticPodPath in --config).
    #[arg(long = "pod-manifest-path")]
    pub pod_manifest_path: Option<String>,
    /// Host the kube-proxy role in this process with this KubeProxyConfiguration file (ours,
    /// not upstream's). In cluster mode it shares the kubelet's apiserver connection.
    #[arg(long = "proxy-config")]
    pub proxy_config: Option<String>,
    /// Run the node network controller (ours, not upstream's): install node-agent-cni, write
    /// its conflist once the Node has a pod CIDR, route to other Nodes' pod CIDRs.
    #[arg(long = "node-agent-cni", num_args = 0..=1, require_equals = true, default_missing_value = "true", value_parser = parse_go_bool)]
    pub node_agent_cni: Option<bool>,
    /// The cluster's pod CIDR(s) (comma-separated, one per family) for the node network
    /// controller's masquerade (ours).
    #[arg(long = "node-agent-cluster-cidr")]
    pub node_agent_cluster_cidr: Option<String>,
    /// Log verbosity.
    #[arg(short = 'v', long = "v")]
    pub verbosity: Option<u8>,
    /// Comma-separated pattern=N settings for file-filtered logging.
    #[arg(long)]
    pub vmodule: Option<String>,
    /// Log format: text or json.
    #[arg(long = "logging-format")]
    pub logging_format: Option<String>,

    #[arg(long = "fail-swap-on", num_args = 0..=1, require_equals = true, default_missing_value = "true", value_parser = parse_go_bool)]
    pub fail_swap_on: Option<bool>,
    /// cgroupfs or systemd.
    #[arg(long = "cgroup-driver")]
    pub cgroup_driver: Option<String>,
    /// Root cgroup for pods (default /).
    #[arg(long = "cgroup-root")]
    pub cgroup_root: Option<String>,
    #[arg(long = "cgroups-per-qos", num_args = 0..=1, require_equals = true, default_missing_value = "true", value_parser = parse_go_bool)]
    pub cgroups_per_qos: Option<bool>,
    /// Cluster DNS server IPs (comma-separated).
    #[arg(long = "cluster-dns")]
    pub cluster_dns: Option<String>,
    #[arg(long = "cluster-domain")]
    pub cluster_domain: Option<String>,
    #[arg(long = "resolv-conf")]
    pub resolv_conf: Option<String>,
    #[arg(long = "max-pods")]
    pub max_pods: Option<i32>,
    /// Port of the authenticated HTTPS server.
    #[arg(long)]
    pub port: Option<i32>,
    /// Bind address of the HTTPS server.
    #[arg(long)]
    pub address: Option<String>,
    #[arg(long = "healthz-port")]
    pub healthz_port: Option<i32>,
    #[arg(long = "healthz-bind-address")]
    pub healthz_bind_address: Option<String>,
    #[arg(long = "read-only-port")]
    pub read_only_port: Option<i32>,
    #[arg(long = "tls-cert-file")]
    pub tls_cert_file: Option<String>,
    #[arg(long = "tls-private-key-file")]
    pub tls_private_key_file: Option<String>,
    #[arg(long = "runtime-request-timeout")]
    pub runtime_request_timeout: Option<String>,
    #[arg(long = "node-status-update-frequency")]
    pub node_status_update_frequency: Option<String>,
    #[arg(long = "file-check-frequency")]
    pub file_check_frequency: Option<String>,
    #[arg(long = "sync-frequency")]
    pub sync_frequency: Option<String>,
    #[arg(long = "register-node", num_args = 0..=1, require_equals = true, default_missing_value = "true", value_parser = parse_go_bool)]
    pub register_node: Option<bool>,
    #[arg(long = "rotate-certificates", num_args = 0..=1, require_equals = true, default_missing_value = "true", value_parser = parse_go_bool)]
    pub rotate_certificates: Option<bool>,
    #[arg(long = "serialize-image-pulls", num_args = 0..=1, require_equals = true, default_missing_value = "true", value_parser = parse_go_bool)]
    pub serialize_image_pulls: Option<bool>,
    #[arg(long = "anonymous-auth", num_args = 0..=1, require_equals = true, default_missing_value = "true", value_parser = parse_go_bool)]
    pub anonymous_auth: Option<bool>,
    #[arg(long = "authentication-token-webhook", num_args = 0..=1, require_equals = true, default_missing_value = "true", value_parser = parse_go_bool)]
    pub authentication_token_webhook: Option<bool>,
    #[arg(long = "authentication-token-webhook-cache-ttl")]
    pub authentication_token_webhook_cache_ttl: Option<String>,
    #[arg(long = "authorization-webhook-cache-authorized-ttl")]
    pub authorization_webhook_cache_authorized_ttl: Option<String>,
    #[arg(long = "authorization-webhook-cache-unauthorized-ttl")]
    pub authorization_webhook_cache_unauthorized_ttl: Option<String>,
    #[arg(long = "authorization-mode")]
    pub authorization_mode: Option<String>,
    #[arg(long = "client-ca-file")]
    pub client_ca_file: Option<String>,
    #[arg(long = "provider-id")]
    pub provider_id: Option<String>,
    #[arg(long = "cloud-provider")]
    pub cloud_provider: Option<String>,
    #[arg(long = "pod-cidr")]
    pub pod_cidr: Option<String>,
    #[arg(long = "kube-api-qps")]
    pub kube_api_qps: Option<i32>,
    #[arg(long = "kube-api-burst")]
    pub kube_api_burst: Option<i32>,
    #[arg(long = "feature-gates", value_parser = parse_feature_gates)]
    pub feature_gates: Option<BTreeMap<String, String>>,
    #[arg(long = "eviction-hard", value_parser = parse_langle_map)]
    pub eviction_hard: Option<BTreeMap<String, String>>,
    #[arg(long = "eviction-soft", value_parser = parse_langle_map)]
    pub eviction_soft: Option<BTreeMap<String, String>>,
    #[arg(long = "eviction-soft-grace-period", value_parser = parse_map)]
    pub eviction_soft_grace_period: Option<BTreeMap<String, String>>,
    #[arg(long = "eviction-minimum-reclaim", value_parser = parse_map)]
    pub eviction_minimum_reclaim: Option<BTreeMap<String, String>>,
    #[arg(long = "eviction-pressure-transition-period")]
    pub eviction_pressure_transition_period: Option<String>,
    #[arg(long = "eviction-max-pod-grace-period", allow_hyphen_values = true)]
    pub eviction_max_pod_grace_period: Option<i32>,
    #[arg(long = "merge-default-eviction-settings", num_args = 0..=1, require_equals = true, default_missing_value = "true", value_parser = parse_go_bool)]
    pub merge_default_eviction_settings: Option<bool>,
    #[arg(long = "reserved-cpus")]
    pub reserved_cpus: Option<String>,
    #[arg(long = "kube-reserved-cgroup")]
    pub kube_reserved_cgroup: Option<String>,
    #[arg(long = "system-reserved-cgroup")]
    pub system_reserved_cgroup: Option<String>,
    #[arg(long = "kube-reserved", value_parser = parse_map)]
    pub kube_reserved: Option<BTreeMap<String, String>>,
    #[arg(long = "system-reserved", value_parser = parse_map)]
    pub system_reserved: Option<BTreeMap<String, String>>,
    #[arg(long = "runtime-cgroups")]
    pub runtime_cgroups: Option<String>,
    #[arg(long = "kubelet-cgroups")]
    pub kubelet_cgroups: Option<String>,
    #[arg(long = "enforce-node-allocatable")]
    pub enforce_node_allocatable: Option<String>,
    #[arg(long = "volume-plugin-dir")]
    pub volume_plugin_dir: Option<String>,
    #[arg(long = "image-gc-high-threshold")]
    pub image_gc_high_threshold: Option<i32>,
    #[arg(long = "image-gc-low-threshold")]
    pub image_gc_low_threshold: Option<i32>,
    #[arg(long = "minimum-image-ttl-duration")]
    pub minimum_image_ttl_duration: Option<String>,
    #[arg(long = "minimum-container-ttl-duration")]
    pub minimum_container_ttl_duration: Option<String>,
    #[arg(long = "maximum-dead-containers-per-container")]
    pub maximum_dead_containers_per_container: Option<i32>,
    #[arg(long = "maximum-dead-containers", allow_hyphen_values = true)]
    pub maximum_dead_containers: Option<i32>,
    #[arg(long = "image-credential-provider-config")]
    pub image_credential_provider_config: Option<String>,
    #[arg(long = "image-credential-provider-bin-dir")]
    pub image_credential_provider_bin_dir: Option<String>,
    #[arg(long = "container-log-max-size")]
    pub container_log_max_size: Option<String>,
    #[arg(long = "container-log-max-files")]
    pub container_log_max_files: Option<i32>,
    #[arg(long = "tls-cipher-suites")]
    pub tls_cipher_suites: Option<String>,
    #[arg(long = "tls-min-version")]
    pub tls_min_version: Option<String>,
    #[arg(long = "hairpin-mode")]
    pub hairpin_mode: Option<String>,
    #[arg(long = "node-status-max-images")]
    pub node_status_max_images: Option<i32>,
    #[arg(long = "max-open-files")]
    pub max_open_files: Option<i64>,
    #[arg(long = "oom-score-adj", allow_hyphen_values = true)]
    pub oom_score_adj: Option<i32>,
    #[arg(long = "pods-per-core")]
    pub pods_per_core: Option<i32>,
    #[arg(long = "registry-qps", allow_hyphen_values = true)]
    pub registry_qps: Option<i32>,
    #[arg(long = "registry-burst", allow_hyphen_values = true)]
    pub registry_burst: Option<i32>,
    #[arg(long = "event-qps", allow_hyphen_values = true)]
    pub event_qps: Option<i32>,
    #[arg(long = "event-burst", allow_hyphen_values = true)]
    pub event_burst: Option<i32>,
    #[arg(long = "streaming-connection-idle-timeout")]
    pub streaming_connection_idle_timeout: Option<String>,
    #[arg(long = "lock-file")]
    pub lock_file: Option<String>,
    #[arg(long = "exit-on-lock-contention", num_args = 0..=1, require_equals = true, default_missing_value = "true", value_parser = parse_go_bool)]
    pub exit_on_lock_contention: Option<bool>,
    #[arg(long = "protect-kernel-defaults", num_args = 0..=1, require_equals = true, default_missing_value = "true", value_parser = parse_go_bool)]
    pub protect_kernel_defaults: Option<bool>,
    #[arg(long = "allowed-unsafe-sysctls", value_delimiter = ',')]
    pub allowed_unsafe_sysctls: Option<Vec<String>>,
    #[arg(long = "seccomp-default", num_args = 0..=1, require_equals = true, default_missing_value = "true", value_parser = parse_go_bool)]
    pub seccomp_default: Option<bool>,
    #[arg(long = "local-storage-capacity-isolation", num_args = 0..=1, require_equals = true, default_missing_value = "true", value_parser = parse_go_bool)]
    pub local_storage_capacity_isolation: Option<bool>,
    #[arg(long = "log-flush-frequency")]
    pub log_flush_frequency: Option<String>,
    /// Deprecated upstream (podPidsLimit): process limit of each pod cgroup; -1 or 0: none.
    #[arg(long = "pod-max-pids", allow_hyphen_values = true, value_parser = parse_go_int64)]
    pub pod_max_pids: Option<i64>,
    /// Deprecated upstream (cpuCFSQuota): CPU limits become CFS quota.
    #[arg(long = "cpu-cfs-quota", num_args = 0..=1, require_equals = true, default_missing_value = "true", value_parser = parse_go_bool)]
    pub cpu_cfs_quota: Option<bool>,
    /// Deprecated upstream (cpuCFSQuotaPeriod): the CFS period; other than 100ms needs the
    /// CustomCPUCFSQuotaPeriod feature gate.
    #[arg(long = "cpu-cfs-quota-period", value_parser = parse_go_duration_flag)]
    pub cpu_cfs_quota_period: Option<std::time::Duration>,
    /// The other upstream flags (`flags/extra.rs`).
    #[command(flatten)]
    pub extra: ExtraFlags,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Flags, clap::Error> {
        Flags::try_parse_from(std::iter::once("kubelet").chain(args.iter().copied()))
    }

    #[test]
    fn kubeadm_command_line_parses() {
        // The command systemd builds from kubeadm's 10-kubeadm.conf and kubeadm-flags.env.
        let f = parse(&[
            "--bootstrap-kubeconfig=/etc/kubernetes/bootstrap-kubelet.conf",
            "--kubeconfig=/etc/kubernetes/kubelet.conf",
            "--config=/var/lib/kubelet/config.yaml",
            "--container-runtime-endpoint=unix:///var/run/containerd/containerd.sock",
            "--node-ip=10.0.0.5",
            "--hostname-override=worker-1",
            "--register-with-taints=dedicated=infra:NoSchedule",
            "--node-labels=role=worker,zone=a",
            "--pod-infra-container-image=registry.k8s.io/pause:3.10",
        ])
        .unwrap();
        assert_eq!(
            f.kubeconfig.as_deref(),
            Some("/etc/kubernetes/kubelet.conf")
        );
        assert_eq!(
            f.node_labels.unwrap().get("zone").map(String::as_str),
            Some("a")
        );
        assert_eq!(f.hostname_override.as_deref(), Some("worker-1"));
    }

    #[test]
    fn pflag_booleans() {
        assert_eq!(
            parse(&["--fail-swap-on=false"]).unwrap().fail_swap_on,
            Some(false)
        );
        assert_eq!(parse(&["--fail-swap-on"]).unwrap().fail_swap_on, Some(true));
        assert_eq!(
            parse(&["--fail-swap-on=T"]).unwrap().fail_swap_on,
            Some(true)
        );
        assert!(parse(&["--fail-swap-on=maybe"]).is_err());
    }

    #[test]
    fn verbosity_both_forms() {
        assert_eq!(parse(&["--v=4"]).unwrap().verbosity, Some(4));
        assert_eq!(parse(&["-v", "2"]).unwrap().verbosity, Some(2));
    }

    #[test]
    fn unknown_flag_is_an_error() {
        let err = parse(&["--no-such-flag=1"]).unwrap_err();
        assert!(err.to_string().contains("--no-such-flag"), "{err}");
    }
    #[test]
    fn go_int64_syntax() {
        for (s, v) in [
            ("-1", -1),
            ("+5", 5),
            ("1_000", 1000),
            ("0x1F", 31),
            ("010", 8),
            ("0o10", 8),
            ("0b101", 5),
            ("-9223372036854775808", i64::MIN),
        ] {
            assert_eq!(parse_go_int64(s), Ok(v), "{s}");
        }
        for s in ["", "-", "1_", "_1", "1__0", "0x", "08", "1.5", " 1"] {
            assert_eq!(
                parse_go_int64(s),
                Err(format!("strconv.ParseInt: parsing {s:?}: invalid syntax")),
                "{s:?}"
            );
        }
        assert!(
            parse_go_int64("9223372036854775808")
                .unwrap_err()
                .ends_with("value out of range")
        );
    }
}
