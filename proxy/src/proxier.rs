//! The sync loop: render the desired ruleset, apply it (full or minimal delta) through an
//! `IptablesRunner`, remember what was applied, and run that on a debounced schedule.
//! Partial syncs re-render only the services changed since the last sync (`Rendered::update`).

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::fmt::Write as _;
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use prometheus::Registry;
use thiserror::Error;
use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info, warn};

use crate::chains::*;
use crate::conntrack::{self, Conntrack, NoConntrack, UdpTarget};
use crate::health::{ProxierHealth, ServiceHealthServer};
use crate::iptables::{self, IptablesRunner, Position};
use crate::metrics::Metrics;
use crate::model::{IpFamily, NamespacedName, NodeFacts, ServiceState};
use crate::render::{RenderConfig, Rendered, TableName};

#[derive(Debug, Error)]
pub enum Error {
    #[error("ensuring {table} {chain}: {source}")]
    Jump {
        table: &'static str,
        chain: String,
        #[source]
        source: iptables::Error,
    },
    #[error("iptables-restore failed ({kind} sync): {source}")]
    Restore {
        kind: &'static str,
        #[source]
        source: iptables::Error,
    },
    #[error("registering metrics: {0}")]
    Metrics(#[from] prometheus::Error),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Timing of the loop (upstream defaults: minSyncPeriod 1 s, syncPeriod 30 s, and a forced
/// full resync at least every hour).
#[derive(Clone, Copy, Debug)]
pub struct SyncConfig {
    /// No two syncs closer than this; changes arriving meanwhile are batched.
    pub min_sync_period: Duration,
    /// A sync runs at least this often; each periodic run also checks the canary chain
    /// and does a full resync if someone flushed our tables.
    pub sync_period: Duration,
    /// Longest time between full resyncs (drift repair).
    pub full_sync_period: Duration,
}

impl Default for SyncConfig {
    fn default() -> Self {
        SyncConfig {
            min_sync_period: Duration::from_secs(1),
            sync_period: Duration::from_secs(30),
            full_sync_period: Duration::from_secs(3600),
        }
    }
}

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

    fn state(&self) -> MutexGuard<'_, ServiceState> {
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

    /// Rules are not written until both initial lists arrived (as upstream), so a restart
    /// never programs a half-known state.
    pub fn initialized(&self) -> bool {
        self.shared.services_synced.load(Ordering::SeqCst)
            && self.shared.slices_synced.load(Ordering::SeqCst)
    }

    async fn notified(&self) {
        self.shared.notify.notified().await
    }
}

fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs_f64()
}

/// The pending-change gauges (one series for both families, as upstream's).
fn set_pending(m: &Metrics, st: &ServiceState) {
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

/// What one `sync` did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SyncOutcome {
    /// Initial lists not received yet.
    NotInitialized,
    /// Partial sync with nothing to write.
    Unchanged,
    Applied {
        full: bool,
        changed_services: usize,
        bytes: usize,
    },
}

/// What a full sync's jump check found: the restore lines adding the missing jump rules
/// and chains, per table, and the nat table's `iptables-save` dump.
#[derive(Debug, Default)]
struct JumpCheck {
    missing: Vec<(TableName, String)>,
    nat_dump: Option<String>,
}

/// One jump from a built-in chain into ours (upstream's iptablesJumpChains).
struct Jump {
    table: TableName,
    target: &'static str,
    from: &'static str,
    comment: &'static str,
    extra: &'static [&'static str],
}

const NEW: &[&str] = &["-m", "conntrack", "--ctstate", "NEW"];

