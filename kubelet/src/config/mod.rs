//! The validated settings the agent runs with. [`load`] reads `--config` and its
//! `--config-dir` drop-ins into a KubeletConfiguration (`settings::file`), checks every flag
//! and field against the registry and the feature gates, and assembles [`Config`]: each
//! subsystem resolves its own part (`node::settings`, `server::settings`, `images::settings`,
//! `runtime::settings`, `cm::settings`, `stats::settings`, `logs::settings`, …); what is left
//! here belongs to the agent as a whole. A pure function of the flags and the files' text.

pub mod dropins;
mod extra_flags;
pub mod limits;

pub use crate::settings::{ConfigError, KubeletConfiguration, parse_file};

use crate::network::settings as network;
use crate::settings::cli::Flags;
pub(crate) use crate::settings::resolve::{dur, invalid, ip};
use plumbing::duration;
use serde::Serialize;
use std::{net::IpAddr, path::PathBuf, time::Duration};

/// Validated settings, defaults applied.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Config {
    /// The Node: name, addresses, registration, pod capacity, status and lease cadence.
    #[serde(flatten)]
    pub node: crate::node::Settings,
    /// :10250, the read-only port and :10248: addresses, TLS, auth, handlers, limits.
    #[serde(flatten)]
    pub server: crate::server::Settings,
    /// Image pulls, pulled-image records, image GC, credential providers.
    #[serde(flatten)]
    pub images: crate::images::Settings,
    /// The CRI endpoints, the request timeout and container GC.
    #[serde(flatten)]
    pub runtime: crate::runtime::Settings,
    /// The cgroup driver and root, QoS tiers, reservations and eviction thresholds, pod limits.
    #[serde(flatten)]
    pub cm: crate::cm::Settings,
    /// `volumeStatsAggPeriod` and the Summary's system containers.
    #[serde(flatten)]
    pub stats: crate::stats::settings::Settings,
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
    /// `oomScoreAdj`: the process's own OOM score adjustment, written at start.
    pub oom_score_adj: i32,
    #[serde(rename = "clusterDNS")]
    pub cluster_dns: Vec<IpAddr>,
    pub cluster_domain: String,
    pub resolv_conf: Option<PathBuf>,
    pub pod_logs_dir: PathBuf,
    /// `eventRecordQPS` / `eventBurst` (default 50 / 100): the event writer's rate limit.
    #[serde(rename = "eventRecordQPS")]
    pub event_record_qps: i32,
    pub event_burst: i32,
    /// `makeIPTablesUtilChains` (default true): the kubelet's iptables chains.
    pub make_iptables_util_chains: bool,
    pub rotate_certificates: bool,
    pub fail_swap_on: bool,
    pub verbosity: u8,
    /// `logging` (format, verbosity, vmodule, split streams) with the logging flags over it.
    #[serde(skip)]
    pub logging: plumbing::logging::Options,
    /// Graceful node shutdown (`shutdownGracePeriod*`); disabled when empty.
    pub shutdown: crate::shutdown::Settings,
    /// `userNamespaces` (pods with `hostUsers: false`).
    pub user_namespaces: crate::userns::Settings,
    /// Cluster mode: `kubeAPIQPS` / `kubeAPIBurst` (default 50 / 100).
    #[serde(rename = "kubeAPIQPS")]
    pub kube_api_qps: i32,
    pub kube_api_burst: i32,
    /// `protectKernelDefaults`: the start fails when kernel tunables differ from upstream's.
    pub protect_kernel_defaults: bool,
    /// `seccompDefault`: containers without a seccomp profile run with `RuntimeDefault`.
    pub seccomp_default: bool,
    /// `allowedUnsafeSysctls`, validated: pods may set these beside the safe sysctls.
    pub allowed_unsafe_sysctls: Vec<String>,
    /// `containerLogMaxSize`, `containerLogMaxFiles`, `containerLogMaxWorkers`,
    /// `containerLogMonitorInterval` (flags over file), validated.
    pub container_log: crate::logs::Settings,
    /// `nodeAgentNetwork` / `--node-agent-cni`: the node network controller (ours).
    pub network: network::Settings,
    /// `crashLoopBackOff.maxContainerRestartPeriod`: the container restart back-off's cap.
    pub crash_loop_max: Duration,
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
}

