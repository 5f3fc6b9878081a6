//! The apiserver source: list+watch Services and `discovery.k8s.io/v1` EndpointSlices in all
//! namespaces (with upstream kube-proxy's label selector) into the [`ProxyHandles`] of the
//! proxiers, and this proxy's Node (zone and addresses for the rules, deletion state for
//! `/healthz`).
//!
//! Each kind runs one `kube::runtime::watcher` whose events drive a [`Mirror`]: a plain-data
//! record of what was delivered to the handle. A (re-)list is buffered until it is complete and
//! then diffed against the mirror, so objects that vanished while the watch was down are
//! deleted, unchanged ones are not re-delivered, and the handle is marked synced once. Objects
//! are decoded one by one, so a malformed object is logged and skipped without failing the
//! list; watch errors are logged and retried with the watcher's backoff.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, ApiResource, DynamicObject};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use thiserror::Error;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

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
    let rest_metrics = crate::metrics::common::RestClientLayer::for_url(&config.cluster_url);
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
// What was delivered: the re-list diff, as plain data.

/// namespace/name ("" namespace for cluster-scoped objects).
pub type Key = (String, String);

/// One change to deliver to a sink.
#[derive(Clone, Debug, PartialEq)]
pub enum Change<K> {
    Upsert(K),
    Delete(K),
}

/// What one kind's watcher has delivered so far, and the list being received.
#[derive(Debug)]
pub struct Mirror<K> {
    delivered: BTreeMap<Key, K>,
    /// Some while a (re-)list is in progress.
    listing: Option<BTreeMap<Key, K>>,
    /// Listed objects that could not be decoded: their last delivered version is kept.
    kept: BTreeSet<Key>,
    synced: bool,
}

impl<K> Default for Mirror<K> {
    fn default() -> Self {
        Mirror {
            delivered: BTreeMap::new(),
            listing: None,
            kept: BTreeSet::new(),
            synced: false,
        }
    }
}

impl<K: Clone + PartialEq> Mirror<K> {
    /// A (re-)list starts.
    pub fn init(&mut self) {
        self.listing = Some(BTreeMap::new());
        self.kept.clear();
    }

    /// One listed object.
    pub fn init_apply(&mut self, key: Key, obj: K) {
        self.listing.get_or_insert_default().insert(key, obj);
    }

    /// A listed object that could not be decoded: keep whatever was delivered for it.
    pub fn init_keep(&mut self, key: Key) {
        self.kept.insert(key);
    }

    /// The list is complete: deletes for what vanished, upserts for what is new or changed.
    /// Returns the changes and whether this was the first complete list.
    pub fn init_done(&mut self) -> (Vec<Change<K>>, bool) {
        let listed = self.listing.take().unwrap_or_default();
        let kept = std::mem::take(&mut self.kept);
        let mut changes = Vec::new();
        let old = std::mem::take(&mut self.delivered);
        for (key, obj) in old {
            if listed.contains_key(&key) || kept.contains(&key) {
                self.delivered.insert(key, obj);
            } else {
                changes.push(Change::Delete(obj));
            }
        }
        for (key, obj) in listed {
            if self.delivered.get(&key) != Some(&obj) {
                changes.push(Change::Upsert(obj.clone()));
            }
            self.delivered.insert(key, obj);
        }
        let first = !self.synced;
        self.synced = true;
        (changes, first)
    }

    /// An object was added or modified (outside a list).
    pub fn apply(&mut self, key: Key, obj: K) -> Option<Change<K>> {
        if self.delivered.get(&key) == Some(&obj) {
            return None;
        }
        self.delivered.insert(key, obj.clone());
        Some(Change::Upsert(obj))
    }

    /// An object was deleted: the delete carries the version that was delivered.
    pub fn delete(&mut self, key: &Key) -> Option<Change<K>> {
        self.delivered.remove(key).map(Change::Delete)
    }

    pub fn len(&self) -> usize {
        self.delivered.len()
    }

    pub fn is_empty(&self) -> bool {
        self.delivered.is_empty()
    }

    pub fn get(&self, key: &Key) -> Option<&K> {
        self.delivered.get(key)
    }
}

// ---------------------------------------------------------------------------------------
// Sinks.

