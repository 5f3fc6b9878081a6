//! The only writer of pod status to the apiserver (upstream's `status/status_manager.go`).
//!
//! On every change in the [`StatusManager`], each pod's status is merged with the conditions
//! other actors own (PodScheduled, readiness gates, DisruptionTarget, ...) and written as a JSON
//! merge patch to `/status` carrying complete lists, guarded by the pod's UID. Writes happen only
//! when the result differs from what the apiserver has; failures are retried with backoff, a 409
//! re-reads the pod first. A terminal phase on the apiserver is never replaced by a non-terminal
//! one. Static pods' statuses go to their mirror pods. Pods whose termination finished get their
//! final status and are then deleted with grace 0 and a UID precondition.

use crate::objects::{ClientHandle, client};
use crate::objects::{PodStore, pod_key, record_pod};
use crate::podspec::Source;
use crate::podspec::{ANN_CONFIG_HASH, ANN_CONFIG_MIRROR, ANN_CONFIG_SOURCE};
use crate::status::manager::StatusManager;
use k8s_openapi::api::core::v1::{Pod, PodCondition, PodStatus};
use kube::api::{Api, DeleteParams, Patch, PatchParams, Preconditions};
use serde_json::{Value, json};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// Pod condition types the kubelet owns (everything else belongs to someone else).
pub const KUBELET_CONDITIONS: [&str; 6] = [
    "PodReadyToStartContainers",
    "Initialized",
    "ContainersReady",
    "Ready",
    "PodResizePending",
    "PodResizeInProgress",
];

/// Status fields the kubelet owns; a missing one is cleared (`null`) in the patch.
const OWNED: [&str; 14] = [
    "phase",
    "conditions",
    "message",
    "reason",
    "hostIP",
    "hostIPs",
    "podIP",
    "podIPs",
    "startTime",
    "initContainerStatuses",
    "containerStatuses",
    "ephemeralContainerStatuses",
    "qosClass",
    "observedGeneration",
];

fn is_terminal(phase: Option<&str>) -> bool {
    matches!(phase, Some("Succeeded") | Some("Failed"))
}

/// Merges the kubelet's `local` status with the apiserver's `api` status. `None`: nothing may
/// be written (the apiserver already has a terminal phase and ours is not).
pub fn merge(api: Option<&PodStatus>, local: &PodStatus) -> Option<PodStatus> {
    let empty = PodStatus::default();
    let api = api.unwrap_or(&empty);
    if is_terminal(api.phase.as_deref()) && !is_terminal(local.phase.as_deref()) {
        return None;
    }
    let mut out = local.clone();
    let api_conds = api.conditions.clone().unwrap_or_default();
    let mut conds: Vec<PodCondition> = api_conds
        .iter()
        .filter(|c| !KUBELET_CONDITIONS.contains(&c.type_.as_str()))
        .cloned()
        .collect();
    for c in local.conditions.iter().flatten() {
        if !KUBELET_CONDITIONS.contains(&c.type_.as_str()) {
            continue;
        }
        let mut c = c.clone();
        // An unchanged condition keeps the apiserver's transition time (e.g. after a restart).
        if let Some(prev) = api_conds.iter().find(|p| p.type_ == c.type_)
            && prev.status == c.status
            && prev.last_transition_time.is_some()
        {
            c.last_transition_time = prev.last_transition_time.clone();
        }
        conds.push(c);
    }
    out.conditions = Some(conds).filter(|c| !c.is_empty());
    if api.start_time.is_some() {
        out.start_time = api.start_time.clone();
    }
    Some(out)
}

/// The JSON of the owned fields of `status` (missing ones as `null`).
pub fn owned_json(status: &PodStatus) -> Value {
    let full = serde_json::to_value(status).unwrap_or_default();
    let mut out = serde_json::Map::new();
    for k in OWNED {
        out.insert(k.to_string(), full.get(k).cloned().unwrap_or(Value::Null));
    }
    Value::Object(out)
}

/// Where a local pod's status goes on the apiserver.
#[derive(Debug, Clone, PartialEq)]
struct Target {
    namespace: String,
    name: String,
    uid: String,
}

