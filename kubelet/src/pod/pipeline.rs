//! The one pod-source pipeline (upstream's `PodConfig` merging the sources, then
//! `HandlePodAdditions`): every source sends its complete set of pods here; the sets are
//! merged and one [`Admission`] decides on the new pods of the merged set, oldest first, so a
//! static pod and an apiserver pod compete for the same `maxPods` slot and allocatable. A
//! rejected pod gets upstream's Failed status and a Warning event once; the allocation
//! checkpoint is written before the workers act. Each source's admitted pods then go to the
//! sync loop as `SourceUpdate { source, pods }`, and the admitted static pods to the mirror
//! pods.

use super::admission::{Admission, Rejection, rejected_status};
use crate::events::{EventRecorder, EventType, pod_ref};
use crate::podspec::Source;
use crate::status::{StatusManager, Terminated};
use crate::sync_loop::SourceUpdate;
use k8s_openapi::api::core::v1::{Node, Pod};
use std::collections::{BTreeMap, HashMap};
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

fn uid(p: &Pod) -> &str {
    p.metadata.uid.as_deref().unwrap_or("")
}

/// Where the pipeline's decisions go.
pub struct Outputs {
    /// A rejected pod's Failed status.
    pub statuses: Arc<StatusManager>,
    /// A rejected pod's Warning event.
    pub events: Arc<dyn EventRecorder>,
    /// The admitted static pods (the mirror pods follow them).
    pub static_tx: watch::Sender<Vec<Pod>>,
    /// Each source's admitted pods, to the sync loop.
    pub pods_tx: mpsc::Sender<SourceUpdate>,
    /// Rejected apiserver pods that were deleted go here to have their object removed
    /// (cluster mode).
    pub terminated_tx: Option<mpsc::UnboundedSender<Terminated>>,
}

/// The sync loop is gone: the pipeline stops.
#[derive(Debug)]
struct Closed;

/// Sources' sets in, admitted sets out; see the module documentation.
pub struct Pipeline {
    admission: Admission,
    max_pods: u32,
    node_name: String,
    /// The sources that must each report before anything of an unseen pod is freed.
    expected: Vec<Source>,
    /// The Node object (cluster mode): its labels and allocatable; None: standalone.
    node_rx: Option<watch::Receiver<Option<Node>>>,
    out: Outputs,
    /// Each source's last complete set.
    sets: BTreeMap<SourceKey, Vec<Pod>>,
    /// What each source's admitted set last was, as sent to the sync loop.
    sent: HashMap<Source, HashMap<String, Pod>>,
    /// Rejected pods (by UID) and their source, until they go.
    rejected: HashMap<String, Source>,
}

/// Sources in a fixed order (static pods first), for a merged set that does not depend on
/// the order updates came in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum SourceKey {
    File,
    Api,
}

impl From<Source> for SourceKey {
    fn from(s: Source) -> Self {
        match s {
            Source::File => SourceKey::File,
            Source::Api => SourceKey::Api,
        }
    }
}

impl From<SourceKey> for Source {
    fn from(s: SourceKey) -> Self {
        match s {
            SourceKey::File => Source::File,
            SourceKey::Api => Source::Api,
        }
    }
}

impl Pipeline {
    /// `expected`: every source this node has (the file source; the apiserver in cluster
    /// mode).
    pub fn new(
        admission: Admission,
        (max_pods, node_name): (u32, String),
        expected: &[Source],
        node_rx: Option<watch::Receiver<Option<Node>>>,
        out: Outputs,
    ) -> Self {
        Self {
            admission,
            max_pods,
            node_name,
            expected: expected.to_vec(),
            node_rx,
            out,
            sets: BTreeMap::new(),
            sent: HashMap::new(),
            rejected: HashMap::new(),
        }
    }

    /// Admits every update from `rx` (waiting ones together) and on every change of the Node
    /// object, until cancelled or the sync loop goes.
    pub async fn run(mut self, mut rx: mpsc::Receiver<SourceUpdate>, cancel: CancellationToken) {
        let mut node_rx = self.node_rx.clone();
        loop {
            let mut updates = Vec::new();
            tokio::select! {
                _ = cancel.cancelled() => return,
                u = rx.recv() => match u {
                    Some(u) => updates.push(u),
                    None => return,
                },
                _ = node_changed(node_rx.as_mut()) => {}
            }
            while let Ok(u) = rx.try_recv() {
                updates.push(u);
            }
            if self.handle(updates).await.is_err() {
                return;
            }
        }
    }

