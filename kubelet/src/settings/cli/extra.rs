//! The rest of upstream's kubelet flags: the ones that map onto a KubeletConfiguration field
//! this agent acts on through the file (`--enable-server`, `--rotate-server-certificates`, …),
//! the resource-manager, logging and static-pod-URL flags, and the cAdvisor flags upstream
//! registers on Linux. What each does here is in the settings registry (`settings::FLAGS`);
//! values are checked with upstream's syntax (pflag types) so a typo stops the start as
//! upstream's does.

use super::{go_duration_text, parse_go_bool, parse_map, quantity_text};
use clap::Args;
use std::collections::BTreeMap;

/// Upstream flags beyond the ones kubeadm and installers commonly pass (see the module doc).
#[derive(Debug, Args, Default, Clone)]
pub struct ExtraFlags {
    /// Enable the kubelet's server (enableServer).
    #[arg(long = "enable-server", num_args = 0..=1, require_equals = true, default_missing_value = "true", value_parser = parse_go_bool)]
    pub enable_server: Option<bool>,
    /// Debugging handlers on :10250 (enableDebuggingHandlers).
    #[arg(long = "enable-debugging-handlers", num_args = 0..=1, require_equals = true, default_missing_value = "true", value_parser = parse_go_bool)]
    pub enable_debugging_handlers: Option<bool>,
    /// Block profiling (enableContentionProfiling).
    #[arg(long = "contention-profiling", num_args = 0..=1, require_equals = true, default_missing_value = "true", value_parser = parse_go_bool)]
    pub contention_profiling: Option<bool>,
    /// The kubelet's iptables utility chains (makeIPTablesUtilChains).
    #[arg(long = "make-iptables-util-chains", num_args = 0..=1, require_equals = true, default_missing_value = "true", value_parser = parse_go_bool)]
    pub make_iptables_util_chains: Option<bool>,
    /// Serving certificate from a kubelet-serving CSR (serverTLSBootstrap).
    #[arg(long = "rotate-server-certificates", num_args = 0..=1, require_equals = true, default_missing_value = "true", value_parser = parse_go_bool)]
    pub rotate_server_certificates: Option<bool>,
    /// How often volumes are measured (volumeStatsAggPeriod).
    #[arg(long = "volume-stats-agg-period", allow_hyphen_values = true, value_parser = go_duration_text)]
    pub volume_stats_agg_period: Option<String>,
    /// Refuse cgroup v1 hosts (failCgroupV1).
    #[arg(long = "fail-cgroupv1", num_args = 0..=1, require_equals = true, default_missing_value = "true", value_parser = parse_go_bool)]
    pub fail_cgroupv1: Option<bool>,
    /// Memcg threshold notifications (kernelMemcgNotification).
    #[arg(long = "kernel-memcg-notification", num_args = 0..=1, require_equals = true, default_missing_value = "true", value_parser = parse_go_bool)]
    pub kernel_memcg_notification: Option<bool>,
    /// Volumes attached by the controller (enableControllerAttachDetach).
    #[arg(long = "enable-controller-attach-detach", num_args = 0..=1, require_equals = true, default_missing_value = "true", value_parser = parse_go_bool)]
    pub enable_controller_attach_detach: Option<bool>,
    /// Exit after starting the static pods (deprecated upstream).
    #[arg(long = "runonce", num_args = 0..=1, require_equals = true, default_missing_value = "true", value_parser = parse_go_bool)]
    pub runonce: Option<bool>,
    /// Ignore hard eviction thresholds in allocatable (deprecated upstream).
    #[arg(long = "experimental-allocatable-ignore-eviction", num_args = 0..=1, require_equals = true, default_missing_value = "true", value_parser = parse_go_bool)]
    pub experimental_allocatable_ignore_eviction: Option<bool>,
    /// Path of a mounter binary (deprecated upstream).
    #[arg(long = "experimental-mounter-path")]
    pub experimental_mounter_path: Option<String>,
    /// Content type of apiserver requests (contentType).
    #[arg(long = "kube-api-content-type")]
    pub kube_api_content_type: Option<String>,
    /// cgroup for non-kernel processes (systemCgroups).
    #[arg(long = "system-cgroups")]
    pub system_cgroups: Option<String>,
    /// Static pods from a URL (staticPodURL).
    #[arg(long = "manifest-url")]
    pub manifest_url: Option<String>,
    /// HTTP headers for --manifest-url (staticPodURLHeader), `name:value,...`; repeatable.
    #[arg(long = "manifest-url-header", action = clap::ArgAction::Append)]
    pub manifest_url_header: Option<Vec<String>>,
    /// How often --manifest-url is read (httpCheckFrequency).
    #[arg(long = "http-check-frequency", allow_hyphen_values = true, value_parser = go_duration_text)]
    pub http_check_frequency: Option<String>,
    /// CPU manager (cpuManagerPolicy).
    #[arg(long = "cpu-manager-policy")]
    pub cpu_manager_policy: Option<String>,
    /// CPU manager options (cpuManagerPolicyOptions), `key=value,...`.
    #[arg(long = "cpu-manager-policy-options", value_parser = parse_map)]
    pub cpu_manager_policy_options: Option<BTreeMap<String, String>>,
    /// CPU manager reconcile period (cpuManagerReconcilePeriod).
    #[arg(long = "cpu-manager-reconcile-period", allow_hyphen_values = true, value_parser = go_duration_text)]
    pub cpu_manager_reconcile_period: Option<String>,
    /// Memory manager (memoryManagerPolicy).
    #[arg(long = "memory-manager-policy")]
    pub memory_manager_policy: Option<String>,
    /// NUMA memory reservations (reservedMemory), `0:memory=1Gi,...`; repeatable.
    #[arg(long = "reserved-memory", action = clap::ArgAction::Append)]
    pub reserved_memory: Option<Vec<String>>,
    /// Topology manager (topologyManagerPolicy).
    #[arg(long = "topology-manager-policy")]
    pub topology_manager_policy: Option<String>,
    /// Topology manager options (topologyManagerPolicyOptions), `key=value,...`.
    #[arg(long = "topology-manager-policy-options", value_parser = parse_map)]
    pub topology_manager_policy_options: Option<BTreeMap<String, String>>,
    /// Topology manager scope (topologyManagerScope).
    #[arg(long = "topology-manager-scope")]
    pub topology_manager_scope: Option<String>,
    /// QoS-level reservations (qosReserved), `memory=50%`.
    #[arg(long = "qos-reserved", value_parser = parse_map)]
    pub qos_reserved: Option<BTreeMap<String, String>>,
    /// Text format: errors to stderr, info to stdout (logging.options.text.splitStream).
    #[arg(long = "log-text-split-stream", num_args = 0..=1, require_equals = true, default_missing_value = "true", value_parser = parse_go_bool)]
    pub log_text_split_stream: Option<bool>,
    /// Text format: info buffer (logging.options.text.infoBufferSize), a quantity.
    #[arg(long = "log-text-info-buffer-size", value_parser = quantity_text)]
    pub log_text_info_buffer_size: Option<String>,
    /// JSON format: errors to stderr, info to stdout (logging.options.json.splitStream).
    #[arg(long = "log-json-split-stream", num_args = 0..=1, require_equals = true, default_missing_value = "true", value_parser = parse_go_bool)]
    pub log_json_split_stream: Option<bool>,
    /// JSON format: info buffer (logging.options.json.infoBufferSize), a quantity.
    #[arg(long = "log-json-info-buffer-size", value_parser = quantity_text)]
    pub log_json_info_buffer_size: Option<String>,
    #[command(flatten)]
    pub cadvisor: CadvisorFlags,
}

