//! The Node object: registration, status every `nodeStatusUpdateFrequency` (written when it
//! changed, and at least every `nodeStatusReportFrequency`), and the node Lease
//! (`kube-node-lease/<node>`, renewed every quarter of its duration). Host facts come through
//! [`HostFacts`], runtime health through [`RuntimeHealth`], so the status logic is unit-tested.

mod cloud;
pub mod settings;
mod status_patch;
pub use cloud::CloudSettings;
pub use settings::Settings;
pub use status_patch::{comparable, is_extended_resource, merge_resources, status_patch};

use crate::events::{EventRecorder, EventType, node_ref};
use crate::objects::{ClientHandle, client};
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::{
    DaemonEndpoint, Node, NodeAddress, NodeCondition, NodeDaemonEndpoints, NodeSpec, NodeStatus,
    NodeSystemInfo, Taint,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, OwnerReference, Time};
use kube::api::{Api, GetParams, Patch, PatchParams, PostParams};
use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

pub use crate::host::{HostFacts, HostInfo, LinuxHost, os_image};

/// Whether the container runtime can run pods; each error goes into the Ready condition.
#[async_trait::async_trait]
pub trait RuntimeHealth: Send + Sync {
    /// `(runtime_name, version)` when the runtime answers.
    async fn version(&self) -> Option<(String, String)>;
    /// Errors that make the node NotReady (empty when healthy).
    async fn errors(&self) -> Vec<String>;
    /// The runtime's images (None when they cannot be listed: status.images is left alone).
    async fn images(&self) -> Option<Vec<crate::runtime::ImageSummary>> {
        None
    }
    /// The eviction manager's pressure conditions now.
    fn pressure(&self) -> Vec<crate::eviction::Condition> {
        Vec::new()
    }
    /// The runtime's handlers and features (None when it does not answer: the Node's
    /// `runtimeHandlers` and `features` are left as read).
    async fn features(&self) -> Option<crate::runtime::RuntimeFeatures> {
        None
    }
}

/// Health from the CRI runtime and the PLEG.
pub struct CriHealth {
    pub runtime: Arc<dyn crate::runtime::Runtime>,
    pub pleg: Arc<crate::pleg::PlegHealth>,
    pub started_unix: i64,
    pub shutdown: Arc<crate::shutdown::ShutdownState>,
    pub pressure: Arc<crate::eviction::PressureState>,
}

#[async_trait::async_trait]
impl RuntimeHealth for CriHealth {
    fn pressure(&self) -> Vec<crate::eviction::Condition> {
        self.pressure.conditions()
    }

    async fn features(&self) -> Option<crate::runtime::RuntimeFeatures> {
        match self.runtime.runtime_features().await {
            Ok(f) => Some(f),
            Err(e) => {
                tracing::warn!(error = %e, "reading the runtime's handlers for the node status failed");
                None
            }
        }
    }

    async fn version(&self) -> Option<(String, String)> {
        let v = self.runtime.version().await.ok()?;
        Some((v.runtime_name, v.runtime_version))
    }
    async fn images(&self) -> Option<Vec<crate::runtime::ImageSummary>> {
        match self.runtime.list_images().await {
            Ok(list) => Some(list),
            Err(e) => {
                tracing::warn!(error = %e, "listing images for the node status failed");
                None
            }
        }
    }

    async fn errors(&self) -> Vec<String> {
        let mut errs = Vec::new();
        // Upstream's order: runtime errors (down, PLEG, RuntimeReady), network errors
        // (NetworkReady), then the shutdown manager's.
        let conditions = self.runtime.status().await;
        if conditions.is_err() {
            errs.push("container runtime is down".to_string());
        }
        let now = crate::clock::unix_now();
        // The PLEG gets three minutes from start before it counts as unhealthy, as upstream.
        if now - self.started_unix > 180 && !self.pleg.healthy(now) {
            let last = self
                .pleg
                .last_ok_unix
                .load(std::sync::atomic::Ordering::Relaxed);
            errs.push(format!(
                "PLEG is not healthy: pleg was last seen active {}s ago; threshold is 3m0s",
                now - last
            ));
        }
        if let Ok(conds) = &conditions {
            let find = |t: &str| conds.iter().find(|c| c.type_ == t);
            let show = |c: Option<&crate::runtime::RuntimeCondition>| {
                c.map_or("<nil>".to_string(), |c| c.to_string())
            };
            let runtime = find("RuntimeReady");
            if !runtime.is_some_and(|c| c.status) {
                errs.push(format!("container runtime not ready: {}", show(runtime)));
            }
            let network = find("NetworkReady");
            if !network.is_some_and(|c| c.status) {
                errs.push(format!(
                    "container runtime network not ready: {}",
                    show(network)
                ));
            }
        }
        if self.shutdown.shutting_down() {
            errs.push(crate::shutdown::SHUTTING_DOWN.to_string());
        }
        errs
    }
}

