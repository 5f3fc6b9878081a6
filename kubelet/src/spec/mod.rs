//! Turning a pod spec into what the runtime is asked for: the sandbox config (hostname, DNS,
//! ports, cgroup parent, labels) and each container's config (command, env, mounts, resources).

use crate::node_settings::{NodeSettings, pod_dir, pod_log_dir};
use crate::podspec::{self, Qos};
use plumbing::quantity;

mod build;
pub mod devices;
mod env;
pub mod mounts;
pub mod security;
use crate::runtime::*;
pub use build::{ContainerFiles, ContainerInputs, build_container_config};
pub use env::{
    ContainerEnv, EnvObjects, ExpandBudget, MAX_EXPANSION_BYTES, container_env, expand,
    is_env_var_name,
};
use k8s_openapi::api::core::v1::{Container, Pod};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Why a container config could not be built (reported as `CreateContainerConfigError`).
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
#[error("{0}")]
pub struct ConfigError(pub String);

impl From<podspec::downward::FieldRefError> for ConfigError {
    fn from(e: podspec::downward::FieldRefError) -> Self {
        ConfigError(e.0)
    }
}

/// Parses resolv.conf text into servers, searches and options.
pub fn parse_resolv_conf(text: &str) -> DnsConfig {
    let mut d = DnsConfig::default();
    for line in text.lines() {
        let line = line.split(['#', ';']).next().unwrap_or("");
        let mut f = line.split_whitespace();
        match f.next() {
            Some("nameserver") => d.servers.extend(f.next().map(str::to_string)),
            Some("search") | Some("domain") => d.searches = f.map(str::to_string).collect(),
            Some("options") => d.options.extend(f.map(str::to_string)),
            _ => {}
        }
    }
    d
}

/// DNS for the sandbox following the pod's dnsPolicy (upstream's rules), or None to let the
/// runtime use its own (never the case for pods we build).
pub fn dns_config(node: &NodeSettings, pod: &Pod) -> DnsConfig {
    let spec = pod.spec.clone().unwrap_or_default();
    let host_net = spec.host_network.unwrap_or(false);
    let policy = spec.dns_policy.as_deref().unwrap_or("ClusterFirst");
    let use_cluster = match policy {
        "ClusterFirstWithHostNet" => true,
        "ClusterFirst" => !host_net,
        _ => false,
    } && !node.cluster_dns.is_empty();
    let mut d = match policy {
        "None" => DnsConfig::default(),
        _ if use_cluster => {
            let ns = pod.metadata.namespace.as_deref().unwrap_or("default");
            let domain = &node.cluster_domain;
            let mut searches = if domain.is_empty() {
                Vec::new()
            } else {
                vec![
                    format!("{ns}.svc.{domain}"),
                    format!("svc.{domain}"),
                    domain.clone(),
                ]
            };
            searches.extend(node.host_dns.searches.iter().cloned());
            DnsConfig {
                servers: node.cluster_dns.clone(),
                searches,
                options: vec!["ndots:5".into()],
            }
        }
        _ => node.host_dns.clone(),
    };
    if let Some(extra) = spec.dns_config {
        d.servers.extend(extra.nameservers.unwrap_or_default());
        d.searches.extend(extra.searches.unwrap_or_default());
        for o in extra.options.unwrap_or_default() {
            let opt = match o.value {
                Some(v) => format!("{}:{v}", o.name.clone().unwrap_or_default()),
                None => o.name.clone().unwrap_or_default(),
            };
            let key = opt.split(':').next().unwrap_or("").to_string();
            d.options
                .retain(|x| x.split(':').next() != Some(key.as_str()));
            d.options.push(opt);
        }
    }
    // Upstream caps searches at 32 entries.
    d.searches.dedup();
    d.searches.truncate(32);
    d
}

fn protocol(p: Option<&str>) -> Protocol {
    match p {
        Some("UDP") => Protocol::Udp,
        Some("SCTP") => Protocol::Sctp,
        _ => Protocol::Tcp,
    }
}

