//! Pods bound to this node on the apiserver as a pod source: the store the watch fills
//! ([`crate::objects::pods`]) passes admission ([`super::admission`]), and the full admitted set
//! goes to the sync loop as `SourceUpdate { source: Api }` after the initial list and on every
//! change.

use super::admission::{Admission, rejected_status};
use crate::events::{EventRecorder, EventType, pod_ref};
use crate::objects::changed;
use crate::objects::{PodStore, on_node};
use crate::podspec::Source;
use crate::status::StatusManager;
use crate::status::Terminated;
use crate::sync_loop::SourceUpdate;
use k8s_openapi::api::core::v1::{Node, Pod};
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

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
    /// Admission reserves devices with it and asks the plugins to allocate them.
    pub devices: Option<Arc<crate::devices::DeviceManager>>,
    /// The pods' allocated resources: admission records them and decides resizes.
    pub allocations: Arc<crate::allocation::Allocations>,
}

impl Dispatcher {
    pub async fn run(mut self, cancel: CancellationToken) {
        let mut store_rx = self.store.subscribe();
        let mut admission = Admission::new(
            self.sysctls.clone(),
            Some(self.shutdown.clone()),
            Some(self.pressure.clone()),
        );
        admission.pod_level_resources = self.pod_level_resources;
        admission.devices = self.devices.clone();
        admission.allocations = Some(self.allocations.clone());
        admission.events = Some(self.events.clone());
        let mut last: Option<HashMap<String, Pod>> = None;
        let mut rejected_uids: HashSet<String> = HashSet::new();
        loop {
            if self.store.has_synced() {
                let pods: Vec<Pod> = self
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
                let mut rejections = admission.admit(
                    &pods,
                    static_count,
                    self.max_pods,
                    Some(&labels),
                    &self.node_name,
                );
                rejections.extend(admission.allocate_devices(&pods).await);
                for (p, r) in rejections {
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
                // The allocations reach the checkpoint before the workers act on them.
                if self.allocations.dirty() {
                    let a = self.allocations.clone();
                    match tokio::task::spawn_blocking(move || a.flush()).await {
                        Ok(Ok(())) => {}
                        Ok(Err(e)) => tracing::error!(error = %e, "SetPodAllocation failed"),
                        Err(e) => {
                            tracing::error!(error = %e, "writing the allocation checkpoint panicked")
                        }
                    }
                }
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
