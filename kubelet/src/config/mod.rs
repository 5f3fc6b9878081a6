//! KubeletConfiguration (kubelet.config.k8s.io/v1beta1) and the validated settings the agent runs
//! with. [`load`] is a pure function of the flags and the config file's text.

pub mod cloud;
pub mod dropins;
mod extra_flags;
mod file;
pub mod gc;
pub mod limits;
pub mod resources;
mod system_cgroups;

pub use file::{KubeletConfiguration, parse_file};

use crate::cm::CgroupDriver;
use crate::flags::Flags;
use crate::network::settings as network;
use crate::server::settings as server;
use plumbing::duration;
use serde::Serialize;
use std::collections::BTreeMap;
use std::{net::IpAddr, path::PathBuf, time::Duration};

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
    /// Security-relevant settings set to values whose behaviour the agent does not provide.
    #[error("refusing to start: {}", .0.join("; "))]
    Refused(Vec<String>),
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
    /// `maxOpenFiles`: RLIMIT_NOFILE set at start.
    pub max_open_files: u64,
    /// `oomScoreAdj`: the process's own OOM score adjustment, written at start.
    pub oom_score_adj: i32,
    /// `nodeAgentServer` (ours): the servers' connection limits.
    pub server: server::Settings,
    /// `nodeStatusMaxImages`: how many images the Node's status lists (-1: all).
    pub node_status_max_images: i32,
    pub tls_cert_file: Option<PathBuf>,
    pub tls_private_key_file: Option<PathBuf>,
    /// The `ReloadKubeletServerCertificateFile` gate (beta, on by default as upstream): a
    /// configured serving pair is reloaded when its files change.
    #[serde(skip)]
    pub reload_tls_cert_files: bool,
    pub healthz_port: u16,
    pub healthz_bind_address: IpAddr,
    #[serde(rename = "clusterDNS")]
    pub cluster_dns: Vec<IpAddr>,
    pub cluster_domain: String,
    pub resolv_conf: Option<PathBuf>,
    pub cgroup_driver: CgroupDriver,
    pub cgroup_root: String,
    pub cgroups_per_qos: bool,
    /// The cgroups of the Summary's `node.systemContainers`.
    #[serde(skip)]
    pub system_cgroups: crate::stats::system::SystemCgroups,
    pub max_pods: u32,
    pub pod_logs_dir: PathBuf,
    /// `enableSystemLogHandler` (default true): `/logs/` is served.
    pub enable_system_log_handler: bool,
    /// `enableDebuggingHandlers` (default true): exec, attach, port-forward, run, logs.
    pub enable_debugging_handlers: bool,
    /// `enableDebugFlagsHandler`, `enableProfilingHandler` and the z-page gates.
    #[serde(flatten)]
    pub debug: server::DebugSettings,
    pub container_runtime_endpoint: String,
    pub image_service_endpoint: String,
    #[serde(with = "duration::serde_opt_plain")]
    pub runtime_request_timeout: Duration,
    /// `streamingConnectionIdleTimeout` (default 4h): an exec/attach/port-forward connection
    /// with no traffic for this long is closed.
    #[serde(with = "duration::serde_opt_plain")]
    pub streaming_connection_idle_timeout: Duration,
    /// `volumeStatsAggPeriod` (default 1m; `0s` means the default, as upstream's defaulting):
    /// how often volumes' and log directories' usage is measured.
    #[serde(with = "duration::serde_opt_plain")]
    pub volume_stats_agg_period: Duration,
    /// `serializeImagePulls` and `maxParallelImagePulls`.
    pub pull_gate: crate::images::PullSettings,
    /// `registryPullQPS` / `registryBurst` (default 5 / 10; 0 QPS: no limit): the image pull
    /// token bucket.
    #[serde(rename = "registryPullQPS")]
    pub registry_pull_qps: i32,
    pub registry_burst: i32,
    /// `eventRecordQPS` / `eventBurst` (default 50 / 100): the event writer's rate limit.
    #[serde(rename = "eventRecordQPS")]
    pub event_record_qps: i32,
    pub event_burst: i32,
    /// `makeIPTablesUtilChains` (default true): the kubelet's iptables chains.
    pub make_iptables_util_chains: bool,
    pub rotate_certificates: bool,
    #[serde(with = "duration::serde_opt_plain")]
    pub node_status_update_frequency: Duration,
    pub fail_swap_on: bool,
    pub pod_infra_container_image: Option<String>,
    pub verbosity: u8,
    /// `logging` (format, verbosity, vmodule, split streams) with the logging flags over it.
    #[serde(skip)]
    pub logging: plumbing::logging::Options,
    /// Cluster mode: `nodeStatusReportFrequency` (default 5m).
    #[serde(with = "duration::serde_opt_plain")]
    pub node_status_report_frequency: Duration,
    /// Graceful node shutdown (`shutdownGracePeriod*`); disabled when empty.
    pub shutdown: crate::shutdown::Settings,
    /// `userNamespaces` (pods with `hostUsers: false`).
    pub user_namespaces: crate::userns::Settings,
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
    /// `enableServer` (default true): serve the :10250 API.
    pub enable_server: bool,
    /// `authentication` / `authorization`, flags over file, upstream's defaults.
    pub auth: crate::server::AuthSettings,
    /// `tlsMinVersion` (validated).
    pub tls_min_version: Option<String>,
    /// `tlsCipherSuites` (validated).
    pub tls_cipher_suites: Vec<String>,
    /// `serverTLSBootstrap`: the serving certificate comes from a `kubernetes.io/kubelet-serving`
    /// CSR (cluster mode only) and is rotated before expiry.
    pub server_tls_bootstrap: bool,
    /// `protectKernelDefaults`: the start fails when kernel tunables differ from upstream's.
    pub protect_kernel_defaults: bool,
    /// `seccompDefault`: containers without a seccomp profile run with `RuntimeDefault`.
    pub seccomp_default: bool,
    /// `allowedUnsafeSysctls`, validated: pods may set these beside the safe sysctls.
    pub allowed_unsafe_sysctls: Vec<String>,
    /// Reservations, node allocatable enforcement and eviction thresholds, validated.
    pub resources: crate::cm::NodeResources,
    /// `containerLogMaxSize`, `containerLogMaxFiles`, `containerLogMaxWorkers`,
    /// `containerLogMonitorInterval` (flags over file), validated.
    pub container_log: crate::logs::Settings,
    /// `nodeAgentNetwork` / `--node-agent-cni`: the node network controller (ours).
    pub network: network::Settings,
    /// cpuCFSQuota, cpuCFSQuotaPeriod, podPidsLimit, memorySwap.swapBehavior.
    pub pod_limits: crate::cm::PodLimits,
    /// `crashLoopBackOff.maxContainerRestartPeriod`: the container restart back-off's cap.
    pub crash_loop_max: Duration,
    /// Image garbage collection, validated.
    pub image_gc: crate::images::ImageGcPolicy,
    /// Container garbage collection (deprecated flags only).
    pub container_gc: crate::runtime::ContainerGcPolicy,
    /// `imagePullCredentialsVerificationPolicy`, `preloadedImagesVerificationAllowlist` and
    /// the `KubeletEnsureSecretPulledImages` gate, validated.
    #[serde(flatten)]
    pub image_pulls: crate::images::PullRecordsSettings,
    /// The `EventedPLEG` gate (alpha, off by default as upstream).
    #[serde(skip)]
    pub evented_pleg: bool,
    /// The `ResourceHealthStatus` gate (beta, on by default in v1.36 as upstream): container
    /// statuses carry their devices' health (`allocatedResourcesStatus`).
    #[serde(skip)]
    pub resource_health_status: bool,
    /// The `SELinuxMount` gate (beta, off by default in v1.36 as upstream): SELinux mount
    /// labels for volumes of every access mode, not only ReadWriteOncePod ones.
    #[serde(skip)]
    pub selinux_mount: bool,
    /// `--image-credential-provider-config` (a file or a directory) and
    /// `--image-credential-provider-bin-dir`: credential provider plugins.
    pub image_credential_provider_config: Option<PathBuf>,
    pub image_credential_provider_bin_dir: Option<PathBuf>,
    /// `--cloud-provider` (empty or `external`) and `--provider-id` / `providerID`.
    pub cloud: cloud::CloudSettings,
}

