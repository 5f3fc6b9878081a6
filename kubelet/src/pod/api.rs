//! Pods bound to this node on the apiserver: a watch with `fieldSelector=spec.nodeName=<node>`
//! feeding a local store, admission (`maxPods`, node selector / required node affinity) like
//! upstream's `lifecycle/predicate.go`, and the full admitted set sent to the sync loop as
//! `SourceUpdate { source: Api }` after the initial list and on every change.

use crate::events::{EventRecorder, EventType, pod_ref};
use crate::objects::changed;
use crate::objects::client::{ClientHandle, WATCH_TIMEOUT_SECS};
use crate::status::manager::StatusManager;
use crate::sync_loop::{Source, SourceUpdate, Terminated};
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, NodeSelectorRequirement, NodeSelectorTerm, Pod, PodStatus};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::api::Api;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, RwLock};
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

/// The apiserver's pods of this node, by `namespace/name`.
#[derive(Debug, Clone)]
pub struct PodStore {
    pods: Arc<RwLock<HashMap<String, Pod>>>,
    version: Arc<watch::Sender<u64>>,
    synced: Arc<std::sync::atomic::AtomicBool>,
}

impl Default for PodStore {
    fn default() -> Self {
        Self {
            pods: Arc::default(),
            version: Arc::new(watch::channel(0).0),
            synced: Arc::default(),
        }
    }
}

pub fn key(namespace: &str, name: &str) -> String {
    format!("{namespace}/{name}")
}

fn pod_key(p: &Pod) -> String {
    key(
        p.metadata.namespace.as_deref().unwrap_or("default"),
        p.metadata.name.as_deref().unwrap_or(""),
    )
}

impl PodStore {
    pub fn get(&self, namespace: &str, name: &str) -> Option<Pod> {
        self.pods
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(&key(namespace, name))
            .cloned()
    }
    pub fn list(&self) -> Vec<Pod> {
        self.pods
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .cloned()
            .collect()
    }
    /// Whether the initial list has arrived.
    pub fn synced(&self) -> bool {
        self.synced.load(std::sync::atomic::Ordering::Acquire)
    }
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.version.subscribe()
    }
    fn bump(&self) {
        self.version.send_modify(|v| *v += 1);
    }
    /// Records the apiserver's latest copy of a pod (also after our own writes).
    pub fn apply(&self, node: &str, mut p: Pod) {
        p.metadata.managed_fields = None;
        let k = pod_key(&p);
        let mut pods = self.pods.write().unwrap_or_else(|e| e.into_inner());
        // Never keep another node's pod, whatever the apiserver's field selector did.
        if on_node(&p, node) {
            pods.insert(k, p);
        } else {
            pods.remove(&k);
        }
        drop(pods);
        self.bump();
    }
    pub fn delete(&self, p: &Pod) {
        self.pods
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&pod_key(p));
        self.bump();
    }
    fn replace(&self, node: &str, list: Vec<Pod>) {
        let map = list
            .into_iter()
            .filter(|p| on_node(p, node))
            .map(|mut p| {
                p.metadata.managed_fields = None;
                (pod_key(&p), p)
            })
            .collect();
        *self.pods.write().unwrap_or_else(|e| e.into_inner()) = map;
        self.synced
            .store(true, std::sync::atomic::Ordering::Release);
        self.bump();
    }
}

/// Whether a pod is bound to `node`.
pub fn on_node(p: &Pod, node: &str) -> bool {
    p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node)
}