const JUMPS: &[Jump] = &[
    Jump {
        table: TableName::Filter,
        target: KUBE_EXTERNAL_SERVICES,
        from: "INPUT",
        comment: "kubernetes externally-visible service portals",
        extra: NEW,
    },
    Jump {
        table: TableName::Filter,
        target: KUBE_EXTERNAL_SERVICES,
        from: "FORWARD",
        comment: "kubernetes externally-visible service portals",
        extra: NEW,
    },
    Jump {
        table: TableName::Filter,
        target: KUBE_NODEPORTS,
        from: "INPUT",
        comment: "kubernetes health check service ports",
        extra: &[],
    },
    Jump {
        table: TableName::Filter,
        target: KUBE_SERVICES,
        from: "FORWARD",
        comment: "kubernetes service portals",
        extra: NEW,
    },
    Jump {
        table: TableName::Filter,
        target: KUBE_SERVICES,
        from: "OUTPUT",
        comment: "kubernetes service portals",
        extra: NEW,
    },
    Jump {
        table: TableName::Filter,
        target: KUBE_FORWARD,
        from: "FORWARD",
        comment: "kubernetes forwarding rules",
        extra: &[],
    },
    Jump {
        table: TableName::Filter,
        target: KUBE_PROXY_FIREWALL,
        from: "INPUT",
        comment: "kubernetes load balancer firewall",
        extra: NEW,
    },
    Jump {
        table: TableName::Filter,
        target: KUBE_PROXY_FIREWALL,
        from: "OUTPUT",
        comment: "kubernetes load balancer firewall",
        extra: NEW,
    },
    Jump {
        table: TableName::Filter,
        target: KUBE_PROXY_FIREWALL,
        from: "FORWARD",
        comment: "kubernetes load balancer firewall",
        extra: NEW,
    },
    Jump {
        table: TableName::Nat,
        target: KUBE_SERVICES,
        from: "OUTPUT",
        comment: "kubernetes service portals",
        extra: &[],
    },
    Jump {
        table: TableName::Nat,
        target: KUBE_SERVICES,
        from: "PREROUTING",
        comment: "kubernetes service portals",
        extra: &[],
    },
    Jump {
        table: TableName::Nat,
        target: KUBE_POSTROUTING,
        from: "POSTROUTING",
        comment: "kubernetes postrouting rules",
        extra: &[],
    },
    // Duplicates of kubelet's jumps; never removed by kube-proxy.
    Jump {
        table: TableName::Filter,
        target: KUBE_FIREWALL,
        from: "INPUT",
        comment: "",
        extra: &[],
    },
    Jump {
        table: TableName::Filter,
        target: KUBE_FIREWALL,
        from: "OUTPUT",
        comment: "",
        extra: &[],
    },
];

/// Owns the last-applied ruleset and turns desired state into iptables transactions.
pub struct Proxier<R: IptablesRunner, C: Conntrack = NoConntrack> {
    runner: R,
    conntrack: C,
    service_health: Option<ServiceHealthServer>,
    cfg: RenderConfig,
    handle: ProxyHandle,
    metrics: Metrics,
    full_sync_period: Duration,
    /// No node IP configured (`--bind-address` unset): take it from the Node object.
    node_ips_from_node: bool,
    /// What the kernel holds, as far as we know, kept per service so that a partial sync
    /// re-renders only what changed; `None` = unknown (start, or after a failure).
    applied: Option<Rendered>,
    need_full: bool,
    last_full: Option<Instant>,
}

impl<R: IptablesRunner, C: Conntrack> std::fmt::Debug for Proxier<R, C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Proxier")
            .field("need_full", &self.need_full)
            .field("applied", &self.applied.is_some())
            .finish_non_exhaustive()
    }
}

impl<R: IptablesRunner> Proxier<R> {
    /// `registry` receives the sync metrics.
    pub fn new(
        runner: R,
        cfg: RenderConfig,
        handle: ProxyHandle,
        sync: SyncConfig,
        registry: &Registry,
    ) -> Result<Self> {
        Ok(Self::with_metrics(
            runner,
            cfg,
            handle,
            sync,
            Metrics::new(registry)?,
        ))
    }

