//! The proxier every mode runs: one generic [`Proxier`] owns what the three backends
//! (iptables, nftables, ipvs) share, and a [`Backend`] supplies only what is its own.
//!
//! The proxier owns the change-tracking handle, the metrics, conntrack cleanup, the
//! healthCheckNodePort servers, the render settings with node adoption, the full-sync
//! decision (asked for, periodic, the node changed, a failure, or nothing known of the
//! kernel) and what a sync that the kernel took records. One sync:
//!
//! 1. [`Backend::observe`] reads what the backend needs of the kernel first, while, under the
//!    state's lock, the changes are taken and [`Backend::plan`] computes the backend's plan
//!    (pure: from the desired state and what the backend remembers of the kernel);
//! 2. [`Backend::apply`] writes the plan and, on success, commits it to what is known;
//! 3. the proxier records the outcome ([`Backend::succeeded`] or [`Backend::failed`] for
//!    the backend's own part).

use std::collections::BTreeSet;
use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;
use tracing::{debug, info};

use crate::conntrack::{self, Conntrack, NoConntrack};
use crate::health::{ServiceHealthServer, health_check_state};
use crate::metrics::Metrics;
use crate::model::{IpFamily, NamespacedName, ServiceState};
use crate::render_config::RenderConfig;
use crate::success::record_success;
use crate::sync_loop::{SyncConfig, SyncOutcome, Syncer};
use crate::tracker::{ProxyHandle, set_pending};

/// What one sync plans from: the settings, whether it is a full one, the desired state and
/// the services changed since the last sync.
#[derive(Clone, Copy)]
pub struct PlanInput<'a> {
    pub cfg: &'a RenderConfig,
    pub full: bool,
    pub state: &'a ServiceState,
    pub changed: &'a BTreeSet<NamespacedName>,
}

/// What one sync applies with: the settings, whether it is a full one, how many services
/// changed (for the logs).
#[derive(Clone, Copy, Debug)]
pub struct ApplyInput<'a> {
    pub cfg: &'a RenderConfig,
    pub full: bool,
    pub changed: usize,
}

/// One mode's own part of a proxier (see the module's text).
pub trait Backend: Send + Sync {
    /// A failed sync (logged by the sync loop, which retries).
    type Error: std::fmt::Display + Send;
    /// What the backend remembers of the kernel after a sync it wrote; the proxier keeps it,
    /// `None` when unknown (at start, after a failure, or after the canary check found the
    /// rules changed behind our back): the next sync is then a full one.
    type Known: Send;
    /// What a sync reads from the kernel before writing.
    type Observed: Send;
    /// The pure plan of one sync's changes.
    type Plan: Send;
    /// What [`Backend::apply`] wrote.
    type Written: Send;

    /// The mode's word in logs ("iptables", "nftables", "IPVS").
    const NAME: &'static str;

    /// Whether the backend renders the cluster's service CIDRs (a change is then a full
    /// sync).
    const FOLLOWS_SERVICE_CIDRS: bool = false;

    /// The longest time between full syncs, from the loop's timing.
    fn full_sync_period(sync: &SyncConfig) -> Duration {
        sync.full_sync_period
    }

    /// The periodic check that nobody changed the backend's rules behind its back. True
    /// when they were: the next sync is a full one (a backend that must read the kernel
    /// again also forgets `known`).
    fn check_canary(
        &self,
        cfg: &RenderConfig,
        known: &mut Option<Self::Known>,
    ) -> impl Future<Output = bool> + Send;

    /// Reads what this sync needs of the kernel before writing (`known`: whether anything is
    /// known of it). Runs while [`Backend::plan`] computes.
    fn observe(
        &self,
        cfg: &RenderConfig,
        full: bool,
        known: bool,
    ) -> impl Future<Output = Result<Self::Observed, Self::Error>> + Send;

