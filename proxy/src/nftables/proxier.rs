//! The nftables mode's [`Backend`]: renders upstream's `kube-proxy` table and applies it
//! through an [`NftRunner`]; the [`crate::proxier::Proxier`] remembers what it wrote
//! ([`KernelState`]), so that no sync ever lists the table. The first sync (and the one
//! after the kernel state became unknown) replaces the table in one transaction; every
//! other sync, full or partial, writes only the difference.

use std::collections::{BTreeMap, BTreeSet};

use prometheus::Registry;
use thiserror::Error;
use tokio::time::Instant;
use tracing::{debug, error, info, warn};

use super::names::{SERVICE_IPS, SERVICES, TABLE};
use super::render::{Base, ServiceNft, family_word, render_service};
use super::runner::{self, NftRunner};
use super::tx::{Existing, KernelState, Listed, Next, Planned};
use crate::conntrack::{Conntrack, NoConntrack};
use crate::metrics::Metrics;
use crate::model::{EndpointInfo, IpFamily, ServicePortInfo, ServicePortName, ports_of};
use crate::proxier::{self, ApplyInput, Backend, PlanInput};
use crate::render_config::RenderConfig;
use crate::sync_loop::SyncConfig;
use crate::tracker::ProxyHandle;

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

/// The nftables mode's proxier of one family.
pub type NftProxier<R, C = NoConntrack> = proxier::Proxier<NftBackend<R>, C>;

/// The nftables mode: its runner and what the last failures leave for the next sync.
pub struct NftBackend<R: NftRunner> {
    runner: R,
    /// Consecutive failed transactions; the second in a row forgets the state.
    failures: u32,
    /// A rewrite in place of a large table failed: the next one replaces it whole.
    rewrite_failed: bool,
}

impl<R: NftRunner> NftBackend<R> {
    pub fn new(runner: R) -> Self {
        NftBackend {
            runner,
            failures: 0,
            rewrite_failed: false,
        }
    }

    pub fn runner(&self) -> &R {
        &self.runner
    }
}

impl<R: NftRunner> NftProxier<R> {
    /// An nftables proxier; `registry` receives the sync metrics.
    pub fn new(
        runner: R,
        cfg: RenderConfig,
        handle: ProxyHandle,
        sync: SyncConfig,
        registry: &Registry,
    ) -> Result<Self> {
        Ok(Self::with_backend(
            NftBackend::new(runner),
            cfg,
            handle,
            sync,
            Metrics::new(registry)?,
        ))
    }
}

impl<R: NftRunner, C: Conntrack> NftProxier<R, C> {
    pub fn runner(&self) -> &R {
        &self.backend().runner
    }

    /// What the table holds as far as this proxier knows (None when unknown).
    pub fn state(&self) -> Option<&KernelState> {
        self.known()
    }
}

/// What a sync with nothing known of the kernel found of the table: its listing, when it
/// reads as our table, or that there is none.
#[derive(Debug, Default)]
pub struct Found {
    listed: Option<Listed>,
    table_absent: bool,
}

/// One sync's plan: the difference to the known state, or (nothing usable known) every
/// service port rendered, for a transaction chosen once the table's listing is in.
pub enum Plan {
    Diff {
        planned: Planned,
        now: Instant,
    },
    Whole {
        base: Base,
        all: BTreeMap<ServicePortName, ServiceNft>,
        now: Instant,
    },
}

/// What one sync wrote: the transactions' texts.
#[derive(Debug)]
pub struct Written {
    kind: &'static str,
    texts: Vec<String>,
}

impl Written {
    fn bytes(&self) -> usize {
        self.texts.iter().map(String::len).sum()
    }
}

impl<R: NftRunner> Backend for NftBackend<R> {
    type Error = Error;
    type Known = KernelState;
    type Observed = Found;
    type Plan = Plan;
    type Written = Written;

    const NAME: &'static str = "nftables";
    const FOLLOWS_SERVICE_CIDRS: bool = true;

    /// The periodic check: one small fixed chain listed (never the table). Gone or changed
    /// means someone removed or flushed the table: the next sync writes it afresh.
    async fn check_canary(&self, cfg: &RenderConfig, known: &mut Option<KernelState>) -> bool {
        if known.is_none() {
            return false;
        }
        let f = family_word(cfg.family);
        match self.runner.list(&["chain", f, TABLE, SERVICES]).await {
            Ok(out) if out.contains(&format!("@{SERVICE_IPS}")) => false,
            Ok(_) => {
                info!("nftables chain {SERVICES} was flushed: the next sync rewrites the table");
                *known = None;
                true
            }
            Err(e) => {
                info!(error = %e, "nftables table {TABLE} is gone: the next sync rewrites it");
                *known = None;
                true
            }
        }
    }

    /// The kernel state unknown (a start, or the table changed behind our back): the
    /// table is read once. Not there: written afresh (a large one in steps, see
    /// `KernelState::replace_in_steps`). There (a restart): only what differs is
    /// written, in one transaction, never flushing or deleting the table, so that its
    /// services keep answering (`KernelState::reconcile`). After a failed restart
    /// write, or when the listing does not read as our table, the one-transaction
    /// replace.
    async fn observe(&self, cfg: &RenderConfig, _full: bool, known: bool) -> Result<Found> {
        let mut found = Found::default();
        if known || self.rewrite_failed {
            return Ok(found);
        }
        let f = family_word(cfg.family);
        match self.runner.list(&["table", f, TABLE]).await {
            Ok(out) => {
                found.listed = Listed::parse(cfg.family, &out);
                if found.listed.is_none() {
                    warn!(
                        "cannot read the existing nftables table; replacing it in one transaction"
                    );
                }
            }
            Err(runner::Error::Failed { stderr, .. })
                if stderr.contains("No such file or directory") =>
            {
                debug!("no nftables table to restart over");
                found.table_absent = true;
            }
            // Unreadable (a timeout, …): replaced in one transaction, never deleted
            // first.
            Err(e) => {
                warn!(error = %e, "cannot read the nftables table; replacing it in one transaction")
            }
        }
        Ok(found)
    }