/// Watches this node's pods into `store` until cancelled; restarts with a new client after
/// certificate rotation. Errors are logged and retried with the watcher's backoff.
pub async fn watch_pods(
    mut client: ClientHandle,
    node: String,
    store: PodStore,
    cancel: CancellationToken,
) {
    loop {
        client.mark_seen();
        let api: Api<Pod> = Api::all(client.current());
        let cfg = watcher::Config::default()
            .fields(&format!("spec.nodeName={node}"))
            .timeout(WATCH_TIMEOUT_SECS);
        let mut stream = watcher::watcher(api, cfg).default_backoff().boxed();
        let mut init: Vec<Pod> = Vec::new();
        loop {
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = client.changed() => {
                    tracing::info!("apiserver client changed; restarting the pod watch");
                    break;
                }
                ev = stream.next() => match ev {
                    Some(Ok(Event::Init)) => init.clear(),
                    Some(Ok(Event::InitApply(p))) => init.push(p),
                    Some(Ok(Event::InitDone)) => store.replace(&node, std::mem::take(&mut init)),
                    Some(Ok(Event::Apply(p))) => store.apply(&node, p),
                    Some(Ok(Event::Delete(p))) => store.delete(&p),
                    Some(Err(e)) => tracing::warn!(error = %e, "pod watch failed; retrying"),
                    None => break,
                }
            }
        }
    }
}

/// Why a pod was not admitted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejection {
    pub reason: String,
    pub message: String,
}

fn requirement_matches(r: &NodeSelectorRequirement, value: Option<&str>) -> bool {
    let values = r.values.clone().unwrap_or_default();
    match r.operator.as_str() {
        "In" => value.is_some_and(|v| values.iter().any(|x| x == v)),
        "NotIn" => !value.is_some_and(|v| values.iter().any(|x| x == v)),
        "Exists" => value.is_some(),
        "DoesNotExist" => value.is_none(),
        "Gt" | "Lt" => {
            let (Some(v), Some(bound)) = (
                value.and_then(|v| v.parse::<i64>().ok()),
                values.first().and_then(|b| b.parse::<i64>().ok()),
            ) else {
                return false;
            };
            if r.operator == "Gt" {
                v > bound
            } else {
                v < bound
            }
        }
        _ => false,
    }
}

fn term_matches(t: &NodeSelectorTerm, labels: &BTreeMap<String, String>, node_name: &str) -> bool {
    let exprs = t.match_expressions.as_deref().unwrap_or_default();
    let fields = t.match_fields.as_deref().unwrap_or_default();
    if exprs.is_empty() && fields.is_empty() {
        return false;
    }
    exprs
        .iter()
        .all(|r| requirement_matches(r, labels.get(&r.key).map(String::as_str)))
        && fields
            .iter()
            .all(|r| r.key == "metadata.name" && requirement_matches(r, Some(node_name)))
}

/// Whether the pod's `nodeSelector` and required node affinity accept this node.
pub fn node_affinity_matches(
    pod: &Pod,
    labels: &BTreeMap<String, String>,
    node_name: &str,
) -> bool {
    let Some(spec) = &pod.spec else { return true };
    if let Some(sel) = &spec.node_selector
        && !sel.iter().all(|(k, v)| labels.get(k) == Some(v))
    {
        return false;
    }
    let required = spec
        .affinity
        .as_ref()
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|n| {
            n.required_during_scheduling_ignored_during_execution
                .as_ref()
        });
    match required {
        Some(r) => r
            .node_selector_terms
            .iter()
            .any(|t| term_matches(t, labels, node_name)),
        None => true,
    }
}

fn is_terminal(p: &Pod) -> bool {
    matches!(
        p.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded") | Some("Failed")
    )
}

/// Admission decisions, sticky per UID: once admitted or rejected, a pod stays so.
#[derive(Debug)]
pub struct Admission {
    admitted: HashSet<String>,
    rejected: HashMap<String, Rejection>,
    /// The sysctls pods may set (safe ones plus `allowedUnsafeSysctls`).
    pub sysctls: crate::pod::admission::sysctl::Allowlist,
    /// While the node shuts down every new pod is rejected.
    pub shutdown: Option<Arc<crate::shutdown::ShutdownState>>,
    /// Under node pressure pods are rejected as upstream's eviction admission does.
    pub pressure: Option<Arc<crate::eviction::PressureState>>,
    /// The node's allocatable (from its Node object); None until known: no resource fit.
    pub allocatable: Option<BTreeMap<String, Quantity>>,
    /// Static pods, whose requests count as used.
    pub static_pods: Vec<Pod>,
    /// The `PodLevelResources` gate: pod-level requests count (and set the QoS class).
    pub pod_level_resources: bool,
}