pub use crate::runtime::settings::DEFAULT_RUNTIME_ENDPOINT;

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

/// `eventRecordQPS`, `eventBurst` (flag over file over upstream's default), each refused when
/// negative with upstream's message.
fn event_rates(flags: &Flags, file: &KubeletConfiguration) -> Result<(i32, i32), ConfigError> {
    use crate::images::settings::rate;
    Ok((
        rate(
            flags.event_qps,
            file.event_record_qps,
            50,
            "eventRecordQPS (--event-qps)",
        )?,
        rate(
            flags.event_burst,
            file.event_burst,
            100,
            "eventBurst (--event-burst)",
        )?,
    ))
}

/// `oomScoreAdj` (`--oom-score-adj`, default -999), range-checked.
fn oom_score_adj(flags: &Flags, file: &KubeletConfiguration) -> Result<i32, ConfigError> {
    let v = match (flags.oom_score_adj, &file.oom_score_adj) {
        (Some(n), _) => n,
        (None, None | Some(serde_json::Value::Null)) => -999,
        (None, Some(v)) => v
            .as_i64()
            .and_then(|n| i32::try_from(n).ok())
            .ok_or_else(|| invalid(format!("oomScoreAdj: {v} is not an integer")))?,
    };
    if !plumbing::oom_score::RANGE.contains(&v) {
        return Err(invalid(format!(
            "oomScoreAdj (--oom-score-adj) {v} must be between -1000 and 1000, inclusive"
        )));
    }
    Ok(v)
}

/// `clusterDNS` (IPs), `clusterDomain` and `resolvConf` (default `/etc/resolv.conf`).
fn dns(
    flags: &Flags,
    file: &KubeletConfiguration,
) -> Result<(Vec<IpAddr>, String, Option<PathBuf>), ConfigError> {
    let cluster_dns = match &flags.cluster_dns {
        Some(list) => list.split(',').map(str::to_string).collect(),
        None => file.cluster_dns.clone().unwrap_or_default(),
    }
    .iter()
    .filter(|s| !s.trim().is_empty())
    .map(|s| ip("clusterDNS", s))
    .collect::<Result<Vec<_>, _>>()?;
    let domain = (flags.cluster_domain.clone())
        .or(file.cluster_domain.clone())
        .unwrap_or_default();
    let resolv_conf = (flags.resolv_conf.clone())
        .or(file.resolv_conf.clone())
        .unwrap_or_else(|| "/etc/resolv.conf".into());
    let resolv_conf = Some(resolv_conf)
        .filter(|s| !s.is_empty())
        .map(PathBuf::from);
    Ok((cluster_dns, domain, resolv_conf))
}