/// Node settings from the configuration.
#[derive(Debug, Clone)]
pub struct NodeConfig {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub taints: Vec<Taint>,
    pub node_ips: Vec<IpAddr>,
    pub hostname: String,
    pub port: u16,
    pub max_pods: u32,
    pub update_frequency: Duration,
    pub report_frequency: Duration,
    pub lease_duration_seconds: i32,
    pub register_node: bool,
    /// `nodeStatusMaxImages` (-1: all).
    pub max_images: i32,
    /// Reservations and hard eviction thresholds subtracted for allocatable.
    pub resources: crate::cm::NodeResources,
    /// `--cloud-provider=external` and `providerID`.
    pub cloud: CloudSettings,
    /// `--node-ip` as given (the provided-node-ip annotation with an external cloud).
    pub given_node_ips: Vec<IpAddr>,
}

/// The taint an external cloud controller manager removes once it initialised the Node.
pub const TAINT_EXTERNAL_CLOUD_PROVIDER: &str = "node.cloudprovider.kubernetes.io/uninitialized";
/// The `--node-ip` the kubelet was given, for the cloud controller manager.
pub const ANNOTATION_PROVIDED_NODE_IP: &str = "alpha.kubernetes.io/provided-node-ip";

/// Upstream's ImagesSetter over ListImages: largest first (ties: greater ID first), at most
/// `max` (-1: all), each named by its digests then its tags, at most 5 names.
pub fn node_images(
    mut list: Vec<crate::runtime::ImageSummary>,
    max: i32,
) -> Vec<k8s_openapi::api::core::v1::ContainerImage> {
    list.sort_by(|a, b| b.size.cmp(&a.size).then_with(|| b.id.cmp(&a.id)));
    if max > -1 && (max as usize) < list.len() {
        list.truncate(max as usize);
    }
    list.into_iter()
        .map(|i| {
            let mut names = i.repo_digests;
            names.extend(i.repo_tags);
            names.truncate(5);
            k8s_openapi::api::core::v1::ContainerImage {
                names: Some(names),
                size_bytes: Some(i.size as i64),
            }
        })
        .collect()
}

/// `amd64`/`arm64`/... for Rust's architecture names (Go's GOARCH).
pub fn go_arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "x86" => "386",
        "powerpc64" => "ppc64le",
        "s390x" => "s390x",
        "riscv64" => "riscv64",
        other => other,
    }
}

/// The Node object registered with the apiserver (upstream's `initialNode`): with an
/// external cloud provider also the uninitialized taint and the provided-node-ip
/// annotation; `spec.providerID` when configured.
pub fn initial_node(cfg: &NodeConfig) -> Node {
    let mut labels = cfg.labels.clone();
    labels.extend(default_labels(cfg));
    let mut taints = cfg.taints.clone();
    let mut annotations = BTreeMap::from([(
        "volumes.kubernetes.io/controller-managed-attach-detach".to_string(),
        "true".to_string(),
    )]);
    if cfg.cloud.external {
        taints.push(Taint {
            key: TAINT_EXTERNAL_CLOUD_PROVIDER.into(),
            value: Some("true".into()),
            effect: "NoSchedule".into(),
            time_added: None,
        });
        if !cfg.given_node_ips.is_empty() {
            let ips: Vec<String> = cfg.given_node_ips.iter().map(ToString::to_string).collect();
            annotations.insert(ANNOTATION_PROVIDED_NODE_IP.into(), ips.join(","));
        }
    }
    Node {
        metadata: ObjectMeta {
            name: Some(cfg.name.clone()),
            labels: Some(labels),
            annotations: Some(annotations),
            ..Default::default()
        },
        spec: Some(NodeSpec {
            taints: Some(taints).filter(|t| !t.is_empty()),
            provider_id: Some(cfg.cloud.provider_id.clone()).filter(|p| !p.is_empty()),
            ..Default::default()
        }),
        status: None,
    }
}

