//! The iptables proxier: render the desired ruleset, apply it (full or minimal delta) through
//! an `IptablesRunner`, and remember what was applied. Partial syncs re-render only the
//! services changed since the last sync (`Rendered::update`). It runs on the debounced
//! schedule of [`crate::sync_loop`], as a [`ProxyBackend`].

use std::collections::{BTreeSet, HashSet};
use std::fmt::Write as _;
use std::time::Duration;

use prometheus::Registry;
use thiserror::Error;
use tokio::time::Instant;
use tracing::{debug, error, info, warn};

use super::chains::*;
use super::render::Rendered;
use super::runner::{self, IptablesRunner, Position, TableName};
use crate::conntrack::{self, Conntrack, NoConntrack};
use crate::health::{ServiceHealthServer, health_check_state};
use crate::metrics::Metrics;
use crate::model::IpFamily;
use crate::render_config::RenderConfig;
use crate::sync_loop::ProxyBackend;
use crate::tracker::set_pending;

// The handles, the loop and its types lived here before they became backend-neutral; their
// old paths keep working.
use crate::success::record_success;
use crate::sync_loop::{SyncConfig, SyncOutcome};
use crate::tracker::ProxyHandle;

#[derive(Debug, Error)]
pub enum Error {
    #[error("ensuring {table} {chain}: {source}")]
    Jump {
        table: &'static str,
        chain: String,
        #[source]
        source: runner::Error,
    },
    #[error("iptables-restore failed ({kind} sync): {source}")]
    Restore {
        kind: &'static str,
        #[source]
        source: runner::Error,
    },
    #[error("registering metrics: {0}")]
    Metrics(#[from] prometheus::Error),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

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
        handle.set_metrics(metrics.clone());
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
        let node_changed = self.cfg.adopt_node(&node, self.node_ips_from_node);
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
        self.metrics.observe_sync(fam, secs, do_full);

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
                self.metrics.set_no_local_endpoints(
                    fam,
                    s.no_local_endpoints_internal,
                    s.no_local_endpoints_external,
                );
                self.metrics.observe_programmed(fam, &triggers);
                self.applied = Some(desired);
                self.need_full = false;
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

impl<R: IptablesRunner, C: Conntrack> ProxyBackend for Proxier<R, C> {
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
        Proxier::check_canary(self).await
    }

    async fn sync(&mut self, full: bool) -> Result<SyncOutcome> {
        Proxier::sync(self, full).await
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