/// The sandbox config for `pod`.
pub fn sandbox_config(
    node: &NodeSettings,
    pod: &Pod,
    attempt: u32,
    cgroup_parent: String,
) -> SandboxConfig {
    let spec = pod.spec.clone().unwrap_or_default();
    let name = pod.metadata.name.clone().unwrap_or_default();
    let namespace = pod
        .metadata
        .namespace
        .clone()
        .unwrap_or_else(|| "default".into());
    let uid = pod.metadata.uid.clone().unwrap_or_default();
    let host_network = spec.host_network.unwrap_or(false);
    // hostNetwork pods share the node's UTS namespace: the runtime refuses a hostname there.
    // A too long FQDN fails the sandbox before it is created (`kernel_hostname`).
    let hostname = if host_network {
        String::new()
    } else {
        kernel_hostname(node, pod).unwrap_or_else(|_| short_hostname(pod))
    };
    let mut labels = pod.metadata.labels.clone().unwrap_or_default();
    labels.insert(LABEL_POD_NAME.into(), name.clone());
    labels.insert(LABEL_POD_NAMESPACE.into(), namespace.clone());
    labels.insert(LABEL_POD_UID.into(), uid.clone());
    let port_mappings = spec
        .containers
        .iter()
        .flat_map(|c| c.ports.iter().flatten())
        .filter(|p| p.host_port.unwrap_or(0) > 0)
        .map(|p| PortMapping {
            protocol: protocol(p.protocol.as_deref()),
            container_port: p.container_port,
            host_port: p.host_port.unwrap_or(0),
            host_ip: p.host_ip.clone().unwrap_or_default(),
        })
        .collect();
    let sysctls = spec
        .security_context
        .as_ref()
        .and_then(|s| s.sysctls.clone())
        .unwrap_or_default()
        .into_iter()
        .map(|s| (s.name, s.value))
        .collect();
    SandboxConfig {
        log_directory: pod_log_dir(node, pod).display().to_string(),
        name,
        namespace,
        uid,
        attempt,
        hostname,
        dns: Some(dns_config(node, pod)),
        port_mappings,
        labels,
        annotations: pod.metadata.annotations.clone().unwrap_or_default(),
        cgroup_parent,
        host_network,
        host_pid: spec.host_pid.unwrap_or(false),
        share_process_namespace: spec.share_process_namespace.unwrap_or(false),
        host_ipc: spec.host_ipc.unwrap_or(false),
        sysctls,
        security: security::sandbox_security(pod),
        resources: Some(sandbox_resources(node, pod)),
        overhead: Some(sandbox_overhead(node, pod)),
        runtime_handler: String::new(),
        userns: None,
    }
}

/// Upstream's calculateLinuxResources for a sandbox: cpu shares from the request (from the
/// limit when no request is given; at least 2), the memory limit when non-zero, and with
/// `cpuCFSQuota` the period and the quota of the cpu limit (0: none).
fn sandbox_linux_resources(
    node: &NodeSettings,
    cpu_request: Option<i128>,
    cpu_limit: i128,
    memory_limit: i128,
) -> LinuxResources {
    let s = &node.pod_limits;
    let shares = crate::cm::milli_cpu_to_shares(cpu_request.unwrap_or(cpu_limit));
    let mut out = LinuxResources {
        cpu_shares: shares as i64,
        memory_limit_in_bytes: memory_limit.clamp(0, i128::from(i64::MAX)) as i64,
        ..Default::default()
    };
    if s.cpu_cfs_quota {
        out.cpu_period = s.cpu_cfs_period_us as i64;
        out.cpu_quota = crate::cm::milli_cpu_to_quota(cpu_limit, s.cpu_cfs_period_us);
    }
    out
}

