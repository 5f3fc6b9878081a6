//! The nftables proxier: renders upstream's `kube-proxy` table, applies it through an
//! [`NftRunner`] and remembers what it wrote ([`KernelState`]), so that no sync ever lists
//! the table. The first sync (and the one after the kernel state became unknown) replaces
//! the table in one transaction; every other sync, full or partial, writes only the
//! difference. It runs on the debounced schedule of [`crate::sync_loop`], as a [`ProxyBackend`].

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, SystemTime};

use prometheus::Registry;
use thiserror::Error;
use tokio::time::Instant;
use tracing::{debug, error, info, warn};

use super::names::{SERVICE_IPS, SERVICES, TABLE};
use super::render::{Base, ServiceNft, family_word, render_service};
use super::runner::{self, NftRunner};
use super::tx::{Existing, KernelState, Listed, Next, Planned};
use crate::conntrack::{self, Conntrack, NoConntrack};
use crate::health::ServiceHealthServer;
use crate::health::health_check_state;
use crate::metrics::Metrics;
use crate::model::{EndpointInfo, IpFamily, ServicePortInfo, ServicePortName, ports_of};
use crate::render_config::RenderConfig;
use crate::success::record_success;
use crate::sync_loop::{ProxyBackend, SyncConfig, SyncOutcome};
use crate::tracker::{ProxyHandle, set_pending};

#[derive(Debug, Error)]
pub enum Error {
    #[error("nft transaction failed ({kind} sync): {source}")]
    Apply {
        kind: &'static str,
        #[source]
        source: runner::Error,
    },
    #[error("registering metrics: {0}")]
    Metrics(#[from] prometheus::Error),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Service ports per transaction when a table that is not there yet is written in steps.
pub const REPLACE_STEP: usize = 2000;

/// Owns what was written to the table and turns desired state into nft transactions.
pub struct NftProxier<R: NftRunner, C: Conntrack = NoConntrack> {
    runner: R,
    conntrack: C,
    service_health: Option<ServiceHealthServer>,
    cfg: RenderConfig,
    handle: ProxyHandle,
    metrics: Metrics,
    full_sync_period: Duration,
    node_ips_from_node: bool,
    /// What the table holds, as written by this process; `None` = unknown (start, after
    /// the periodic check found the table changed, or after a replace failed).
    state: Option<KernelState>,
    need_full: bool,
    last_full: Option<Instant>,
    /// Consecutive failed transactions; the second in a row forgets the state.
    failures: u32,
    /// A rewrite in place of a large table failed: the next one replaces it whole.
    rewrite_failed: bool,
}

impl<R: NftRunner, C: Conntrack> std::fmt::Debug for NftProxier<R, C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NftProxier")
            .field("need_full", &self.need_full)
            .field("state", &self.state.is_some())
            .finish_non_exhaustive()
    }
}

impl<R: NftRunner> NftProxier<R> {
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

    pub fn with_metrics(
        runner: R,
        cfg: RenderConfig,
        handle: ProxyHandle,
        sync: SyncConfig,
        metrics: Metrics,
    ) -> Self {
        handle.set_metrics(metrics.clone());
        NftProxier {
            runner,
            conntrack: NoConntrack,
            service_health: None,
            node_ips_from_node: cfg.node_ips.is_empty(),
            cfg,
            handle,
            metrics,
            full_sync_period: sync.full_sync_period,
            state: None,
            need_full: true,
            last_full: None,
            failures: 0,
            rewrite_failed: false,
        }
    }
}

impl<R: NftRunner, C: Conntrack> NftProxier<R, C> {
    pub fn with_conntrack<C2: Conntrack>(self, conntrack: C2) -> NftProxier<R, C2> {
        NftProxier {
            runner: self.runner,
            conntrack,
            service_health: self.service_health,
            cfg: self.cfg,
            handle: self.handle,
            metrics: self.metrics,
            full_sync_period: self.full_sync_period,
            node_ips_from_node: self.node_ips_from_node,
            state: self.state,
            need_full: self.need_full,
            last_full: self.last_full,
            failures: self.failures,
            rewrite_failed: self.rewrite_failed,
        }
    }

    pub fn with_service_health(mut self, server: ServiceHealthServer) -> Self {
        self.service_health = Some(server);
        self
    }

    pub fn handle(&self) -> &ProxyHandle {
        &self.handle
    }

    pub fn runner(&self) -> &R {
        &self.runner
    }

    pub fn conntrack(&self) -> &C {
        &self.conntrack
    }

    /// What the table holds as far as this proxier knows (None when unknown).
    pub fn state(&self) -> Option<&KernelState> {
        self.state.as_ref()
    }

    pub fn needs_full_sync(&self) -> bool {
        self.need_full || self.state.is_none()
    }

