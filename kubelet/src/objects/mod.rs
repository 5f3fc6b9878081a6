//! ConfigMaps, Secrets and ServiceAccount tokens the kubelet reads for its pods (upstream's
//! `pkg/kubelet/{configmap,secret,token}` managers). One narrow trait reaches the apiserver
//! ([`ApiObjects`], implemented by [`apiserver`], faked in tests); [`ObjectCache`] follows
//! every object a pod on this node references with a watch of its own (upstream's
//! `changeDetectionStrategy: Watch`); [`token::TokenManager`] requests and rotates tokens.
//! Volumes (`volume::`) and container env (`spec::env`) read through these.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::authentication::v1::TokenRequest;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret};
use tokio::sync::watch;

pub mod apiserver;
pub mod client;
pub mod events;
pub mod informer;
pub mod pods;
pub mod runtime_class;
pub mod services;
pub mod token;
pub use pods::{PodStore, on_node, pod_key, record_pod, watch_pods};

#[cfg(any(test, feature = "test-util"))]
pub mod fake;
pub use apiserver::ClusterObjects;
pub use client::{ClientHandle, ClientPublisher, RateLimitLayer, timed};
pub use events::{EventSink, channel as event_channel};
pub use informer::{Changed, Store};
pub use runtime_class::RuntimeClassStore;
pub use services::ServiceStore;
pub use token::{TokenKey, TokenManager};

/// Waits for a change; a channel whose sender is gone never changes again (the caller's
/// cancellation token ends its loop), so this then waits forever instead of spinning.
pub(crate) async fn changed<T>(rx: &mut watch::Receiver<T>) {
    if rx.changed().await.is_err() {
        std::future::pending::<()>().await;
    }
}

/// Which kind of object.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    ConfigMap,
    Secret,
}

impl Kind {
    /// As upstream's messages write it: `configmap "x" not found`.
    pub fn lower(self) -> &'static str {
        match self {
            Kind::ConfigMap => "configmap",
            Kind::Secret => "secret",
        }
    }
}

/// One object: kind, namespace, name.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ObjectKey {
    pub kind: Kind,
    pub namespace: String,
    pub name: String,
}

/// What pods read from a ConfigMap or Secret.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ObjectData {
    /// A ConfigMap's `data` (env and volumes read it).
    pub text: BTreeMap<String, String>,
    /// A ConfigMap's `binaryData` (volumes only) or a Secret's `data`.
    pub binary: BTreeMap<String, Vec<u8>>,
    /// The object's `metadata.uid` (pulled-image records name pull secrets by it).
    pub uid: String,
}

impl ObjectData {
    pub fn from_config_map(cm: ConfigMap) -> Self {
        ObjectData {
            uid: cm.metadata.uid.unwrap_or_default(),
            text: cm.data.unwrap_or_default(),
            binary: cm
                .binary_data
                .unwrap_or_default()
                .into_iter()
                .map(|(k, v)| (k, v.0))
                .collect(),
        }
    }

    pub fn from_secret(s: Secret) -> Self {
        ObjectData {
            uid: s.metadata.uid.unwrap_or_default(),
            text: BTreeMap::new(),
            binary: s
                .data
                .unwrap_or_default()
                .into_iter()
                .map(|(k, v)| (k, v.0))
                .collect(),
        }
    }

    /// The value of `key` as files and env see it (ConfigMap `data` first).
    pub fn value(&self, key: &str) -> Option<Vec<u8>> {
        self.text
            .get(key)
            .map(|s| s.as_bytes().to_vec())
            .or_else(|| self.binary.get(key).cloned())
    }

    /// Every key with its value (volumes without `items`).
    pub fn entries(&self) -> BTreeMap<String, Vec<u8>> {
        let mut out: BTreeMap<String, Vec<u8>> = self
            .binary
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        for (k, v) in &self.text {
            out.insert(k.clone(), v.as_bytes().to_vec());
        }
        out
    }
}

/// Why an object or token could not be read.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum ObjectError {
    /// Upstream's wording: `configmap "x" not found`.
    #[error("{} \"{}\" not found", .0.kind.lower(), .0.name)]
    NotFound(ObjectKey),
    /// Static pods (and a kubelet without an apiserver) cannot reference API objects.
    #[error("cannot get {} \"{}\": the kubelet has no apiserver connection (standalone mode)", .0.kind.lower(), .0.name)]
    NoApiserver(ObjectKey),
    #[error("{0}")]
    Api(String),
}