/// `LinuxPodSandboxConfig.resources`, as upstream's calculateSandboxResources: the pod's
/// requests and limits (PodRequests/PodLimits without the overhead; pod-level
/// `spec.resources` count when `PodLevelResources` is on).
pub fn sandbox_resources(node: &NodeSettings, pod: &Pod) -> LinuxResources {
    use crate::cm::pod_amounts_without_overhead;
    let gate = node.pod_limits.pod_level_resources;
    let requests = pod_amounts_without_overhead(pod, false, gate);
    let limits = pod_amounts_without_overhead(pod, true, gate);
    sandbox_linux_resources(
        node,
        requests.get("cpu").copied(),
        limits.get("cpu").copied().unwrap_or(0),
        limits.get("memory").copied().unwrap_or(0),
    )
}

/// `LinuxPodSandboxConfig.overhead`, as upstream's convertOverheadToLinuxResources: the
/// pod's `spec.overhead` as both request and limit; all zero when the pod has none.
pub fn sandbox_overhead(node: &NodeSettings, pod: &Pod) -> LinuxResources {
    let Some(overhead) = pod.spec.as_ref().and_then(|s| s.overhead.as_ref()) else {
        return LinuxResources::default();
    };
    let cpu = overhead
        .get("cpu")
        .and_then(|q| quantity::milli(q).ok())
        .unwrap_or(0);
    let memory = overhead
        .get("memory")
        .and_then(|q| quantity::value(q).ok())
        .unwrap_or(0);
    sandbox_linux_resources(node, Some(cpu), cpu, memory)
}

/// Upstream's oom_score_adj constants (pkg/kubelet/qos/policy.go).
pub const GUARANTEED_OOM_SCORE_ADJ: i64 = -997;
pub const BESTEFFORT_OOM_SCORE_ADJ: i64 = 1000;
/// `SystemCriticalPriority`: pods at or above it are critical.
const SYSTEM_CRITICAL_PRIORITY: i32 = 2_000_000_000;

fn memory_request(c: &Container) -> i128 {
    let res = c.resources.clone().unwrap_or_default();
    let q = |m: Option<
        BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>,
    >| { m.and_then(|m| m.get("memory").and_then(|q| quantity::value(q).ok())) };
    q(res.requests)
        .or_else(|| q(res.limits))
        .unwrap_or(0)
        .max(0)
}

/// Upstream's IsCriticalPod: a static or mirror pod, or priority at least system-critical.
pub fn is_critical_pod(pod: &Pod) -> bool {
    let ann = pod.metadata.annotations.clone().unwrap_or_default();
    let static_pod = ann
        .get(podspec::ANN_CONFIG_SOURCE)
        .is_some_and(|s| s != "api");
    let priority = pod.spec.as_ref().and_then(|s| s.priority).unwrap_or(0);
    static_pod
        || ann.contains_key(podspec::ANN_CONFIG_MIRROR)
        || priority >= SYSTEM_CRITICAL_PRIORITY
}

/// Upstream's GetContainerOOMScoreAdjust: node-critical and Guaranteed −997, BestEffort 1000,
/// Burstable 1000 − 1000 × request / capacity in [3, 999] (a sidecar no higher than the
/// pod's regular container with the smallest request).
pub fn oom_score_adj(pod: &Pod, c: &Container, memory_capacity: i64, pod_level_gate: bool) -> i64 {
    let spec = pod.spec.clone().unwrap_or_default();
    let node_critical =
        is_critical_pod(pod) && spec.priority_class_name.as_deref() == Some("system-node-critical");
    let qos = podspec::qos_class_with(&spec, pod_level_gate);
    if node_critical || qos == Qos::Guaranteed {
        return GUARANTEED_OOM_SCORE_ADJ;
    }
    if qos == Qos::BestEffort {
        return BESTEFFORT_OOM_SCORE_ADJ;
    }
    let cap = i128::from(memory_capacity.max(1));
    let mut adj = 1000 - (1000 * memory_request(c)) / cap;
    let sidecar = c.restart_policy.as_deref() == Some("Always")
        && spec
            .init_containers
            .iter()
            .flatten()
            .any(|i| i.name == c.name);
    if sidecar && let Some(min) = spec.containers.iter().map(memory_request).min() {
        adj = adj.min(1000 - (1000 * min) / cap);
    }
    let floor = i128::from(1000 + GUARANTEED_OOM_SCORE_ADJ);
    if adj < floor {
        return floor as i64;
    }
    if adj == i128::from(BESTEFFORT_OOM_SCORE_ADJ) {
        return adj as i64 - 1;
    }
    adj as i64
}

