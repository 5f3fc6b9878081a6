//! The config file: the v1beta1 KubeletConfiguration as written, and its parsing.

use super::ConfigError;
use plumbing::duration;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::time::Duration;

/// The v1beta1 KubeletConfiguration. Every upstream field is declared: the ones the agent acts
/// on are typed, the others kept as raw values that [`crate::settings`] warns about (or refuses)
/// when set to non-defaults. Fields upstream does not have land in `extra` and are named in a
/// warning, as upstream's lenient decoding reports them. Values are validated in [`merge`].
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
    pub tls_cipher_suites: Option<Vec<String>>,
    pub tls_min_version: Option<String>,
    pub healthz_port: Option<i32>,
    pub healthz_bind_address: Option<String>,
    #[serde(rename = "clusterDNS")]
    pub cluster_dns: Option<Vec<String>>,
    pub cluster_domain: Option<String>,
    pub resolv_conf: Option<String>,
    pub cgroup_driver: Option<String>,
    pub cgroup_root: Option<String>,
    #[serde(rename = "cgroupsPerQOS")]
    pub cgroups_per_qos: Option<bool>,
    pub max_pods: Option<i32>,
    pub pod_logs_dir: Option<String>,
    pub container_runtime_endpoint: Option<String>,
    pub image_service_endpoint: Option<String>,
    #[serde(with = "duration::serde_opt")]
    pub runtime_request_timeout: Option<Duration>,
    pub serialize_image_pulls: Option<bool>,
    pub rotate_certificates: Option<bool>,
    #[serde(rename = "serverTLSBootstrap")]
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
    #[serde(rename = "kubeAPIBurst")]
    pub kube_api_burst: Option<i32>,
    pub eviction_hard: Option<BTreeMap<String, String>>,
    pub authentication: Option<KubeletAuthentication>,
    pub authorization: Option<KubeletAuthorization>,
    pub protect_kernel_defaults: Option<bool>,
    pub register_with_taints: Option<Vec<serde_json::Value>>,
    #[serde(rename = "podCIDR")]
    pub pod_cidr: Option<String>,
    pub http_check_frequency: Option<serde_json::Value>,
    #[serde(rename = "staticPodURL")]
    pub static_pod_url: Option<serde_json::Value>,
    #[serde(rename = "staticPodURLHeader")]
    pub static_pod_url_header: Option<serde_json::Value>,
    #[serde(rename = "registryPullQPS")]
    pub registry_pull_qps: Option<i32>,
    pub registry_burst: Option<i32>,
    pub image_pull_credentials_verification_policy: Option<serde_json::Value>,
    pub preloaded_images_verification_allowlist: Option<serde_json::Value>,
    #[serde(rename = "eventRecordQPS")]
    pub event_record_qps: Option<i32>,
    pub event_burst: Option<i32>,
    pub enable_debugging_handlers: Option<bool>,
    pub enable_contention_profiling: Option<serde_json::Value>,
    pub oom_score_adj: Option<serde_json::Value>,
    #[serde(with = "duration::serde_opt")]
    pub streaming_connection_idle_timeout: Option<Duration>,
    #[serde(rename = "imageMinimumGCAge")]
    pub image_minimum_gc_age: Option<serde_json::Value>,
    #[serde(rename = "imageMaximumGCAge")]
    pub image_maximum_gc_age: Option<serde_json::Value>,
    #[serde(rename = "imageGCHighThresholdPercent")]
    pub image_gc_high_threshold_percent: Option<serde_json::Value>,
    #[serde(rename = "imageGCLowThresholdPercent")]
    pub image_gc_low_threshold_percent: Option<serde_json::Value>,
    #[serde(with = "duration::serde_opt")]
    pub volume_stats_agg_period: Option<Duration>,
    pub kubelet_cgroups: Option<serde_json::Value>,
    pub system_cgroups: Option<serde_json::Value>,
    pub cpu_manager_policy: Option<serde_json::Value>,
    pub cpu_manager_policy_options: Option<serde_json::Value>,
    pub cpu_manager_reconcile_period: Option<serde_json::Value>,
    #[serde(rename = "singleProcessOOMKill")]
    pub single_process_oom_kill: Option<serde_json::Value>,
    pub memory_manager_policy: Option<serde_json::Value>,
    pub topology_manager_policy: Option<serde_json::Value>,
    pub topology_manager_scope: Option<serde_json::Value>,
    pub topology_manager_policy_options: Option<serde_json::Value>,
    pub qos_reserved: Option<serde_json::Value>,
    pub hairpin_mode: Option<serde_json::Value>,
    pub pod_pids_limit: Option<serde_json::Value>,
    pub run_once: Option<serde_json::Value>,
    #[serde(rename = "cpuCFSQuota")]
    pub cpu_cfs_quota: Option<serde_json::Value>,
    #[serde(rename = "cpuCFSQuotaPeriod")]
    pub cpu_cfs_quota_period: Option<serde_json::Value>,
    pub node_status_max_images: Option<i32>,
    pub max_open_files: Option<serde_json::Value>,
    pub content_type: Option<serde_json::Value>,
    pub max_parallel_image_pulls: Option<serde_json::Value>,
    pub eviction_soft: Option<serde_json::Value>,
    pub eviction_soft_grace_period: Option<serde_json::Value>,
    pub eviction_pressure_transition_period: Option<serde_json::Value>,
    pub eviction_max_pod_grace_period: Option<serde_json::Value>,
    pub eviction_minimum_reclaim: Option<serde_json::Value>,
    pub merge_default_eviction_settings: Option<serde_json::Value>,
    pub pods_per_core: Option<serde_json::Value>,
    pub enable_controller_attach_detach: Option<serde_json::Value>,
    #[serde(rename = "makeIPTablesUtilChains")]
    pub make_ip_tables_util_chains: Option<serde_json::Value>,
    pub iptables_masquerade_bit: Option<serde_json::Value>,
    pub iptables_drop_bit: Option<serde_json::Value>,
    pub feature_gates: Option<serde_json::Value>,
    pub memory_swap: Option<serde_json::Value>,
    pub container_log_max_size: Option<serde_json::Value>,
    pub container_log_max_files: Option<serde_json::Value>,
    pub container_log_max_workers: Option<serde_json::Value>,
    pub container_log_monitor_interval: Option<serde_json::Value>,
    pub config_map_and_secret_change_detection_strategy: Option<serde_json::Value>,
    pub system_reserved: Option<serde_json::Value>,
    pub kube_reserved: Option<serde_json::Value>,
    #[serde(rename = "reservedSystemCPUs")]
    pub reserved_system_cpus: Option<serde_json::Value>,
    pub show_hidden_metrics_for_version: Option<serde_json::Value>,
    pub system_reserved_cgroup: Option<serde_json::Value>,
    pub kube_reserved_cgroup: Option<serde_json::Value>,
    pub enforce_node_allocatable: Option<serde_json::Value>,
    pub allowed_unsafe_sysctls: Option<Vec<String>>,
    pub volume_plugin_dir: Option<serde_json::Value>,
    #[serde(rename = "providerID")]
    pub provider_id: Option<serde_json::Value>,
    pub kernel_memcg_notification: Option<serde_json::Value>,
    pub logging: Option<serde_json::Value>,
    pub enable_system_log_handler: Option<serde_json::Value>,
    pub enable_system_log_query: Option<serde_json::Value>,
    #[serde(with = "duration::serde_opt")]
    pub shutdown_grace_period: Option<Duration>,
    #[serde(with = "duration::serde_opt")]
    pub shutdown_grace_period_critical_pods: Option<Duration>,
    pub shutdown_grace_period_by_pod_priority: Option<Vec<PriorityGrace>>,
    pub crash_loop_back_off: Option<serde_json::Value>,
    pub reserved_memory: Option<serde_json::Value>,
    pub enable_profiling_handler: Option<serde_json::Value>,
    pub enable_debug_flags_handler: Option<serde_json::Value>,
    pub seccomp_default: Option<bool>,
    pub memory_throttling_factor: Option<serde_json::Value>,
    pub tracing: Option<serde_json::Value>,
    pub local_storage_capacity_isolation: Option<serde_json::Value>,
    #[serde(rename = "failCgroupV1")]
    pub fail_cgroup_v1: Option<serde_json::Value>,
    pub user_namespaces: Option<serde_json::Value>,
    /// Ours: the node network controller (the `network` subsystem).
    pub node_agent_network: Option<NetworkFileSettings>,
    /// Ours: the servers' connection limits.
    pub node_agent_server: Option<ServerFileSettings>,
    /// Fields upstream's v1beta1 does not have (named in a warning at start).
    #[serde(flatten)]
    pub extra: BTreeMap<String, serde_json::Value>,
}

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