    /// The periodic check: one small fixed chain listed (never the table). Gone or changed
    /// means someone removed or flushed the table: the next sync writes it afresh.
    pub async fn check_canary(&mut self) {
        if self.state.is_none() {
            return;
        }
        let f = family_word(self.cfg.family);
        match self.runner.list(&["chain", f, TABLE, SERVICES]).await {
            Ok(out) if out.contains(&format!("@{SERVICE_IPS}")) => {}
            Ok(_) => {
                info!("nftables chain {SERVICES} was flushed: the next sync rewrites the table");
                self.state = None;
            }
            Err(e) => {
                info!(error = %e, "nftables table {TABLE} is gone: the next sync rewrites it");
                self.state = None;
            }
        }
    }

    pub async fn sync(&mut self, full: bool) -> Result<SyncOutcome> {
        if !self.handle.initialized() {
            debug!("not syncing nftables until Services and EndpointSlices are synced");
            return Ok(SyncOutcome::NotInitialized);
        }
        let started = std::time::Instant::now();
        let stale_full = self
            .last_full
            .is_none_or(|t| t.elapsed() >= self.full_sync_period);
        let (node, cidrs) = {
            let st = self.handle.state();
            (st.node().clone(), st.service_cidrs().to_vec())
        };
        let mut node_changed = self.cfg.adopt_node(&node, self.node_ips_from_node);
        if cidrs != self.cfg.service_cidrs {
            info!(service_cidrs = ?cidrs, "service CIDRs changed");
            self.cfg.service_cidrs = cidrs;
            node_changed = true;
        }
        let do_full = full || stale_full || node_changed || self.needs_full_sync();
        let want_hc = self.service_health.is_some();
        let now = Instant::now();

        // The kernel state unknown (a start, or the table changed behind our back): the
        // table is read once. Not there: written afresh (a large one in steps, see
        // `KernelState::replace_in_steps`). There (a restart): only what differs is
        // written, in one transaction, never flushing or deleting the table, so that its
        // services keep answering (`KernelState::reconcile`). After a failed restart
        // write, or when the listing does not read as our table, the one-transaction
        // replace.
        let (mut listed, mut table_absent) = (None, false);
        if self.state.is_none() && !self.rewrite_failed {
            let f = family_word(self.cfg.family);
            match self.runner.list(&["table", f, TABLE]).await {
                Ok(out) => {
                    listed = Listed::parse(self.cfg.family, &out);
                    if listed.is_none() {
                        warn!(
                            "cannot read the existing nftables table; replacing it in one transaction"
                        );
                    }
                }
                Err(runner::Error::Failed { stderr, .. })
                    if stderr.contains("No such file or directory") =>
                {
                    debug!("no nftables table to restart over");
                    table_absent = true;
                }
                // Unreadable (a timeout, …): replaced in one transaction, never deleted
                // first.
                Err(e) => {
                    warn!(error = %e, "cannot read the nftables table; replacing it in one transaction")
                }
            }
        }
        let mut existing = None;
        let (planned, replace, changed, udp, hc, triggers) = {
            let mut st = self.handle.state();
            let changed: BTreeSet<_> = st.take_changes();
            let triggers = st.take_trigger_times();
            set_pending(&self.metrics, &st);
            let (services, endpoints) = (st.service_port_map(), st.endpoints_map());
            let base = Base::new(&self.cfg);
            let (planned, replace) = match &self.state {
                Some(s) if s.base_compatible(&base) => {
                    let keys: BTreeSet<ServicePortName> = if do_full {
                        s.services()
                            .keys()
                            .chain(services.keys())
                            .cloned()
                            .collect()
                    } else {
                        let mut k = BTreeSet::new();
                        for nn in &changed {
                            k.extend(ports_of(s.services(), nn).map(|(k, _)| k.clone()));
                            k.extend(ports_of(services, nn).map(|(k, _)| k.clone()));
                        }
                        k
                    };
                    let updates = keys
                        .into_iter()
                        .map(|k| {
                            let new = render_one(&k, services, endpoints, &self.cfg);
                            (k, new)
                        })
                        .collect();
                    (s.diff(&base, updates, now), false)
                }
                _ => {
                    let all: BTreeMap<ServicePortName, ServiceNft> = services
                        .iter()
                        .map(|(k, svc)| {
                            let eps = endpoints.get(k).map_or(&[][..], Vec::as_slice);
                            (k.clone(), render_service(k, svc, eps, &self.cfg))
                        })
                        .collect();
                    let planned = if let Some(l) = &listed {
                        let base2 = base.clone();
                        match KernelState::reconcile(
                            self.cfg.family,
                            base,
                            all,
                            l,
                            REPLACE_STEP,
                            now,
                        ) {
                            Ok(p) => p,
                            // Too much differs for one transaction: in place, in steps.
                            Err(all) => {
                                let e = Existing::from(l);
                                let p = KernelState::rewrite_in_steps(
                                    self.cfg.family,
                                    base2,
                                    all,
                                    REPLACE_STEP,
                                    &e,
                                    now,
                                );
                                existing = Some(e);
                                p
                            }
                        }
                    } else if table_absent && all.len() > REPLACE_STEP {
                        KernelState::replace_in_steps(self.cfg.family, base, all, REPLACE_STEP)
                    } else {
                        KernelState::replace(self.cfg.family, base, all)
                    };
                    (planned, true)
                }
            };
            let udp = conntrack::udp_targets(services, endpoints);
            let hc = want_hc.then(|| health_check_state(&st));
            (planned, replace, changed, udp, hc, triggers)
        };
        let Planned { texts, next } = planned;
        let bytes: usize = texts.iter().map(String::len).sum();
        let kind = if existing.is_some() && replace {
            "rewrite"
        } else if listed.is_some() && replace {
            "restart"
        } else if replace {
            "replace"
        } else if do_full {
            "full"
        } else {
            "partial"
        };
        debug!(kind, changed = changed.len(), "syncing nftables rules");
        let mut result = Ok(());
        for text in &texts {
            result = self
                .runner
                .apply(text)
                .await
                .map_err(|source| Error::Apply { kind, source });
            if result.is_err() {
                break;
            }
        }
        let fam = self.cfg.family.label();
        let secs = started.elapsed().as_secs_f64();
        self.metrics.observe_sync(fam, secs, do_full);

        match result {
            Ok(()) => {
                match next {
                    Next::Replace(s) => self.state = Some(s),
                    // A diff is planned only from a known state, kept until here.
                    Next::Apply(c) => {
                        if let Some(s) = self.state.as_mut() {
                            s.commit(c, now);
                        }
                    }
                }
                if let Some(s) = &self.state {
                    self.record_success(s, &triggers);
                }
                self.need_full = false;
                self.failures = 0;
                self.rewrite_failed = false;
                if do_full {
                    self.last_full = Some(Instant::now());
                }
                record_success(
                    &self.handle,
                    self.cfg.family,
                    self.service_health.as_ref(),
                    hc.as_ref(),
                    &self.conntrack,
                    &udp,
                )
                .await;
                if texts.is_empty() {
                    return Ok(SyncOutcome::Unchanged);
                }
                info!(
                    kind,
                    bytes,
                    transactions = texts.len(),
                    elapsed = secs,
                    "synced nftables rules"
                );
                Ok(SyncOutcome::Applied {
                    full: do_full,
                    changed_services: changed.len(),
                    bytes,
                })
            }
            Err(e) => {
                // The transaction was refused as a whole: the kernel still holds the state
                // we knew (a table written in steps is written afresh next time). The next sync diffs every service against it; if that fails too
                // (the table changed behind our back), the one after replaces the table.
                self.failures += 1;
                self.metrics
                    .nftables_sync_failures
                    .with_label_values(&[fam])
                    .inc();
                if replace || self.failures >= 2 {
                    self.state = None;
                }
                if kind == "rewrite" || kind == "restart" {
                    self.rewrite_failed = true;
                }
                self.need_full = true;
                error!(error = %e, "nftables sync failed; the next sync is a full one");
                Err(e)
            }
        }
    }