/// Upstream's calculateLinuxResources + GetHugepageLimitsFromResources +
/// configureContainerSwapResources for one container.
pub fn linux_resources(node: &NodeSettings, pod: &Pod, c: &Container) -> LinuxResources {
    let res = c.resources.clone().unwrap_or_default();
    let limits = res.limits.unwrap_or_default();
    let requests = res.requests.unwrap_or_default();
    let milli = |m: &BTreeMap<String, _>, k: &str| m.get(k).and_then(|q| quantity::milli(q).ok());
    let spec = pod.spec.clone().unwrap_or_default();
    let gate = node.pod_limits.pod_level_resources;
    // Upstream's getCPULimit/getMemoryLimit: a container without a (non-zero) limit of its
    // own gets the pod-level limit when pod-level resources are set.
    let cpu_limit = milli(&limits, "cpu")
        .filter(|v| *v != 0)
        .or_else(|| podspec::resources::pod_limit(&spec, gate, "cpu"));
    // A request that is absent (not zero) defaults to the limit.
    let cpu_request = milli(&requests, "cpu").or(cpu_limit);
    let mem_limit = limits
        .get("memory")
        .and_then(|q| quantity::value(q).ok())
        .filter(|v| *v != 0)
        .or_else(|| podspec::resources::pod_limit(&spec, gate, "memory"));
    // Quantities are at most an int64 of thousandths (quantity::MAX_MILLI), so this i128
    // arithmetic cannot overflow; results are clamped into the kernel's ranges.
    let to_i64 = |v: i128| v.clamp(0, i64::MAX as i128) as i64;
    let s = &node.pod_limits;
    let mut out = LinuxResources {
        cpu_shares: crate::cm::milli_cpu_to_shares(cpu_request.unwrap_or(0)) as i64,
        memory_limit_in_bytes: to_i64(mem_limit.unwrap_or(0)),
        oom_score_adj: oom_score_adj(pod, c, node.memory_capacity, gate),
        ..Default::default()
    };
    if s.cpu_cfs_quota {
        out.cpu_period = s.cpu_cfs_period_us as i64;
        out.cpu_quota = crate::cm::milli_cpu_to_quota(cpu_limit.unwrap_or(0), s.cpu_cfs_period_us);
    }
    // Upstream's default on cgroup v2: the kernel kills every process of the container's
    // cgroup on OOM, unless singleProcessOOMKill is true.
    if node.cgroup_v2 && s.single_process_oom_kill != Some(true) {
        out.unified.insert("memory.oom.group".into(), "1".into());
    }
    // Every page size of the node gets a limit: 0 unless the container asks for pages.
    let mut pages: BTreeMap<u64, u64> = node.hugepage_sizes.iter().map(|s| (*s, 0)).collect();
    let mut asked = BTreeMap::new();
    for (map, is_limit) in [(&limits, true), (&requests, false)] {
        for (k, q) in map {
            if let (Some(size), Ok(v)) = (crate::cm::hugepage_size(k), quantity::value(q)) {
                let v = v.clamp(0, i128::from(i64::MAX)) as u64;
                if is_limit {
                    asked.insert(size, v);
                } else {
                    asked.entry(size).or_insert(v);
                }
            }
        }
    }
    for (size, v) in asked {
        if let Some(e) = pages.get_mut(&size) {
            *e = v;
        }
    }
    out.hugepage_limits = pages
        .into_iter()
        .map(|(size, limit)| (crate::cm::hugetlb_size_name(size), limit))
        .collect();
    configure_swap(node, pod, c, &mut out);
    out
}

