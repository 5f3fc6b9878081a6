//! The rest of upstream's kube-proxy flags: the deprecated port flags, `--init-only`,
//! `--write-config-to`, the logging flags of component-base and the two cAdvisor flags
//! upstream's binary picks up from Go's global flag set. What each does here is in the
//! settings registry (`settings::FLAGS`); values are checked with upstream's syntax.

use clap::Args;

fn go_bool(s: &str) -> Result<bool, String> {
    plumbing::go::flag_bool(s)
}

fn duration_text(s: &str) -> Result<String, String> {
    let body = s.strip_prefix(['-', '+']).unwrap_or(s);
    match plumbing::duration::parse_go_duration(body) {
        Some(_) if !body.starts_with(['-', '+']) => Ok(s.to_string()),
        _ => Err(format!("time: invalid duration {s:?}")),
    }
}

fn quantity_text(s: &str) -> Result<String, String> {
    plumbing::quantity::parse_value(s)
        .map(|_| s.to_string())
        .map_err(|e| e.to_string())
}

/// Upstream's kube-proxy flags beyond the everyday ones (see the module doc).
#[derive(Clone, Debug, Default, Args)]
pub struct MoreFlags {
    /// Write upstream's default configuration to this file and exit.
    #[arg(long = "write-config-to")]
    pub write_config_to: Option<std::path::PathBuf>,
    /// Upstream: do the privileged set-up and exit.
    #[arg(long = "init-only", num_args = 0..=1, require_equals = true, default_missing_value = "true", value_parser = go_bool)]
    pub init_only: Option<bool>,
    /// Deprecated upstream: the health server's port (0 disables it).
    #[arg(long = "healthz-port", allow_hyphen_values = true)]
    pub healthz_port: Option<i32>,
    /// Deprecated upstream: the metrics server's port (0 disables it).
    #[arg(long = "metrics-port", allow_hyphen_values = true)]
    pub metrics_port: Option<i32>,
    /// Re-enable metrics hidden since this version (`<major>.<minor>`).
    #[arg(long = "show-hidden-metrics-for-version")]
    pub show_hidden_metrics_for_version: Option<String>,
    /// Per-file verbosity, `pattern=N,...`.
    #[arg(long = "vmodule")]
    pub vmodule: Option<String>,
    /// Maximum time between log flushes.
    #[arg(long = "log-flush-frequency", allow_hyphen_values = true, value_parser = duration_text)]
    pub log_flush_frequency: Option<String>,
    #[arg(long = "log-text-split-stream", num_args = 0..=1, require_equals = true, default_missing_value = "true", value_parser = go_bool)]
    pub log_text_split_stream: Option<bool>,
    #[arg(long = "log-text-info-buffer-size", value_parser = quantity_text)]
    pub log_text_info_buffer_size: Option<String>,
    #[arg(long = "log-json-split-stream", num_args = 0..=1, require_equals = true, default_missing_value = "true", value_parser = go_bool)]
    pub log_json_split_stream: Option<bool>,
    #[arg(long = "log-json-info-buffer-size", value_parser = quantity_text)]
    pub log_json_info_buffer_size: Option<String>,
    /// cAdvisor's flag (registered through Go's global flags upstream).
    #[arg(long = "boot-id-file")]
    pub boot_id_file: Option<String>,
    /// cAdvisor's flag (registered through Go's global flags upstream).
    #[arg(long = "machine-id-file")]
    pub machine_id_file: Option<String>,
}

/// Upstream's `KubeProxyConfiguration` v1alpha1 defaults on Linux, as `--write-config-to`
/// writes them.
pub const DEFAULT_CONFIG: &str = "apiVersion: kubeproxy.config.k8s.io/v1alpha1
bindAddress: 0.0.0.0
bindAddressHardFail: false
clientConnection:
  acceptContentTypes: \"\"
  burst: 10
  contentType: application/vnd.kubernetes.protobuf
  kubeconfig: \"\"
  qps: 5
clusterCIDR: \"\"
configSyncPeriod: 15m0s
conntrack:
  maxPerCore: 32768
  min: 131072
  tcpBeLiberal: false
  tcpCloseWaitTimeout: 1h0m0s
  tcpEstablishedTimeout: 24h0m0s
  udpStreamTimeout: 0s
  udpTimeout: 0s
detectLocal:
  bridgeInterface: \"\"
  interfaceNamePrefix: \"\"
detectLocalMode: \"\"
enableProfiling: false
healthzBindAddress: 0.0.0.0:10256
hostnameOverride: \"\"
iptables:
  localhostNodePorts: true
  masqueradeAll: false
  masqueradeBit: 14
  minSyncPeriod: 1s
  syncPeriod: 30s
ipvs:
  excludeCIDRs: null
  minSyncPeriod: 0s
  scheduler: \"\"
  strictARP: false
  syncPeriod: 30s
  tcpFinTimeout: 0s
  tcpTimeout: 0s
  udpTimeout: 0s
kind: KubeProxyConfiguration
logging:
  flushFrequency: 0
  options:
    json:
      infoBufferSize: \"0\"
    text:
      infoBufferSize: \"0\"
  verbosity: 0
metricsBindAddress: 127.0.0.1:10249
mode: \"\"
nftables:
  masqueradeAll: false
  masqueradeBit: 14
  minSyncPeriod: 1s
  syncPeriod: 30s
nodePortAddresses: null
oomScoreAdj: -999
portRange: \"\"
showHiddenMetricsForVersion: \"\"
";