/// The Node's addresses: `--node-ip` (or the detected one) and the hostname. With an
/// external cloud provider the addresses the cloud controller manager set win: once the
/// Node has any, they are kept (upstream's NodeAddress setter).
fn node_addresses(cfg: &NodeConfig, prev: Option<&NodeStatus>) -> Vec<NodeAddress> {
    if cfg.cloud.external
        && let Some(set) = prev
            .and_then(|s| s.addresses.as_ref())
            .filter(|a| !a.is_empty())
    {
        return set.clone();
    }
    let mut addresses: Vec<NodeAddress> = cfg
        .node_ips
        .iter()
        .map(|ip| NodeAddress {
            type_: "InternalIP".into(),
            address: ip.to_string(),
        })
        .collect();
    addresses.push(NodeAddress {
        type_: "Hostname".into(),
        address: cfg.hostname.clone(),
    });
    addresses
}

/// Labels the kubelet keeps on its Node.
pub fn default_labels(cfg: &NodeConfig) -> BTreeMap<String, String> {
    BTreeMap::from([
        ("kubernetes.io/hostname".to_string(), cfg.hostname.clone()),
        ("kubernetes.io/os".to_string(), "linux".to_string()),
        ("kubernetes.io/arch".to_string(), go_arch().to_string()),
        ("beta.kubernetes.io/os".to_string(), "linux".to_string()),
        ("beta.kubernetes.io/arch".to_string(), go_arch().to_string()),
    ])
}

/// Capacity from the host (CPUs, MemTotal, huge pages, the root dir's filesystem, maxPods)
/// and allocatable from it as upstream's container manager (`cm::allocatable`).
pub fn capacity_and_allocatable(
    cfg: &NodeConfig,
    host: &HostInfo,
) -> (BTreeMap<String, Quantity>, BTreeMap<String, Quantity>) {
    crate::cm::resource_lists(host, cfg.max_pods, &cfg.resources)
}

/// Adds extended resources (the device plugins') to the status's capacity and allocatable.
pub fn add_resources(
    status: &mut NodeStatus,
    capacity: BTreeMap<String, Quantity>,
    allocatable: BTreeMap<String, Quantity>,
) {
    status
        .capacity
        .get_or_insert_with(Default::default)
        .extend(capacity);
    status
        .allocatable
        .get_or_insert_with(Default::default)
        .extend(allocatable);
}