    fn plan(&self, input: &PlanInput<'_>, known: Option<&mut KernelState>) -> Plan {
        let now = Instant::now();
        let (services, endpoints) = (input.state.service_port_map(), input.state.endpoints_map());
        let cfg = input.cfg;
        let base = Base::new(cfg);
        match known {
            Some(s) if s.base_compatible(&base) => {
                let keys: BTreeSet<ServicePortName> = if input.full {
                    s.services()
                        .keys()
                        .chain(services.keys())
                        .cloned()
                        .collect()
                } else {
                    let mut k = BTreeSet::new();
                    for nn in input.changed {
                        k.extend(ports_of(s.services(), nn).map(|(k, _)| k.clone()));
                        k.extend(ports_of(services, nn).map(|(k, _)| k.clone()));
                    }
                    k
                };
                let updates = keys
                    .into_iter()
                    .map(|k| {
                        let new = render_one(&k, services, endpoints, cfg);
                        (k, new)
                    })
                    .collect();
                Plan::Diff {
                    planned: s.diff(&base, updates, now),
                    now,
                }
            }
            _ => {
                let all = services
                    .iter()
                    .map(|(k, svc)| {
                        let eps = endpoints.get(k).map_or(&[][..], Vec::as_slice);
                        (k.clone(), render_service(k, svc, eps, cfg))
                    })
                    .collect();
                Plan::Whole { base, all, now }
            }
        }
    }

    async fn apply(
        &mut self,
        plan: Plan,
        found: Found,
        input: ApplyInput<'_>,
        known: &mut Option<KernelState>,
    ) -> Result<Written> {
        let family = input.cfg.family;
        let (planned, replace, now, existing) = match plan {
            Plan::Diff { planned, now } => (planned, false, now, None),
            Plan::Whole { base, all, now } => {
                let mut existing = None;
                let planned = if let Some(l) = &found.listed {
                    let base2 = base.clone();
                    match KernelState::reconcile(family, base, all, l, REPLACE_STEP, now) {
                        Ok(p) => p,
                        // Too much differs for one transaction: in place, in steps.
                        Err(all) => {
                            let e = Existing::from(l);
                            let p = KernelState::rewrite_in_steps(
                                family,
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
                } else if found.table_absent && all.len() > REPLACE_STEP {
                    KernelState::replace_in_steps(family, base, all, REPLACE_STEP)
                } else {
                    KernelState::replace(family, base, all)
                };
                (planned, true, now, existing)
            }
        };
        let Planned { texts, next } = planned;
        let kind = if existing.is_some() && replace {
            "rewrite"
        } else if found.listed.is_some() && replace {
            "restart"
        } else if replace {
            "replace"
        } else if input.full {
            "full"
        } else {
            "partial"
        };
        debug!(kind, changed = input.changed, "syncing nftables rules");
        for text in &texts {
            self.runner
                .apply(text)
                .await
                .map_err(|source| Error::Apply { kind, source })?;
        }
        match next {
            Next::Replace(s) => *known = Some(s),
            // A diff is planned only from a known state, kept until here.
            Next::Apply(c) => {
                if let Some(s) = known.as_mut() {
                    s.commit(c, now);
                }
            }
        }
        self.failures = 0;
        self.rewrite_failed = false;
        Ok(Written { kind, texts })
    }

    fn succeeded(
        &mut self,
        written: &Written,
        known: Option<&KernelState>,
        family: IpFamily,
        metrics: &Metrics,
    ) -> usize {
        if let Some(next) = known {
            let (mut ni, mut ne) = (0usize, 0usize);
            for s in next.services().values() {
                ni += usize::from(s.no_local_internal);
                ne += usize::from(s.no_local_external);
            }
            metrics.set_no_local_endpoints(family.label(), ni, ne);
        }
        written.bytes()
    }

    fn log_synced(&self, written: &Written, _full: bool, secs: f64) {
        info!(
            kind = written.kind,
            bytes = written.bytes(),
            transactions = written.texts.len(),
            elapsed = secs,
            "synced nftables rules"
        );
    }

    /// The transaction was refused as a whole: the kernel still holds the state we knew
    /// (a table written in steps is written afresh next time). The next sync diffs every
    /// service against it; if that fails too (the table changed behind our back), the one
    /// after replaces the table.
    fn failed(&mut self, e: &Error, _full: bool, family: IpFamily, metrics: &Metrics) -> bool {
        self.failures += 1;
        metrics
            .nftables_sync_failures
            .with_label_values(&[family.label()])
            .inc();
        let kind = match e {
            Error::Apply { kind, .. } => *kind,
            Error::Metrics(_) => "",
        };
        let replace = matches!(kind, "rewrite" | "restart" | "replace");
        if kind == "rewrite" || kind == "restart" {
            self.rewrite_failed = true;
        }
        error!(error = %e, "nftables sync failed; the next sync is a full one");
        replace || self.failures >= 2
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

/// Warns once at start when the proxier's configuration asks for something the nftables
/// mode does not do (upstream: localhost node ports are iptables-only).
pub fn warn_unsupported(cfg: &RenderConfig, localhost_explicit: bool) {
    if localhost_explicit && cfg.localhost_node_ports && cfg.family == IpFamily::V4 {
        warn!(
            "localhostNodePorts is ignored in nftables mode: node ports are not reachable on 127.0.0.1"
        );
    }
}