/// Upstream's default CRI endpoint on Linux.
pub const DEFAULT_RUNTIME_ENDPOINT: &str = "unix:///run/containerd/containerd.sock";

/// `--config` (if given) with the `--config-dir` drop-ins applied: the configuration and the
/// text it was read from (None: neither given).
fn read(flags: &Flags) -> Result<(KubeletConfiguration, Option<String>), ConfigError> {
    let main = match &flags.config {
        Some(path) => {
            let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
                path: path.clone(),
                source,
            })?;
            Some((path.as_str(), text))
        }
        None => None,
    };
    let text = match flags.config_dir.as_deref().filter(|d| !d.is_empty()) {
        Some(dir) => Some((
            "the configuration with its drop-ins",
            dropins::merge(main.as_ref().map(|(p, t)| (*p, t.as_str())), dir.as_ref())?,
        )),
        None => main,
    };
    match text {
        Some((path, text)) => Ok((parse_file(path, &text)?, Some(text))),
        None => Ok((KubeletConfiguration::default(), None)),
    }
}

/// Reads `--config` (if given, with its `--config-dir` drop-ins) and merges the flags over
/// it. Flags win, as upstream.
pub fn load(flags: &Flags, hostname: &str) -> Result<Config, ConfigError> {
    merge(flags, read(flags)?.0, hostname)
}