/// The cAdvisor flags upstream's kubelet registers on Linux (`globalflags_linux.go`); all but
/// `--housekeeping-interval` deprecated upstream. This agent has no cAdvisor.
#[derive(Debug, Args, Default, Clone)]
pub struct CadvisorFlags {
    #[arg(long = "housekeeping-interval", allow_hyphen_values = true, value_parser = go_duration_text)]
    pub housekeeping_interval: Option<String>,
    #[arg(long = "global-housekeeping-interval", allow_hyphen_values = true, value_parser = go_duration_text)]
    pub global_housekeeping_interval: Option<String>,
    #[arg(long = "application-metrics-count-limit", allow_hyphen_values = true)]
    pub application_metrics_count_limit: Option<i64>,
    #[arg(long = "boot-id-file")]
    pub boot_id_file: Option<String>,
    #[arg(long = "machine-id-file")]
    pub machine_id_file: Option<String>,
    #[arg(long = "container-hints")]
    pub container_hints: Option<String>,
    #[arg(long = "containerd")]
    pub containerd: Option<String>,
    #[arg(long = "containerd-namespace")]
    pub containerd_namespace: Option<String>,
    #[arg(long = "enable-load-reader", num_args = 0..=1, require_equals = true, default_missing_value = "true", value_parser = parse_go_bool)]
    pub enable_load_reader: Option<bool>,
    #[arg(long = "event-storage-age-limit")]
    pub event_storage_age_limit: Option<String>,
    #[arg(long = "event-storage-event-limit")]
    pub event_storage_event_limit: Option<String>,
    #[arg(long = "log-cadvisor-usage", num_args = 0..=1, require_equals = true, default_missing_value = "true", value_parser = parse_go_bool)]
    pub log_cadvisor_usage: Option<bool>,
    #[arg(long = "storage-driver-user")]
    pub storage_driver_user: Option<String>,
    #[arg(long = "storage-driver-password")]
    pub storage_driver_password: Option<String>,
    #[arg(long = "storage-driver-host")]
    pub storage_driver_host: Option<String>,
    #[arg(long = "storage-driver-db")]
    pub storage_driver_db: Option<String>,
    #[arg(long = "storage-driver-table")]
    pub storage_driver_table: Option<String>,
    #[arg(long = "storage-driver-secure", num_args = 0..=1, require_equals = true, default_missing_value = "true", value_parser = parse_go_bool)]
    pub storage_driver_secure: Option<bool>,
    #[arg(long = "storage-driver-buffer-duration", allow_hyphen_values = true, value_parser = go_duration_text)]
    pub storage_driver_buffer_duration: Option<String>,
}