fn is_static(p: &Pod) -> bool {
    p.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(ANN_CONFIG_SOURCE))
        .is_some_and(|s| s != "api")
}

/// The apiserver object a local pod's status belongs to: itself, or the mirror pod of a static pod.
fn api_object(local: &Pod, store: &PodStore) -> Option<Pod> {
    let ns = local.metadata.namespace.as_deref().unwrap_or("default");
    let name = local.metadata.name.as_deref()?;
    let api = store.get(&pod_key(ns, name))?;
    if is_static(local) {
        let hash = local
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(ANN_CONFIG_HASH));
        let mirror = api
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(ANN_CONFIG_MIRROR));
        (hash.is_some() && hash == mirror && api.metadata.deletion_timestamp.is_none())
            .then_some(api)
    } else {
        (api.metadata.uid == local.metadata.uid).then_some(api)
    }
}

/// The longest wait between two attempts to write a pod's status (upstream's status manager
/// retries on its 10 s batch sync).
const MAX_RETRY_BACKOFF: Duration = Duration::from_secs(8);

#[derive(Debug)]
struct Retry {
    at: Instant,
    backoff: plumbing::Backoff,
}

/// A pod whose containers and sandbox are all gone (sent after a termination finished).
#[derive(Debug, Clone)]
pub struct Terminated {
    pub source: Option<Source>,
    pub pod: Pod,
}

/// Writes pod statuses; see the module docs.
pub struct StatusWriter {
    pub client: ClientHandle,
    pub node_name: String,
    pub store: PodStore,
    pub statuses: Arc<StatusManager>,
    pub terminated_rx: mpsc::UnboundedReceiver<Terminated>,
}

/// Why a status write failed.
#[derive(Debug, thiserror::Error)]
enum WriteError {
    #[error("conflict")]
    Conflict,
    #[error("the pod is gone")]
    Gone,
    #[error("{0}")]
    Other(kube::Error),
}

impl StatusWriter {
    async fn patch(&self, target: &Target, status: &Value) -> Result<Pod, WriteError> {
        let api: Api<Pod> = Api::namespaced(self.client.current(), &target.namespace);
        let body = json!({"metadata": {"uid": target.uid}, "status": status});
        match client::timed(api.patch_status(
            &target.name,
            &PatchParams::default(),
            &Patch::Merge(&body),
        ))
        .await
        {
            Ok(p) => Ok(p),
            Err(e) => match client::status_code(&e) {
                Some(409) => Err(WriteError::Conflict),
                Some(404) => Err(WriteError::Gone),
                _ => Err(WriteError::Other(e)),
            },
        }
    }

    async fn fresh(&self, target: &Target) -> Option<Pod> {
        let api: Api<Pod> = Api::namespaced(self.client.current(), &target.namespace);
        let p = client::timed(api.get_opt(&target.name))
            .await
            .ok()
            .flatten()?;
        record_pod(&self.store, &self.node_name, p.clone());
        Some(p)
    }

    /// Writes one pod's status if it differs. `Ok(true)`: written or nothing to write.
    async fn sync_pod(
        &self,
        local: &Pod,
        written: &mut HashMap<String, Value>,
    ) -> Result<(), WriteError> {
        self.sync_pod_checked(local, written, &mut HashMap::new())
            .await
    }

