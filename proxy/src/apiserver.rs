//! The apiserver source: list+watch Services and `discovery.k8s.io/v1` EndpointSlices in all
//! namespaces (with upstream kube-proxy's label selector) into the [`ProxyHandles`] of the
//! proxiers, and this proxy's Node (zone and addresses for the rules, deletion state for
//! `/healthz`).
//!
//! Each kind runs one [`Reflector`] (the node agent's one list+watch store, `plumbing::store`)
//! whose [`Sink`] hands each change to the handles. A (re-)list is buffered until it is
//! complete and then diffed against the store, so objects that vanished while the watch was
//! down are deleted, unchanged ones are not re-delivered, and the handle is marked synced
//! once. Objects are decoded one by one, so a malformed object is logged and skipped without
//! failing the list; watch errors are logged and retried with the watcher's backoff.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::ServiceCIDR;
use kube::api::{Api, ApiResource, DynamicObject};
use kube::runtime::watcher;
use plumbing::store::{Reflector, Sink, Store};
use thiserror::Error;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::model::NodeFacts;
use crate::tracker::ProxyHandles;

/// `apis.LabelServiceProxyName`: Services (and their slices) carrying it belong to another proxy.
pub const LABEL_SERVICE_PROXY_NAME: &str = "service.kubernetes.io/service-proxy-name";
/// `v1.IsHeadlessService`: set on the EndpointSlices of headless Services.
pub const LABEL_HEADLESS: &str = "service.kubernetes.io/headless";