    fn record_success(
        &self,
        next: &KernelState,
        triggers: &[(crate::model::NamespacedName, SystemTime)],
    ) {
        let fam = self.cfg.family.label();
        let (mut ni, mut ne) = (0usize, 0usize);
        for s in next.services().values() {
            ni += usize::from(s.no_local_internal);
            ne += usize::from(s.no_local_external);
        }
        self.metrics.set_no_local_endpoints(fam, ni, ne);
        self.metrics.observe_programmed(fam, triggers);
    }
}

fn render_one(
    k: &ServicePortName,
    services: &BTreeMap<ServicePortName, ServicePortInfo>,
    endpoints: &BTreeMap<ServicePortName, Vec<EndpointInfo>>,
    cfg: &RenderConfig,
) -> Option<ServiceNft> {
    let svc = services.get(k)?;
    let eps = endpoints.get(k).map_or(&[][..], Vec::as_slice);
    Some(render_service(k, svc, eps, cfg))
}

impl<R: NftRunner, C: Conntrack> ProxyBackend for NftProxier<R, C> {
    type Error = Error;

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
        NftProxier::check_canary(self).await
    }

    async fn sync(&mut self, full: bool) -> Result<SyncOutcome> {
        NftProxier::sync(self, full).await
    }
}

/// Warns once at start when the proxier's configuration asks for something the nftables
/// mode does not do (upstream: localhost node ports are iptables-only).
pub fn warn_unsupported(cfg: &RenderConfig, localhost_explicit: bool) {
    if localhost_explicit && cfg.localhost_node_ports && cfg.family == IpFamily::V4 {
        warn!(
            "localhostNodePorts is ignored in nftables mode: node ports are not reachable on 127.0.0.1"
        );
    }
}
