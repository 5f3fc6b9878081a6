//! Change tracking: the entry points the Service sources feed (`ProxyHandle` per IP family,
//! `ProxyHandles` for all families of a node, upstream's meta-proxier) and that wake the
//! sync loop (`sync_loop::run`).
//!
//! The data model the events are applied to, with its per-port view and the set of services
//! changed since the last sync, is [`ServiceState`] in [`crate::model`]; this module holds
//! what surrounds it: the lock, the wake-up, the "initial lists delivered" flags, the health
//! and metrics bookkeeping done where changes arrive. None of it depends on a backend.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{SystemTime, UNIX_EPOCH};

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use tokio::sync::Notify;

use crate::health::ProxierHealth;
use crate::metrics::Metrics;
use crate::model::{IpFamily, NodeFacts, ServiceState};

struct Shared {
    family: IpFamily,
    state: Mutex<ServiceState>,
    notify: Notify,
    services_synced: AtomicBool,
    slices_synced: AtomicBool,
    health: ProxierHealth,
    /// Set once the proxier exists: the change counters are counted where changes arrive.
    metrics: OnceLock<Metrics>,
}

/// Cheap, cloneable entry point for the watchers: feed objects in, the loop wakes up.
#[derive(Clone)]
pub struct ProxyHandle {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for ProxyHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProxyHandle").finish_non_exhaustive()
    }
}

impl ProxyHandle {
    pub fn new(state: ServiceState) -> Self {
        Self::with_health(state, ProxierHealth::default())
    }

    /// A handle reporting to `health`, which the proxiers of both families share.
    pub fn with_health(state: ServiceState, health: ProxierHealth) -> Self {
        ProxyHandle {
            shared: Arc::new(Shared {
                family: state.family(),
                state: Mutex::new(state),
                notify: Notify::new(),
                services_synced: AtomicBool::new(false),
                slices_synced: AtomicBool::new(false),
                health,
                metrics: OnceLock::new(),
            }),
        }
    }

    /// The IP family of this handle's proxier.
    pub fn family(&self) -> IpFamily {
        self.shared.family
    }

    /// The state, locked (the sync takes its changes and renders from it).
    pub(crate) fn state(&self) -> MutexGuard<'_, ServiceState> {
        self.shared.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Read access to the current desired state (e.g. for a health-check server).
    pub fn with_state<T>(&self, f: impl FnOnce(&ServiceState) -> T) -> T {
        f(&self.state())
    }

    #[cfg(test)]
    pub(crate) fn state_for_test(&self) -> MutexGuard<'_, ServiceState> {
        self.state()
    }

    /// The health state `/healthz` reports: queued on every change, updated on every
    /// successful sync.
    pub fn health(&self) -> &ProxierHealth {
        &self.shared.health
    }

    /// Reports to `metrics` from now on (set once, by the proxier: the change counters are
    /// counted where changes arrive).
    pub(crate) fn set_metrics(&self, metrics: Metrics) {
        let _ = self.shared.metrics.set(metrics);
    }

    fn changed(&self, changed: bool) -> bool {
        if changed {
            let family = self.shared.family;
            self.shared.health.queued_update(family);
            if let Some(m) = self.shared.metrics.get() {
                m.last_queued_timestamp
                    .with_label_values(&[family.label()])
                    .set(unix_now());
            }
            self.shared.notify.notify_one();
        }
        changed
    }

    /// Applies one Service event to the state and counts it (upstream counts every Service
    /// event, and only the EndpointSlice events that change something).
    fn service_event(&self, f: impl FnOnce(&mut ServiceState) -> bool) -> bool {
        let mut st = self.state();
        let c = f(&mut st);
        if let Some(m) = self.shared.metrics.get() {
            m.service_changes_total.inc();
            set_pending(m, &st);
        }
        drop(st);
        self.changed(c)
    }

    fn slice_event(&self, f: impl FnOnce(&mut ServiceState) -> bool) -> bool {
        let mut st = self.state();
        let c = f(&mut st);
        if let (true, Some(m)) = (c, self.shared.metrics.get()) {
            m.endpoint_changes_total.inc();
            set_pending(m, &st);
        }
        drop(st);
        self.changed(c)
    }

    /// Service added or modified. Returns true if the rules will change.
    pub fn on_service_upsert(&self, svc: &Service) -> bool {
        self.service_event(|st| st.upsert_service(svc))
    }

    pub fn on_service_delete(&self, svc: &Service) -> bool {
        let ns = svc.metadata.namespace.as_deref().unwrap_or_default();
        let name = svc.metadata.name.as_deref().unwrap_or_default();
        self.service_event(|st| st.delete_service(ns, name))
    }

    pub fn on_endpoint_slice_upsert(&self, slice: &EndpointSlice) -> bool {
        self.slice_event(|st| st.upsert_endpoint_slice(slice))
    }

    pub fn on_endpoint_slice_delete(&self, slice: &EndpointSlice) -> bool {
        self.slice_event(|st| st.delete_endpoint_slice(slice))
    }

    /// The initial Service list has been delivered.
    pub fn on_services_synced(&self) {
        self.shared.services_synced.store(true, Ordering::SeqCst);
        self.shared.notify.notify_one();
    }

    /// The initial EndpointSlice list has been delivered.
    pub fn on_endpoint_slices_synced(&self) {
        self.shared.slices_synced.store(true, Ordering::SeqCst);
        self.shared.notify.notify_one();
    }

    /// What this proxy's Node says (zone, addresses). Returns true if the rules will be
    /// re-rendered.
    pub fn on_node(&self, node: NodeFacts) -> bool {
        let c = self.state().set_node(node);
        self.changed(c)
    }

    /// The cluster's service CIDRs (ServiceCIDR objects). Returns true if the rules will be
    /// re-rendered.
    pub fn on_service_cidrs(&self, cidrs: &[crate::model::Cidr]) -> bool {
        let c = self.state().set_service_cidrs(cidrs);
        self.changed(c)
    }

    /// Rules are not written until both initial lists arrived (as upstream), so a restart
    /// never programs a half-known state.
    pub fn initialized(&self) -> bool {
        self.shared.services_synced.load(Ordering::SeqCst)
            && self.shared.slices_synced.load(Ordering::SeqCst)
    }

    /// Returns when a change (or an initial list) arrived; what the sync loop waits on.
    pub(crate) async fn notified(&self) {
        self.shared.notify.notified().await
    }
}