    /// As `new`, reporting to metrics already registered (shared by the proxiers of both
    /// families; every series carries an `ip_family` label).
    pub fn with_metrics(
        runner: R,
        cfg: RenderConfig,
        handle: ProxyHandle,
        sync: SyncConfig,
        metrics: Metrics,
    ) -> Self {
        let _ = handle.shared.metrics.set(metrics.clone());
        Proxier {
            runner,
            conntrack: NoConntrack,
            service_health: None,
            node_ips_from_node: cfg.node_ips.is_empty(),
            cfg,
            handle,
            metrics,
            full_sync_period: sync.full_sync_period,
            applied: None,
            need_full: true,
            last_full: None,
        }
    }
}

impl<R: IptablesRunner, C: Conntrack> Proxier<R, C> {
    /// Cleans stale UDP conntrack entries after each successful sync.
    pub fn with_conntrack<C2: Conntrack>(self, conntrack: C2) -> Proxier<R, C2> {
        Proxier {
            runner: self.runner,
            conntrack,
            service_health: self.service_health,
            cfg: self.cfg,
            handle: self.handle,
            metrics: self.metrics,
            full_sync_period: self.full_sync_period,
            node_ips_from_node: self.node_ips_from_node,
            applied: self.applied,
            need_full: self.need_full,
            last_full: self.last_full,
        }
    }

    /// Serves healthCheckNodePorts of externalTrafficPolicy=Local services.
    pub fn with_service_health(mut self, server: ServiceHealthServer) -> Self {
        self.service_health = Some(server);
        self
    }

    pub fn conntrack(&self) -> &C {
        &self.conntrack
    }

    pub fn handle(&self) -> &ProxyHandle {
        &self.handle
    }

    pub fn runner(&self) -> &R {
        &self.runner
    }

    /// The ruleset believed to be in the kernel (None when unknown).
    pub fn applied(&self) -> Option<&Rendered> {
        self.applied.as_ref()
    }

    /// True if the next sync will be full.
    pub fn needs_full_sync(&self) -> bool {
        self.need_full || self.applied.is_none()
    }

    /// Checks upstream's canary chain; if someone flushed our tables, schedule a full sync.
    pub async fn check_canary(&mut self) {
        match self
            .runner
            .chain_exists(TableName::Mangle, KUBE_PROXY_CANARY)
            .await
        {
            Ok(true) => {}
            Ok(false) => {
                info!("canary chain gone, iptables were flushed: next sync is full");
                self.need_full = true;
            }
            Err(e) => warn!(error = %e, "cannot check canary chain"),
        }
    }