impl Default for Admission {
    fn default() -> Self {
        Admission {
            admitted: HashSet::new(),
            rejected: HashMap::new(),
            sysctls: Default::default(),
            shutdown: None,
            pressure: None,
            allocatable: None,
            static_pods: Vec::new(),
            // Upstream's default in v1.36.
            pod_level_resources: true,
        }
    }
}

impl Admission {
    /// Decides for every pod not decided yet, oldest first. `static_pods` count against maxPods.
    /// Returns the newly rejected pods.
    pub fn admit(
        &mut self,
        pods: &[Pod],
        static_pods: usize,
        max_pods: u32,
        labels: &BTreeMap<String, String>,
        node_name: &str,
    ) -> Vec<(Pod, Rejection)> {
        let live: HashSet<&str> = pods
            .iter()
            .filter_map(|p| p.metadata.uid.as_deref())
            .collect();
        self.admitted.retain(|u| live.contains(u.as_str()));
        self.rejected.retain(|u, _| live.contains(u.as_str()));
        let running: Vec<&Pod> = pods
            .iter()
            .filter(|p| {
                self.admitted
                    .contains(p.metadata.uid.as_deref().unwrap_or(""))
                    && !is_terminal(p)
            })
            .collect();
        let mut active = static_pods + running.len();
        let mut used = BTreeMap::new();
        for p in running.iter().copied().chain(self.static_pods.iter()) {
            super::admission::fit::add_requests(&mut used, p, self.pod_level_resources);
        }
        let mut fresh: Vec<&Pod> = pods
            .iter()
            .filter(|p| {
                let uid = p.metadata.uid.as_deref().unwrap_or("");
                !uid.is_empty() && !self.admitted.contains(uid) && !self.rejected.contains_key(uid)
            })
            .collect();
        fresh.sort_by(|a, b| {
            (
                &a.metadata.creation_timestamp.as_ref().map(|t| t.0),
                &a.metadata.name,
            )
                .cmp(&(
                    &b.metadata.creation_timestamp.as_ref().map(|t| t.0),
                    &b.metadata.name,
                ))
        });
        let mut out = Vec::new();
        for p in fresh {
            let uid = p.metadata.uid.clone().unwrap_or_default();
            // Terminal pods and pods being deleted need no room.
            if is_terminal(p) || p.metadata.deletion_timestamp.is_some() {
                self.admitted.insert(uid);
                continue;
            }
            let rejection = if self.shutdown.as_ref().is_some_and(|s| s.shutting_down()) {
                Some(Rejection {
                    reason: crate::shutdown::NOT_ADMITTED_REASON.into(),
                    message: crate::shutdown::NOT_ADMITTED_MESSAGE.into(),
                })
            } else if let Some((reason, message)) = self
                .pressure
                .as_ref()
                .and_then(|s| crate::eviction::admit(s, p, self.pod_level_resources))
            {
                Some(Rejection { reason, message })
            } else if active >= max_pods as usize {
                Some(Rejection {
                    reason: "OutOfpods".into(),
                    message: format!(
                        "Node didn't have enough resource: pods, requested: 1, used: {active}, capacity: {max_pods}"
                    ),
                })
            } else if let Some((reason, message)) = self
                .allocatable
                .as_ref()
                .and_then(|a| super::admission::fit::check(p, &used, a, self.pod_level_resources))
            {
                Some(Rejection { reason, message })
            } else if !node_affinity_matches(p, labels, node_name) {
                Some(Rejection {
                    reason: "NodeAffinity".into(),
                    message: "Predicate NodeAffinity failed: node(s) didn't match Pod's node affinity/selector".into(),
                })
            } else if let Err((reason, message)) = self.sysctls.admit(p) {
                Some(Rejection { reason, message })
            } else {
                None
            };
            match rejection {
                Some(r) => {
                    self.rejected.insert(uid, r.clone());
                    out.push((p.clone(), r));
                }
                None => {
                    self.admitted.insert(uid);
                    active += 1;
                    super::admission::fit::add_requests(&mut used, p, self.pod_level_resources);
                }
            }
        }
        out
    }