/// [`load`], plus the check of every setting against [`crate::settings`]: `given` are the flags
/// given on the command line (`(long name, raw value)`). Returns the warnings to log; settings
/// refused by the registry are an error.
pub fn load_checked(
    flags: &Flags,
    given: &[(String, String)],
    hostname: &str,
) -> Result<(Config, Vec<String>), ConfigError> {
    let (file, text) = read(flags)?;
    let findings = crate::settings::check(given, text.as_deref());
    if !findings.refusals.is_empty() {
        return Err(ConfigError::Refused(findings.refusals));
    }
    limits::check_gates(flags, &file)?;
    let mut warnings = findings.warnings;
    warnings.extend(limits::unread_gates(flags, &file));
    Ok((merge(flags, file, hostname)?, warnings))
}

/// The node's pod capacity, as upstream's node status computes it: `maxPods`, or with
/// `podsPerCore` set, `podsPerCore` × the CPU count when that is lower.
pub fn pod_capacity(max_pods: u32, pods_per_core: u32, cores: usize) -> u32 {
    if pods_per_core == 0 {
        return max_pods;
    }
    let per_core = u64::from(pods_per_core).saturating_mul(cores as u64);
    per_core.min(u64::from(max_pods)) as u32
}

/// `registryPullQPS`, `registryBurst`, `eventRecordQPS`, `eventBurst` (flag over file over
/// upstream's default), each refused when negative with upstream's message.
fn rate_limits(flags: &Flags, file: &KubeletConfiguration) -> Result<[i32; 4], ConfigError> {
    use crate::images::throttle::{DEFAULT_BURST, DEFAULT_QPS};
    let all = [
        (
            flags.registry_qps,
            file.registry_pull_qps,
            DEFAULT_QPS,
            "registryPullQPS (--registry-qps)",
        ),
        (
            flags.registry_burst,
            file.registry_burst,
            DEFAULT_BURST,
            "registryBurst (--registry-burst)",
        ),
        (
            flags.event_qps,
            file.event_record_qps,
            50,
            "eventRecordQPS (--event-qps)",
        ),
        (
            flags.event_burst,
            file.event_burst,
            100,
            "eventBurst (--event-burst)",
        ),
    ];
    let mut out = [0; 4];
    for (slot, (flag, file, default, name)) in out.iter_mut().zip(all) {
        let v = flag.or(file).unwrap_or(default);
        if v < 0 {
            return Err(invalid(format!("{name} {v} must not be a negative number")));
        }
        *slot = v;
    }
    Ok(out)
}