    /// [`sync_pod`](Self::sync_pod), skipped when neither the local status nor the API
    /// object's resourceVersion moved since the pod was last found in sync (`checked`): a
    /// pass over every pod after one pod's change then costs a comparison per pod, not two
    /// JSON renderings.
    async fn sync_pod_checked(
        &self,
        local: &Pod,
        written: &mut HashMap<String, Value>,
        checked: &mut HashMap<String, (Option<String>, PodStatus)>,
    ) -> Result<(), WriteError> {
        let Some(local_status) = &local.status else {
            return Ok(());
        };
        let uid = local.metadata.uid.clone().unwrap_or_default();
        let Some(mut api) = api_object(local, &self.store) else {
            // Not on the apiserver (yet): the store's next change retries.
            return Ok(());
        };
        if checked
            .get(&uid)
            .is_some_and(|(rv, st)| *rv == api.metadata.resource_version && st == local_status)
        {
            return Ok(());
        }
        checked.remove(&uid);
        let in_sync = |api: &Pod| (api.metadata.resource_version.clone(), local_status.clone());
        for attempt in 0..3 {
            let Some(merged) = merge(api.status.as_ref(), local_status) else {
                tracing::debug!(pod = %crate::podspec::full_name(local), %uid, "apiserver has a terminal phase; not writing a non-terminal one");
                checked.insert(uid, in_sync(&api));
                return Ok(());
            };
            let want = owned_json(&merged);
            let have = api.status.as_ref().map(owned_json);
            // Nothing new: the apiserver has it, or we already wrote exactly this (and any
            // difference is the apiserver's normalization or another writer's business).
            if have.as_ref() == Some(&want) || written.get(&uid) == Some(&want) {
                written.insert(uid.clone(), want);
                checked.insert(uid, in_sync(&api));
                return Ok(());
            }
            let target = Target {
                namespace: api
                    .metadata
                    .namespace
                    .clone()
                    .unwrap_or_else(|| "default".into()),
                name: api.metadata.name.clone().unwrap_or_default(),
                uid: api.metadata.uid.clone().unwrap_or_default(),
            };
            match self.patch(&target, &want).await {
                Ok(p) => {
                    tracing::debug!(pod = %crate::podspec::full_name(local), %uid, phase = ?merged.phase, "pod status written");
                    checked.insert(uid.clone(), in_sync(&p));
                    record_pod(&self.store, &self.node_name, p);
                    written.insert(uid.clone(), want);
                    return Ok(());
                }
                Err(WriteError::Conflict) if attempt < 2 => match self.fresh(&target).await {
                    Some(p) => api = p,
                    None => return Ok(()),
                },
                Err(WriteError::Gone) => return Ok(()),
                Err(e @ (WriteError::Conflict | WriteError::Other(_))) => return Err(e),
            }
        }
        Ok(())
    }

    /// Final status, then delete the API object (grace 0, UID precondition).
    async fn finish(&self, t: Terminated, written: &mut HashMap<String, Value>) {
        let uid = t.pod.metadata.uid.clone().unwrap_or_default();
        let last = self.statuses.take_removed(&uid);
        written.remove(&uid);
        if t.source != Some(Source::Api) {
            return;
        }
        let ns = t
            .pod
            .metadata
            .namespace
            .clone()
            .unwrap_or_else(|| "default".into());
        let name = t.pod.metadata.name.clone().unwrap_or_default();
        if let Some(local) = last
            && let Err(e) = self.sync_pod(&local, &mut HashMap::new()).await
        {
            tracing::warn!(pod = %format!("{ns}/{name}"), %uid, error = %e, "writing the final status failed");
        }
        let api: Api<Pod> = Api::namespaced(self.client.current(), &ns);
        let dp = DeleteParams {
            grace_period_seconds: Some(0),
            preconditions: Some(Preconditions {
                uid: Some(uid.clone()),
                resource_version: None,
            }),
            ..Default::default()
        };
        // 0.5 s doubling: six tries within about half a minute.
        let mut backoff =
            plumbing::Backoff::new(Duration::from_millis(500), Duration::from_secs(16));
        for _ in 0..6 {
            match client::timed(api.delete(&name, &dp)).await {
                Ok(_) => {
                    tracing::info!(pod = %format!("{ns}/{name}"), %uid, "pod terminated; API object deleted");
                    return;
                }
                Err(e) if matches!(client::status_code(&e), Some(404) | Some(409)) => return,
                Err(e) => {
                    tracing::warn!(pod = %format!("{ns}/{name}"), %uid, error = %e, "deleting the pod failed; retrying");
                    tokio::time::sleep(backoff.fail()).await;
                }
            }
        }
    }