pub(crate) fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs_f64()
}

/// The pending-change gauges (one series for both families, as upstream's).
pub(crate) fn set_pending(m: &Metrics, st: &ServiceState) {
    let (services, endpoints) = st.pending();
    m.service_changes_pending.set(services as f64);
    m.endpoint_changes_pending.set(endpoints as f64);
}

/// The proxiers of a node, one per IP family, fed by one source (upstream's meta-proxier):
/// every event goes to each family's handle, which keeps what concerns its family.
#[derive(Clone, Debug)]
pub struct ProxyHandles(Vec<ProxyHandle>);

impl ProxyHandles {
    pub fn new(handles: Vec<ProxyHandle>) -> Self {
        ProxyHandles(handles)
    }

    /// Returns true if the rules of any family will change.
    pub fn on_service_upsert(&self, svc: &Service) -> bool {
        self.0
            .iter()
            .fold(false, |c, h| h.on_service_upsert(svc) | c)
    }

    pub fn on_service_delete(&self, svc: &Service) -> bool {
        self.0
            .iter()
            .fold(false, |c, h| h.on_service_delete(svc) | c)
    }

    pub fn on_endpoint_slice_upsert(&self, slice: &EndpointSlice) -> bool {
        self.0
            .iter()
            .fold(false, |c, h| h.on_endpoint_slice_upsert(slice) | c)
    }

    pub fn on_endpoint_slice_delete(&self, slice: &EndpointSlice) -> bool {
        self.0
            .iter()
            .fold(false, |c, h| h.on_endpoint_slice_delete(slice) | c)
    }

    /// This proxy's Node was added, changed or deleted: `facts` for the rules, and the
    /// health server's node eligibility (upstream's SyncNode: ineligible once the Node has
    /// a deletionTimestamp or the ToBeDeletedByClusterAutoscaler taint).
    pub fn on_node(&self, facts: &NodeFacts, deleting: bool, taint_keys: &[&str]) -> bool {
        // One health state serves both families.
        if let Some(h) = self.0.first() {
            h.shared.health.sync_node(deleting, taint_keys);
        }
        self.0
            .iter()
            .fold(false, |c, h| h.on_node(facts.clone()) | c)
    }

    /// The cluster's service CIDRs, both families (each proxier keeps its own).
    pub fn on_service_cidrs(&self, cidrs: &[crate::model::Cidr]) -> bool {
        self.0
            .iter()
            .fold(false, |c, h| h.on_service_cidrs(cidrs) | c)
    }

    pub fn on_services_synced(&self) {
        self.0.iter().for_each(ProxyHandle::on_services_synced);
    }

    pub fn on_endpoint_slices_synced(&self) {
        self.0
            .iter()
            .for_each(ProxyHandle::on_endpoint_slices_synced);
    }

    pub fn initialized(&self) -> bool {
        self.0.iter().all(ProxyHandle::initialized)
    }
}

impl From<ProxyHandle> for ProxyHandles {
    fn from(h: ProxyHandle) -> Self {
        ProxyHandles(vec![h])
    }
}