pub(super) fn invalid(msg: impl Into<String>) -> ConfigError {
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
    mut file: KubeletConfiguration,
    hostname: &str,
) -> Result<Config, ConfigError> {
    extra_flags::apply(&flags.extra, &mut file)?;
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
    let allowed_unsafe_sysctls = flags
        .allowed_unsafe_sysctls
        .clone()
        .or(file.allowed_unsafe_sysctls.clone())
        .unwrap_or_default();
    crate::pod::SysctlAllowlist::new(&allowed_unsafe_sysctls)
        .map_err(|e| invalid(format!("allowedUnsafeSysctls: {e}")))?;
    let resources = resources::parse(flags, &file)?;
    let pod_limits = limits::parse(flags, &file)?;
    let crash_loop_max = limits::crash_loop_max(flags, &file)?;
    let image_gc = gc::image_policy(flags, &file)?;
    let container_gc = gc::container_policy(flags)?;
    let image_pulls = crate::images::PullRecordsSettings::parse(
        limits::gate_or(flags, &file, crate::images::PULL_RECORDS_GATE, true),
        file.image_pull_credentials_verification_policy.as_ref(),
        file.preloaded_images_verification_allowlist.as_ref(),
    )
    .map_err(invalid)?;
    let pull_gate = crate::images::PullSettings::parse(
        flags.serialize_image_pulls,
        file.serialize_image_pulls,
        file.max_parallel_image_pulls.as_ref(),
    )
    .map_err(invalid)?;
    let max_pods = flags.max_pods.or(file.max_pods).unwrap_or(110);
    if max_pods < 0 {
        return Err(invalid(format!("maxPods: {max_pods} must not be negative")));
    }
    let pods_per_core = match (flags.pods_per_core, &file.pods_per_core) {
        (Some(n), _) => n,
        (None, None | Some(serde_json::Value::Null)) => 0,
        (None, Some(v)) => v
            .as_i64()
            .and_then(|n| i32::try_from(n).ok())
            .ok_or_else(|| invalid(format!("podsPerCore: {v} is not an integer")))?,
    };
    if pods_per_core < 0 {
        return Err(invalid(format!(
            "podsPerCore (--pods-per-core) {pods_per_core} must not be a negative number"
        )));
    }
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let max_pods = pod_capacity(max_pods as u32, pods_per_core as u32, cores);
    let oom_score_adj = match (flags.oom_score_adj, &file.oom_score_adj) {
        (Some(n), _) => n,
        (None, None | Some(serde_json::Value::Null)) => -999,
        (None, Some(v)) => v
            .as_i64()
            .and_then(|n| i32::try_from(n).ok())
            .ok_or_else(|| invalid(format!("oomScoreAdj: {v} is not an integer")))?,
    };
    if !plumbing::oom_score::RANGE.contains(&oom_score_adj) {
        return Err(invalid(format!(
            "oomScoreAdj (--oom-score-adj) {oom_score_adj} must be between -1000 and 1000, inclusive"
        )));
    }
    let rates = rate_limits(flags, &file)?;
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
    let auth = server::auth_settings(
        server::AuthFlags {
            anonymous_auth: flags.anonymous_auth,
            authentication_token_webhook: flags.authentication_token_webhook,
            authentication_token_webhook_cache_ttl: flags
                .authentication_token_webhook_cache_ttl
                .as_deref(),
            authorization_mode: flags.authorization_mode.as_deref(),
            authorization_webhook_cache_authorized_ttl: flags
                .authorization_webhook_cache_authorized_ttl
                .as_deref(),
            authorization_webhook_cache_unauthorized_ttl: flags
                .authorization_webhook_cache_unauthorized_ttl
                .as_deref(),
            client_ca_file: flags.client_ca_file.as_deref(),
        },
        flags.config.is_some(),
        file.authentication.as_ref(),
        file.authorization.as_ref(),
    )
    .map_err(invalid)?;
    let tls_min_version = flags
        .tls_min_version
        .clone()
        .or(file.tls_min_version.clone())
        .filter(|s| !s.is_empty());
    let tls_cipher_suites: Vec<String> = match &flags.tls_cipher_suites {
        Some(list) => list.split(',').map(|s| s.trim().to_string()).collect(),
        None => file.tls_cipher_suites.clone().unwrap_or_default(),
    }
    .into_iter()
    .filter(|s| !s.is_empty())
    .collect();
    crate::server::tls_policy(tls_min_version.as_deref(), &tls_cipher_suites).map_err(invalid)?;
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
        max_open_files: server::max_open_files(flags.max_open_files, file.max_open_files.as_ref())
            .map_err(invalid)?,
        server: server::merge(file.node_agent_server.as_ref()).map_err(invalid)?,
        node_status_max_images: match flags
            .node_status_max_images
            .or(file.node_status_max_images)
            .unwrap_or(50)
        {
            n if n < -1 => {
                return Err(invalid(format!(
                    "nodeStatusMaxImages (--node-status-max-images) {n} must be -1 or greater"
                )));
            }
            n => n,
        },
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
        system_cgroups: system_cgroups::system_cgroups(
            flags,
            &file,
            &cgroup_root,
            flags
                .cgroups_per_qos
                .or(file.cgroups_per_qos)
                .unwrap_or(true),
        ),
        cgroup_root,
        cgroups_per_qos: flags
            .cgroups_per_qos
            .or(file.cgroups_per_qos)
            .unwrap_or(true),
        max_pods,
        oom_score_adj,
        pod_logs_dir: PathBuf::from(
            file.pod_logs_dir
                .clone()
                .unwrap_or_else(|| "/var/log/pods".into()),
        ),
        enable_system_log_handler: file
            .enable_system_log_handler
            .as_ref()
            .and_then(|v| v.as_bool())
            .unwrap_or(true),
        enable_debugging_handlers: file.enable_debugging_handlers.unwrap_or(true),
        debug: server::debug_settings(
            file.enable_debug_flags_handler.as_ref(),
            file.enable_profiling_handler.as_ref(),
            file.enable_system_log_query.as_ref(),
            file.enable_system_log_handler
                .as_ref()
                .and_then(|v| v.as_bool())
                != Some(false),
            |name, default| limits::gate_or(flags, &file, name, default),
        )
        .map_err(invalid)?,
        container_runtime_endpoint: runtime_endpoint,
        image_service_endpoint: image_endpoint,
        runtime_request_timeout: dur(
            "runtimeRequestTimeout",
            &flags.runtime_request_timeout,
            file.runtime_request_timeout,
            Duration::from_secs(120),
        )?,
        streaming_connection_idle_timeout: dur(
            "streamingConnectionIdleTimeout",
            &flags.streaming_connection_idle_timeout,
            file.streaming_connection_idle_timeout,
            Duration::from_secs(4 * 3600),
        )?,
        volume_stats_agg_period: dur(
            "volumeStatsAggPeriod",
            &None,
            file.volume_stats_agg_period,
            crate::stats::DEFAULT_VOLUME_STATS_AGG_PERIOD,
        )?,
        pull_gate,
        registry_pull_qps: rates[0],
        registry_burst: rates[1],
        event_record_qps: rates[2],
        event_burst: rates[3],
        make_iptables_util_chains: (file.make_ip_tables_util_chains.as_ref())
            .is_none_or(|v| v.as_bool() != Some(false)),
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
        logging: logging_options(flags, file.logging.as_ref())?,
        user_namespaces: crate::userns::Settings::from_file(file.user_namespaces.as_ref())
            .map_err(|e| invalid(e.to_string()))?,
        shutdown: crate::shutdown::Settings::new(
            file.shutdown_grace_period.unwrap_or_default(),
            file.shutdown_grace_period_critical_pods.unwrap_or_default(),
            file.shutdown_grace_period_by_pod_priority
                .clone()
                .unwrap_or_default(),
        )
        .map_err(invalid)?,
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
        enable_server: file.enable_server.unwrap_or(true),
        auth,
        tls_min_version,
        tls_cipher_suites,
        server_tls_bootstrap: file.server_tls_bootstrap.unwrap_or(false),
        protect_kernel_defaults: flags
            .protect_kernel_defaults
            .or(file.protect_kernel_defaults)
            .unwrap_or(false),
        seccomp_default: flags
            .seccomp_default
            .or(file.seccomp_default)
            .unwrap_or(false),
        allowed_unsafe_sysctls,
        resources,
        container_log: container_log(flags, &file)?,
        network: network::merge(
            flags.node_agent_cni,
            flags.node_agent_cluster_cidr.as_deref(),
            file.node_agent_network.as_ref(),
        )
        .map_err(invalid)?,
        pod_limits,
        crash_loop_max,
        image_gc,
        container_gc,
        image_pulls,
        evented_pleg: limits::gate_or(flags, &file, crate::pleg::EVENTED_PLEG_GATE, false),
        reload_tls_cert_files: limits::gate_or(
            flags,
            &file,
            crate::certs::serving_files::RELOAD_GATE,
            true,
        ),
        resource_health_status: limits::gate_or(
            flags,
            &file,
            crate::devices::RESOURCE_HEALTH_STATUS_GATE,
            true,
        ),
        selinux_mount: limits::gate_or(
            flags,
            &file,
            crate::volume::selinux::SELINUX_MOUNT_GATE,
            false,
        ),
        cloud: cloud::parse(flags, &file)?,
        image_credential_provider_config: flags
            .image_credential_provider_config
            .as_ref()
            .filter(|p| !p.is_empty())
            .map(PathBuf::from),
        image_credential_provider_bin_dir: flags
            .image_credential_provider_bin_dir
            .as_ref()
            .map(PathBuf::from),
    })
}