    /// Renders and applies. `full` forces a full rewrite; otherwise a partial sync writes only
    /// what differs from the last applied state (full anyway if that state is unknown).
    pub async fn sync(&mut self, full: bool) -> Result<SyncOutcome> {
        if !self.handle.initialized() {
            debug!("not syncing iptables until Services and EndpointSlices are synced");
            return Ok(SyncOutcome::NotInitialized);
        }
        let started = std::time::Instant::now();
        let stale_full = self
            .last_full
            .is_none_or(|t| t.elapsed() >= self.full_sync_period);
        let node = self.handle.state().node().clone();
        let node_changed = self.adopt_node(&node);
        let do_full = full || stale_full || node_changed || self.needs_full_sync();

        let want_hc = self.service_health.is_some();
        // A partial sync works on the last applied state in place: only the changed services
        // are re-rendered and diffed. On failure the state is dropped (next sync is full).
        let previous = if do_full { None } else { self.applied.take() };
        let render = async {
            let mut state = self.handle.state();
            let changed: BTreeSet<_> = state.take_changes();
            let triggers = state.take_trigger_times();
            set_pending(&self.metrics, &state);
            let (desired, delta) = match previous {
                Some(mut r) => {
                    let text = r.update(
                        state.service_port_map(),
                        state.endpoints_map(),
                        &changed,
                        &self.cfg,
                    );
                    (r, Some(text))
                }
                None => (
                    Rendered::build(state.service_port_map(), state.endpoints_map(), &self.cfg),
                    None,
                ),
            };
            let udp = conntrack::udp_targets(state.service_port_map(), state.endpoints_map());
            let hc = want_hc.then(|| health_check_state(&state));
            (desired, delta, changed, udp, hc, triggers)
        };
        // A full sync checks the jump rules first: iptables runs while this thread renders.
        let (rendered, jumps) = if do_full {
            let (jumps, rendered) = futures::join!(self.check_jumps(), render);
            (rendered, Some(jumps))
        } else {
            (render.await, None)
        };
        let (desired, delta, changed, udp, hc, triggers) = rendered;
        debug!(
            full = do_full,
            changed = changed.len(),
            "syncing iptables rules"
        );

        let result = match jumps.transpose() {
            Ok(jumps) => self.apply(&desired, delta, jumps.unwrap_or_default()).await,
            Err(e) => Err(e),
        };
        let fam = self.cfg.family.label();
        let secs = started.elapsed().as_secs_f64();
        self.metrics
            .sync_duration
            .with_label_values(&[fam])
            .observe(secs);
        if do_full {
            self.metrics
                .sync_full_duration
                .with_label_values(&[fam])
                .observe(secs);
        } else {
            self.metrics
                .sync_partial_duration
                .with_label_values(&[fam])
                .observe(secs);
        }

        match result {
            Ok(text) => {
                for t in [TableName::Filter, TableName::Nat] {
                    let (count, t) = (desired.rule_count(t), t.as_str());
                    self.metrics
                        .iptables_total
                        .with_label_values(&[t, fam])
                        .set(count as f64);
                    self.metrics
                        .iptables_last
                        .with_label_values(&[t, fam])
                        .set(count_appends(&text, t) as f64);
                }
                let s = desired.stats();
                self.metrics
                    .no_local_endpoints
                    .with_label_values(&["internal", fam])
                    .set(s.no_local_endpoints_internal as f64);
                self.metrics
                    .no_local_endpoints
                    .with_label_values(&["external", fam])
                    .set(s.no_local_endpoints_external as f64);
                self.metrics
                    .last_timestamp
                    .with_label_values(&[fam])
                    .set(unix_now());
                let now = SystemTime::now();
                for (service, t) in &triggers {
                    let latency = now.duration_since(*t).unwrap_or_default().as_secs_f64();
                    self.metrics
                        .network_programming
                        .with_label_values(&[fam])
                        .observe(latency);
                    debug!(%service, elapsed = latency, "network programming");
                }
                self.applied = Some(desired);
                self.need_full = false;
                if do_full {
                    self.last_full = Some(Instant::now());
                }
                self.handle.shared.health.updated(self.cfg.family);
                if let (Some(server), Some((ports, counts))) = (&self.service_health, &hc) {
                    server.sync_services(ports).await;
                    server.sync_endpoints(counts);
                }
                self.clean_conntrack(&udp).await;
                if text.is_empty() {
                    return Ok(SyncOutcome::Unchanged);
                }
                info!(
                    full = do_full,
                    bytes = text.len(),
                    elapsed = secs,
                    "synced iptables rules"
                );
                Ok(SyncOutcome::Applied {
                    full: do_full,
                    changed_services: changed.len(),
                    bytes: text.len(),
                })
            }
            Err(e) => {
                error!(error = %e, "sync failed; next sync will be full");
                if matches!(e, Error::Restore { .. }) {
                    self.metrics
                        .restore_failures
                        .with_label_values(&[fam])
                        .inc();
                    if !do_full {
                        self.metrics
                            .partial_restore_failures
                            .with_label_values(&[fam])
                            .inc();
                    }
                }
                // The change set is consumed and the kernel may hold a mix: forget it.
                self.applied = None;
                self.need_full = true;
                Err(e)
            }
        }
    }

    /// Takes the Node's zone (topology hints) and, when no node IP was configured, its IP
    /// into the render configuration. Returns true if either changed: they touch every
    /// service, so the sync is a full one (upstream's OnTopologyChange).
    fn adopt_node(&mut self, node: &NodeFacts) -> bool {
        let mut changed = false;
        if self.cfg.zone != node.zone {
            info!(zone = ?node.zone, "node topology zone changed");
            self.cfg.zone = node.zone.clone();
            changed = true;
        }
        if self.node_ips_from_node {
            let ips: Vec<IpAddr> = node.ip_of(self.cfg.family).into_iter().collect();
            if self.cfg.node_ips != ips {
                info!(node_ips = ?ips, "node IPs taken from the Node object");
                self.cfg.node_ips = ips;
                changed = true;
            }
        }
        changed
    }