// ---------------------------------------------------------------------------------------
// Nested objects as written in the file (each resolved by its subsystem's settings).

/// `authentication` (upstream's KubeletAuthentication).
#[derive(Debug, Default, Clone, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", default)]
pub struct KubeletAuthentication {
    pub x509: Option<KubeletX509Authentication>,
    pub webhook: Option<KubeletWebhookAuthentication>,
    pub anonymous: Option<KubeletAnonymousAuthentication>,
}

#[derive(Debug, Default, Clone, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", default)]
pub struct KubeletX509Authentication {
    #[serde(rename = "clientCAFile")]
    pub client_ca_file: Option<String>,
}

#[derive(Debug, Default, Clone, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", default)]
pub struct KubeletWebhookAuthentication {
    pub enabled: Option<bool>,
    #[serde(rename = "cacheTTL")]
    pub cache_ttl: Option<serde_json::Value>,
}

#[derive(Debug, Default, Clone, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", default)]
pub struct KubeletAnonymousAuthentication {
    pub enabled: Option<bool>,
}

/// `authorization` (upstream's KubeletAuthorization).
#[derive(Debug, Default, Clone, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", default)]
pub struct KubeletAuthorization {
    pub mode: Option<String>,
    pub webhook: Option<KubeletWebhookAuthorization>,
}

