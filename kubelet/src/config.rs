//! KubeletConfiguration (kubelet.config.k8s.io/v1beta1) and the validated settings the agent runs
//! with. [`load`] is a pure function of the flags and the config file's text.

use crate::duration;
use crate::flags::Flags;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

/// Why the configuration cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("reading config file {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("parsing config file {path}: {message}")]
    Parse { path: String, message: String },
    #[error("invalid configuration: {0}")]
    Invalid(String),
}

/// The subset of the v1beta1 KubeletConfiguration this agent reads. Unknown fields are ignored,
/// as upstream's lenient decoding does; values are validated in [`load`].
#[derive(Debug, Default, Clone, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", default)]
pub struct KubeletConfiguration {
    pub kind: Option<String>,
    pub api_version: Option<String>,
    pub static_pod_path: Option<String>,
    #[serde(with = "duration::serde_opt")]
    pub sync_frequency: Option<Duration>,
    #[serde(with = "duration::serde_opt")]
    pub file_check_frequency: Option<Duration>,
    pub address: Option<String>,
    pub port: Option<i32>,
    pub read_only_port: Option<i32>,
    pub tls_cert_file: Option<String>,
    pub tls_private_key_file: Option<String>,
    pub healthz_port: Option<i32>,
    pub healthz_bind_address: Option<String>,
    #[serde(rename = "clusterDNS")]
    pub cluster_dns: Option<Vec<String>>,
    pub cluster_domain: Option<String>,
    pub resolv_conf: Option<String>,
    pub cgroup_driver: Option<String>,
    pub cgroup_root: Option<String>,
    pub cgroups_per_qos: Option<bool>,
    pub max_pods: Option<i32>,
    pub pod_logs_dir: Option<String>,
    pub container_runtime_endpoint: Option<String>,
    pub image_service_endpoint: Option<String>,
    #[serde(with = "duration::serde_opt")]
    pub runtime_request_timeout: Option<Duration>,
    pub serialize_image_pulls: Option<bool>,
    pub rotate_certificates: Option<bool>,
    pub server_tls_bootstrap: Option<bool>,
    #[serde(with = "duration::serde_opt")]
    pub node_status_update_frequency: Option<Duration>,
    #[serde(with = "duration::serde_opt")]
    pub node_status_report_frequency: Option<Duration>,
    pub node_lease_duration_seconds: Option<i32>,
    pub fail_swap_on: Option<bool>,
    pub enable_server: Option<bool>,
    pub register_node: Option<bool>,
    #[serde(rename = "kubeAPIQPS")]
    pub kube_api_qps: Option<i32>,
    pub kube_api_burst: Option<i32>,
    pub eviction_hard: Option<BTreeMap<String, String>>,
    pub authentication: Option<serde_json::Value>,
    pub authorization: Option<serde_json::Value>,
    pub register_with_taints: Option<Vec<serde_json::Value>>,
    pub pod_cidr: Option<String>,
}

/// Which cgroup manager names pod cgroups: `cgroupfs` paths or `systemd` slices.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum CgroupDriver {
    Cgroupfs,
    Systemd,
}