/// Where one kind's changes go.
pub trait Sink: Send + 'static {
    type Obj: Clone + PartialEq + Send + 'static;
    /// For logs: "Service", "EndpointSlice", "Node".
    const KIND: &'static str;
    /// Decodes one object; `Err` is logged and the object skipped.
    fn decode(&self, obj: DynamicObject) -> Result<Self::Obj, String>;
    fn upsert(&mut self, obj: &Self::Obj);
    fn delete(&mut self, obj: &Self::Obj);
    /// The first complete list was delivered.
    fn synced(&mut self);
}

fn key_of(obj: &DynamicObject) -> Key {
    (
        obj.metadata.namespace.clone().unwrap_or_default(),
        obj.metadata.name.clone().unwrap_or_default(),
    )
}

fn check_name(obj: &DynamicObject) -> Result<(), String> {
    if obj.metadata.name.as_deref().unwrap_or_default().is_empty() {
        return Err("object without metadata.name".into());
    }
    Ok(())
}

/// Services into the handles.
#[derive(Debug)]
pub struct ServiceSink(pub ProxyHandles);

impl Sink for ServiceSink {
    type Obj = Service;
    const KIND: &'static str = "Service";

    fn decode(&self, obj: DynamicObject) -> Result<Service, String> {
        check_name(&obj)?;
        let mut svc: Service = obj.try_parse().map_err(|e| e.to_string())?;
        svc.metadata.managed_fields = None;
        Ok(svc)
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

/// EndpointSlices into the handles.
#[derive(Debug)]
pub struct EndpointSliceSink(pub ProxyHandles);

impl Sink for EndpointSliceSink {
    type Obj = EndpointSlice;
    const KIND: &'static str = "EndpointSlice";

    fn decode(&self, obj: DynamicObject) -> Result<EndpointSlice, String> {
        check_name(&obj)?;
        let mut slice: EndpointSlice = obj.try_parse().map_err(|e| e.to_string())?;
        slice.metadata.managed_fields = None;
        Ok(slice)
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

impl Sink for NodeSink {
    type Obj = NodeInfo;
    const KIND: &'static str = "Node";

    fn decode(&self, obj: DynamicObject) -> Result<NodeInfo, String> {
        check_name(&obj)?;
        let node: Node = obj.try_parse().map_err(|e| e.to_string())?;
        Ok(NodeInfo::from_node(&node))
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

/// Feeds one watcher event into `mirror` and `sink`. Pure with respect to I/O (logs only),
/// so tests drive it with hand-made events.
pub fn handle_event<S: Sink>(mirror: &mut Mirror<S::Obj>, sink: &mut S, ev: Event<DynamicObject>) {
    let deliver = |sink: &mut S, change: Change<S::Obj>| match change {
        Change::Upsert(o) => sink.upsert(&o),
        Change::Delete(o) => sink.delete(&o),
    };
    match ev {
        Event::Init => {
            debug!(kind = S::KIND, "list started");
            mirror.init();
        }
        Event::InitApply(obj) => {
            let key = key_of(&obj);
            match sink.decode(obj) {
                Ok(o) => mirror.init_apply(key, o),
                Err(e) => {
                    warn!(kind = S::KIND, namespace = %key.0, name = %key.1, error = %e, "skipping malformed object");
                    mirror.init_keep(key);
                }
            }
        }
        Event::InitDone => {
            let (changes, first) = mirror.init_done();
            let deleted = changes
                .iter()
                .filter(|c| matches!(c, Change::Delete(_)))
                .count();
            info!(
                kind = S::KIND,
                objects = mirror.len(),
                changed = changes.len() - deleted,
                deleted,
                "listed"
            );
            for c in changes {
                deliver(sink, c);
            }
            if first {
                sink.synced();
            }
        }
        Event::Apply(obj) => {
            let key = key_of(&obj);
            match sink.decode(obj) {
                Ok(o) => {
                    if let Some(c) = mirror.apply(key, o) {
                        deliver(sink, c);
                    }
                }
                Err(e) => {
                    warn!(kind = S::KIND, namespace = %key.0, name = %key.1, error = %e, "skipping malformed object")
                }
            }
        }
        Event::Delete(obj) => {
            if let Some(c) = mirror.delete(&key_of(&obj)) {
                deliver(sink, c);
            }
        }
    }
}

/// List+watches one kind into `sink` until `shutdown`. Errors are logged; the watcher retries
/// them with its default backoff (and re-lists after 410 Gone). Should the stream ever end, a
/// new watcher starts after a pause and its first list is diffed against what was delivered.
pub async fn run_watch<S: Sink>(
    api: Api<DynamicObject>,
    cfg: watcher::Config,
    mut sink: S,
    shutdown: CancellationToken,
) {
    let mut mirror: Mirror<S::Obj> = Mirror::default();
    loop {
        let mut stream = watcher::watcher(api.clone(), cfg.clone())
            .default_backoff()
            .boxed();
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                ev = stream.next() => match ev {
                    Some(Ok(ev)) => handle_event(&mut mirror, &mut sink, ev),
                    Some(Err(e)) => warn!(kind = S::KIND, error = %e, "watch failed; retrying with backoff"),
                    None => break,
                }
            }
        }
        warn!(kind = S::KIND, "watch stream ended; restarting");
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
        }
    }
}

/// Runs the Service, EndpointSlice and Node watches until `shutdown`.
pub async fn run(
    client: kube::Client,
    handle: ProxyHandles,
    node_name: String,
    shutdown: CancellationToken,
) {
    let selector = label_selector();
    info!(label_selector = %selector, node = %node_name, "watching Services, EndpointSlices and this Node");
    let base = watcher::Config::default().timeout(WATCH_TIMEOUT_SECS);
    let services = run_watch(
        Api::all_with(client.clone(), &ApiResource::erase::<Service>(&())),
        base.clone().labels(&selector),
        ServiceSink(handle.clone()),
        shutdown.clone(),
    );
    let slices = run_watch(
        Api::all_with(client.clone(), &ApiResource::erase::<EndpointSlice>(&())),
        base.clone().labels(&selector),
        EndpointSliceSink(handle.clone()),
        shutdown.clone(),
    );
    let node = run_watch(
        Api::all_with(client, &ApiResource::erase::<Node>(&())),
        base.fields(&node_field_selector(&node_name)),
        NodeSink::new(handle),
        shutdown.clone(),
    );
    tokio::join!(services, slices, node);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{IpFamily, ServiceState};
    use crate::tracker::{ProxyHandle, ProxyHandles};
    use serde_json::json;

    #[test]
    fn selectors_match_upstream() {
        assert_eq!(
            label_selector(),
            "!service.kubernetes.io/headless,!service.kubernetes.io/service-proxy-name"
        );
        assert_eq!(node_field_selector("node-a"), "metadata.name=node-a");
    }

    #[test]
    fn rate_window_defaults() {
        assert_eq!(rate_window(5.0, 10), (10, Duration::from_secs(2)));
        assert_eq!(rate_window(0.0, 0), (1, Duration::from_millis(200)));
        assert_eq!(rate_window(50.0, 100), (100, Duration::from_secs(2)));
        assert_eq!(rate_window(1e-30, 10), (10, Duration::from_secs(3600)));
    }

    #[test]
    fn master_must_be_a_url() {
        assert!(parse_master("https://10.0.0.1:6443").is_ok());
        assert!(parse_master("http://h").is_ok());
        assert!(matches!(
            parse_master("10.0.0.1:6443"),
            Err(Error::Master { .. })
        ));
        assert!(matches!(parse_master(""), Err(Error::Master { .. })));
    }

    fn k(name: &str) -> Key {
        ("default".into(), name.into())
    }

    #[test]
    fn relist_deletes_vanished_and_skips_unchanged() {
        let mut m: Mirror<u32> = Mirror::default();
        m.init();
        m.init_apply(k("a"), 1);
        m.init_apply(k("b"), 1);
        let (c, first) = m.init_done();
        assert!(first);
        assert_eq!(c, vec![Change::Upsert(1), Change::Upsert(1)]);
        assert_eq!(m.apply(k("a"), 1), None, "unchanged apply is dropped");
        assert_eq!(m.apply(k("a"), 2), Some(Change::Upsert(2)));
        assert_eq!(m.apply(k("c"), 7), Some(Change::Upsert(7)));

        // Re-list: a unchanged, b changed, c vanished, d new.
        m.init();
        m.init_apply(k("a"), 2);
        m.init_apply(k("b"), 3);
        m.init_apply(k("d"), 4);
        let (c, first) = m.init_done();
        assert!(!first);
        assert_eq!(
            c,
            vec![Change::Delete(7), Change::Upsert(3), Change::Upsert(4)]
        );
        assert_eq!(m.len(), 3);

        // Deletes carry the delivered version; unknown deletes are dropped.
        assert_eq!(m.delete(&k("b")), Some(Change::Delete(3)));
        assert_eq!(m.delete(&k("b")), None);

        // A malformed object in a re-list keeps its delivered version.
        m.init();
        m.init_keep(k("a"));
        let (c, _) = m.init_done();
        assert_eq!(c, vec![Change::Delete(4)]);
        assert_eq!(m.get(&k("a")), Some(&2));
    }

    fn dyn_obj(v: serde_json::Value) -> DynamicObject {
        serde_json::from_value(v).unwrap()
    }

    fn svc(name: &str, ip: &str) -> DynamicObject {
        dyn_obj(json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"namespace": "default", "name": name, "resourceVersion": "1",
                         "managedFields": [{"manager": "x"}]},
            "spec": {"clusterIP": ip, "clusterIPs": [ip], "type": "ClusterIP",
                     "ports": [{"name": "p", "port": 80, "protocol": "TCP"}]}
        }))
    }

