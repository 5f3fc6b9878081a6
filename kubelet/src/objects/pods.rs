//! The apiserver's pods bound to this node: a watch with `fieldSelector=spec.nodeName=<node>`
//! feeding a local store ([`PodStore`]) that the pod source, mirror pods and the status writer
//! read.

use crate::objects::client::{ClientHandle, WATCH_TIMEOUT_SECS};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use std::collections::HashMap;
use std::sync::{Arc, RwLock};
use tokio::sync::watch;
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::podspec::test_pod as pod;

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