/// Validated settings, defaults applied.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Config {
    pub node_name: String,
    pub node_ips: Vec<IpAddr>,
    pub node_labels: BTreeMap<String, String>,
    pub kubeconfig: Option<PathBuf>,
    pub bootstrap_kubeconfig: Option<PathBuf>,
    pub root_dir: PathBuf,
    pub cert_dir: PathBuf,
    pub static_pod_path: Option<PathBuf>,
    /// `--proxy-config`: run the kube-proxy role in-process with this KubeProxyConfiguration.
    #[serde(skip)]
    pub proxy_config: Option<PathBuf>,
    #[serde(with = "duration::serde_opt_plain")]
    pub sync_frequency: Duration,
    #[serde(with = "duration::serde_opt_plain")]
    pub file_check_frequency: Duration,
    pub address: IpAddr,
    pub port: u16,
    pub read_only_port: u16,
    pub tls_cert_file: Option<PathBuf>,
    pub tls_private_key_file: Option<PathBuf>,
    pub healthz_port: u16,
    pub healthz_bind_address: IpAddr,
    #[serde(rename = "clusterDNS")]
    pub cluster_dns: Vec<IpAddr>,
    pub cluster_domain: String,
    pub resolv_conf: Option<PathBuf>,
    pub cgroup_driver: CgroupDriver,
    pub cgroup_root: String,
    pub cgroups_per_qos: bool,
    pub max_pods: u32,
    pub pod_logs_dir: PathBuf,
    pub container_runtime_endpoint: String,
    pub image_service_endpoint: String,
    #[serde(with = "duration::serde_opt_plain")]
    pub runtime_request_timeout: Duration,
    pub serialize_image_pulls: bool,
    pub rotate_certificates: bool,
    #[serde(with = "duration::serde_opt_plain")]
    pub node_status_update_frequency: Duration,
    pub fail_swap_on: bool,
    pub pod_infra_container_image: Option<String>,
    pub verbosity: u8,
    /// Cluster mode: `nodeStatusReportFrequency` (default 5m).
    #[serde(with = "duration::serde_opt_plain")]
    pub node_status_report_frequency: Duration,
    /// Cluster mode: `nodeLeaseDurationSeconds` (default 40).
    pub node_lease_duration_seconds: i32,
    /// Cluster mode: `kubeAPIQPS` / `kubeAPIBurst` (default 50 / 100).
    #[serde(rename = "kubeAPIQPS")]
    pub kube_api_qps: i32,
    pub kube_api_burst: i32,
    /// Cluster mode: `registerNode` (default true).
    pub register_node: bool,
    /// Cluster mode: taints to register the Node with (`--register-with-taints` or the file's list).
    pub register_with_taints: Vec<k8s_openapi::api::core::v1::Taint>,
}

/// Upstream's default CRI endpoint on Linux.
pub const DEFAULT_RUNTIME_ENDPOINT: &str = "unix:///run/containerd/containerd.sock";

/// Parses a config file's text (YAML or JSON) with Go-YAML-compatible number and boolean rules.
pub fn parse_file(path: &str, text: &str) -> Result<KubeletConfiguration, ConfigError> {
    let opts = serde_saphyr::options! { legacy_octal_numbers: true };
    let cfg: KubeletConfiguration =
        serde_saphyr::from_str_with_options(text, opts).map_err(|e| ConfigError::Parse {
            path: path.to_string(),
            message: e.to_string(),
        })?;
    if let Some(kind) = &cfg.kind
        && kind != "KubeletConfiguration"
    {
        return Err(ConfigError::Parse {
            path: path.into(),
            message: format!("kind is {kind:?}, want \"KubeletConfiguration\""),
        });
    }
    if let Some(v) = &cfg.api_version
        && v != "kubelet.config.k8s.io/v1beta1"
        && v != "kubelet.config.k8s.io/v1"
    {
        return Err(ConfigError::Parse {
            path: path.into(),
            message: format!("apiVersion {v:?} is not kubelet.config.k8s.io/v1beta1"),
        });
    }
    Ok(cfg)
}

/// Reads `--config` (if given) and merges the flags over it. Flags win, as upstream.
pub fn load(flags: &Flags, hostname: &str) -> Result<Config, ConfigError> {
    let file = match &flags.config {
        Some(path) => {
            let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
                path: path.clone(),
                source,
            })?;
            parse_file(path, &text)?
        }
        None => KubeletConfiguration::default(),
    };
    merge(flags, file, hostname)
}

fn invalid(msg: impl Into<String>) -> ConfigError {
    ConfigError::Invalid(msg.into())
}