    fn slice(name: &str, svc: &str, ips: &[&str]) -> DynamicObject {
        dyn_obj(json!({
            "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"namespace": "default", "name": name,
                         "labels": {"kubernetes.io/service-name": svc}},
            "addressType": "IPv4",
            "endpoints": ips.iter().map(|ip| json!({"addresses": [ip], "conditions": {"ready": true}})).collect::<Vec<_>>(),
            "ports": [{"name": "p", "port": 8080, "protocol": "TCP"}]
        }))
    }

    #[test]
    fn events_drive_the_handle_and_relist_deletes() {
        let handle = ProxyHandle::new(ServiceState::new(IpFamily::V4, "n"));
        let mut svcs = ServiceSink(handle.clone().into());
        let mut sm = Mirror::default();
        let mut slices = EndpointSliceSink(handle.clone().into());
        let mut em = Mirror::default();

        handle_event(&mut sm, &mut svcs, Event::Init);
        handle_event(&mut sm, &mut svcs, Event::InitApply(svc("a", "10.96.0.1")));
        handle_event(&mut sm, &mut svcs, Event::InitApply(svc("b", "10.96.0.2")));
        // Malformed: a port that is not a number. Skipped, the rest of the list is kept.
        let bad = dyn_obj(json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"namespace": "default", "name": "bad"},
            "spec": {"ports": [{"port": "eighty"}]}
        }));
        handle_event(&mut sm, &mut svcs, Event::InitApply(bad.clone()));
        assert!(!handle.initialized());
        handle_event(&mut sm, &mut svcs, Event::InitDone);
        assert_eq!(sm.len(), 2);
        assert!(
            sm.get(&k("a")).unwrap().metadata.managed_fields.is_none(),
            "managedFields stripped"
        );
        handle_event(&mut em, &mut slices, Event::Init);
        handle_event(
            &mut em,
            &mut slices,
            Event::InitApply(slice("a-1", "a", &["10.244.0.2", "10.244.1.2"])),
        );
        handle_event(&mut em, &mut slices, Event::InitDone);
        assert!(handle.initialized());
        assert_eq!(handle.with_state(|s| s.service_port_map().len()), 2);
        assert_eq!(
            handle.with_state(|s| s.endpoints_map().values().map(Vec::len).sum::<usize>()),
            2
        );

        // Watch events: a malformed update is skipped (the old version stays).
        handle_event(&mut sm, &mut svcs, Event::Apply(bad));
        let mut bad_a = svc("a", "10.96.0.1");
        bad_a.data["spec"]["ports"] = json!("not a list");
        handle_event(&mut sm, &mut svcs, Event::Apply(bad_a));
        assert_eq!(handle.with_state(|s| s.service_port_map().len()), 2);
        handle_event(
            &mut em,
            &mut slices,
            Event::Apply(slice("a-1", "a", &["10.244.0.2"])),
        );
        assert_eq!(
            handle.with_state(|s| s.endpoints_map().values().map(Vec::len).sum::<usize>()),
            1
        );

        // Re-list after an outage: b and the slice vanished meanwhile.
        handle_event(&mut sm, &mut svcs, Event::Init);
        handle_event(&mut sm, &mut svcs, Event::InitApply(svc("a", "10.96.0.1")));
        handle_event(&mut sm, &mut svcs, Event::InitDone);
        handle_event(&mut em, &mut slices, Event::Init);
        handle_event(&mut em, &mut slices, Event::InitDone);
        assert_eq!(handle.with_state(|s| s.service_port_map().len()), 1);
        assert!(handle.with_state(|s| s.endpoints_map().is_empty()));

        // Delete events.
        handle_event(&mut sm, &mut svcs, Event::Delete(svc("a", "10.96.0.1")));
        assert!(handle.with_state(|s| s.service_port_map().is_empty()));
        assert!(sm.is_empty());
    }

    #[test]
    fn node_facts_reach_the_proxiers_and_health() {
        let node = |taints: serde_json::Value, deleting: bool| {
            let mut meta =
                json!({"name": "node-a", "labels": {"topology.kubernetes.io/zone": "z1"}});
            if deleting {
                meta["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
            }
            dyn_obj(json!({
                "apiVersion": "v1", "kind": "Node",
                "metadata": meta,
                "spec": {"podCIDR": "10.244.1.0/24", "taints": taints},
                "status": {"addresses": [
                    {"type": "Hostname", "address": "node-a"},
                    {"type": "ExternalIP", "address": "203.0.113.7"},
                    {"type": "InternalIP", "address": "fd00::2"},
                    {"type": "InternalIP", "address": "192.168.0.2"}
                ]}
            }))
        };
        let v4 = ProxyHandle::new(ServiceState::new(IpFamily::V4, "node-a"));
        let v6 = ProxyHandle::with_health(
            ServiceState::new(IpFamily::V6, "node-a"),
            v4.health().clone(),
        );
        let handles = ProxyHandles::new(vec![v4.clone(), v6.clone()]);
        let mut sink = NodeSink::new(handles);
        let mut m = Mirror::default();
        handle_event(&mut m, &mut sink, Event::Init);
        handle_event(&mut m, &mut sink, Event::InitApply(node(json!([]), false)));
        handle_event(&mut m, &mut sink, Event::InitDone);

        let cur = sink.current.clone().unwrap();
        assert_eq!(cur.pod_cidrs, vec!["10.244.1.0/24"]);
        let facts = v4.with_state(|s| s.node().clone());
        assert_eq!(facts.zone.as_deref(), Some("z1"));
        // InternalIPs before ExternalIPs; one per family for each proxier.
        assert_eq!(
            facts.ip_of(IpFamily::V4),
            Some("192.168.0.2".parse().unwrap())
        );
        let facts6 = v6.with_state(|s| s.node().clone());
        assert_eq!(facts6.ip_of(IpFamily::V6), Some("fd00::2".parse().unwrap()));
        assert!(v4.health().node_eligible());

        // The autoscaler's taint, then deletion, make the node ineligible for /healthz.
        let tainted = json!([{"key": "ToBeDeletedByClusterAutoscaler", "effect": "NoSchedule"}]);
        handle_event(&mut m, &mut sink, Event::Apply(node(tainted, false)));
        assert!(!v4.health().node_eligible());
        handle_event(&mut m, &mut sink, Event::Apply(node(json!([]), false)));
        assert!(v4.health().node_eligible());
        handle_event(&mut m, &mut sink, Event::Apply(node(json!([]), true)));
        assert!(!v4.health().node_eligible());

        handle_event(&mut m, &mut sink, Event::Init);
        handle_event(&mut m, &mut sink, Event::InitDone);
        assert!(sink.current.is_none(), "node gone after re-list");
    }

    #[tokio::test]
    async fn kubeconfig_errors_are_clear() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("missing.conf");
        let opts = ClientOptions {
            kubeconfig: Some(path.clone()),
            master: None,
            qps: 5.0,
            burst: 10,
        };
        let e = build_client(&opts)
            .await
            .err()
            .expect("missing kubeconfig must fail");
        assert!(matches!(e, Error::Kubeconfig { .. }), "{e}");
        assert!(e.to_string().contains("missing.conf"), "{e}");

        // --master alone: an unauthenticated client to that URL.
        let opts = ClientOptions {
            kubeconfig: None,
            master: Some("http://127.0.0.1:1".into()),
            qps: 5.0,
            burst: 10,
        };
        assert!(build_client(&opts).await.is_ok());

        // Neither: the in-cluster configuration, which outside a pod fails clearly.
        if std::env::var_os("KUBERNETES_SERVICE_HOST").is_none() {
            let opts = ClientOptions {
                kubeconfig: None,
                master: None,
                qps: 5.0,
                burst: 10,
            };
            let e = build_client(&opts).await.err().expect("not in a pod");
            assert!(matches!(e, Error::InCluster(_)), "{e}");
            assert!(e.to_string().contains("KUBERNETES_SERVICE_HOST"), "{e}");
        }
    }
}