/// Merges flags over the file and applies upstream's defaults: each subsystem resolves its own
/// settings; what is left here belongs to the agent as a whole.
pub fn merge(
    flags: &Flags,
    mut file: KubeletConfiguration,
    hostname: &str,
) -> Result<Config, ConfigError> {
    extra_flags::apply(&flags.extra, &mut file)?;
    let file = &file;
    let node = crate::node::settings::resolve(flags, file, hostname)?;
    let root_dir =
        PathBuf::from((flags.root_dir.clone()).unwrap_or_else(|| "/var/lib/kubelet".into()));
    let cm = crate::cm::settings::resolve(flags, file)?;
    let allowed_unsafe_sysctls = (flags.allowed_unsafe_sysctls.clone())
        .or(file.allowed_unsafe_sysctls.clone())
        .unwrap_or_default();
    crate::pod::SysctlAllowlist::new(&allowed_unsafe_sysctls)
        .map_err(|e| invalid(format!("allowedUnsafeSysctls: {e}")))?;
    let crash_loop_max = limits::crash_loop_max(flags, file)?;
    let images = crate::images::settings::resolve(flags, file)?;
    let runtime = crate::runtime::settings::resolve(flags, file)?;
    let oom_score_adj = oom_score_adj(flags, file)?;
    let (event_record_qps, event_burst) = event_rates(flags, file)?;
    let (cluster_dns, cluster_domain, resolv_conf) = dns(flags, file)?;
    let server = crate::server::settings::resolve(flags, file)?;
    let stats = crate::stats::settings::resolve(flags, file, &cm.cgroup_root, cm.cgroups_per_qos)?;
    Ok(Config {
        node,
        server,
        images,
        runtime,
        cm,
        stats,
        kubeconfig: flags.kubeconfig.clone().map(PathBuf::from),
        bootstrap_kubeconfig: flags.bootstrap_kubeconfig.clone().map(PathBuf::from),
        cert_dir: (flags.cert_dir.clone().map(PathBuf::from))
            .unwrap_or_else(|| root_dir.join("pki")),
        root_dir,
        static_pod_path: (flags.pod_manifest_path.clone())
            .or(file.static_pod_path.clone())
            .filter(|s| !s.is_empty())
            .map(PathBuf::from),
        proxy_config: (flags.proxy_config.clone())
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
        oom_score_adj,
        cluster_dns,
        cluster_domain,
        resolv_conf,
        pod_logs_dir: PathBuf::from(
            (file.pod_logs_dir.clone()).unwrap_or_else(|| "/var/log/pods".into()),
        ),
        event_record_qps,
        event_burst,
        make_iptables_util_chains: (file.make_ip_tables_util_chains.as_ref())
            .is_none_or(|v| v.as_bool() != Some(false)),
        rotate_certificates: (flags.rotate_certificates)
            .or(file.rotate_certificates)
            .unwrap_or(false),
        fail_swap_on: flags.fail_swap_on.or(file.fail_swap_on).unwrap_or(true),
        verbosity: flags.verbosity.unwrap_or(0),
        logging: logging_options(flags, file.logging.as_ref())?,
        user_namespaces: crate::userns::Settings::from_file(file.user_namespaces.as_ref())
            .map_err(|e| invalid(e.to_string()))?,
        shutdown: crate::shutdown::Settings::new(
            file.shutdown_grace_period.unwrap_or_default(),
            file.shutdown_grace_period_critical_pods.unwrap_or_default(),
            (file.shutdown_grace_period_by_pod_priority.clone()).unwrap_or_default(),
        )
        .map_err(invalid)?,
        kube_api_qps: (flags.kube_api_qps.or(file.kube_api_qps))
            .filter(|q| *q > 0)
            .unwrap_or(50),
        kube_api_burst: (flags.kube_api_burst.or(file.kube_api_burst))
            .filter(|b| *b > 0)
            .unwrap_or(100),
        protect_kernel_defaults: (flags.protect_kernel_defaults)
            .or(file.protect_kernel_defaults)
            .unwrap_or(false),
        seccomp_default: (flags.seccomp_default.or(file.seccomp_default)).unwrap_or(false),
        allowed_unsafe_sysctls,
        container_log: crate::logs::settings::resolve(flags, file)?,
        network: network::merge(
            flags.node_agent_cni,
            flags.node_agent_cluster_cidr.as_deref(),
            file.node_agent_network.as_ref(),
        )
        .map_err(invalid)?,
        crash_loop_max,
        evented_pleg: limits::gate_or(flags, file, crate::pleg::EVENTED_PLEG_GATE, false),
        resource_health_status: limits::gate_or(
            flags,
            file,
            crate::devices::RESOURCE_HEALTH_STATUS_GATE,
            true,
        ),
        selinux_mount: limits::gate_or(
            flags,
            file,
            crate::volume::selinux::SELINUX_MOUNT_GATE,
            false,
        ),
    })
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