    pub fn is_admitted(&self, uid: &str) -> bool {
        self.admitted.contains(uid)
    }
    pub fn is_rejected(&self, uid: &str) -> bool {
        self.rejected.contains_key(uid)
    }
}

/// The status upstream writes for a rejected pod.
pub fn rejected_status(r: &Rejection) -> PodStatus {
    PodStatus {
        phase: Some("Failed".into()),
        reason: Some(r.reason.clone()),
        message: Some(format!("Pod was rejected: {}", r.message)),
        ..Default::default()
    }
}

/// Strips what changes without changing intent (status, resourceVersion).
fn intent(p: &Pod) -> Pod {
    let mut p = p.clone();
    p.status = None;
    p.metadata.resource_version = None;
    p
}

/// Turns store changes into admitted pod sets for the sync loop.
pub struct Dispatcher {
    pub node_name: String,
    pub max_pods: u32,
    pub sysctls: crate::pod::admission::sysctl::Allowlist,
    pub store: PodStore,
    pub statuses: Arc<StatusManager>,
    pub events: Arc<dyn EventRecorder>,
    pub node_rx: watch::Receiver<Option<Node>>,
    pub static_rx: watch::Receiver<Vec<Pod>>,
    pub pods_tx: mpsc::Sender<SourceUpdate>,
    /// Rejected pods that were deleted on the apiserver go here to be removed.
    pub terminated_tx: mpsc::UnboundedSender<Terminated>,
    pub shutdown: Arc<crate::shutdown::ShutdownState>,
    pub pressure: Arc<crate::eviction::PressureState>,
    /// The `PodLevelResources` gate.
    pub pod_level_resources: bool,
}