/// Server-side timeout of each watch request (kube's default idle timeout is ~295 s).
pub const WATCH_TIMEOUT_SECS: u32 = 60;
/// Upper bound for connecting to the apiserver.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug, Error)]
pub enum Error {
    #[error("reading kubeconfig {path}: {message}")]
    Kubeconfig { path: PathBuf, message: String },
    #[error("invalid --master {master:?}: {message}")]
    Master { master: String, message: String },
    #[error(
        "neither --kubeconfig nor --master given, and the in-cluster configuration (KUBERNETES_SERVICE_HOST/PORT, /var/run/secrets/kubernetes.io/serviceaccount) failed: {0}"
    )]
    InCluster(String),
    #[error("building the apiserver client: {0}")]
    Build(#[from] kube::Error),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The label selector of upstream's Service and EndpointSlice informers (both use the same
/// one: `labels.Selector.String()` sorts requirements by key).
pub fn label_selector() -> String {
    let mut keys = [LABEL_SERVICE_PROXY_NAME, LABEL_HEADLESS];
    keys.sort_unstable();
    keys.iter()
        .map(|k| format!("!{k}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// The field selector of the Node watch (upstream watches only its own Node).
pub fn node_field_selector(node_name: &str) -> String {
    format!("metadata.name={node_name}")
}

// ---------------------------------------------------------------------------------------
// Client.

/// Where the client comes from: `--kubeconfig` / `clientConnection.kubeconfig`, `--master`
/// (overrides the kubeconfig's server, as upstream's `BuildConfigFromFlags`), or, with
/// neither, the in-cluster configuration (a DaemonSet pod's service account); and the
/// client-side rate limit (`clientConnection.qps` / `burst`).
#[derive(Clone, Debug, PartialEq)]
pub struct ClientOptions {
    pub kubeconfig: Option<PathBuf>,
    pub master: Option<String>,
    pub qps: f32,
    pub burst: i32,
}

fn parse_master(master: &str) -> Result<http::Uri> {
    let err = |message: String| Error::Master {
        master: master.to_string(),
        message,
    };
    let uri: http::Uri = master.trim().parse().map_err(|e| err(format!("{e}")))?;
    match uri.scheme_str() {
        Some("http" | "https") if uri.host().is_some() => Ok(uri),
        _ => Err(err("must be an http(s) URL with a host".into())),
    }
}

async fn load_config(opts: &ClientOptions) -> Result<kube::Config> {
    let mut config = match &opts.kubeconfig {
        Some(path) => {
            let err = |message: String| Error::Kubeconfig {
                path: path.clone(),
                message,
            };
            let kc = kube::config::Kubeconfig::read_from(path).map_err(|e| err(e.to_string()))?;
            kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
                .await
                .map_err(|e| err(e.to_string()))?
        }
        None => match opts.master.as_deref().filter(|m| !m.trim().is_empty()) {
            Some(master) => kube::Config::new(parse_master(master)?),
            None => {
                info!(
                    "neither --kubeconfig nor --master given: using the in-cluster configuration"
                );
                kube::Config::incluster().map_err(|e| Error::InCluster(e.to_string()))?
            }
        },
    };
    if let Some(master) = opts.master.as_deref().filter(|m| !m.trim().is_empty()) {
        config.cluster_url = parse_master(master)?;
    }
    config.connect_timeout = Some(CONNECT_TIMEOUT);
    Ok(config)
}

/// The fixed-window approximation of client-go's token bucket: at most `burst` requests per
/// `burst / qps` seconds (5 QPS / burst 10 → 10 requests per 2 s).
pub fn rate_window(qps: f32, burst: i32) -> (u64, Duration) {
    let burst = u64::try_from(burst.max(1)).unwrap_or(1);
    let qps = if qps.is_finite() && qps > 0.0 {
        f64::from(qps)
    } else {
        5.0
    };
    // A tiny qps would make the window overflow: past an hour it is an hour.
    let per = Duration::try_from_secs_f64(burst as f64 / qps)
        .unwrap_or(MAX_RATE_WINDOW)
        .clamp(Duration::from_millis(1), MAX_RATE_WINDOW);
    (burst, per)
}

/// The longest rate-limit window [`rate_window`] gives.
const MAX_RATE_WINDOW: Duration = Duration::from_secs(3600);

/// Builds a rate-limited client (client certificates and tokens as kube supports them:
/// inline or file certificates, `token`, `tokenFile`, exec plugins).
pub async fn build_client(opts: &ClientOptions) -> Result<kube::Client> {
    let config = load_config(opts).await?;
    let (num, per) = rate_window(opts.qps, opts.burst);
    let rest_metrics = plumbing::metrics::RestClientLayer::for_url(&config.cluster_url);
    let builder = kube::client::ClientBuilder::try_from(config)?;
    Ok(builder
        .with_layer(&rest_metrics)
        .with_layer(&tower::limit::RateLimitLayer::new(num, per))
        .build())
}

/// Reads a kubeconfig just to report which server it points at (for logs).
pub fn kubeconfig_server(path: &Path) -> Option<String> {
    let kc = kube::config::Kubeconfig::read_from(path).ok()?;
    let ctx_name = kc.current_context.clone()?;
    let ctx = kc
        .contexts
        .iter()
        .find(|c| c.name == ctx_name)?
        .context
        .clone()?;
    kc.clusters
        .iter()
        .find(|c| c.name == ctx.cluster)?
        .cluster
        .as_ref()?
        .server
        .clone()
}

// ---------------------------------------------------------------------------------------
// Sinks.

fn check_name(obj: &DynamicObject) -> Result<(), DecodeError> {
    if obj.metadata.name.as_deref().unwrap_or_default().is_empty() {
        return Err(DecodeError::NoName);
    }
    Ok(())
}

/// Why a watched object is skipped as malformed.
#[derive(Debug, thiserror::Error)]
pub enum DecodeError {
    #[error("object without metadata.name")]
    NoName,
    #[error("{0}")]
    Parse(#[from] kube::core::dynamic::ParseDynamicObjectError),
}

/// Services into the handles.
#[derive(Debug)]
pub struct ServiceSink(pub ProxyHandles);

impl Sink<DynamicObject> for ServiceSink {
    type Item = Service;
    type Error = DecodeError;
    fn kind(&self) -> &'static str {
        "Service"
    }
    fn decode(&self, obj: DynamicObject) -> Result<Option<Service>, DecodeError> {
        check_name(&obj)?;
        let mut svc: Service = obj.try_parse()?;
        svc.metadata.managed_fields = None;
        Ok(Some(svc))
    }
    fn upsert(&mut self, obj: &Service) {
        self.0.on_service_upsert(obj);
    }
    fn delete(&mut self, obj: &Service) {
        self.0.on_service_delete(obj);
    }
    fn synced(&mut self) {
        self.0.on_services_synced();
    }
}

/// `networking.k8s.io/v1` ServiceCIDRs: the union of their `spec.cidrs` goes to the
/// handles (upstream's OnServiceCIDRsChanged; the nftables mode drops traffic to the
/// addresses in them that are no ClusterIP).
#[derive(Debug)]
pub struct ServiceCidrSink {
    handles: ProxyHandles,
    by_name: BTreeMap<String, Vec<crate::model::Cidr>>,
}

impl ServiceCidrSink {
    pub fn new(handles: ProxyHandles) -> Self {
        ServiceCidrSink {
            handles,
            by_name: BTreeMap::new(),
        }
    }

    fn push(&self) {
        let all: Vec<crate::model::Cidr> = self.by_name.values().flatten().copied().collect();
        self.handles.on_service_cidrs(&all);
    }
}

impl Sink<DynamicObject> for ServiceCidrSink {
    type Item = ServiceCIDR;
    type Error = DecodeError;
    fn kind(&self) -> &'static str {
        "ServiceCIDR"
    }
    fn decode(&self, obj: DynamicObject) -> Result<Option<ServiceCIDR>, DecodeError> {
        check_name(&obj)?;
        let mut c: ServiceCIDR = obj.try_parse()?;
        c.metadata.managed_fields = None;
        Ok(Some(c))
    }
    fn upsert(&mut self, obj: &ServiceCIDR) {
        let cidrs = obj
            .spec
            .as_ref()
            .and_then(|s| s.cidrs.as_ref())
            .into_iter()
            .flatten()
            .filter_map(|c| crate::model::Cidr::parse_or_host(c).ok())
            .collect();
        let name = obj.metadata.name.clone().unwrap_or_default();
        self.by_name.insert(name, cidrs);
        self.push();
    }
    fn delete(&mut self, obj: &ServiceCIDR) {
        self.by_name
            .remove(obj.metadata.name.as_deref().unwrap_or_default());
        self.push();
    }
    fn synced(&mut self) {
        self.push();
    }
}

/// EndpointSlices into the handles.
#[derive(Debug)]
pub struct EndpointSliceSink(pub ProxyHandles);

impl Sink<DynamicObject> for EndpointSliceSink {
    type Item = EndpointSlice;
    type Error = DecodeError;
    fn kind(&self) -> &'static str {
        "EndpointSlice"
    }
    fn decode(&self, obj: DynamicObject) -> Result<Option<EndpointSlice>, DecodeError> {
        check_name(&obj)?;
        let mut slice: EndpointSlice = obj.try_parse()?;
        slice.metadata.managed_fields = None;
        Ok(Some(slice))
    }
    fn upsert(&mut self, obj: &EndpointSlice) {
        self.0.on_endpoint_slice_upsert(obj);
    }
    fn delete(&mut self, obj: &EndpointSlice) {
        self.0.on_endpoint_slice_delete(obj);
    }
    fn synced(&mut self) {
        self.0.on_endpoint_slices_synced();
    }
}

/// `spec.podCIDRs` (else `spec.podCIDR`), parsed; entries that do not parse are left out.
fn node_pod_cidrs(spec: Option<&k8s_openapi::api::core::v1::NodeSpec>) -> Vec<crate::model::Cidr> {
    let Some(spec) = spec else {
        return Vec::new();
    };
    let list = match &spec.pod_cidrs {
        Some(l) if !l.is_empty() => l.clone(),
        _ => spec.pod_cidr.clone().into_iter().collect(),
    };
    list.iter().filter_map(|c| c.trim().parse().ok()).collect()
}

/// What the proxy looks at in its Node.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeInfo {
    pub name: String,
    /// Zone label and addresses, for the rules.
    pub facts: NodeFacts,
    /// `metadata.deletionTimestamp` is set.
    pub deleting: bool,
    /// Keys of `spec.taints`.
    pub taint_keys: Vec<String>,
    /// `spec.podCIDRs` (logged only).
    pub pod_cidrs: Vec<String>,
}

impl NodeInfo {
    pub fn from_node(node: &Node) -> NodeInfo {
        let status = node.status.as_ref();
        let spec = node.spec.as_ref();
        let addresses = status.and_then(|s| s.addresses.as_ref());
        // InternalIPs first, then ExternalIPs (upstream's GetNodeHostIPs).
        let ips = ["InternalIP", "ExternalIP"]
            .iter()
            .flat_map(|kind| {
                addresses
                    .into_iter()
                    .flatten()
                    .filter(move |a| a.type_ == *kind)
                    .filter_map(|a| a.address.trim().parse().ok())
            })
            .collect();
        NodeInfo {
            name: node.metadata.name.clone().unwrap_or_default(),
            facts: NodeFacts {
                zone: node
                    .metadata
                    .labels
                    .as_ref()
                    .and_then(|l| l.get(ZONE_LABEL))
                    .cloned(),
                ips,
                pod_cidrs: node_pod_cidrs(spec),
            },
            deleting: node.metadata.deletion_timestamp.is_some(),
            taint_keys: spec
                .and_then(|s| s.taints.as_ref())
                .into_iter()
                .flatten()
                .map(|t| t.key.clone())
                .collect(),
            pod_cidrs: spec
                .and_then(|s| s.pod_cidrs.clone())
                .or_else(|| spec.and_then(|s| s.pod_cidr.clone()).map(|c| vec![c]))
                .unwrap_or_default(),
        }
    }

    fn sync(&self, handles: &ProxyHandles) {
        let taints: Vec<&str> = self.taint_keys.iter().map(String::as_str).collect();
        handles.on_node(&self.facts, self.deleting, &taints);
    }
}

/// The node label topology hints are matched against.
pub const ZONE_LABEL: &str = "topology.kubernetes.io/zone";

/// This proxy's Node: its zone and addresses go to the proxiers, its deletion state to the
/// health server; changes are logged.
#[derive(Debug)]
pub struct NodeSink {
    handles: ProxyHandles,
    pub current: Option<NodeInfo>,
}

impl NodeSink {
    pub fn new(handles: ProxyHandles) -> Self {
        NodeSink {
            handles,
            current: None,
        }
    }
}

impl Sink<DynamicObject> for NodeSink {
    type Item = NodeInfo;
    type Error = DecodeError;
    fn kind(&self) -> &'static str {
        "Node"
    }
    fn decode(&self, obj: DynamicObject) -> Result<Option<NodeInfo>, DecodeError> {
        check_name(&obj)?;
        let node: Node = obj.try_parse()?;
        Ok(Some(NodeInfo::from_node(&node)))
    }
    fn upsert(&mut self, obj: &NodeInfo) {
        match &self.current {
            None => info!(
                node = %obj.name,
                zone = ?obj.facts.zone,
                ips = ?obj.facts.ips,
                pod_cidrs = ?obj.pod_cidrs,
                "node seen"
            ),
            Some(old) => {
                if old.facts != obj.facts {
                    info!(node = %obj.name, old = ?old.facts, new = ?obj.facts, "node zone or addresses changed");
                }
                if old.pod_cidrs != obj.pod_cidrs {
                    info!(node = %obj.name, old = ?old.pod_cidrs, new = ?obj.pod_cidrs, "node pod CIDRs changed");
                }
                if (old.deleting, &old.taint_keys) != (obj.deleting, &obj.taint_keys) {
                    info!(node = %obj.name, deleting = obj.deleting, taints = ?obj.taint_keys, "node deletion state or taints changed");
                }
            }
        }
        obj.sync(&self.handles);
        self.current = Some(obj.clone());
    }
    fn delete(&mut self, obj: &NodeInfo) {
        warn!(node = %obj.name, "node deleted");
        // As upstream: the health server judges the deleted Node's last state.
        obj.sync(&self.handles);
        self.current = None;
    }
    fn synced(&mut self) {
        if self.current.is_none() {
            info!("node not registered (yet)");
        }
    }
}