    /// The plan of this sync (pure), from the desired state and what is known of the
    /// kernel (which a partial plan may update in place: it is forgotten if the sync fails).
    fn plan(&self, input: &PlanInput<'_>, known: Option<&mut Self::Known>) -> Self::Plan;

    /// Writes `plan`; on success commits what was written to `known`.
    fn apply(
        &mut self,
        plan: Self::Plan,
        observed: Self::Observed,
        input: ApplyInput<'_>,
        known: &mut Option<Self::Known>,
    ) -> impl Future<Output = Result<Self::Written, Self::Error>> + Send;

    /// After the kernel took `written`: this backend's metrics. Returns how much was
    /// written (bytes or operations; 0 when nothing needed writing).
    fn succeeded(
        &mut self,
        written: &Self::Written,
        known: Option<&Self::Known>,
        family: IpFamily,
        metrics: &Metrics,
    ) -> usize;

    /// Logs a sync that wrote something.
    fn log_synced(&self, written: &Self::Written, full: bool, secs: f64);

    /// After a failed sync: this backend's metrics, state and log line. True when what is
    /// known of the kernel is to be forgotten.
    fn failed(
        &mut self,
        error: &Self::Error,
        full: bool,
        family: IpFamily,
        metrics: &Metrics,
    ) -> bool;
}

/// One IP family's proxier in one mode: see the module's text.
pub struct Proxier<B: Backend, C: Conntrack = NoConntrack> {
    backend: B,
    conntrack: C,
    service_health: Option<ServiceHealthServer>,
    cfg: RenderConfig,
    handle: ProxyHandle,
    metrics: Metrics,
    full_sync_period: Duration,
    /// No node IP configured (`--bind-address` unset): take it from the Node object.
    node_ips_from_node: bool,
    /// What the kernel holds, as far as this proxier knows.
    known: Option<B::Known>,
    need_full: bool,
    last_full: Option<Instant>,
}

impl<B: Backend, C: Conntrack> std::fmt::Debug for Proxier<B, C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Proxier")
            .field("mode", &B::NAME)
            .field("need_full", &self.need_full)
            .field("known", &self.known.is_some())
            .finish_non_exhaustive()
    }
}

impl<B: Backend> Proxier<B> {
    /// `backend` for `handle`'s family, reporting to `metrics` (registered once and shared
    /// by the proxiers of both families; every series carries an `ip_family` label).
    pub fn with_backend(
        backend: B,
        cfg: RenderConfig,
        handle: ProxyHandle,
        sync: SyncConfig,
        metrics: Metrics,
    ) -> Self {
        handle.set_metrics(metrics.clone());
        Proxier {
            backend,
            conntrack: NoConntrack,
            service_health: None,
            node_ips_from_node: cfg.node_ips.is_empty(),
            cfg,
            handle,
            metrics,
            full_sync_period: B::full_sync_period(&sync),
            known: None,
            need_full: true,
            last_full: None,
        }
    }
}

impl<B: Backend, C: Conntrack> Proxier<B, C> {
    /// Cleans stale UDP conntrack entries after each successful sync.
    pub fn with_conntrack<C2: Conntrack>(self, conntrack: C2) -> Proxier<B, C2> {
        Proxier {
            backend: self.backend,
            conntrack,
            service_health: self.service_health,
            cfg: self.cfg,
            handle: self.handle,
            metrics: self.metrics,
            full_sync_period: self.full_sync_period,
            node_ips_from_node: self.node_ips_from_node,
            known: self.known,
            need_full: self.need_full,
            last_full: self.last_full,
        }
    }

    /// Serves healthCheckNodePorts of externalTrafficPolicy=Local services.
    pub fn with_service_health(mut self, server: ServiceHealthServer) -> Self {
        self.service_health = Some(server);
        self
    }

    pub fn backend(&self) -> &B {
        &self.backend
    }

    pub fn backend_mut(&mut self) -> &mut B {
        &mut self.backend
    }

    pub fn conntrack(&self) -> &C {
        &self.conntrack
    }

    pub fn handle(&self) -> &ProxyHandle {
        &self.handle
    }

    pub fn family(&self) -> IpFamily {
        self.cfg.family
    }

    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// What the kernel holds as far as this proxier knows (None when unknown).
    pub fn known(&self) -> Option<&B::Known> {
        self.known.as_ref()
    }

    /// True if the next sync will be full.
    pub fn needs_full_sync(&self) -> bool {
        self.need_full || self.known.is_none()
    }

    /// The backend's canary check; a change behind our back makes the next sync full.
    pub async fn check_canary(&mut self) {
        if self.backend.check_canary(&self.cfg, &mut self.known).await {
            self.need_full = true;
        }
    }

