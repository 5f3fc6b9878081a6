//! Device health in the pod status (upstream's `ResourceHealthStatus`, beta and on by default
//! since v1.36): each container status lists, per device plugin resource it holds, the health
//! of each of its devices as the plugin last reported it in `ListAndWatch`
//! (`allocatedResourcesStatus`). A change of a held device's health, or a held device the
//! plugin lists again after it was missing, re-syncs the holding pod so its status follows.

use super::{AllocKey, DeviceManager, State};
use cri_proto::deviceplugin::{HEALTHY, v1beta1 as api};
use k8s_openapi::api::core::v1::{PodStatus, ResourceHealth, ResourceStatus};
use std::collections::{BTreeMap, BTreeSet};

/// The feature gate (upstream's name; beta, on by default in v1.36).
pub const RESOURCE_HEALTH_STATUS_GATE: &str = "ResourceHealthStatus";
/// Upstream's `ResourceHealthStatusHealthy` / `ResourceHealthStatusUnhealthy`. The device
/// plugin part never reports `Unknown`: a held device no longer listed counts as healthy,
/// as upstream.
pub const HEALTH_HEALTHY: &str = "Healthy";
pub const HEALTH_UNHEALTHY: &str = "Unhealthy";
/// How many re-sync requests may wait before more are dropped (upstream's channel size).
const UPDATES_BUFFER: usize = 100;

/// Pod UIDs whose devices changed health: their status is to be computed again.
pub type HealthUpdates = tokio::sync::mpsc::Receiver<Vec<String>>;

impl DeviceManager {
    /// Turns the gate's behaviour on: from now on container statuses get their
    /// `allocatedResourcesStatus` ([`Self::fill_allocated_resources_status`]) and the pods whose
    /// devices change health arrive on the returned receiver. Called once, at start.
    pub fn enable_health_status(&self) -> HealthUpdates {
        let (tx, rx) = tokio::sync::mpsc::channel(UPDATES_BUFFER);
        *self.health_tx.lock().unwrap_or_else(|e| e.into_inner()) = Some(tx);
        rx
    }

    fn health_enabled(&self) -> bool {
        self.health_tx
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_some()
    }

    /// Sets `allocatedResourcesStatus` of each of the pod's (regular) container statuses that
    /// holds devices, as upstream's `UpdateAllocatedResourcesStatus`: one entry per resource
    /// (replacing one of the same name), one `resources[]` item per device. Init and
    /// ephemeral container statuses are left alone, as upstream's device manager does.
    /// Does nothing while the gate is off.
    pub fn fill_allocated_resources_status(&self, uid: &str, status: &mut PodStatus) {
        if !self.health_enabled() {
            return;
        }
        let st = self.lock();
        for cs in status.container_statuses.iter_mut().flatten() {
            for (resource, ids) in held(&st, uid, &cs.name) {
                let resources = ids
                    .into_iter()
                    .map(|id| {
                        let health = match reported_health(&st, &resource, &id) {
                            Some(h) if h != HEALTHY => HEALTH_UNHEALTHY,
                            _ => HEALTH_HEALTHY,
                        };
                        ResourceHealth {
                            resource_id: id,
                            health: Some(health.into()),
                            message: None,
                        }
                    })
                    .collect();
                let entry = ResourceStatus {
                    name: resource,
                    resources: Some(resources),
                };
                let list = cs.allocated_resources_status.get_or_insert_with(Vec::new);
                match list.iter_mut().find(|e| e.name == entry.name) {
                    Some(old) => *old = entry,
                    None => list.push(entry),
                }
            }
        }
    }

    /// After a plugin listed `devices` for `resource`: the pods holding a device whose health
    /// differs from the plugin's previous list, or that was not in it, are sent for a re-sync
    /// (dropped with an error log when the buffer is full, as upstream) when the gate is on.
    /// Records the list's health as the one reported either way.
    pub(super) fn note_reported_health(&self, resource: &str, devices: &[api::Device]) {
        let pods: BTreeSet<String> = {
            let mut st = self.lock();
            let old = st
                .resources
                .get(resource)
                .map(|r| r.reported.clone())
                .unwrap_or_default();
            let changed: BTreeSet<&str> = devices
                .iter()
                .filter(|d| old.get(&d.id) != Some(&d.health))
                .map(|d| d.id.as_str())
                .collect();
            let pods = holders(&st, resource, &changed);
            if let Some(r) = st.resources.get_mut(resource) {
                r.reported = devices
                    .iter()
                    .map(|d| (d.id.clone(), d.health.clone()))
                    .collect();
            }
            pods
        };
        let tx = self
            .health_tx
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let Some(tx) = tx.filter(|_| !pods.is_empty()) else {
            return;
        };
        let pods: Vec<String> = pods.into_iter().collect();
        if tx.try_send(pods.clone()).is_err() {
            tracing::error!(pods = ?pods, "device update channel is full; discarding pods info");
        }
    }
}

/// The devices the container holds, by resource, IDs sorted.
fn held(st: &State, uid: &str, container: &str) -> BTreeMap<String, Vec<String>> {
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for ((u, c, r), a) in &st.allocs {
        if u == uid && c == container {
            let ids = out.entry(r.clone()).or_default();
            ids.extend(a.ids.values().flatten().cloned());
            ids.sort();
            ids.dedup();
        }
    }
    out
}

/// The health the resource's plugin last listed for the device (None: not listed).
fn reported_health<'a>(st: &'a State, resource: &str, id: &str) -> Option<&'a str> {
    st.resources
        .get(resource)
        .and_then(|r| r.reported.get(id))
        .map(String::as_str)
}

/// The pods holding any of `ids` of `resource`.
fn holders(st: &State, resource: &str, ids: &BTreeSet<&str>) -> BTreeSet<String> {
    st.allocs
        .iter()
        .filter(|((_, _, r), a)| {
            r == resource && a.ids.values().flatten().any(|id| ids.contains(id.as_str()))
        })
        .map(|((u, _, _), _): (&AllocKey, _)| u.clone())
        .collect()
}

#[cfg(test)]
mod tests;