    async fn clean_conntrack(&self, udp: &[UdpTarget]) {
        conntrack::clean_stale_entries(&self.conntrack, self.cfg.family, udp).await;
    }

    /// Writes `desired`: the partial-sync `delta` when given, else everything, with the jump
    /// rules `jumps` found missing and deletion of the stale chains its nat dump shows.
    /// Returns the restore text (empty when nothing needed writing).
    async fn apply(
        &mut self,
        desired: &Rendered,
        delta: Option<String>,
        jumps: JumpCheck,
    ) -> Result<String> {
        let full = delta.is_none();
        let text = match delta {
            Some(text) => text,
            None => {
                let stale = self.stale_nat_chains(desired, jumps.nat_dump).await;
                desired.full_text_with_heads(&stale, &jumps.missing)
            }
        };
        if text.is_empty() {
            return Ok(text);
        }
        let kind = if full { "full" } else { "partial" };
        self.runner
            .restore(&text, true)
            .await
            .map_err(|source| Error::Restore { kind, source })?;
        Ok(text)
    }

    /// Jump rules from the built-in chains, plus the canary chains. Only on full syncs:
    /// they exist otherwise. One `iptables-save` shows what is there; whatever is missing is
    /// returned, per table, for the full restore to add first (chains declared only when
    /// absent, so none is flushed; jumps prepended in upstream's order), along with the nat
    /// table's dump for the stale-chain check. Without a dump, falls back to one command per
    /// chain and rule.
    async fn check_jumps(&self) -> Result<JumpCheck> {
        let dump = match self.runner.save_all().await {
            Ok(d) => d,
            Err(e) => {
                warn!(error = %e, "iptables-save failed: ensuring jumps one by one");
                self.ensure_jumps_one_by_one().await?;
                return Ok(JumpCheck::default());
            }
        };
        let dumps = split_tables(&dump);
        Ok(JumpCheck {
            missing: missing_jumps(&dumps),
            nat_dump: dumps
                .into_iter()
                .find(|(t, _)| *t == TableName::Nat)
                .map(|(_, d)| d),
        })
    }

    async fn ensure_jumps_one_by_one(&self) -> Result<()> {
        for t in [TableName::Mangle, TableName::Nat, TableName::Filter] {
            self.runner
                .ensure_chain(t, KUBE_PROXY_CANARY)
                .await
                .map_err(|source| Error::Jump {
                    table: t.as_str(),
                    chain: KUBE_PROXY_CANARY.into(),
                    source,
                })?;
        }
        for j in JUMPS {
            let err = |source| Error::Jump {
                table: j.table.as_str(),
                chain: j.target.into(),
                source,
            };
            self.runner
                .ensure_chain(j.table, j.target)
                .await
                .map_err(err)?;
            self.runner
                .ensure_rule(Position::Prepend, j.table, j.from, &j.args())
                .await
                .map_err(|source| Error::Jump {
                    table: j.table.as_str(),
                    chain: j.from.into(),
                    source,
                })?;
        }
        Ok(())
    }