/// Upstream's swap configuration. NoSwap: cgroup v2 gets `memory.swap.max` 0; on v1, with
/// swap on the node, the memory+swap limit equals the memory limit. LimitedSwap (v2 only,
/// refused on v1 at start): a Burstable, non-critical container with a memory request below
/// its limit gets request / node memory × node swap.
fn configure_swap(node: &NodeSettings, pod: &Pod, c: &Container, out: &mut LinuxResources) {
    use crate::cm::SwapBehavior;
    let no_swap = |out: &mut LinuxResources| {
        if node.cgroup_v2 {
            out.unified.insert("memory.swap.max".into(), "0".into());
        } else if node.swap_capacity > 0 {
            out.memory_swap_limit_in_bytes = out.memory_limit_in_bytes;
        }
    };
    if node.pod_limits.swap_behavior != SwapBehavior::LimitedSwap
        || !node.cgroup_v2
        || is_critical_pod(pod)
    {
        return no_swap(out);
    }
    let spec = pod.spec.clone().unwrap_or_default();
    let res = c.resources.clone().unwrap_or_default();
    let get =
        |m: Option<BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>>| {
            m.and_then(|m| m.get("memory").and_then(|q| quantity::value(q).ok()))
                .unwrap_or(0)
        };
    let (req, lim) = (get(res.requests), get(res.limits));
    if podspec::qos_class_with(&spec, node.pod_limits.pod_level_resources) != Qos::Burstable
        || (req == 0 && lim == 0)
        || req == lim
        || node.memory_capacity <= 0
        || node.swap_capacity <= 0
    {
        return no_swap(out);
    }
    let share = req as f64 / node.memory_capacity as f64;
    let swap = (share * node.swap_capacity as f64) as i64;
    out.unified
        .insert("memory.swap.max".into(), swap.to_string());
}

/// The pod's managed /etc/hosts. A hostNetwork pod gets the node's (`node_hosts`, the text
/// of its /etc/hosts) under upstream's host-network header; others get localhost entries and
/// their own address. Both end with the pod's hostAliases. None: not mounted (a pod that is
/// not hostNetwork and has no IP yet, as upstream).
pub fn etc_hosts_text(
    node: &NodeSettings,
    pod: &Pod,
    pod_ips: &[String],
    node_hosts: &str,
) -> Option<String> {
    let spec = pod.spec.clone().unwrap_or_default();
    if spec.host_network.unwrap_or(false) {
        let mut text = String::from("# Kubernetes-managed hosts file (host network).\n");
        text.push_str(node_hosts);
        text.push_str(&host_alias_entries(&spec.host_aliases.unwrap_or_default()));
        return Some(text);
    }
    if pod_ips.is_empty() {
        return None;
    }
    let hostname = spec
        .hostname
        .clone()
        .unwrap_or_else(|| pod.metadata.name.clone().unwrap_or_default());
    let mut text = String::from(
        "# Kubernetes-managed hosts file.\n127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\nfe00::0\tip6-localnet\nfe00::0\tip6-mcastprefix\nfe00::1\tip6-allnodes\nfe00::2\tip6-allrouters\n",
    );
    let fqdn = pod_domain(node, pod).map(|d| format!("{hostname}.{d}"));
    for ip in pod_ips {
        match &fqdn {
            Some(f) => text.push_str(&format!("{ip}\t{f}\t{hostname}\n")),
            None => text.push_str(&format!("{ip}\t{hostname}\n")),
        }
    }
    text.push_str(&host_alias_entries(&spec.host_aliases.unwrap_or_default()));
    Some(text)
}

/// The pod's domain, `<subdomain>.<namespace>.svc.<clusterDomain>` (upstream's), when it
/// has a subdomain.
pub fn pod_domain(node: &NodeSettings, pod: &Pod) -> Option<String> {
    let sub = pod.spec.as_ref()?.subdomain.as_deref()?;
    let ns = pod.metadata.namespace.as_deref()?;
    if sub.is_empty() {
        return None;
    }
    Some(match node.cluster_domain.as_str() {
        "" => format!("{sub}.{ns}.svc"),
        domain => format!("{sub}.{ns}.svc.{domain}"),
    })
}