/// The apiserver edge of this module.
#[async_trait::async_trait]
pub trait ApiObjects: Send + Sync + 'static {
    /// The object, or `Ok(None)` when the apiserver says it does not exist.
    async fn get(&self, key: &ObjectKey) -> Result<Option<ObjectData>, ObjectError>;
    /// Follows `key` (list + watch by name) and calls `on_change` with each new state
    /// (`None`: deleted or absent) until the future is dropped; returns only on an error.
    async fn follow(
        &self,
        key: &ObjectKey,
        on_change: &(dyn Fn(Option<ObjectData>) + Send + Sync),
    ) -> ObjectError;
    /// `POST serviceaccounts/<name>/token` in `namespace`.
    async fn request_token(
        &self,
        namespace: &str,
        service_account: &str,
        request: &TokenRequest,
    ) -> Result<TokenRequest, ObjectError>;
    /// `GET serviceaccounts/<name>` in `namespace` (credential provider plugins' token
    /// mode); None when it does not exist. Not every source can read them.
    async fn service_account(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Option<k8s_openapi::api::core::v1::ServiceAccount>, ObjectError> {
        let _ = (namespace, name);
        Err(ObjectError::Api(
            "service accounts cannot be read here".into(),
        ))
    }
}

/// Every ConfigMap and Secret `pod` references: volumes (also projected sources), env and
/// envFrom of every container.
pub fn referenced(pod: &Pod) -> BTreeSet<ObjectKey> {
    let ns = pod
        .metadata
        .namespace
        .clone()
        .unwrap_or_else(|| "default".into());
    let mut out = BTreeSet::new();
    let mut add = |kind, name: &str| {
        if !name.is_empty() {
            out.insert(ObjectKey {
                kind,
                namespace: ns.clone(),
                name: name.to_string(),
            });
        }
    };
    let Some(spec) = &pod.spec else {
        return BTreeSet::new();
    };
    for v in spec.volumes.iter().flatten() {
        if let Some(cm) = &v.config_map {
            add(Kind::ConfigMap, &cm.name);
        }
        if let Some(s) = &v.secret {
            add(Kind::Secret, s.secret_name.as_deref().unwrap_or_default());
        }
        for p in v.projected.iter().flat_map(|p| p.sources.iter().flatten()) {
            if let Some(cm) = &p.config_map {
                add(Kind::ConfigMap, &cm.name);
            }
            if let Some(s) = &p.secret {
                add(Kind::Secret, &s.name);
            }
        }
    }
    let containers = spec
        .init_containers
        .iter()
        .flatten()
        .chain(spec.containers.iter());
    for c in containers {
        for e in c.env.iter().flatten() {
            if let Some(from) = &e.value_from {
                if let Some(r) = &from.config_map_key_ref {
                    add(Kind::ConfigMap, &r.name);
                }
                if let Some(r) = &from.secret_key_ref {
                    add(Kind::Secret, &r.name);
                }
            }
        }
        for f in c.env_from.iter().flatten() {
            if let Some(r) = &f.config_map_ref {
                add(Kind::ConfigMap, &r.name);
            }
            if let Some(r) = &f.secret_ref {
                add(Kind::Secret, &r.name);
            }
        }
    }
    out
}

/// How long a read waits for a new watch to deliver its first state before asking directly.
const FOLLOW_WAIT: Duration = Duration::from_millis(500);
/// Upper bound of a direct read.
const GET_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Default)]
struct Entry {
    /// UIDs of the pods referencing the object.
    pods: BTreeSet<String>,
    /// The latest state from the watch: `Some(None)` when the object does not exist.
    state: Option<Option<Arc<ObjectData>>>,
    task: Option<tokio::task::AbortHandle>,
}

impl Drop for Entry {
    fn drop(&mut self) {
        if let Some(t) = self.task.take() {
            t.abort();
        }
    }
}

/// The objects pods on this node reference, each followed by its own watch while a pod
/// references it; reads are served from the watch once it delivered a state.
pub struct ObjectCache {
    api: Option<Arc<dyn ApiObjects>>,
    entries: Arc<Mutex<HashMap<ObjectKey, Entry>>>,
    /// By pod UID: what it references.
    pods: Mutex<HashMap<String, BTreeSet<ObjectKey>>>,
    /// Bumped on every change a watch delivers (the volume manager re-renders).
    changed: watch::Sender<u64>,
}

impl std::fmt::Debug for ObjectCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ObjectCache")
            .field("apiserver", &self.api.is_some())
            .finish()
    }
}

impl ObjectCache {
    /// `api` is None without an apiserver: every read fails with [`ObjectError::NoApiserver`].
    pub fn new(api: Option<Arc<dyn ApiObjects>>) -> Self {
        ObjectCache {
            api,
            entries: Default::default(),
            pods: Default::default(),
            changed: watch::channel(0).0,
        }
    }

    pub fn has_apiserver(&self) -> bool {
        self.api.is_some()
    }