    /// Per-service nat chains present in the kernel (`nat_dump`, when there is one; else a
    /// fresh `iptables-save`) or in our last applied state that the desired state no longer
    /// has.
    async fn stale_nat_chains(&self, desired: &Rendered, nat_dump: Option<String>) -> Vec<String> {
        let mut found = BTreeSet::new();
        let dump = match nat_dump {
            Some(d) => Ok(d),
            None => self.runner.save(TableName::Nat).await,
        };
        match dump {
            Ok(dump) => {
                for line in dump.lines() {
                    if let Some(rest) = line.strip_prefix(':') {
                        let name = rest.split_whitespace().next().unwrap_or_default();
                        found.insert(name.to_string());
                    }
                }
            }
            Err(e) => warn!(error = %e, "iptables-save failed: stale chains not deleted this time"),
        }
        if let Some(applied) = &self.applied {
            found.extend(applied.nat_chain_names().map(str::to_string));
        }
        found.retain(|c| is_service_chain(c));
        if found.is_empty() {
            // A fresh table: no need to index the desired chains.
            return Vec::new();
        }
        let wanted: HashSet<&str> = desired.nat_chain_names().collect();
        found
            .into_iter()
            .filter(|c| !wanted.contains(c.as_str()))
            .collect()
    }
}

impl Jump {
    /// The rule's arguments after `-A <from>`, as `ensure_rule` takes them.
    fn args(&self) -> Vec<String> {
        let mut args: Vec<String> = self.extra.iter().map(|s| s.to_string()).collect();
        if !self.comment.is_empty() {
            args.extend([
                "-m".into(),
                "comment".into(),
                "--comment".into(),
                self.comment.into(),
            ]);
        }
        args.extend(["-j".into(), self.target.into()]);
        args
    }

    /// The rule as `iptables-save` prints it (`args`, with the spaced comment quoted).
    fn save_line(&self) -> String {
        let args: Vec<String> = self
            .args()
            .into_iter()
            .map(|a| {
                if a.contains(' ') {
                    format!("\"{a}\"")
                } else {
                    a
                }
            })
            .collect();
        format!("-A {} {}", self.from, args.join(" "))
    }
}

/// Splits plain `iptables-save` output into the tables kube-proxy uses (mangle, nat, filter;
/// one absent from the dump gets an empty entry, so that its chains count as missing).
fn split_tables(dump: &str) -> Vec<(TableName, String)> {
    let mut out: Vec<(TableName, String)> = [TableName::Mangle, TableName::Nat, TableName::Filter]
        .into_iter()
        .map(|t| (t, String::new()))
        .collect();
    let mut current: Option<usize> = None;
    for line in dump.lines() {
        if let Some(name) = line.strip_prefix('*') {
            current = out.iter().position(|(t, _)| t.as_str() == name.trim());
        } else if let Some(i) = current {
            out[i].1.push_str(line);
            out[i].1.push('\n');
        }
    }
    out
}

/// Per table, the `iptables-restore --noflush` lines that add the canary chains, jump
/// targets and jump rules missing from `dumps` (`iptables-save` output per table); only the
/// tables that miss something.
fn missing_jumps(dumps: &[(TableName, String)]) -> Vec<(TableName, String)> {
    let mut out = Vec::new();
    for (t, dump) in dumps {
        let chains: HashSet<&str> = dump
            .lines()
            .filter_map(|l| l.strip_prefix(':'))
            .filter_map(|l| l.split_whitespace().next())
            .collect();
        let rules: HashSet<&str> = dump
            .lines()
            .map(str::trim_end)
            .filter(|l| l.starts_with("-A "))
            .collect();
        let mut wanted: Vec<&str> = vec![KUBE_PROXY_CANARY];
        for j in JUMPS.iter().filter(|j| j.table == *t) {
            if !wanted.contains(&j.target) {
                wanted.push(j.target);
            }
        }
        let mut body = String::new();
        for c in wanted.iter().filter(|c| !chains.contains(*c)) {
            let _ = writeln!(body, ":{c} - [0:0]");
        }
        for j in JUMPS.iter().filter(|j| j.table == *t) {
            let line = j.save_line();
            if !rules.contains(line.as_str()) {
                let _ = writeln!(body, "-I{}", &line["-A".len()..]);
            }
        }
        if !body.is_empty() {
            out.push((*t, body));
        }
    }
    out
}

/// Health-check node ports by service, and each service's number of distinct ready local
/// endpoint IPs (upstream's HealthCheckNodePorts and LocalReadyEndpoints).
type HealthCheckState = (
    BTreeMap<NamespacedName, u16>,
    BTreeMap<NamespacedName, usize>,
);