impl Dispatcher {
    pub async fn run(mut self, cancel: CancellationToken) {
        let mut store_rx = self.store.subscribe();
        let mut admission = Admission {
            sysctls: self.sysctls.clone(),
            shutdown: Some(self.shutdown.clone()),
            pressure: Some(self.pressure.clone()),
            pod_level_resources: self.pod_level_resources,
            ..Default::default()
        };
        let mut last: Option<HashMap<String, Pod>> = None;
        let mut rejected_uids: HashSet<String> = HashSet::new();
        loop {
            if self.store.synced() {
                let pods: Vec<Pod> = self
                    .store
                    .list()
                    .into_iter()
                    .filter(|p| on_node(p, &self.node_name))
                    .filter(|p| {
                        !p.metadata
                            .annotations
                            .as_ref()
                            .is_some_and(|a| a.contains_key(crate::podspec::ANN_CONFIG_MIRROR))
                    })
                    .collect();
                let labels = self
                    .node_rx
                    .borrow()
                    .as_ref()
                    .and_then(|n| n.metadata.labels.clone())
                    .unwrap_or_default();
                let static_count = self.static_rx.borrow().len();
                admission.static_pods = self.static_rx.borrow().clone();
                admission.allocatable = self
                    .node_rx
                    .borrow()
                    .as_ref()
                    .and_then(|n| n.status.as_ref()?.allocatable.clone());
                for (p, r) in
                    admission.admit(&pods, static_count, self.max_pods, &labels, &self.node_name)
                {
                    tracing::warn!(pod = %crate::podspec::full_name(&p), uid = ?p.metadata.uid, reason = %r.reason, message = %r.message, "pod rejected at admission");
                    self.events
                        .record(&pod_ref(&p), EventType::Warning, &r.reason, &r.message);
                    self.statuses.set(&p, rejected_status(&r));
                    rejected_uids.insert(p.metadata.uid.clone().unwrap_or_default());
                }
                // Rejected pods that are gone or being deleted: forget them (and delete the object).
                rejected_uids.retain(|uid| {
                    let pod = pods
                        .iter()
                        .find(|p| p.metadata.uid.as_deref() == Some(uid.as_str()));
                    match pod {
                        None => {
                            self.statuses.remove(uid);
                            self.statuses.take_removed(uid);
                            false
                        }
                        Some(p) if p.metadata.deletion_timestamp.is_some() => {
                            self.statuses.remove(uid);
                            self.statuses.take_removed(uid);
                            let _ = self.terminated_tx.send(Terminated {
                                source: Some(Source::Api),
                                pod: p.clone(),
                            });
                            false
                        }
                        Some(_) => true,
                    }
                });
                let admitted: HashMap<String, Pod> = pods
                    .iter()
                    .filter(|p| admission.is_admitted(p.metadata.uid.as_deref().unwrap_or("")))
                    .map(|p| (p.metadata.uid.clone().unwrap_or_default(), intent(p)))
                    .collect();
                if last.as_ref() != Some(&admitted) {
                    let update = SourceUpdate {
                        source: Source::Api,
                        pods: admitted.values().cloned().collect(),
                    };
                    if self.pods_tx.send(update).await.is_err() {
                        return;
                    }
                    last = Some(admitted);
                }
            }
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = changed(&mut store_rx) => {}
                _ = changed(&mut self.node_rx) => {}
                _ = changed(&mut self.static_rx) => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(name: &str, uid: &str, extra_spec: serde_json::Value) -> Pod {
        let mut spec =
            serde_json::json!({"nodeName": "n1", "containers": [{"name": "c", "image": "i"}]});
        for (k, v) in extra_spec.as_object().unwrap() {
            spec[k] = v.clone();
        }
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "namespace": "default", "uid": uid,
                         "creationTimestamp": format!("2026-01-01T00:00:0{}Z", uid.len() % 10)},
            "spec": spec
        }))
        .unwrap()
    }

    #[test]
    fn forbidden_sysctls_are_rejected_at_admission() {
        let mut a = Admission {
            sysctls: crate::pod::admission::sysctl::Allowlist::new(&["net.core.somaxconn".into()])
                .unwrap(),
            ..Default::default()
        };
        let sysctls = |n: &str| serde_json::json!({"securityContext": {"sysctls": [{"name": n, "value": "1"}]}});
        let pods = vec![
            pod("safe", "1", sysctls("net.ipv4.tcp_syncookies")),
            pod("allowed", "22", sysctls("net.core.somaxconn")),
            pod("bad", "333", sysctls("kernel.msgmax")),
        ];
        let rejected = a.admit(&pods, 0, 110, &BTreeMap::new(), "n1");
        assert_eq!(rejected.len(), 1);
        assert_eq!(rejected[0].0.metadata.name.as_deref(), Some("bad"));
        assert_eq!(rejected[0].1.reason, "SysctlForbidden");
        assert_eq!(
            rejected[0].1.message,
            "forbidden sysctl: \"kernel.msgmax\" not allowlisted"
        );
        assert!(a.is_admitted("1") && a.is_admitted("22"));
    }

    #[test]
    fn max_pods_rejects_the_newest_with_upstreams_reason() {
        let mut a = Admission::default();
        let labels = BTreeMap::new();
        let pods = vec![
            pod("a", "1", serde_json::json!({})),
            pod("b", "22", serde_json::json!({})),
            pod("c", "333", serde_json::json!({})),
        ];
        let rej = a.admit(&pods, 1, 3, &labels, "n1");
        assert_eq!(rej.len(), 1);
        assert_eq!(rej[0].0.metadata.name.as_deref(), Some("c"));
        assert_eq!(rej[0].1.reason, "OutOfpods");
        assert_eq!(
            rej[0].1.message,
            "Node didn't have enough resource: pods, requested: 1, used: 3, capacity: 3"
        );
        assert_eq!(rejected_status(&rej[0].1).phase.as_deref(), Some("Failed"));
        // Sticky: a later pass does not re-decide, even when room appears.
        assert!(a.admit(&pods[..], 0, 3, &labels, "n1").is_empty());
        assert!(a.is_rejected("333") && a.is_admitted("1"));
    }

    /// The node's allocatable is shared by the admitted pods, static pods included, by their
    /// effective requests (pod-level when set): the newest pod that does not fit is rejected
    /// with upstream's reason and message.
    #[test]
    fn requests_must_fit_allocatable() {
        let q = |s: &str| Quantity(s.into());
        let mut a = Admission {
            allocatable: Some(
                [
                    ("cpu".to_string(), q("2")),
                    ("memory".to_string(), q("4Gi")),
                ]
                .into(),
            ),
            static_pods: vec![pod(
                "static",
                "s",
                serde_json::json!({"containers": [{"name": "c", "image": "i",
                    "resources": {"requests": {"cpu": "500m"}}}]}),
            )],
            ..Default::default()
        };
        let level = |cpu: &str| serde_json::json!({"resources": {"limits": {"cpu": cpu, "memory": "64Mi"}}});
        let pods = vec![pod("a", "1", level("1")), pod("b", "22", level("600m"))];
        let rej = a.admit(&pods, 1, 110, &BTreeMap::new(), "n1");
        assert_eq!(rej.len(), 1);
        assert_eq!(rej[0].0.metadata.name.as_deref(), Some("b"));
        assert_eq!(rej[0].1.reason, "OutOfcpu");
        assert_eq!(
            rej[0].1.message,
            "Node didn't have enough resource: cpu, requested: 600, used: 1500, capacity: 2000"
        );
        assert!(a.is_admitted("1"));
    }

    #[test]
    fn node_selector_and_affinity() {
        let labels = BTreeMap::from([
            ("zone".to_string(), "a".to_string()),
            ("gen".to_string(), "5".to_string()),
        ]);
        assert!(node_affinity_matches(
            &pod("p", "1", serde_json::json!({"nodeSelector": {"zone": "a"}})),
            &labels,
            "n1"
        ));
        assert!(!node_affinity_matches(
            &pod("p", "1", serde_json::json!({"nodeSelector": {"zone": "b"}})),
            &labels,
            "n1"
        ));
        let aff = |expr: serde_json::Value| {
            pod(
                "p",
                "1",
                serde_json::json!({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [expr]}}}}),
            )
        };
        assert!(node_affinity_matches(
            &aff(
                serde_json::json!({"matchExpressions": [{"key": "gen", "operator": "Gt", "values": ["4"]}]})
            ),
            &labels,
            "n1"
        ));
        assert!(!node_affinity_matches(
            &aff(
                serde_json::json!({"matchExpressions": [{"key": "zone", "operator": "NotIn", "values": ["a"]}]})
            ),
            &labels,
            "n1"
        ));
        assert!(node_affinity_matches(
            &aff(
                serde_json::json!({"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]})
            ),
            &labels,
            "n1"
        ));
        let mut a = Admission::default();
        let rej = a.admit(
            &[pod(
                "p",
                "1",
                serde_json::json!({"nodeSelector": {"zone": "b"}}),
            )],
            0,
            110,
            &labels,
            "n1",
        );
        assert_eq!(rej[0].1.reason, "NodeAffinity");
    }

    #[test]
    fn store_drops_pods_of_other_nodes() {
        let s = PodStore::default();
        let mut other = pod("x", "9", serde_json::json!({}));
        other.spec.as_mut().unwrap().node_name = Some("n2".into());
        s.replace(
            "n1",
            vec![pod("a", "1", serde_json::json!({})), other.clone()],
        );
        assert_eq!(s.list().len(), 1);
        s.apply("n1", other);
        assert_eq!(s.list().len(), 1);
        assert!(s.get("default", "a").is_some());
    }
}