/// The log rotation settings: flags over the file, then upstream's validation.
fn container_log(
    flags: &Flags,
    file: &KubeletConfiguration,
) -> Result<crate::logs::Settings, ConfigError> {
    let set = |v: &Option<serde_json::Value>| v.clone().filter(|v| !v.is_null());
    let int = |name: &str, v: Option<serde_json::Value>| -> Result<Option<i64>, ConfigError> {
        v.map(|v| {
            v.as_i64()
                .ok_or_else(|| invalid(format!("{name}: {v} is not an integer")))
        })
        .transpose()
    };
    let size = match (
        &flags.container_log_max_size,
        set(&file.container_log_max_size),
    ) {
        (Some(s), _) => Some(s.clone()),
        (None, Some(serde_json::Value::String(s))) => Some(s),
        (None, Some(v)) => Some(v.to_string()),
        (None, None) => None,
    };
    let files = match flags.container_log_max_files {
        Some(n) => Some(i64::from(n)),
        None => int("containerLogMaxFiles", set(&file.container_log_max_files))?,
    };
    let workers = int(
        "containerLogMaxWorkers",
        set(&file.container_log_max_workers),
    )?;
    // `0s` (as kubeadm writes unset durations) means the default, as for the other periods.
    let interval = match set(&file.container_log_monitor_interval) {
        None => None,
        Some(serde_json::Value::String(t)) => Some(
            duration::parse(&t)
                .map_err(|e| invalid(format!("containerLogMonitorInterval: {e}")))?,
        )
        .filter(|d| !d.is_zero()),
        Some(v) => {
            return Err(invalid(format!(
                "containerLogMonitorInterval: {v} is not a duration"
            )));
        }
    };
    crate::logs::Settings::new(size.as_deref(), files, workers, interval).map_err(invalid)
}

#[cfg(test)]
pub(crate) mod tests;

/// The logging flags given over the file's `logging` (upstream's unknown format is refused).
fn logging_options(
    flags: &Flags,
    file: Option<&serde_json::Value>,
) -> Result<plumbing::logging::Options, ConfigError> {
    let given = plumbing::logging::Flags {
        format: flags.logging_format.as_deref(),
        verbosity: flags.verbosity.map(i32::from),
        vmodule: flags.vmodule.as_deref(),
        text_split_stream: flags.extra.log_text_split_stream,
        json_split_stream: flags.extra.log_json_split_stream,
    };
    plumbing::logging::Options::resolve(&given, file).map_err(|e| invalid(e.to_string()))
}