    /// Takes the Node object's zone and addresses (and the service CIDRs, for a backend
    /// that renders them). True when any changed: the next sync is a full one.
    fn adopt(&mut self) -> bool {
        let (node, cidrs) = {
            let st = self.handle.state();
            let cidrs = B::FOLLOWS_SERVICE_CIDRS.then(|| st.service_cidrs().to_vec());
            (st.node().clone(), cidrs)
        };
        let mut changed = self.cfg.adopt_node(&node, self.node_ips_from_node);
        if let Some(cidrs) = cidrs
            && cidrs != self.cfg.service_cidrs
        {
            info!(service_cidrs = ?cidrs, "service CIDRs changed");
            self.cfg.service_cidrs = cidrs;
            changed = true;
        }
        changed
    }

    /// Plans and applies. `full` forces a full sync; otherwise only what changed since the
    /// last successful sync is written (a full sync anyway when it is due, the node
    /// changed, or nothing is known of the kernel).
    pub async fn sync(&mut self, full: bool) -> Result<SyncOutcome, B::Error> {
        if !self.handle.initialized() {
            debug!(
                "not syncing {} until Services and EndpointSlices are synced",
                B::NAME
            );
            return Ok(SyncOutcome::NotInitialized);
        }
        let started = std::time::Instant::now();
        let stale_full = self
            .last_full
            .is_none_or(|t| t.elapsed() >= self.full_sync_period);
        let node_changed = self.adopt();
        let full = full || stale_full || node_changed || self.needs_full_sync();
        let want_hc = self.service_health.is_some();

        let Proxier {
            backend,
            cfg,
            handle,
            metrics,
            known,
            ..
        } = self;
        let (backend, cfg) = (&*backend, &*cfg);
        let is_known = known.is_some();
        let plan = async {
            let mut st = handle.state();
            let changed: BTreeSet<_> = st.take_changes();
            let triggers = st.take_trigger_times();
            set_pending(metrics, &st);
            let input = PlanInput {
                cfg,
                full,
                state: &st,
                changed: &changed,
            };
            let plan = backend.plan(&input, known.as_mut());
            let udp = conntrack::udp_targets(st.service_port_map(), st.endpoints_map());
            let hc = want_hc.then(|| health_check_state(&st));
            (plan, changed.len(), triggers, udp, hc)
        };
        // The backend's reads of the kernel run while this thread plans.
        let (observed, (plan, changed, triggers, udp, hc)) =
            futures::join!(backend.observe(cfg, full, is_known), plan);
        let input = ApplyInput {
            cfg: &self.cfg,
            full,
            changed,
        };
        let result = match observed {
            Ok(observed) => {
                self.backend
                    .apply(plan, observed, input, &mut self.known)
                    .await
            }
            Err(e) => Err(e),
        };
        let family = self.cfg.family;
        let secs = started.elapsed().as_secs_f64();
        self.metrics.observe_sync(family.label(), secs, full);

        match result {
            Ok(written) => {
                let bytes =
                    self.backend
                        .succeeded(&written, self.known.as_ref(), family, &self.metrics);
                self.metrics.observe_programmed(family.label(), &triggers);
                self.need_full = false;
                if full {
                    self.last_full = Some(Instant::now());
                }
                record_success(
                    &self.handle,
                    family,
                    self.service_health.as_ref(),
                    hc.as_ref(),
                    &self.conntrack,
                    &udp,
                )
                .await;
                if bytes == 0 {
                    return Ok(SyncOutcome::Unchanged);
                }
                self.backend.log_synced(&written, full, secs);
                Ok(SyncOutcome::Applied {
                    full,
                    changed_services: changed,
                    bytes,
                })
            }
            Err(e) => {
                if self.backend.failed(&e, full, family, &self.metrics) {
                    self.known = None;
                }
                self.need_full = true;
                Err(e)
            }
        }
    }
}

impl<B: Backend, C: Conntrack> Syncer for Proxier<B, C> {
    type Error = B::Error;

    fn handle(&self) -> &ProxyHandle {
        &self.handle
    }

    fn family(&self) -> IpFamily {
        self.cfg.family
    }

    fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    async fn check_canary(&mut self) {
        Proxier::check_canary(self).await
    }

    async fn sync(&mut self, full: bool) -> Result<SyncOutcome, B::Error> {
        Proxier::sync(self, full).await
    }
}

#[cfg(test)]
mod tests;