/// The pod's short hostname: `spec.hostname` or its name, cut to 63 characters without a
/// trailing `-` or `.` (upstream's truncation).
fn short_hostname(pod: &Pod) -> String {
    let spec = pod.spec.as_ref();
    let name = (spec.and_then(|s| s.hostname.clone()))
        .unwrap_or_else(|| pod.metadata.name.clone().unwrap_or_default());
    let cut: String = name.chars().take(63).collect();
    cut.trim_end_matches(['-', '.']).to_string()
}

/// The kernel's nodename field holds 64 characters (upstream's limit for an FQDN hostname).
const FQDN_MAX_LEN: usize = 64;

/// The name the pod's UTS namespace gets: its short hostname, or with `setHostnameAsFQDN`
/// and a subdomain its FQDN, which must fit the kernel's nodename (upstream's error text
/// otherwise; the sandbox is not created).
pub fn kernel_hostname(node: &NodeSettings, pod: &Pod) -> Result<String, String> {
    let short = short_hostname(pod);
    let as_fqdn = pod.spec.as_ref().and_then(|s| s.set_hostname_as_fqdn) == Some(true);
    match pod_domain(node, pod) {
        Some(domain) if as_fqdn => {
            let fqdn = format!("{short}.{domain}");
            if fqdn.len() > FQDN_MAX_LEN {
                return Err(format!(
                    "failed to construct FQDN from pod hostname and cluster domain, FQDN {fqdn} is too long ({FQDN_MAX_LEN} characters is the max, {} characters requested)",
                    fqdn.len()
                ));
            }
            Ok(fqdn)
        }
        _ => Ok(short),
    }
}

/// Upstream's hostsEntriesFromHostAliases: one header, then a line per alias.
fn host_alias_entries(aliases: &[k8s_openapi::api::core::v1::HostAlias]) -> String {
    if aliases.is_empty() {
        return String::new();
    }
    let mut text = String::from("\n# Entries added by HostAliases.\n");
    for ha in aliases {
        text.push_str(&format!(
            "{}\t{}\n",
            ha.ip,
            ha.hostnames.clone().unwrap_or_default().join("\t")
        ));
    }
    text
}

/// Host files a container's config points at, made by `pod_dirs::prepare_container` beforehand.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ContainerHostPaths {
    /// Mount index → the bind mount of its subPath.
    pub subpaths: BTreeMap<usize, PathBuf>,
    /// The host file behind `terminationMessagePath`, when the container has one.
    pub termination_log: Option<PathBuf>,
}

/// The container-side termination message path (`/dev/termination-log` by default, empty
/// for none).
pub fn termination_message_path(c: &Container) -> String {
    c.termination_message_path
        .clone()
        .unwrap_or_else(|| "/dev/termination-log".into())
}

/// The host file behind a container instance's termination message.
pub fn termination_log_host_path(
    node: &NodeSettings,
    uid: &str,
    container: &str,
    restart_count: u32,
) -> PathBuf {
    pod_dir(node, uid)
        .join("containers")
        .join(container)
        .join(restart_count.to_string())
}

/// Whether the pod's volume `name` is mounted read-only whatever the mount says, subPath
/// mounts included (upstream's `mustMountRO`, the volume's own read-only attribute):
/// - one the kubelet writes from API data (configMap, secret, downwardAPI, projected): a
///   container that could write there could plant links for the kubelet's next re-render
///   (CVE-2017-1002102);
/// - a claim with `persistentVolumeClaim.readOnly` (the PV behind it, hostPath and local
///   ones included, is then read-only to the pod), an inline CSI volume with `readOnly`.
pub fn must_mount_read_only(pod: &Pod, name: &str) -> bool {
    pod.spec
        .iter()
        .flat_map(|s| s.volumes.iter().flatten())
        .find(|v| v.name == name)
        .is_some_and(|v| {
            v.config_map.is_some()
                || v.secret.is_some()
                || v.downward_api.is_some()
                || v.projected.is_some()
                || v.persistent_volume_claim
                    .as_ref()
                    .is_some_and(|c| c.read_only == Some(true))
                || v.csi.as_ref().is_some_and(|c| c.read_only == Some(true))
        })
}