    /// Resolves on the next change a watch delivers.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.changed.subscribe()
    }

    /// Records what `pod` references now: new objects start being followed, objects no pod
    /// references any more stop. Must run inside a tokio runtime.
    pub fn register(&self, pod: &Pod) {
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let now = referenced(pod);
        let before = self
            .pods
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(uid.clone(), now.clone())
            .unwrap_or_default();
        if before == now {
            return;
        }
        let mut entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        for key in before.difference(&now) {
            self.release(&mut entries, key, &uid);
        }
        for key in now.difference(&before) {
            let e = entries.entry(key.clone()).or_default();
            e.pods.insert(uid.clone());
            if e.task.is_none()
                && let Some(api) = &self.api
            {
                e.task = Some(self.spawn_follow(api.clone(), key.clone()));
            }
        }
    }

    /// The pod is gone: its objects stop being followed unless another pod references them.
    pub fn unregister(&self, uid: &str) {
        let Some(keys) = self
            .pods
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(uid)
        else {
            return;
        };
        let mut entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        for key in &keys {
            self.release(&mut entries, key, uid);
        }
    }

    fn release(&self, entries: &mut HashMap<ObjectKey, Entry>, key: &ObjectKey, uid: &str) {
        if let Some(e) = entries.get_mut(key) {
            e.pods.remove(uid);
            if e.pods.is_empty() {
                entries.remove(key);
            }
        }
    }

    /// How many objects are followed now.
    pub fn followed(&self) -> usize {
        self.entries.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    fn spawn_follow(&self, api: Arc<dyn ApiObjects>, key: ObjectKey) -> tokio::task::AbortHandle {
        let entries = Arc::downgrade(&self.entries);
        let changed = self.changed.clone();
        tokio::spawn(async move {
            let mut backoff =
                plumbing::Backoff::new(Duration::from_millis(500), Duration::from_secs(30))
                    .reset_after(Duration::from_secs(60));
            loop {
                let on_change = |state: Option<ObjectData>| {
                    let Some(entries) = entries.upgrade() else {
                        return;
                    };
                    let mut map = entries.lock().unwrap_or_else(|p| p.into_inner());
                    if let Some(e) = map.get_mut(&key) {
                        let state = state.map(Arc::new);
                        if e.state.as_ref() != Some(&state) {
                            e.state = Some(state);
                            changed.send_modify(|g| *g += 1);
                        }
                    }
                };
                let err = api.follow(&key, &on_change).await;
                let wait = backoff.fail();
                tracing::debug!(kind = key.kind.lower(), namespace = %key.namespace, name = %key.name, error = %err, ?wait, "watch ended; following again");
                tokio::time::sleep(wait).await;
            }
        })
        .abort_handle()
    }

    fn cached(&self, key: &ObjectKey) -> Option<Option<Arc<ObjectData>>> {
        self.entries
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(key)
            .and_then(|e| e.state.clone())
    }

    /// The ConfigMaps and Secrets container `c` of `pod` reads in its env (`None`: not
    /// found); the first that cannot be read is the error.
    pub async fn container_objects(
        &self,
        pod: &Pod,
        c: &k8s_openapi::api::core::v1::Container,
    ) -> Result<BTreeMap<ObjectKey, Option<Arc<ObjectData>>>, ObjectError> {
        let only = Pod {
            metadata: pod.metadata.clone(),
            spec: Some(k8s_openapi::api::core::v1::PodSpec {
                containers: vec![c.clone()],
                ..Default::default()
            }),
            ..Default::default()
        };
        let mut out = BTreeMap::new();
        for key in referenced(&only) {
            let object = self.get(&key).await?;
            out.insert(key, object);
        }
        Ok(out)
    }

    /// The object as pods see it: from its watch when that delivered a state, else read
    /// directly (the watch may still be starting). `Ok(None)`: it does not exist.
    pub async fn get(&self, key: &ObjectKey) -> Result<Option<Arc<ObjectData>>, ObjectError> {
        let Some(api) = &self.api else {
            return Err(ObjectError::NoApiserver(key.clone()));
        };
        if let Some(state) = self.cached(key) {
            return Ok(state);
        }
        // A watch that just started usually delivers within milliseconds.
        let followed = self
            .entries
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains_key(key);
        if followed {
            let mut rx = self.subscribe();
            let deadline = tokio::time::Instant::now() + FOLLOW_WAIT;
            while tokio::time::Instant::now() < deadline {
                if let Some(state) = self.cached(key) {
                    return Ok(state);
                }
                if tokio::time::timeout_at(deadline, rx.changed())
                    .await
                    .is_err()
                {
                    break;
                }
            }
        }
        tokio::time::timeout(GET_TIMEOUT, api.get(key))
            .await
            .unwrap_or_else(|_| {
                Err(ObjectError::Api(format!(
                    "reading {} {}/{}: timed out",
                    key.kind.lower(),
                    key.namespace,
                    key.name
                )))
            })
            .map(|o| o.map(Arc::new))
    }

    /// Like [`ObjectCache::get`], with a missing object as [`ObjectError::NotFound`].
    pub async fn require(&self, key: &ObjectKey) -> Result<Arc<ObjectData>, ObjectError> {
        self.get(key)
            .await?
            .ok_or_else(|| ObjectError::NotFound(key.clone()))
    }
}

#[cfg(test)]
mod tests;