fn port(name: &str, v: i32, allow_zero: bool) -> Result<u16, ConfigError> {
    match u16::try_from(v) {
        Ok(0) if allow_zero => Ok(0),
        Ok(p) if p > 0 => Ok(p),
        _ => Err(invalid(format!(
            "{name}: {v} must be between {} and 65535, inclusive",
            if allow_zero { 0 } else { 1 }
        ))),
    }
}

fn ip(name: &str, v: &str) -> Result<IpAddr, ConfigError> {
    v.trim()
        .parse()
        .map_err(|_| invalid(format!("{name}: {v:?} is not a valid IP address")))
}

fn dur(
    name: &str,
    flag: &Option<String>,
    file: Option<Duration>,
    default: Duration,
) -> Result<Duration, ConfigError> {
    match flag {
        Some(s) => duration::parse(s).map_err(|e| invalid(format!("{name}: {e}"))),
        // A zero duration in the file means "unset" (kubeadm writes `0s` for defaults).
        None => Ok(file.filter(|d| !d.is_zero()).unwrap_or(default)),
    }
}

/// `--register-with-taints=k=v:Effect,k2:Effect` or the file's `registerWithTaints` list.
fn register_taints(
    flags: &Flags,
    file: &KubeletConfiguration,
) -> Result<Vec<k8s_openapi::api::core::v1::Taint>, ConfigError> {
    use k8s_openapi::api::core::v1::Taint;
    if let Some(list) = &flags.register_with_taints {
        return list
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(|spec| {
                let (kv, effect) = spec.rsplit_once(':').ok_or_else(|| {
                    invalid(format!(
                        "--register-with-taints: {spec:?} has no effect (key=value:Effect)"
                    ))
                })?;
                if !matches!(effect, "NoSchedule" | "PreferNoSchedule" | "NoExecute") {
                    return Err(invalid(format!(
                        "--register-with-taints: invalid taint effect {effect:?}"
                    )));
                }
                let (key, value) = match kv.split_once('=') {
                    Some((k, v)) => (k.to_string(), Some(v.to_string()).filter(|v| !v.is_empty())),
                    None => (kv.to_string(), None),
                };
                if key.is_empty() {
                    return Err(invalid(format!(
                        "--register-with-taints: {spec:?} has an empty key"
                    )));
                }
                Ok(Taint {
                    key,
                    value,
                    effect: effect.to_string(),
                    time_added: None,
                })
            })
            .collect();
    }
    file.register_with_taints
        .iter()
        .flatten()
        .map(|v| {
            serde_json::from_value::<Taint>(v.clone())
                .map_err(|e| invalid(format!("registerWithTaints: {e}")))
        })
        .collect()
}

