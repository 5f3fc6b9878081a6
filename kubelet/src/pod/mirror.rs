//! Mirror pods: each static pod is shown on the apiserver as a pod with annotation
//! `kubernetes.io/config.mirror: <config hash>`, owned by the Node (controller reference, as
//! upstream's mirror client sets it). A mirror that is deleted is recreated, one whose hash no
//! longer matches is replaced, and one whose static pod is gone is deleted.

use crate::objects::PodStore;
use crate::objects::changed;
use crate::objects::pod_key as key;
use crate::objects::{ClientHandle, client};
use crate::podspec::{ANN_CONFIG_HASH, ANN_CONFIG_MIRROR};
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::api::{Api, DeleteParams, PostParams, Preconditions};
use std::collections::HashMap;
use std::time::Duration;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// The mirror pod to create for a static pod on `node`.
pub fn mirror_of(static_pod: &Pod, node: &Node) -> Option<Pod> {
    let hash = static_pod
        .metadata
        .annotations
        .as_ref()?
        .get(ANN_CONFIG_HASH)?
        .clone();
    let mut annotations = static_pod.metadata.annotations.clone().unwrap_or_default();
    annotations.insert(ANN_CONFIG_MIRROR.into(), hash);
    let node_name = node.metadata.name.clone()?;
    let mut spec = static_pod.spec.clone()?;
    spec.node_name = Some(node_name.clone());
    Some(Pod {
        metadata: ObjectMeta {
            name: static_pod.metadata.name.clone(),
            namespace: static_pod
                .metadata
                .namespace
                .clone()
                .or(Some("default".into())),
            labels: static_pod.metadata.labels.clone(),
            annotations: Some(annotations),
            owner_references: Some(vec![OwnerReference {
                api_version: "v1".into(),
                kind: "Node".into(),
                name: node_name,
                uid: node.metadata.uid.clone()?,
                controller: Some(true),
                ..Default::default()
            }]),
            ..Default::default()
        },
        spec: Some(spec),
        status: None,
    })
}

fn mirror_hash(p: &Pod) -> Option<&String> {
    p.metadata.annotations.as_ref()?.get(ANN_CONFIG_MIRROR)
}

/// Keeps mirror pods in line with the static pods.
pub struct MirrorPods {
    pub client: ClientHandle,
    pub store: PodStore,
    pub static_rx: watch::Receiver<Vec<Pod>>,
    pub node_rx: watch::Receiver<Option<Node>>,
}

impl MirrorPods {
    async fn delete(&self, p: &Pod) {
        let ns = p.metadata.namespace.clone().unwrap_or_default();
        let name = p.metadata.name.clone().unwrap_or_default();
        let api: Api<Pod> = Api::namespaced(self.client.current(), &ns);
        let dp = DeleteParams {
            grace_period_seconds: Some(0),
            preconditions: Some(Preconditions {
                uid: p.metadata.uid.clone(),
                resource_version: None,
            }),
            ..Default::default()
        };
        match client::timed(api.delete(&name, &dp)).await {
            Ok(_) => tracing::info!(pod = %format!("{ns}/{name}"), "mirror pod deleted"),
            Err(e) if matches!(client::status_code(&e), Some(404) | Some(409)) => {}
            Err(e) => {
                tracing::warn!(pod = %format!("{ns}/{name}"), error = %e, "deleting the mirror pod failed")
            }
        }
    }

    async fn reconcile(&self) {
        let Some(node) = self.node_rx.borrow().clone() else {
            return;
        };
        if !self.store.has_synced() {
            return;
        }
        let statics: HashMap<String, Pod> = self
            .static_rx
            .borrow()
            .iter()
            .map(|p| {
                (
                    key(
                        p.metadata.namespace.as_deref().unwrap_or("default"),
                        p.metadata.name.as_deref().unwrap_or(""),
                    ),
                    p.clone(),
                )
            })
            .collect();
        let api_pods = self.store.values();
        // Mirrors whose static pod is gone.
        for p in api_pods.iter().filter(|p| mirror_hash(p).is_some()) {
            let k = key(
                p.metadata.namespace.as_deref().unwrap_or(""),
                p.metadata.name.as_deref().unwrap_or(""),
            );
            if !statics.contains_key(&k) && p.metadata.deletion_timestamp.is_none() {
                self.delete(p).await;
            }
        }
        for (k, sp) in &statics {
            let existing = api_pods.iter().find(|p| {
                key(
                    p.metadata.namespace.as_deref().unwrap_or(""),
                    p.metadata.name.as_deref().unwrap_or(""),
                ) == *k
            });
            let want_hash = sp
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(ANN_CONFIG_HASH));
            match existing {
                Some(p)
                    if mirror_hash(p).is_some()
                        && (mirror_hash(p) != want_hash
                            || p.metadata.deletion_timestamp.is_some()) =>
                {
                    // Outdated or being deleted: remove, recreate on the next pass.
                    if p.metadata.deletion_timestamp.is_none() {
                        self.delete(p).await;
                    }
                }
                Some(_) => {}
                None => {
                    let Some(mirror) = mirror_of(sp, &node) else {
                        continue;
                    };
                    let ns = mirror.metadata.namespace.clone().unwrap_or_default();
                    let api: Api<Pod> = Api::namespaced(self.client.current(), &ns);
                    match client::timed(api.create(&PostParams::default(), &mirror)).await {
                        Ok(p) => {
                            tracing::info!(pod = %k, "mirror pod created");
                            crate::objects::record_pod(
                                &self.store,
                                node.metadata.name.as_deref().unwrap_or(""),
                                p,
                            );
                        }
                        Err(e) if client::status_code(&e) == Some(409) => {}
                        Err(e) => {
                            tracing::warn!(pod = %k, error = %e, "creating the mirror pod failed")
                        }
                    }
                }
            }
        }
    }

    pub async fn run(mut self, cancel: CancellationToken) {
        let mut store_rx = self.store.subscribe();
        loop {
            self.reconcile().await;
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = changed(&mut store_rx) => {}
                _ = changed(&mut self.static_rx) => {}
                _ = changed(&mut self.node_rx) => {}
                _ = tokio::time::sleep(Duration::from_secs(10)) => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mirror_carries_hash_and_node_owner() {
        let sp: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "web-n1", "namespace": "default", "uid": "abc",
                         "annotations": {"kubernetes.io/config.hash": "abc", "kubernetes.io/config.source": "file"}},
            "spec": {"containers": [{"name": "c", "image": "i"}]}
        }))
        .unwrap();
        let node: Node = serde_json::from_value(
            serde_json::json!({"metadata": {"name": "n1", "uid": "node-uid"}}),
        )
        .unwrap();
        let m = mirror_of(&sp, &node).unwrap();
        assert_eq!(
            m.metadata.annotations.as_ref().unwrap()[ANN_CONFIG_MIRROR],
            "abc"
        );
        assert!(m.metadata.uid.is_none());
        let o = &m.metadata.owner_references.unwrap()[0];
        assert_eq!(
            (
                o.kind.as_str(),
                o.name.as_str(),
                o.uid.as_str(),
                o.controller
            ),
            ("Node", "n1", "node-uid", Some(true))
        );
        assert_eq!(m.spec.unwrap().node_name.as_deref(), Some("n1"));
    }
}