    /// Takes the sources' new sets and runs one pass of admission on the merged set.
    async fn handle(&mut self, updates: Vec<SourceUpdate>) -> Result<(), Closed> {
        for u in updates {
            self.sets.insert(u.source.into(), u.pods);
        }
        if self.sets.is_empty() {
            return Ok(());
        }
        let merged: Vec<(Source, &Pod)> = (self.sets.iter())
            .flat_map(|(s, pods)| pods.iter().map(|p| (Source::from(*s), p)))
            .collect();
        let source_of: HashMap<String, Source> = merged
            .iter()
            .map(|(s, p)| (uid(p).to_string(), *s))
            .collect();
        let pods: Vec<Pod> = merged.into_iter().map(|(_, p)| p.clone()).collect();
        let rejections = self.admit(&pods).await;
        for (p, r) in rejections {
            let source = source_of.get(uid(&p)).copied().unwrap_or(Source::Api);
            self.reject(source, &p, &r);
        }
        self.forget_rejected(&pods);
        self.save_checkpoints().await;
        self.publish().await
    }

    /// One pass of admission over the merged set; the newly rejected pods.
    async fn admit(&mut self, pods: &[Pod]) -> Vec<(Pod, Rejection)> {
        let node = self.node_rx.as_ref().and_then(|rx| rx.borrow().clone());
        let labels = node.as_ref().and_then(|n| n.metadata.labels.clone());
        self.admission.allocatable = node
            .as_ref()
            .and_then(|n| n.status.as_ref()?.allocatable.clone());
        self.admission.sources_ready =
            (self.expected.iter()).all(|s| self.sets.contains_key(&(*s).into()));
        // Without a Node object (standalone, or not known yet) node affinity is not judged.
        let labels = node.is_some().then(|| labels.unwrap_or_default());
        let mut out = (self.admission).admit(pods, self.max_pods, labels.as_ref(), &self.node_name);
        out.extend(self.admission.allocate_devices(pods).await);
        out
    }

    /// Upstream's `rejectPod`: a Warning event and the Failed status with the reason.
    fn reject(&mut self, source: Source, p: &Pod, r: &Rejection) {
        tracing::warn!(pod = %crate::podspec::full_name(p), uid = ?p.metadata.uid, ?source, reason = %r.reason, message = %r.message, "pod rejected at admission");
        (self.out.events).record(&pod_ref(p), EventType::Warning, &r.reason, &r.message);
        self.out.statuses.set(p, rejected_status(r));
        self.rejected.insert(uid(p).to_string(), source);
    }

    /// Rejected pods that are gone or being deleted: their status goes (and a deleted
    /// apiserver pod's object is removed).
    fn forget_rejected(&mut self, pods: &[Pod]) {
        let by_uid: HashMap<&str, &Pod> = pods.iter().map(|p| (uid(p), p)).collect();
        let out = &self.out;
        self.rejected.retain(|id, source| {
            let pod = by_uid.get(id.as_str());
            if pod.is_some_and(|p| p.metadata.deletion_timestamp.is_none()) {
                return true;
            }
            out.statuses.remove(id);
            if *source == Source::Api {
                out.statuses.take_removed(id);
            }
            if let (Some(p), Some(tx)) = (pod, &out.terminated_tx) {
                let _ = tx.send(Terminated {
                    source: Some(*source),
                    pod: (*p).clone(),
                });
            }
            false
        });
    }

    /// The allocations and the devices reach their checkpoints before the workers act on
    /// them (off the async workers).
    async fn save_checkpoints(&mut self) {
        if let Some(a) = self.admission.allocations.clone().filter(|a| a.dirty()) {
            match tokio::task::spawn_blocking(move || a.flush()).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => tracing::error!(error = %e, "SetPodAllocation failed"),
                Err(e) => tracing::error!(error = %e, "writing the allocation checkpoint panicked"),
            }
        }
        if self.admission.take_devices_freed()
            && let Some(d) = &self.admission.devices
        {
            d.save().await;
        }
    }

    /// Each reported source's admitted pods to the sync loop when they changed; the admitted
    /// static pods to the mirror pods.
    async fn publish(&mut self) -> Result<(), Closed> {
        let mut updates = Vec::new();
        for (key, pods) in &self.sets {
            let source = Source::from(*key);
            let admitted: HashMap<String, Pod> = pods
                .iter()
                .filter(|p| self.admission.is_admitted(uid(p)))
                .map(|p| (uid(p).to_string(), intent(p)))
                .collect();
            if source == Source::File {
                let statics: Vec<Pod> = (pods.iter())
                    .filter(|p| self.admission.is_admitted(uid(p)))
                    .cloned()
                    .collect();
                self.out.static_tx.send_if_modified(|s| {
                    let changed = *s != statics;
                    *s = statics;
                    changed
                });
            }
            if self.sent.get(&source) != Some(&admitted) {
                let mut list: Vec<Pod> = admitted.values().cloned().collect();
                list.sort_by(|a, b| uid(a).cmp(uid(b)));
                updates.push(SourceUpdate { source, pods: list });
                self.sent.insert(source, admitted);
            }
        }
        for u in updates {
            self.out.pods_tx.send(u).await.map_err(|_| Closed)?;
        }
        Ok(())
    }
}

/// A change of the Node object; never when there is none to watch.
async fn node_changed(rx: Option<&mut watch::Receiver<Option<Node>>>) {
    match rx {
        Some(rx) => crate::objects::changed(rx).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests;