// ---------------------------------------------------------------------------------------
// The loop.

/// List+watches every `K` into `sink` until `shutdown` (see [`Reflector::run`]); the
/// store is the sink's own (what it was handed).
async fn watch_kind<K, S>(
    client: kube::Client,
    cfg: watcher::Config,
    sink: S,
    shutdown: CancellationToken,
) where
    K: kube::Resource<DynamicType = ()>,
    S: Sink<DynamicObject>,
{
    let resource = ApiResource::erase::<K>(&());
    Reflector::new(Arc::new(Store::default()), sink)
        .run(client, move |c| Api::all_with(c, &resource), cfg, shutdown)
        .await;
}

/// Runs the Service, EndpointSlice, ServiceCIDR and Node watches until `shutdown`.
pub async fn run(
    client: kube::Client,
    handle: ProxyHandles,
    node_name: String,
    shutdown: CancellationToken,
) {
    let selector = label_selector();
    info!(label_selector = %selector, node = %node_name, "watching Services, EndpointSlices, ServiceCIDRs and this Node");
    let base = watcher::Config::default().timeout(WATCH_TIMEOUT_SECS);
    let services = watch_kind::<Service, _>(
        client.clone(),
        base.clone().labels(&selector),
        ServiceSink(handle.clone()),
        shutdown.clone(),
    );
    let slices = watch_kind::<EndpointSlice, _>(
        client.clone(),
        base.clone().labels(&selector),
        EndpointSliceSink(handle.clone()),
        shutdown.clone(),
    );
    let cidrs = watch_kind::<ServiceCIDR, _>(
        client.clone(),
        base.clone(),
        ServiceCidrSink::new(handle.clone()),
        shutdown.clone(),
    );
    let node = watch_kind::<Node, _>(
        client,
        base.fields(&node_field_selector(&node_name)),
        NodeSink::new(handle),
        shutdown.clone(),
    );
    tokio::join!(services, slices, cidrs, node);
}

#[cfg(test)]
mod tests;