fn health_check_state(state: &ServiceState) -> HealthCheckState {
    let mut ports = BTreeMap::new();
    for (name, info) in state.service_port_map() {
        if info.health_check_node_port != 0 {
            ports.insert(name.service.clone(), info.health_check_node_port);
        }
    }
    let mut ips: BTreeMap<NamespacedName, BTreeSet<std::net::IpAddr>> = BTreeMap::new();
    for (name, eps) in state.endpoints_map() {
        for e in eps.iter().filter(|e| e.ready && e.is_local) {
            ips.entry(name.service.clone()).or_default().insert(e.ip);
        }
    }
    let counts = ips.into_iter().map(|(k, v)| (k, v.len())).collect();
    (ports, counts)
}

fn count_appends(text: &str, table: &str) -> usize {
    let mut in_table = false;
    let mut n = 0;
    for line in text.lines() {
        if let Some(t) = line.strip_prefix('*') {
            in_table = t == table;
        } else if in_table && line.starts_with("-A ") {
            n += 1;
        }
    }
    n
}

/// Runs syncs until `shutdown`: at most one per `min_sync_period`, woken by changes from the
/// handle, and at least one per `sync_period` (which also checks the canary chain).
/// A failed sync is retried, fully, after [`RetryBackoff`]: 1 s, doubling up to `sync_period`.
pub async fn run<R: IptablesRunner, C: Conntrack>(
    mut proxier: Proxier<R, C>,
    cfg: SyncConfig,
    shutdown: CancellationToken,
) -> Proxier<R, C> {
    let handle = proxier.handle.clone();
    let mut last_run: Option<Instant> = None;
    let mut next_periodic = Instant::now() + cfg.sync_period;
    let mut pending = true;
    let mut retry = RetryBackoff::new(cfg.sync_period);
    let mut retry_at: Option<Instant> = None;
    loop {
        let wake = if pending {
            let earliest = last_run.map_or_else(Instant::now, |t| t + cfg.min_sync_period);
            earliest.min(next_periodic)
        } else {
            retry_at.map_or(next_periodic, |t| t.min(next_periodic))
        };
        tokio::select! {
            _ = shutdown.cancelled() => return proxier,
            _ = handle.notified() => {
                let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
                proxier
                    .metrics
                    .last_queued_timestamp
                    .with_label_values(&[proxier.cfg.family.label()])
                    .set(now.as_secs_f64());
                pending = true;
                continue;
            }
            _ = tokio::time::sleep_until(wake) => {}
        }
        let now = Instant::now();
        if now >= next_periodic {
            proxier.check_canary().await;
        }
        match proxier.sync(false).await {
            // Nothing was written: the first real sync need not wait for minSyncPeriod.
            Ok(SyncOutcome::NotInitialized) => {}
            Ok(_) => {
                last_run = Some(now);
                retry.reset();
                retry_at = None;
            }
            Err(e) => {
                let after = retry.next_delay();
                warn!(error = %e, retry_in = ?after, "sync failed");
                last_run = Some(now);
                retry_at = Some(Instant::now() + after);
            }
        }
        pending = false;
        next_periodic = now + cfg.sync_period;
    }
}

/// Delay before retrying a failed sync: 1 s, doubling up to a cap (`syncPeriod`); back to
/// 1 s after a success.
#[derive(Clone, Copy, Debug)]
pub struct RetryBackoff {
    next: Duration,
    cap: Duration,
}

impl RetryBackoff {
    pub const FIRST: Duration = Duration::from_secs(1);

    pub fn new(cap: Duration) -> Self {
        RetryBackoff {
            next: Self::FIRST.min(cap),
            cap,
        }
    }

    /// The delay for this failure; the one after it doubles.
    pub fn next_delay(&mut self) -> Duration {
        let now = self.next;
        self.next = (now * 2).min(self.cap);
        now
    }

    pub fn reset(&mut self) {
        self.next = Self::FIRST.min(self.cap);
    }
}