#[derive(Debug, Default, Clone, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", default)]
pub struct KubeletWebhookAuthorization {
    #[serde(rename = "cacheAuthorizedTTL")]
    pub cache_authorized_ttl: Option<serde_json::Value>,
    #[serde(rename = "cacheUnauthorizedTTL")]
    pub cache_unauthorized_ttl: Option<serde_json::Value>,
}

/// `nodeAgentServer` (the `server` subsystem) as written in the config file.
#[derive(Debug, Default, Clone, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase", default)]
pub struct ServerFileSettings {
    pub max_connections: Option<i64>,
    pub max_connections_per_source: Option<i64>,
    pub authenticated_connection_reserve: Option<i64>,
    pub max_connections_per_identity: Option<i64>,
}

/// `nodeAgentNetwork` (the `network` subsystem) as written in the config file.
#[derive(Debug, Default, Clone, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase", default)]
pub struct NetworkFileSettings {
    pub enabled: Option<bool>,
    #[serde(rename = "clusterCIDR")]
    pub cluster_cidr: Option<String>,
    pub cni_conf_dir: Option<String>,
    pub cni_bin_dir: Option<String>,
    pub plugin_path: Option<String>,
    pub mtu: Option<u32>,
    pub data_dir: Option<String>,
}

/// One `shutdownGracePeriodByPodPriority` entry: pods at or above `priority` (up to the next
/// entry) get `grace_seconds`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PriorityGrace {
    pub priority: i32,
    pub shutdown_grace_period_seconds: i64,
}
