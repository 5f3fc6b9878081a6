//! Pods bound to this node on the apiserver as a pod source: the complete set in the store
//! the watch fills ([`crate::objects::pods`]), mirror pods left out, goes to the pod pipeline
//! ([`super::pipeline`]) as `SourceUpdate { source: Api }` after the initial list and on
//! every change.

use crate::objects::changed;
use crate::objects::{PodStore, on_node};
use crate::podspec::Source;
use crate::sync_loop::SourceUpdate;
use k8s_openapi::api::core::v1::Pod;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// Sends the store's pods of this node, whole, whenever they change.
pub struct ApiSource {
    pub node_name: String,
    pub store: PodStore,
    pub tx: mpsc::Sender<SourceUpdate>,
}

impl ApiSource {
    /// The pods of this node that are not mirror pods, by UID.
    fn pods(&self) -> Vec<Pod> {
        let mut pods: Vec<Pod> = self
            .store
            .values()
            .into_iter()
            .filter(|p| on_node(p, &self.node_name))
            .filter(|p| {
                !p.metadata
                    .annotations
                    .as_ref()
                    .is_some_and(|a| a.contains_key(crate::podspec::ANN_CONFIG_MIRROR))
            })
            .collect();
        pods.sort_by(|a, b| a.metadata.uid.cmp(&b.metadata.uid));
        pods
    }

    pub async fn run(self, cancel: CancellationToken) {
        let mut store_rx = self.store.subscribe();
        let mut last: Option<Vec<Pod>> = None;
        loop {
            if self.store.has_synced() {
                let pods = self.pods();
                if last.as_ref() != Some(&pods) {
                    let update = SourceUpdate {
                        source: Source::Api,
                        pods: pods.clone(),
                    };
                    if self.tx.send(update).await.is_err() {
                        return;
                    }
                    last = Some(pods);
                }
            }
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = changed(&mut store_rx) => {}
            }
        }
    }
}
