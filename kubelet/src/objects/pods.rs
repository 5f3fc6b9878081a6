//! The apiserver's pods bound to this node: a watch with `fieldSelector=spec.nodeName=<node>`
//! feeding a local store ([`PodStore`], the one list+watch store) that the pod source, mirror
//! pods and the status writer read.

use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;
use kube::runtime::watcher;
use plumbing::store::{Reflector, Sink, Store, key_of};
use tokio_util::sync::CancellationToken;

use crate::objects::client::{ClientHandle, WATCH_TIMEOUT_SECS};

/// The apiserver's pods of this node, by `namespace/name` ([`pod_key`]).
pub type PodStore = Arc<Store<Pod>>;

pub fn pod_key(namespace: &str, name: &str) -> String {
    format!("{namespace}/{name}")
}

/// Whether a pod is bound to `node`.
pub fn on_node(p: &Pod, node: &str) -> bool {
    p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node)
}

/// What the store keeps of the pods the apiserver sends: never another node's pod, whatever
/// the apiserver's field selector did; no `managedFields`.
struct NodePods {
    node: String,
}

impl NodePods {
    fn keep(&self, mut p: Pod) -> Option<Pod> {
        if !on_node(&p, &self.node) {
            return None;
        }
        p.metadata.managed_fields = None;
        Some(p)
    }
}

impl Sink<Pod> for NodePods {
    type Item = Pod;
    type Error = std::convert::Infallible;
    fn kind(&self) -> &'static str {
        "pods"
    }
    fn decode(&self, p: Pod) -> Result<Option<Pod>, std::convert::Infallible> {
        Ok(self.keep(p))
    }
}

/// Records the apiserver's latest copy of a pod (after our own writes).
pub fn record_pod(store: &PodStore, node: &str, p: Pod) {
    let key = key_of(&p);
    let keep = NodePods { node: node.into() }.keep(p);
    store.put(key, keep);
}

/// Watches this node's pods into `store` until cancelled; restarts with a new client after
/// certificate rotation. Errors are logged and retried with the watcher's backoff.
pub async fn watch_pods(
    client: ClientHandle,
    node: String,
    store: PodStore,
    cancel: CancellationToken,
) {
    let config = watcher::Config::default()
        .fields(&format!("spec.nodeName={node}"))
        .timeout(WATCH_TIMEOUT_SECS);
    Reflector::new(store, NodePods { node })
        .run(client, Api::all, config, cancel)
        .await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::podspec::test_pod as pod;
    use kube::runtime::watcher::Event;

    #[test]
    fn store_drops_pods_of_other_nodes() {
        let s = PodStore::default();
        let mut r = Reflector::new(s.clone(), NodePods { node: "n1".into() });
        let mut other = pod("x", "9", serde_json::json!({}));
        other.spec.as_mut().unwrap().node_name = Some("n2".into());
        r.handle(Event::Init);
        r.handle(Event::InitApply(pod("a", "1", serde_json::json!({}))));
        r.handle(Event::InitApply(other.clone()));
        r.handle(Event::InitDone);
        assert_eq!(s.len(), 1);
        r.handle(Event::Apply(other.clone()));
        record_pod(&s, "n1", other);
        assert_eq!(s.len(), 1);
        assert!(s.get(&pod_key("default", "a")).is_some());
        // A pod of this node leaving it (as the store sees it) is dropped.
        let mut moved = pod("a", "1", serde_json::json!({}));
        moved.spec.as_mut().unwrap().node_name = Some("n2".into());
        record_pod(&s, "n1", moved);
        assert!(s.is_empty());
    }
}