/// A condition transition worth an event: `(type, reason)` of the new state.
pub type Transition = (EventType, &'static str);

/// `(reason, message, event)` of one condition state.
type CondText = (&'static str, &'static str, &'static str);

fn set_pressure(
    conds: &mut Vec<NodeCondition>,
    now: &Time,
    ty: &str,
    pressure: bool,
    (when_true, when_false): (CondText, CondText),
    out: &mut Vec<Transition>,
) {
    let pos = conds.iter().position(|c| c.type_ == ty);
    let c = match pos {
        Some(i) => &mut conds[i],
        None => {
            conds.push(NodeCondition {
                type_: ty.into(),
                status: "Unknown".into(),
                ..Default::default()
            });
            conds.last_mut().expect("just pushed")
        }
    };
    c.last_heartbeat_time = Some(now.clone());
    let (status, (reason, message, event)) = if pressure {
        ("True", when_true)
    } else {
        ("False", when_false)
    };
    if c.status != status {
        c.status = status.into();
        c.reason = Some(reason.into());
        c.message = Some(message.into());
        c.last_transition_time = Some(now.clone());
        out.push((EventType::Normal, event));
    }
}

/// Upstream's error aggregate as text: one error as itself, several as `[a, b]`.
fn aggregate(errors: &[String]) -> String {
    match errors {
        [one] => one.clone(),
        many => format!("[{}]", many.join(", ")),
    }
}

/// Computes the node's status from the previous one (upstream's setters): conditions keep
/// their `lastTransitionTime` unless their status changes. Returns the transitions to report.
pub fn compute_status(
    prev: Option<&NodeStatus>,
    cfg: &NodeConfig,
    host: &HostInfo,
    runtime: Option<&(String, String)>,
    runtime_errors: &[String],
    pressure: &[crate::eviction::Condition],
    now: jiff::Timestamp,
) -> (NodeStatus, Vec<Transition>) {
    let now_t = Time(now);
    let mut events = Vec::new();
    let (capacity, allocatable) = capacity_and_allocatable(cfg, host);

    let (capacity, allocatable) = merge_resources(prev, capacity, allocatable);
    // Every condition stays (node-problem-detector's, the network plugin's
    // NetworkUnavailable); the kubelet's own are updated in place by type.
    let mut conds: Vec<NodeCondition> = prev.and_then(|s| s.conditions.clone()).unwrap_or_default();
    set_pressure_conditions(&mut conds, &now_t, pressure, &mut events);
    set_ready(&mut conds, &now_t, runtime_errors, &mut events);
    let addresses = node_addresses(cfg, prev);
    let status = NodeStatus {
        capacity: Some(capacity),
        allocatable: Some(allocatable),
        conditions: Some(conds),
        addresses: Some(addresses),
        daemon_endpoints: Some(NodeDaemonEndpoints {
            kubelet_endpoint: Some(DaemonEndpoint {
                port: i32::from(cfg.port),
            }),
        }),
        node_info: Some(node_info(prev, host, runtime)),
        ..prev.cloned().unwrap_or_default()
    };
    (status, events)
}

/// The three pressure conditions from the eviction manager's, with their events.
fn set_pressure_conditions(
    conds: &mut Vec<NodeCondition>,
    now_t: &Time,
    pressure: &[crate::eviction::Condition],
    events: &mut Vec<Transition>,
) {
    use crate::eviction::Condition as C;
    set_pressure(
        conds,
        now_t,
        "MemoryPressure",
        pressure.contains(&C::MemoryPressure),
        (
            (
                "KubeletHasInsufficientMemory",
                "kubelet has insufficient memory available",
                "NodeHasInsufficientMemory",
            ),
            (
                "KubeletHasSufficientMemory",
                "kubelet has sufficient memory available",
                "NodeHasSufficientMemory",
            ),
        ),
        events,
    );
    set_pressure(
        conds,
        now_t,
        "DiskPressure",
        pressure.contains(&C::DiskPressure),
        (
            (
                "KubeletHasDiskPressure",
                "kubelet has disk pressure",
                "NodeHasDiskPressure",
            ),
            (
                "KubeletHasNoDiskPressure",
                "kubelet has no disk pressure",
                "NodeHasNoDiskPressure",
            ),
        ),
        events,
    );
    set_pressure(
        conds,
        now_t,
        "PIDPressure",
        pressure.contains(&C::PidPressure),
        (
            (
                "KubeletHasInsufficientPID",
                "kubelet has insufficient PID available",
                "NodeHasInsufficientPID",
            ),
            (
                "KubeletHasSufficientPID",
                "kubelet has sufficient PID available",
                "NodeHasSufficientPID",
            ),
        ),
        events,
    );
}

/// The Ready condition: ready unless the runtime reports errors; `NodeReady`/`NodeNotReady`
/// on a change.
fn set_ready(
    conds: &mut Vec<NodeCondition>,
    now_t: &Time,
    runtime_errors: &[String],
    events: &mut Vec<Transition>,
) {
    let mut ready = if runtime_errors.is_empty() {
        NodeCondition {
            type_: "Ready".into(),
            status: "True".into(),
            reason: Some("KubeletReady".into()),
            message: Some("kubelet is posting ready status".into()),
            ..Default::default()
        }
    } else {
        NodeCondition {
            type_: "Ready".into(),
            status: "False".into(),
            reason: Some("KubeletNotReady".into()),
            message: Some(aggregate(runtime_errors)),
            ..Default::default()
        }
    };
    ready.last_heartbeat_time = Some(now_t.clone());
    match conds.iter().position(|c| c.type_ == "Ready") {
        Some(i) => {
            if conds[i].status == ready.status {
                ready.last_transition_time = conds[i].last_transition_time.clone();
            } else {
                ready.last_transition_time = Some(now_t.clone());
                let reason = if ready.status == "True" {
                    "NodeReady"
                } else {
                    "NodeNotReady"
                };
                events.push((EventType::Normal, reason));
            }
            if ready.status == "True" {
                crate::metrics::node_ready();
            }
            // In place, as upstream's setter: the list's order is the Node's.
            conds[i] = ready;
        }
        None => {
            ready.last_transition_time = Some(now_t.clone());
            if ready.status == "True" {
                events.push((EventType::Normal, "NodeReady"));
                crate::metrics::node_ready();
            }
            conds.push(ready);
        }
    }
}

/// `nodeInfo`: the host's facts, the runtime's version (the last known one while the runtime
/// does not answer), the kubelet's; what the kubelet does not set stays as read.
fn node_info(
    prev: Option<&NodeStatus>,
    host: &HostInfo,
    runtime: Option<&(String, String)>,
) -> NodeSystemInfo {
    let runtime_version = runtime
        .map(|(n, v)| format!("{n}://{v}"))
        .or_else(|| {
            prev.and_then(|s| s.node_info.as_ref())
                .map(|i| i.container_runtime_version.clone())
        })
        .unwrap_or_default();
    NodeSystemInfo {
        machine_id: host.machine_id.clone(),
        system_uuid: host.system_uuid.clone(),
        boot_id: host.boot_id.clone(),
        kernel_version: host.kernel_version.clone(),
        os_image: host.os_image.clone(),
        container_runtime_version: runtime_version,
        kubelet_version: crate::KUBERNETES_VERSION.to_string(),
        // kubeProxyVersion is no longer set by the kubelet (DisableNodeKubeProxyVersion, GA).
        kube_proxy_version: String::new(),
        operating_system: "linux".into(),
        architecture: go_arch().into(),
        // What the kubelet does not set (swap, features) stays as read.
        ..prev.and_then(|s| s.node_info.clone()).unwrap_or_default()
    }
}

/// Upstream's RuntimeHandlers and NodeFeatures setters: `status.runtimeHandlers` (each
/// handler with both its features) and `status.features.supplementalGroupsPolicy`, from the
/// runtime's Status. A runtime listing no handlers leaves no list; one sending no features
/// leaves `features` as read.
pub fn set_runtime_features(status: &mut NodeStatus, f: &crate::runtime::RuntimeFeatures) {
    use k8s_openapi::api::core::v1::{
        NodeFeatures, NodeRuntimeHandler, NodeRuntimeHandlerFeatures,
    };
    let handlers: Vec<NodeRuntimeHandler> = f
        .handlers
        .iter()
        .map(|(name, h)| NodeRuntimeHandler {
            name: Some(name.clone()),
            features: Some(NodeRuntimeHandlerFeatures {
                recursive_read_only_mounts: Some(h.recursive_read_only_mounts),
                user_namespaces: Some(h.user_namespaces),
            }),
        })
        .collect();
    status.runtime_handlers = (!handlers.is_empty()).then_some(handlers);
    if let Some(sgp) = f.supplemental_groups_policy {
        status.features = Some(NodeFeatures {
            supplemental_groups_policy: Some(sgp),
        });
    }
}

/// The attachable volumes mounted for pods (`status.volumesInUse`, upstream's unique volume
/// names), from the volume manager.
pub trait VolumesInUse: Send + Sync {
    fn volumes_in_use(&self) -> Vec<String>;
}

/// Registers the node and keeps its status current.
pub struct NodeStatusLoop {
    /// `status.volumesInUse`; None leaves the field as it is.
    pub volumes: Option<Arc<dyn VolumesInUse>>,
    pub cfg: NodeConfig,
    pub client: ClientHandle,
    pub host: Arc<dyn HostFacts>,
    pub health: Arc<dyn RuntimeHealth>,
    pub events: Arc<dyn EventRecorder>,
    /// The registered Node's UID and labels, for the lease, mirror pods and admission.
    pub node_tx: watch::Sender<Option<Node>>,
    /// The device plugins' resources join capacity and allocatable.
    pub devices: Option<Arc<crate::devices::DeviceManager>>,
}

impl NodeStatusLoop {
    async fn register(&self, api: &Api<Node>) -> Result<Node, kube::Error> {
        let node = initial_node(&self.cfg);
        match client::timed(api.create(&PostParams::default(), &node)).await {
            Ok(n) => {
                tracing::info!(node = %self.cfg.name, "node registered");
                Ok(n)
            }
            Err(e) if client::status_code(&e) == Some(409) => {
                // Already registered (an agent restart or a re-join): keep the default labels current.
                let patch = serde_json::json!({"metadata": {"labels": default_labels(&self.cfg)}});
                let n = client::timed(api.patch(
                    &self.cfg.name,
                    &PatchParams::default(),
                    &Patch::Merge(&patch),
                ))
                .await?;
                tracing::info!(node = %self.cfg.name, "node was already registered");
                Ok(n)
            }
            Err(e) => Err(e),
        }
    }

    pub async fn run(self, cancel: CancellationToken) {
        let name = self.cfg.name.clone();
        let nref = node_ref(&name);
        let mut registered: Option<Node> = None;
        let mut last_report: Option<tokio::time::Instant> = None;
        let mut backoff =
            plumbing::Backoff::new(Duration::from_millis(500), Duration::from_secs(7));
        let mut started_event = false;
        loop {
            let api: Api<Node> = Api::all(self.client.current());
            let mut wait = self.cfg.update_frequency;
            if registered.is_none() {
                match self.register(&api).await {
                    Ok(n) => {
                        registered = Some(n.clone());
                        last_report = None;
                        self.node_tx.send_replace(Some(n));
                        backoff.succeed();
                        wait = Duration::ZERO;
                    }
                    Err(e) => {
                        wait = backoff.fail();
                        tracing::warn!(node = %name, error = %e, retry_in = ?wait, "registering the node failed");
                    }
                }
            } else {
                match self.update_once(&api, &mut last_report, &nref).await {
                    Ok(n) => {
                        // Admission reads the labels (node affinity) and allocatable (fit,
                        // resizes) from here.
                        self.node_tx.send_if_modified(|cur| {
                            let key = |n: &Node| {
                                (
                                    n.metadata.uid.clone(),
                                    n.metadata.labels.clone(),
                                    n.status.as_ref().and_then(|s| s.allocatable.clone()),
                                )
                            };
                            let changed = cur.as_ref().map(key) != Some(key(&n));
                            if changed {
                                *cur = Some(n.clone());
                            }
                            changed
                        });
                        registered = Some(n);
                    }
                    Err(e) if client::status_code(&e) == Some(404) => {
                        tracing::warn!(node = %name, "the Node object is gone; registering again");
                        registered = None;
                        wait = Duration::ZERO;
                    }
                    Err(e) => {
                        tracing::warn!(node = %name, error = %e, "updating node status failed; retrying next period")
                    }
                }
            }
            if registered.is_some() && !started_event {
                started_event = true;
                self.events
                    .record(&nref, EventType::Normal, "Starting", "Starting kubelet.");
            }
            if wait > Duration::ZERO {
                tokio::select! {
                    _ = cancel.cancelled() => return,
                    _ = tokio::time::sleep(wait) => {}
                }
            } else if cancel.is_cancelled() {
                return;
            }
        }
    }

    async fn update_once(
        &self,
        api: &Api<Node>,
        last_report: &mut Option<tokio::time::Instant>,
        nref: &k8s_openapi::api::core::v1::ObjectReference,
    ) -> Result<Node, kube::Error> {
        // As upstream's first try: served from the apiserver's cache (resourceVersion 0).
        let current = client::timed(api.get_with(&self.cfg.name, &GetParams::any())).await?;
        let facts = self.host.clone();
        let host = tokio::task::spawn_blocking(move || facts.host_info())
            .await
            .unwrap_or_else(|e| {
                tracing::warn!(error = %e, "reading host facts failed");
                HostInfo::default()
            });
        let version = self.health.version().await;
        let errors = self.health.errors().await;
        let (mut status, transitions) = compute_status(
            current.status.as_ref(),
            &self.cfg,
            &host,
            version.as_ref(),
            &errors,
            &self.health.pressure(),
            jiff::Timestamp::now(),
        );
        if let Some(dm) = &self.devices {
            let (cap, alloc) = dm.capacity();
            add_resources(&mut status, cap, alloc);
        }
        if let Some(f) = self.health.features().await {
            set_runtime_features(&mut status, &f);
        }
        status.images = match self.health.images().await {
            Some(list) => Some(node_images(list, self.cfg.max_images)),
            None => current.status.as_ref().and_then(|s| s.images.clone()),
        };
        if let Some(v) = &self.volumes {
            let list = v.volumes_in_use();
            status.volumes_in_use = (!list.is_empty()).then_some(list);
        }
        // Upstream's tryUpdateNodeStatus: a write when something the kubelet owns changed
        // (or someone else changed it), else once per nodeStatusReportFrequency.
        let changed = current.status.as_ref().map(comparable) != Some(comparable(&status));
        let due = last_report.is_none_or(|at| at.elapsed() >= self.cfg.report_frequency);
        let old = current.status.clone().unwrap_or_default();
        let patch = match status_patch(&old, &status) {
            Some(p) if changed || due => p,
            _ => return Ok(current),
        };
        let node = client::timed(api.patch_status(
            &self.cfg.name,
            &PatchParams::default(),
            &Patch::Strategic(&patch),
        ))
        .await?;
        *last_report = Some(tokio::time::Instant::now());
        for (ty, reason) in transitions {
            self.events.record(
                nref,
                ty,
                reason,
                &format!("Node {} status is now: {reason}", self.cfg.name),
            );
        }
        Ok(node)
    }
}

/// Keeps `kube-node-lease/<node>` renewed (upstream's node lease controller).
pub struct LeaseLoop {
    pub node_name: String,
    pub lease_duration_seconds: i32,
    pub client: ClientHandle,
    pub node_rx: watch::Receiver<Option<Node>>,
}

/// The namespace node leases live in.
pub const LEASE_NAMESPACE: &str = "kube-node-lease";

impl LeaseLoop {
    fn desired(&self, base: Option<Lease>) -> Lease {
        let mut lease = base.unwrap_or_else(|| Lease {
            metadata: ObjectMeta {
                name: Some(self.node_name.clone()),
                namespace: Some(LEASE_NAMESPACE.into()),
                ..Default::default()
            },
            spec: None,
        });
        let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
        spec.holder_identity = Some(self.node_name.clone());
        spec.lease_duration_seconds = Some(self.lease_duration_seconds);
        spec.renew_time = Some(MicroTime(jiff::Timestamp::now()));
        if let Some(node) = self.node_rx.borrow().as_ref()
            && let Some(uid) = &node.metadata.uid
        {
            let owner = OwnerReference {
                api_version: "v1".into(),
                kind: "Node".into(),
                name: self.node_name.clone(),
                uid: uid.clone(),
                ..Default::default()
            };
            let owners = lease.metadata.owner_references.get_or_insert_with(Vec::new);
            if !owners.iter().any(|o| o.uid == owner.uid) {
                owners.retain(|o| o.kind != "Node");
                owners.push(owner);
            }
        }
        lease
    }

    pub async fn run(mut self, cancel: CancellationToken) {
        let interval = Duration::from_secs_f64(f64::from(self.lease_duration_seconds) * 0.25);
        let mut cached: Option<Lease> = None;
        let mut backoff =
            plumbing::Backoff::new(Duration::from_millis(200), Duration::from_secs(7));
        loop {
            let api: Api<Lease> = Api::namespaced(self.client.current(), LEASE_NAMESPACE);
            let result = match cached.take() {
                Some(l) => {
                    client::timed(api.replace(
                        &self.node_name,
                        &PostParams::default(),
                        &self.desired(Some(l)),
                    ))
                    .await
                }
                None => match client::timed(api.get_opt(&self.node_name)).await {
                    Ok(Some(l)) => {
                        client::timed(api.replace(
                            &self.node_name,
                            &PostParams::default(),
                            &self.desired(Some(l)),
                        ))
                        .await
                    }
                    Ok(None) => {
                        client::timed(api.create(&PostParams::default(), &self.desired(None))).await
                    }
                    Err(e) => Err(e),
                },
            };
            let wait = match result {
                Ok(l) => {
                    cached = Some(l);
                    backoff.succeed();
                    interval
                }
                Err(e) => {
                    // Conflicts and errors: re-read next time.
                    let w = backoff.fail();
                    tracing::warn!(node = %self.node_name, error = %e, retry_in = ?w, "renewing the node lease failed");
                    w
                }
            };
            let owned = cached.as_ref().is_some_and(|l| {
                l.metadata
                    .owner_references
                    .as_ref()
                    .is_some_and(|o| !o.is_empty())
            });
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = tokio::time::sleep(wait) => {}
                // The Node appeared (or was re-registered): set the owner reference right away.
                r = self.node_rx.changed(), if !owned || cached.is_none() => {
                    if r.is_err() {
                        tokio::time::sleep(wait).await;
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests;