    pub async fn run(mut self, cancel: CancellationToken) {
        let mut status_rx = self.statuses.subscribe();
        let mut store_rx = self.store.subscribe();
        let mut written: HashMap<String, Value> = HashMap::new();
        let mut checked: HashMap<String, (Option<String>, PodStatus)> = HashMap::new();
        let mut retries: HashMap<String, Retry> = HashMap::new();
        loop {
            if self.store.has_synced() {
                let now = Instant::now();
                let pods = self.statuses.pods();
                for local in &pods {
                    let uid = local.metadata.uid.clone().unwrap_or_default();
                    if retries.get(&uid).is_some_and(|r| r.at > now) {
                        continue;
                    }
                    match self
                        .sync_pod_checked(local, &mut written, &mut checked)
                        .await
                    {
                        Ok(()) => {
                            retries.remove(&uid);
                        }
                        Err(e) => {
                            let mut backoff = retries.remove(&uid).map_or_else(
                                || {
                                    plumbing::Backoff::new(
                                        Duration::from_millis(500),
                                        MAX_RETRY_BACKOFF,
                                    )
                                },
                                |r| r.backoff,
                            );
                            let wait = backoff.fail();
                            tracing::warn!(pod = %crate::podspec::full_name(local), %uid, error = %e, retry_in = ?wait, "writing pod status failed");
                            retries.insert(
                                uid,
                                Retry {
                                    at: Instant::now() + wait,
                                    backoff,
                                },
                            );
                        }
                    }
                }
                let live: std::collections::HashSet<String> =
                    pods.iter().filter_map(|p| p.metadata.uid.clone()).collect();
                written.retain(|u, _| live.contains(u));
                checked.retain(|u, _| live.contains(u));
                retries.retain(|u, _| live.contains(u));
            }
            let next_retry = retries.values().map(|r| r.at).min();
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = crate::objects::changed(&mut status_rx) => {}
                // News from the pod watch: the apiserver answers again, retry everything now.
                _ = crate::objects::changed(&mut store_rx) => retries.clear(),
                Some(t) = self.terminated_rx.recv() => self.finish(t, &mut written).await,
                _ = async {
                    match next_retry {
                        Some(at) => tokio::time::sleep_until(at).await,
                        None => std::future::pending().await,
                    }
                } => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(v: Value) -> PodStatus {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn others_conditions_are_kept_and_transition_times_do_not_move() {
        let api = status(json!({
            "phase": "Running",
            "conditions": [
                {"type": "PodScheduled", "status": "True", "lastTransitionTime": "2026-01-01T00:00:00Z"},
                {"type": "example.com/gate", "status": "True"},
                {"type": "Ready", "status": "True", "lastTransitionTime": "2026-01-01T00:00:05Z"}
            ],
            "startTime": "2026-01-01T00:00:01Z"
        }));
        let local = status(json!({
            "phase": "Running",
            "conditions": [
                {"type": "Ready", "status": "True", "lastTransitionTime": "2026-01-01T01:00:00Z"},
                {"type": "ContainersReady", "status": "True", "lastTransitionTime": "2026-01-01T01:00:00Z"}
            ],
            "startTime": "2026-01-01T01:00:00Z",
            "containerStatuses": [{"name": "c", "image": "i", "imageID": "", "ready": true, "restartCount": 0}]
        }));
        let m = merge(Some(&api), &local).unwrap();
        let v = owned_json(&m);
        let types: Vec<_> = v["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["type"].as_str().unwrap())
            .collect();
        assert_eq!(
            types,
            [
                "PodScheduled",
                "example.com/gate",
                "Ready",
                "ContainersReady"
            ]
        );
        assert_eq!(
            v["conditions"][2]["lastTransitionTime"],
            "2026-01-01T00:00:05Z"
        );
        assert_eq!(v["startTime"], "2026-01-01T00:00:01Z");
        assert_eq!(v["containerStatuses"].as_array().unwrap().len(), 1);
        assert_eq!(
            v["reason"],
            Value::Null,
            "owned fields absent locally are cleared"
        );
    }

    #[test]
    fn terminal_phase_never_goes_back() {
        let api = status(json!({"phase": "Succeeded"}));
        assert!(merge(Some(&api), &status(json!({"phase": "Running"}))).is_none());
        assert!(merge(Some(&api), &status(json!({"phase": "Succeeded"}))).is_some());
        assert!(
            merge(
                Some(&status(json!({"phase": "Running"}))),
                &status(json!({"phase": "Failed"}))
            )
            .is_some()
        );
    }
}
