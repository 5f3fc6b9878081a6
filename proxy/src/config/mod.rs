//! kube-proxy's command line and `KubeProxyConfiguration` (kubeproxy.config.k8s.io/v1alpha1),
//! resolved by one pure function into a validated [`ProxyConfig`].
//!
//! Flag names, config field names and defaults are upstream's. One deliberate difference:
//! upstream ignores most flags when `--config` is given; here a flag that is given explicitly
//! overrides the file's value (a superset: kubeadm only passes `--config` and
//! `--hostname-override`, which behave the same either way).

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;
use plumbing::duration::parse_go_duration;
use serde::Deserialize;
use thiserror::Error;

use crate::model::{Cidr, IpFamily};
pub use crate::render_config::LocalDetect;

pub const API_VERSION: &str = "kubeproxy.config.k8s.io/v1alpha1";
pub const KIND: &str = "KubeProxyConfiguration";
/// `ports.ProxyHealthzPort`.
pub const HEALTHZ_PORT: u16 = 10256;
/// `ports.ProxyStatusPort`.
pub const METRICS_PORT: u16 = 10249;
/// What `--version` prints.

#[derive(Debug, Error, PartialEq, Eq)]
pub enum Error {
    #[error("failed to decode config file: {0}")]
    Decode(String),
    #[error("config file: {0}")]
    Kind(String),
    #[error("invalid configuration: {field}: {message}")]
    Invalid { field: String, message: String },
    /// An unknown feature gate, or a locked one set against its lock (upstream's Complete
    /// fails, and the command exits 1).
    #[error("failed complete: {0}")]
    FeatureGate(#[from] plumbing::feature_gates::GateError),
    #[error("invalid configuration: {0}")]
    Logging(#[from] plumbing::logging::LogError),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// A `detectLocal` interface name or prefix: required by its mode, and a name the kernel
/// could have (upstream's validateInterface asks for non-empty).
fn interface(field: &str, value: Option<String>) -> Result<String> {
    let v = value.unwrap_or_default().trim().to_string();
    if v.is_empty() {
        return Err(invalid(field, "must not be empty"));
    }
    // IFNAMSIZ is 16 with the NUL; no separators the rule text would split on.
    if v.len() > 15
        || v.contains(|c: char| c.is_whitespace() || c == '/' || c == '"' || c == '*' || c == '+')
    {
        return Err(invalid(
            field,
            format!("{v:?} is not a valid interface name"),
        ));
    }
    Ok(v)
}

fn invalid(field: &str, message: impl Into<String>) -> Error {
    Error::Invalid {
        field: field.to_string(),
        message: message.into(),
    }
}

/// Command-line flags, spelled as upstream's. Flags that upstream has but this proxy does not
/// act on are accepted (so existing manifests start) and warned about at start when set to a
/// non-default value; see the settings module.
#[derive(Clone, Debug, Default, Parser)]
#[command(
    name = "kube-proxy",
    disable_version_flag = true,
    args_override_self = true,
    about = "The Kubernetes network proxy runs on each node (iptables, nftables or ipvs mode)."
)]
pub struct Flags {
    /// The path to the configuration file.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Print version information and quit (`--version`, `--version=raw`).
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    pub version: Option<String>,
    /// If true cleanup iptables rules and exit.
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true", value_parser = go_bool)]
    pub cleanup: Option<bool>,
    /// Path to kubeconfig file with authorization information.
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    /// The address of the Kubernetes API server (overrides any value in kubeconfig).
    #[arg(long)]
    pub master: Option<String>,
    /// QPS to use while talking with kubernetes apiserver.
    #[arg(long = "kube-api-qps")]
    pub kube_api_qps: Option<f32>,
    /// Burst to use while talking with kubernetes apiserver.
    #[arg(long = "kube-api-burst")]
    pub kube_api_burst: Option<i32>,
    /// Content type of requests sent to apiserver (accepted; no effect, warned about when set).
    #[arg(long = "kube-api-content-type")]
    pub kube_api_content_type: Option<String>,
    /// Name of this Node (default: the hostname, lower-cased).
    #[arg(long = "hostname-override")]
    pub hostname_override: Option<String>,
    /// kube-proxy's idea of its node's primary IP.
    #[arg(long = "bind-address")]
    pub bind_address: Option<String>,
    /// IP:port of the health check server (default 0.0.0.0:10256).
    #[arg(long = "healthz-bind-address")]
    pub healthz_bind_address: Option<String>,
    /// IP:port of the metrics server (default 127.0.0.1:10249); empty disables it.
    #[arg(long = "metrics-bind-address")]
    pub metrics_bind_address: Option<String>,
    /// Which proxy mode to use: 'iptables' (default), 'nftables' or 'ipvs' (deprecated
    /// upstream since v1.35).
    #[arg(long = "proxy-mode")]
    pub proxy_mode: Option<String>,
    /// The CIDR range(s) of the pods in the cluster (comma-separated dual-stack pair).
    #[arg(long = "cluster-cidr")]
    pub cluster_cidr: Option<String>,
    /// CIDRs (or 'primary') on which NodePorts are served; default all local addresses.
    #[arg(long = "nodeport-addresses", value_delimiter = ',')]
    pub nodeport_addresses: Option<Vec<String>>,
    /// SNAT all traffic sent via Service cluster IPs.
    #[arg(long = "masquerade-all", num_args = 0..=1, require_equals = true, default_missing_value = "true", value_parser = go_bool)]
    pub masquerade_all: Option<bool>,
    /// Bit of the fwmark space that marks packets requiring SNAT, [0, 31].
    #[arg(long = "iptables-masquerade-bit")]
    pub iptables_masquerade_bit: Option<i32>,
    /// Allow NodePort services to be reached via localhost (IPv4 only).
    #[arg(long = "iptables-localhost-nodeports", num_args = 0..=1, require_equals = true, default_missing_value = "true", value_parser = go_bool)]
    pub iptables_localhost_nodeports: Option<bool>,
    /// How often a periodic resync runs (e.g. '5s', '1m', '2h22m').
    #[arg(long = "iptables-sync-period")]
    pub iptables_sync_period: Option<String>,
    /// The minimum period between rule resyncs; 0 means sync on every change.
    #[arg(long = "iptables-min-sync-period")]
    pub iptables_min_sync_period: Option<String>,
    /// Mode to detect local traffic: ClusterCIDR (default).
    #[arg(long = "detect-local-mode")]
    pub detect_local_mode: Option<String>,
    /// Bridge for detect-local-mode BridgeInterface.
    #[arg(long = "pod-bridge-interface")]
    pub pod_bridge_interface: Option<String>,
    /// Interface prefix for detect-local-mode InterfaceNamePrefix.
    #[arg(long = "pod-interface-name-prefix")]
    pub pod_interface_name_prefix: Option<String>,
    /// Maximum NAT connections to track per CPU core (0: leave nf_conntrack_max alone).
    #[arg(long = "conntrack-max-per-core")]
    pub conntrack_max_per_core: Option<i32>,
    /// Minimum conntrack entries to allocate, regardless of conntrack-max-per-core.
    #[arg(long = "conntrack-min")]
    pub conntrack_min: Option<i32>,
    /// Idle timeout for established TCP connections (0: leave as is).
    #[arg(long = "conntrack-tcp-timeout-established")]
    pub conntrack_tcp_timeout_established: Option<String>,
    /// NAT timeout for TCP connections in CLOSE_WAIT (0: leave as is).
    #[arg(long = "conntrack-tcp-timeout-close-wait")]
    pub conntrack_tcp_timeout_close_wait: Option<String>,
    /// Sets nf_conntrack_tcp_be_liberal to 1 (only out-of-window RSTs are INVALID).
    #[arg(long = "conntrack-tcp-be-liberal", num_args = 0..=1, require_equals = true, default_missing_value = "true", value_parser = go_bool)]
    pub conntrack_tcp_be_liberal: Option<bool>,
    /// Idle timeout for UNREPLIED UDP flows (0: leave as is).
    #[arg(long = "conntrack-udp-timeout")]
    pub conntrack_udp_timeout: Option<String>,
    /// Idle timeout for ASSURED UDP flows (0: leave as is).
    #[arg(long = "conntrack-udp-timeout-stream")]
    pub conntrack_udp_timeout_stream: Option<String>,
    /// IPVS scheduler (rr, lc, dh, sh, sed, nq, …; default rr). IPVS mode only.
    #[arg(long = "ipvs-scheduler")]
    pub ipvs_scheduler: Option<String>,
    /// Maximum interval of IPVS rule refreshes (default 30s). IPVS mode only.
    #[arg(long = "ipvs-sync-period")]
    pub ipvs_sync_period: Option<String>,
    /// Minimum interval between IPVS rule refreshes (default 0s). IPVS mode only.
    #[arg(long = "ipvs-min-sync-period")]
    pub ipvs_min_sync_period: Option<String>,
    /// CIDRs whose IPVS virtual servers the proxy never removes. IPVS mode only.
    #[arg(long = "ipvs-exclude-cidrs", value_delimiter = ',')]
    pub ipvs_exclude_cidrs: Option<Vec<String>>,
    /// Sets arp_ignore=1 and arp_announce=2. IPVS mode only.
    #[arg(long = "ipvs-strict-arp", num_args = 0..=1, require_equals = true, default_missing_value = "true", value_parser = go_bool)]
    pub ipvs_strict_arp: Option<bool>,
    /// IPVS timeout of idle TCP connections (0 leaves the kernel's).
    #[arg(long = "ipvs-tcp-timeout")]
    pub ipvs_tcp_timeout: Option<String>,
    /// IPVS timeout of TCP connections after FIN (0 leaves the kernel's).
    #[arg(long = "ipvs-tcpfin-timeout")]
    pub ipvs_tcpfin_timeout: Option<String>,
    /// IPVS timeout of UDP packets (0 leaves the kernel's).
    #[arg(long = "ipvs-udp-timeout")]
    pub ipvs_udp_timeout: Option<String>,
    /// Log verbosity.
    #[arg(long = "v", short = 'v')]
    pub v: Option<u8>,
    /// Checked against upstream's gates (an unknown or locked-against gate exits 1); known
    /// gates have no effect (warned about at start).
    #[arg(long = "feature-gates", value_parser = feature_gates)]
    pub feature_gates: Option<String>,
    /// The OOM score adjustment of the kube-proxy process, in the range [-1000, 1000].
    #[arg(long = "oom-score-adj", allow_hyphen_values = true)]
    pub oom_score_adj: Option<i32>,
    /// Accepted; no effect (warned about at start when set to a non-default value).
    #[arg(long = "config-sync-period")]
    pub config_sync_period: Option<String>,
    /// Accepted; no effect (warned about at start when set to a non-default value).
    #[arg(long = "profiling", num_args = 0..=1, require_equals = true, default_missing_value = "true", value_parser = go_bool)]
    pub profiling: Option<bool>,
    /// Accepted; no effect (warned about at start when set to a non-default value).
    #[arg(long = "bind-address-hard-fail", num_args = 0..=1, require_equals = true, default_missing_value = "true", value_parser = go_bool)]
    pub bind_address_hard_fail: Option<bool>,
    /// The log format: `text` (klog's lines, the default) or `json`.
    #[arg(long = "logging-format")]
    pub logging_format: Option<String>,
    /// Not upstream: read Services and EndpointSlices (YAML/JSON, one or more documents per
    /// file, `List` kinds allowed) from this directory instead of an apiserver. The directory
    /// is re-read periodically; removed objects are deleted. Ignored (logged) when an
    /// apiserver is configured (--kubeconfig, clientConnection.kubeconfig or --master).
    #[arg(long = "static-services-dir")]
    pub static_services_dir: Option<PathBuf>,
    /// The other upstream flags (`more_flags.rs`).
    #[command(flatten)]
    pub more: MoreFlags,
}

fn go_bool(s: &str) -> Result<bool, String> {
    plumbing::go::flag_bool(s)
}

/// `--feature-gates` checked as upstream's `MapStringBool` (values with `strconv.ParseBool`).
fn feature_gates(s: &str) -> Result<String, String> {
    plumbing::go::parse_map_string_bool(s).map(|_| s.to_string())
}

/// `clientConnection` (component-base ClientConnectionConfiguration).
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClientConnectionFile {
    pub kubeconfig: Option<String>,
    pub qps: Option<f32>,
    pub burst: Option<i32>,
    pub content_type: Option<String>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct IptablesFile {
    pub masquerade_bit: Option<i32>,
    pub masquerade_all: Option<bool>,
    pub localhost_node_ports: Option<bool>,
    pub sync_period: Option<String>,
    pub min_sync_period: Option<String>,
}

/// `nftables:`, read in nftables mode instead of `iptables:` (as upstream's v1alpha1).
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NftablesFile {
    pub masquerade_bit: Option<i32>,
    pub masquerade_all: Option<bool>,
    pub sync_period: Option<String>,
    pub min_sync_period: Option<String>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ConntrackFile {
    pub max_per_core: Option<i32>,
    pub min: Option<i32>,
    pub tcp_established_timeout: Option<String>,
    pub tcp_close_wait_timeout: Option<String>,
    pub tcp_be_liberal: Option<bool>,
    pub udp_timeout: Option<String>,
    pub udp_stream_timeout: Option<String>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DetectLocalFile {
    pub bridge_interface: Option<String>,
    pub interface_name_prefix: Option<String>,
}

/// The file as written (v1alpha1). Unknown fields are tolerated (collected in `extra`, warned
/// about by the settings check); absent and null fields take upstream's defaults in
/// [`resolve`].
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct KubeProxyConfiguration {
    pub api_version: Option<String>,
    pub kind: Option<String>,
    pub client_connection: Option<ClientConnectionFile>,
    pub hostname_override: Option<String>,
    pub bind_address: Option<String>,
    pub healthz_bind_address: Option<String>,
    pub metrics_bind_address: Option<String>,
    pub mode: Option<String>,
    pub iptables: Option<IptablesFile>,
    pub detect_local_mode: Option<String>,
    pub detect_local: Option<DetectLocalFile>,
    #[serde(rename = "clusterCIDR")]
    pub cluster_cidr: Option<String>,
    pub node_port_addresses: Option<Vec<String>>,
    pub conntrack: Option<ConntrackFile>,
    // Upstream fields this proxy does not act on; declared so that they are known, and checked
    // (warned about when set to non-defaults) by the settings module.
    pub feature_gates: Option<serde_json::Value>,
    pub bind_address_hard_fail: Option<serde_json::Value>,
    pub enable_profiling: Option<serde_json::Value>,
    pub show_hidden_metrics_for_version: Option<serde_json::Value>,
    pub sync_period: Option<serde_json::Value>,
    pub min_sync_period: Option<serde_json::Value>,
    pub ipvs: Option<ipvs::IpvsFile>,
    pub nftables: Option<NftablesFile>,
    pub winkernel: Option<serde_json::Value>,
    pub windows_run_as_service: Option<serde_json::Value>,
    pub oom_score_adj: Option<serde_json::Value>,
    pub config_sync_period: Option<serde_json::Value>,
    pub port_range: Option<serde_json::Value>,
    pub logging: Option<serde_json::Value>,
    /// Fields upstream's v1alpha1 does not have: kept so that they can be named in a warning.
    #[serde(flatten)]
    pub extra: std::collections::BTreeMap<String, serde_json::Value>,
}

impl KubeProxyConfiguration {
    /// Parses YAML or JSON and checks apiVersion/kind.
    pub fn parse(text: &str) -> Result<Self> {
        let cfg: KubeProxyConfiguration = serde_saphyr::from_str_with_options(
            text,
            serde_saphyr::options! { legacy_octal_numbers: true },
        )
        .map_err(|e| Error::Decode(e.to_string()))?;
        match (cfg.api_version.as_deref(), cfg.kind.as_deref()) {
            (Some(API_VERSION), Some(KIND)) => Ok(cfg),
            (None, _) | (_, None) => Err(Error::Kind(format!(
                "apiVersion and kind must be set ({API_VERSION}, {KIND})"
            ))),
            (Some(v), Some(k)) => Err(Error::Kind(format!(
                "unsupported {v}/{k}; expected {API_VERSION}, kind {KIND}"
            ))),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProxyMode {
    Iptables,
    Nftables,
    /// Deprecated upstream since v1.35.
    Ipvs,
}

impl ProxyMode {
    /// The name upstream uses (`--proxy-mode`, the `/metrics` `mode` notes, logs).
    pub fn as_str(self) -> &'static str {
        match self {
            ProxyMode::Iptables => "iptables",
            ProxyMode::Nftables => "nftables",
            ProxyMode::Ipvs => "ipvs",
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct ConntrackConfig {
    pub max_per_core: i32,
    pub min: i32,
    /// Zero: leave the sysctl alone (as every timeout below).
    pub tcp_established_timeout: Duration,
    pub tcp_close_wait_timeout: Duration,
    pub tcp_be_liberal: bool,
    pub udp_timeout: Duration,
    pub udp_stream_timeout: Duration,
}

/// Validated, defaulted configuration.
#[derive(Clone, Debug, PartialEq)]
pub struct ProxyConfig {
    pub node_name: String,
    pub bind_address: IpAddr,
    /// None: disabled.
    pub healthz_bind_address: Option<SocketAddr>,
    /// None: disabled.
    pub metrics_bind_address: Option<SocketAddr>,
    pub mode: ProxyMode,
    /// At most one per family.
    pub cluster_cidrs: Vec<Cidr>,
    /// `detectLocalMode` with its interface (validated).
    pub local_detect: LocalDetect,
    pub node_port_addresses: Vec<String>,
    pub masquerade_all: bool,
    pub masquerade_bit: u8,
    pub localhost_node_ports: bool,
    /// localhostNodePorts was set in nftables or ipvs mode, where it has no effect (warned at
    /// start).
    pub localhost_node_ports_ignored: bool,
    pub sync_period: Duration,
    pub min_sync_period: Duration,
    pub conntrack: ConntrackConfig,
    /// `ipvs.*` (used in IPVS mode only, as upstream).
    pub ipvs: crate::ipvs::IpvsSettings,
    pub kubeconfig: Option<PathBuf>,
    pub master: Option<String>,
    pub qps: f32,
    pub burst: i32,
    pub verbosity: u8,
    /// `logging` (format, verbosity, vmodule, split streams) with the logging flags over it.
    pub logging: plumbing::logging::Options,
    pub static_services_dir: Option<PathBuf>,
    pub cleanup: bool,
    /// `oomScoreAdj` (default -999): written to the process's own oom_score_adj by the
    /// kube-proxy binary at start (the kubelet's hosted proxy role keeps the kubelet's).
    pub oom_score_adj: i32,
}

impl ProxyConfig {
    /// The primary IP family (that of `bindAddress`, upstream's rule when no Node IP is known).
    pub fn primary_family(&self) -> IpFamily {
        if self.bind_address.is_ipv4() {
            IpFamily::V4
        } else {
            IpFamily::V6
        }
    }

    pub fn cluster_cidr(&self, family: IpFamily) -> Option<Cidr> {
        self.cluster_cidrs
            .iter()
            .copied()
            .find(|c| c.family() == family)
    }

    /// Upstream's healthTimeout for /healthz: twice the sync period.
    pub fn health_timeout(&self) -> Duration {
        self.sync_period * 2
    }
}

fn duration(field: &str, v: Option<&str>, default: Duration) -> Result<Duration> {
    match v.map(str::trim) {
        None | Some("") => Ok(default),
        Some(s) => parse_go_duration(s)
            .ok_or_else(|| invalid(field, format!("{s:?} is not a valid non-negative duration"))),
    }
}

/// Upstream's AppendPortIfNeeded + IP:port validation. Empty means "use the default".
/// A deprecated port flag: `None` when it is 0 (the server is off), else the port.
fn deprecated_port(flag: &str, v: Option<i32>, default: u16) -> Result<Option<u16>> {
    match v {
        None => Ok(Some(default)),
        Some(0) => Ok(None),
        Some(p) => u16::try_from(p)
            .map(Some)
            .map_err(|_| invalid(flag, format!("{p} is not a valid port"))),
    }
}

fn host_port(field: &str, v: &str, default_ip: IpAddr, default_port: u16) -> Result<SocketAddr> {
    let v = v.trim();
    if v.is_empty() {
        return Ok(SocketAddr::new(default_ip, default_port));
    }
    if let Ok(sa) = v.parse::<SocketAddr>() {
        return Ok(sa);
    }
    let bare = v.trim_start_matches('[').trim_end_matches(']');
    if let Ok(ip) = bare.parse::<IpAddr>() {
        return Ok(SocketAddr::new(ip, default_port));
    }
    Err(invalid(
        field,
        format!("{v:?} must be IP:port (e.g. 0.0.0.0:{default_port}) or an IP"),
    ))
}

fn cidrs(field: &str, v: &str) -> Result<Vec<Cidr>> {
    let mut out: Vec<Cidr> = Vec::new();
    for part in v.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let c = Cidr::parse_or_host(part)
            .map_err(|_| invalid(field, format!("{part:?} is not a valid CIDR")))?;
        if !part.contains('/') {
            return Err(invalid(field, format!("{part:?} is not a valid CIDR")));
        }
        if out.iter().any(|o| o.family() == c.family()) {
            return Err(invalid(
                field,
                "at most one CIDR per IP family (a dual-stack pair)",
            ));
        }
        out.push(c);
    }
    Ok(out)
}

fn flag_or<T: Clone>(flag: &Option<T>, file: Option<T>) -> Option<T> {
    flag.clone().or(file)
}

/// `featureGates` with `--feature-gates` over it, checked against upstream's gate set.
fn check_gates(flags: &Flags, file: &KubeProxyConfiguration) -> Result<()> {
    let mut gates = plumbing::feature_gates::from_json(file.feature_gates.as_ref())?;
    if let Some(s) = &flags.feature_gates {
        // Already checked by the flag's parser.
        gates.extend(plumbing::go::parse_map_string_bool(s).unwrap_or_default());
    }
    Ok(plumbing::feature_gates::check(&gates)?)
}

/// The pure core: flags + the config file's text (if `--config` was given and read) + the
/// machine's hostname → validated config with upstream defaults. Explicit flags override the
/// file. Each section is resolved in `sections.rs`.
pub fn resolve(flags: &Flags, file_text: Option<&str>, hostname: &str) -> Result<ProxyConfig> {
    let file = match file_text {
        Some(t) => KubeProxyConfiguration::parse(t)?,
        None => KubeProxyConfiguration::default(),
    };
    check_gates(flags, &file)?;
    let mode = sections::mode(flags, &file)?;
    let ipvs = ipvs::settings(flags, &file.ipvs.clone().unwrap_or_default())?;
    let servers = sections::servers(flags, &file)?;
    let node_name = sections::node_name(flags, &file, hostname)?;
    let oom_score_adj = sections::oom_score_adj(flags, &file)?;
    if node_name.is_empty() {
        return Err(invalid("hostnameOverride", "node name is empty"));
    }
    let cluster_cidrs = sections::cluster_cidrs(flags, &file)?;
    let local_detect = sections::local_detect(flags, &file)?;
    let node_port_addresses = sections::node_port_addresses(flags, &file)?;
    let rules = sections::rules(flags, &file, mode)?;
    let conntrack = sections::conntrack(flags, &file)?;
    let client = sections::client(flags, &file)?;
    Ok(ProxyConfig {
        node_name,
        bind_address: servers.bind_address,
        healthz_bind_address: servers.healthz,
        metrics_bind_address: servers.metrics,
        mode,
        cluster_cidrs,
        local_detect,
        node_port_addresses,
        masquerade_all: rules.masquerade_all,
        masquerade_bit: rules.masquerade_bit,
        localhost_node_ports: rules.localhost_node_ports,
        localhost_node_ports_ignored: rules.localhost_node_ports_ignored,
        sync_period: rules.sync_period,
        min_sync_period: rules.min_sync_period,
        conntrack,
        ipvs,
        kubeconfig: client.kubeconfig,
        master: flags.master.clone(),
        qps: client.qps,
        burst: client.burst,
        verbosity: flags.v.unwrap_or(0),
        logging: plumbing::logging::Options::resolve(
            &plumbing::logging::Flags {
                format: flags.logging_format.as_deref(),
                verbosity: flags.v.map(i32::from),
                vmodule: flags.more.vmodule.as_deref(),
                text_split_stream: flags.more.log_text_split_stream,
                json_split_stream: flags.more.log_json_split_stream,
            },
            file.logging.as_ref(),
        )?,
        static_services_dir: flags.static_services_dir.clone(),
        cleanup: flags.cleanup.unwrap_or(false),
        oom_score_adj,
    })
}

mod ipvs;
mod more_flags;
mod sections;
pub use ipvs::IpvsFile;
pub use more_flags::{DEFAULT_CONFIG, MoreFlags};

#[cfg(test)]
mod tests;