/// Merges flags over the file and applies upstream's defaults.
pub fn merge(
    flags: &Flags,
    file: KubeletConfiguration,
    hostname: &str,
) -> Result<Config, ConfigError> {
    let node_name = flags
        .hostname_override
        .clone()
        .unwrap_or_else(|| hostname.to_string())
        .trim()
        .to_lowercase();
    if node_name.is_empty() {
        return Err(invalid("node name is empty: set --hostname-override"));
    }
    let node_ips = match &flags.node_ip {
        Some(list) => list
            .split(',')
            .filter(|s| !s.trim().is_empty())
            .map(|s| ip("--node-ip", s))
            .collect::<Result<Vec<_>, _>>()?,
        None => Vec::new(),
    };
    let root_dir = PathBuf::from(
        flags
            .root_dir
            .clone()
            .unwrap_or_else(|| "/var/lib/kubelet".into()),
    );
    let cert_dir = flags
        .cert_dir
        .clone()
        .map(PathBuf::from)
        .unwrap_or_else(|| root_dir.join("pki"));
    let cgroup_driver = match flags
        .cgroup_driver
        .clone()
        .or(file.cgroup_driver.clone())
        .as_deref()
        .unwrap_or("cgroupfs")
    {
        "cgroupfs" => CgroupDriver::Cgroupfs,
        "systemd" => CgroupDriver::Systemd,
        other => {
            return Err(invalid(format!(
                "cgroupDriver: {other:?} is not supported: want \"cgroupfs\" or \"systemd\""
            )));
        }
    };
    let max_pods = flags.max_pods.or(file.max_pods).unwrap_or(110);
    if max_pods < 0 {
        return Err(invalid(format!("maxPods: {max_pods} must not be negative")));
    }
    let cluster_dns = match &flags.cluster_dns {
        Some(list) => list.split(',').map(str::to_string).collect(),
        None => file.cluster_dns.clone().unwrap_or_default(),
    }
    .iter()
    .filter(|s| !s.trim().is_empty())
    .map(|s| ip("clusterDNS", s))
    .collect::<Result<Vec<_>, _>>()?;
    let runtime_endpoint = flags
        .container_runtime_endpoint
        .clone()
        .or(file.container_runtime_endpoint.clone())
        .unwrap_or_else(|| DEFAULT_RUNTIME_ENDPOINT.into());
    if runtime_endpoint.is_empty() {
        return Err(invalid("containerRuntimeEndpoint must not be empty"));
    }
    let image_endpoint = flags
        .image_service_endpoint
        .clone()
        .or(file.image_service_endpoint.clone())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| runtime_endpoint.clone());
    let static_pod_path = flags
        .pod_manifest_path
        .clone()
        .or(file.static_pod_path.clone())
        .filter(|s| !s.is_empty())
        .map(PathBuf::from);
    let cgroup_root = flags
        .cgroup_root
        .clone()
        .or(file.cgroup_root.clone())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "/".into());
    if !cgroup_root.starts_with('/') {
        return Err(invalid(format!(
            "cgroupRoot: {cgroup_root:?} must be an absolute path"
        )));
    }
    let resolv_conf = flags
        .resolv_conf
        .clone()
        .or(file.resolv_conf.clone())
        .unwrap_or_else(|| "/etc/resolv.conf".into());

    Ok(Config {
        node_name,
        node_ips,
        node_labels: flags.node_labels.clone().unwrap_or_default(),
        kubeconfig: flags.kubeconfig.clone().map(PathBuf::from),
        bootstrap_kubeconfig: flags.bootstrap_kubeconfig.clone().map(PathBuf::from),
        root_dir,
        cert_dir,
        static_pod_path,
        proxy_config: flags
            .proxy_config
            .clone()
            .filter(|s| !s.is_empty())
            .map(PathBuf::from),
        sync_frequency: dur(
            "syncFrequency",
            &flags.sync_frequency,
            file.sync_frequency,
            Duration::from_secs(60),
        )?,
        file_check_frequency: dur(
            "fileCheckFrequency",
            &flags.file_check_frequency,
            file.file_check_frequency,
            Duration::from_secs(20),
        )?,
        address: ip(
            "address",
            flags
                .address
                .as_deref()
                .or(file.address.as_deref())
                .unwrap_or("0.0.0.0"),
        )?,
        port: port("port", flags.port.or(file.port).unwrap_or(10250), false)?,
        read_only_port: port(
            "readOnlyPort",
            flags.read_only_port.or(file.read_only_port).unwrap_or(0),
            true,
        )?,
        tls_cert_file: flags
            .tls_cert_file
            .clone()
            .or(file.tls_cert_file.clone())
            .map(PathBuf::from),
        tls_private_key_file: flags
            .tls_private_key_file
            .clone()
            .or(file.tls_private_key_file.clone())
            .map(PathBuf::from),
        healthz_port: port(
            "healthzPort",
            flags.healthz_port.or(file.healthz_port).unwrap_or(10248),
            true,
        )?,
        healthz_bind_address: ip(
            "healthzBindAddress",
            flags
                .healthz_bind_address
                .as_deref()
                .or(file.healthz_bind_address.as_deref())
                .unwrap_or("127.0.0.1"),
        )?,
        cluster_dns,
        cluster_domain: flags
            .cluster_domain
            .clone()
            .or(file.cluster_domain.clone())
            .unwrap_or_default(),
        resolv_conf: Some(resolv_conf)
            .filter(|s| !s.is_empty())
            .map(PathBuf::from),
        cgroup_driver,
        cgroup_root,
        cgroups_per_qos: flags
            .cgroups_per_qos
            .or(file.cgroups_per_qos)
            .unwrap_or(true),
        max_pods: max_pods as u32,
        pod_logs_dir: PathBuf::from(
            file.pod_logs_dir
                .clone()
                .unwrap_or_else(|| "/var/log/pods".into()),
        ),
        container_runtime_endpoint: runtime_endpoint,
        image_service_endpoint: image_endpoint,
        runtime_request_timeout: dur(
            "runtimeRequestTimeout",
            &flags.runtime_request_timeout,
            file.runtime_request_timeout,
            Duration::from_secs(120),
        )?,
        serialize_image_pulls: flags
            .serialize_image_pulls
            .or(file.serialize_image_pulls)
            .unwrap_or(true),
        rotate_certificates: flags
            .rotate_certificates
            .or(file.rotate_certificates)
            .unwrap_or(false),
        node_status_update_frequency: dur(
            "nodeStatusUpdateFrequency",
            &flags.node_status_update_frequency,
            file.node_status_update_frequency,
            Duration::from_secs(10),
        )?,
        fail_swap_on: flags.fail_swap_on.or(file.fail_swap_on).unwrap_or(true),
        pod_infra_container_image: flags.pod_infra_container_image.clone(),
        verbosity: flags.verbosity.unwrap_or(0),
        node_status_report_frequency: dur(
            "nodeStatusReportFrequency",
            &None,
            file.node_status_report_frequency,
            Duration::from_secs(300),
        )?,
        node_lease_duration_seconds: file
            .node_lease_duration_seconds
            .filter(|d| *d > 0)
            .unwrap_or(40),
        kube_api_qps: flags
            .kube_api_qps
            .or(file.kube_api_qps)
            .filter(|q| *q > 0)
            .unwrap_or(50),
        kube_api_burst: flags
            .kube_api_burst
            .or(file.kube_api_burst)
            .filter(|b| *b > 0)
            .unwrap_or(100),
        register_node: flags.register_node.or(file.register_node).unwrap_or(true),
        register_with_taints: register_taints(flags, &file)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    const KUBEADM_CONFIG: &str = r#"apiVersion: kubelet.config.k8s.io/v1beta1
authentication:
  anonymous:
    enabled: false
  webhook:
    cacheTTL: 0s
    enabled: true
  x509:
    clientCAFile: /etc/kubernetes/pki/ca.crt
authorization:
  mode: Webhook
  webhook:
    cacheAuthorizedTTL: 0s
    cacheUnauthorizedTTL: 0s
cgroupDriver: systemd
clusterDNS:
- 10.96.0.10
clusterDomain: cluster.local
containerRuntimeEndpoint: ""
cpuManagerReconcilePeriod: 0s
evictionPressureTransitionPeriod: 0s
fileCheckFrequency: 0s
healthzBindAddress: 127.0.0.1
healthzPort: 10248
httpCheckFrequency: 0s
imageMinimumGCAge: 0s
kind: KubeletConfiguration
logging:
  flushFrequency: 0
  options:
    json:
      infoBufferSize: "0"
  verbosity: 0
memorySwap: {}
nodeStatusReportFrequency: 0s
nodeStatusUpdateFrequency: 0s
resolvConf: /run/systemd/resolve/resolv.conf
rotateCertificates: true
runtimeRequestTimeout: 0s
shutdownGracePeriod: 0s
shutdownGracePeriodCriticalPods: 0s
staticPodPath: /etc/kubernetes/manifests
streamingConnectionIdleTimeout: 0s
syncFrequency: 0s
volumeStatsAggPeriod: 0s
"#;

    fn flags(args: &[&str]) -> Flags {
        Flags::try_parse_from(std::iter::once("kubelet").chain(args.iter().copied())).unwrap()
    }

    #[test]
    fn kubeadm_written_config_parses() {
        let file = parse_file("config.yaml", KUBEADM_CONFIG).unwrap();
        assert_eq!(file.cgroup_driver.as_deref(), Some("systemd"));
        assert_eq!(
            file.static_pod_path.as_deref(),
            Some("/etc/kubernetes/manifests")
        );
        let cfg = merge(
            &flags(&["--container-runtime-endpoint=unix:///run/x.sock"]),
            file,
            "Node-A",
        )
        .unwrap();
        assert_eq!(cfg.node_name, "node-a");
        assert_eq!(cfg.cgroup_driver, CgroupDriver::Systemd);
        assert_eq!(
            cfg.cluster_dns,
            vec!["10.96.0.10".parse::<IpAddr>().unwrap()]
        );
        assert!(cfg.rotate_certificates);
        assert_eq!(cfg.container_runtime_endpoint, "unix:///run/x.sock");
    }

    #[test]
    fn defaults_match_upstream() {
        let cfg = merge(&flags(&[]), KubeletConfiguration::default(), "n").unwrap();
        assert_eq!(cfg.port, 10250);
        assert_eq!(cfg.healthz_port, 10248);
        assert_eq!(cfg.read_only_port, 0);
        assert_eq!(cfg.max_pods, 110);
        assert_eq!(cfg.file_check_frequency, Duration::from_secs(20));
        assert_eq!(cfg.node_status_update_frequency, Duration::from_secs(10));
        assert_eq!(cfg.container_runtime_endpoint, DEFAULT_RUNTIME_ENDPOINT);
        assert_eq!(cfg.cgroup_driver, CgroupDriver::Cgroupfs);
        assert!(cfg.cgroups_per_qos);
        assert_eq!(cfg.node_status_report_frequency, Duration::from_secs(300));
        assert_eq!(
            (
                cfg.kube_api_qps,
                cfg.kube_api_burst,
                cfg.node_lease_duration_seconds
            ),
            (50, 100, 40)
        );
        assert!(cfg.register_node);
    }

    #[test]
    fn register_with_taints_flag() {
        let cfg = merge(
            &flags(&["--register-with-taints=dedicated=infra:NoSchedule,gpu:NoExecute"]),
            KubeletConfiguration::default(),
            "n",
        )
        .unwrap();
        assert_eq!(cfg.register_with_taints.len(), 2);
        assert_eq!(cfg.register_with_taints[0].value.as_deref(), Some("infra"));
        assert_eq!(cfg.register_with_taints[1].key, "gpu");
        assert!(
            merge(
                &flags(&["--register-with-taints=x=y:Sometimes"]),
                KubeletConfiguration::default(),
                "n"
            )
            .is_err()
        );
    }

    #[test]
    fn flags_override_file() {
        let file = parse_file("c", "maxPods: 20\nport: 11000\n").unwrap();
        let cfg = merge(&flags(&["--max-pods=30"]), file, "n").unwrap();
        assert_eq!(cfg.max_pods, 30);
        assert_eq!(cfg.port, 11000);
    }

    #[test]
    fn invalid_values_are_named() {
        let file = parse_file("c", "cgroupDriver: upstart\n").unwrap();
        let err = merge(&flags(&[]), file, "n").unwrap_err().to_string();
        assert!(
            err.contains("cgroupDriver") && err.contains("upstart"),
            "{err}"
        );
        let err = merge(
            &flags(&["--port=70000"]),
            KubeletConfiguration::default(),
            "n",
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("port") && err.contains("70000"), "{err}");
        let err = parse_file("c", "syncFrequency: soon\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("soon"), "{err}");
    }

    #[test]
    fn wrong_kind_rejected_unknown_fields_tolerated() {
        assert!(parse_file("c", "kind: Pod\n").is_err());
        assert!(parse_file("c", "someFutureField: 3\nmaxPods: 5\n").is_ok());
    }
}