/// The container's config for attempt `restart_count` (pure: the host files it names are
/// made beforehand by `pod_dirs`).
#[allow(clippy::too_many_arguments)]
pub fn container_config(
    node: &NodeSettings,
    pod: &Pod,
    c: &Container,
    restart_count: u32,
    volumes: &BTreeMap<String, PathBuf>,
    etc_hosts: Option<&Path>,
    host_paths: &ContainerHostPaths,
    env: &ContainerEnv,
    handler: &str,
    features: HandlerFeatures,
) -> Result<ContainerConfig, ConfigError> {
    security::check_user_namespace(pod, handler, features)?;
    let uid = pod.metadata.uid.clone().unwrap_or_default();
    let vars = env.map();
    let envs = env.vars.clone();
    let mut budget = ExpandBudget::default();
    let mounts =
        mounts::container_mounts(node, pod, c, volumes, etc_hosts, host_paths, env, features)?;
    let term_path = termination_message_path(c);
    let mut labels = BTreeMap::new();
    labels.insert(
        LABEL_POD_NAME.to_string(),
        pod.metadata.name.clone().unwrap_or_default(),
    );
    labels.insert(
        LABEL_POD_NAMESPACE.to_string(),
        pod.metadata.namespace.clone().unwrap_or_default(),
    );
    labels.insert(LABEL_POD_UID.to_string(), uid.clone());
    labels.insert(LABEL_CONTAINER_NAME.to_string(), c.name.clone());
    let mut annotations = BTreeMap::new();
    annotations.insert(ANN_CONTAINER_HASH.to_string(), podspec::container_hash(c));
    annotations.insert(ANN_RESTART_COUNT.to_string(), restart_count.to_string());
    annotations.insert(ANN_TERMINATION_MESSAGE_PATH.to_string(), term_path);
    annotations.insert(
        ANN_TERMINATION_MESSAGE_POLICY.to_string(),
        c.termination_message_policy
            .clone()
            .unwrap_or_else(|| "File".into()),
    );
    annotations.insert(
        ANN_POD_GRACE_PERIOD.to_string(),
        podspec::spec_grace_seconds(pod).to_string(),
    );
    if let Some(ports) = &c.ports
        && !ports.is_empty()
    {
        let ports: Vec<serde_json::Value> = ports
            .iter()
            .map(|p| {
                let mut o = serde_json::json!({"containerPort": p.container_port, "protocol": p.protocol.clone().unwrap_or_else(|| "TCP".into())});
                if let Some(n) = &p.name {
                    o["name"] = n.clone().into();
                }
                if let Some(hp) = p.host_port {
                    o["hostPort"] = hp.into();
                }
                o
            })
            .collect();
        annotations.insert(
            ANN_CONTAINER_PORTS.to_string(),
            serde_json::to_string(&ports).unwrap_or_default(),
        );
    }
    let mut expand_all = |list: &Option<Vec<String>>| {
        list.iter()
            .flatten()
            .map(|s| expand(s, &vars, &mut budget))
            .collect::<Result<Vec<_>, _>>()
    };
    let command = expand_all(&c.command)?;
    let args = expand_all(&c.args)?;
    Ok(ContainerConfig {
        name: c.name.clone(),
        attempt: restart_count,
        image: c.image.clone().unwrap_or_default(),
        command,
        args,
        working_dir: c.working_dir.clone().unwrap_or_default(),
        envs,
        mounts,
        devices: devices::block_devices(node, pod, c, volumes)?,
        cdi_devices: Vec::new(),
        labels,
        annotations,
        log_path: format!("{}/{restart_count}.log", c.name),
        stdin: c.stdin.unwrap_or(false),
        stdin_once: c.stdin_once.unwrap_or(false),
        tty: c.tty.unwrap_or(false),
        resources: linux_resources(node, pod, c),
        security: security::container_security(node, pod, c)?,
    })
}

#[cfg(test)]
mod tests;
