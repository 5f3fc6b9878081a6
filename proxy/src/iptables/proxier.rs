//! The iptables mode's [`Backend`]: render the desired ruleset, apply it (full or minimal
//! delta) through an `IptablesRunner`; the [`crate::proxier::Proxier`] remembers what was
//! applied ([`Rendered`]). Partial syncs re-render only the services changed since the last
//! sync (`Rendered::update`); a full sync checks the jump rules (one `iptables-save`) while
//! the ruleset renders.

use std::collections::{BTreeSet, HashSet};
use std::fmt::Write as _;

use prometheus::Registry;
use thiserror::Error;
use tracing::{debug, error, info, warn};

use super::chains::*;
use super::render::Rendered;
use crate::conntrack::{Conntrack, NoConntrack};
use crate::metrics::Metrics;
use crate::model::IpFamily;
use crate::proxier::{self, ApplyInput, Backend, PlanInput};
use crate::render_config::RenderConfig;
use crate::sync_loop::SyncConfig;
use crate::tracker::ProxyHandle;
use plumbing::iptables::{self as runner, IptablesRunner, Position, TableName};

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
pub struct JumpCheck {
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

/// The iptables mode's proxier of one family.
pub type Proxier<R, C = NoConntrack> = proxier::Proxier<IptablesBackend<R>, C>;

/// The iptables mode: its runner (see the module's text).
pub struct IptablesBackend<R: IptablesRunner> {
    runner: R,
}

impl<R: IptablesRunner> IptablesBackend<R> {
    pub fn new(runner: R) -> Self {
        IptablesBackend { runner }
    }

    pub fn runner(&self) -> &R {
        &self.runner
    }
}

impl<R: IptablesRunner> Proxier<R> {
    /// An iptables proxier; `registry` receives the sync metrics.
    pub fn new(
        runner: R,
        cfg: RenderConfig,
        handle: ProxyHandle,
        sync: SyncConfig,
        registry: &Registry,
    ) -> Result<Self> {
        Ok(Self::with_backend(
            IptablesBackend::new(runner),
            cfg,
            handle,
            sync,
            Metrics::new(registry)?,
        ))
    }
}

impl<R: IptablesRunner, C: Conntrack> Proxier<R, C> {
    pub fn runner(&self) -> &R {
        &self.backend().runner
    }

    /// The ruleset believed to be in the kernel (None when unknown).
    pub fn applied(&self) -> Option<&Rendered> {
        self.known()
    }
}

/// One sync's plan: the whole ruleset (a full sync), or the text of a partial sync's
/// minimal delta (the remembered ruleset updated in place).
pub enum Plan {
    Full(Rendered),
    Delta(String),
}

impl<R: IptablesRunner> Backend for IptablesBackend<R> {
    type Error = Error;
    type Known = Rendered;
    /// A full sync's jump check (None for a partial sync).
    type Observed = Option<JumpCheck>;
    type Plan = Plan;
    /// The restore text (empty when nothing needed writing).
    type Written = String;

    const NAME: &'static str = "iptables";

    /// Checks upstream's canary chain; if someone flushed our tables, the next sync is full.
    async fn check_canary(&self, _cfg: &RenderConfig, _known: &mut Option<Rendered>) -> bool {
        match self
            .runner
            .chain_exists(TableName::Mangle, KUBE_PROXY_CANARY)
            .await
        {
            Ok(true) => false,
            Ok(false) => {
                info!("canary chain gone, iptables were flushed: next sync is full");
                true
            }
            Err(e) => {
                warn!(error = %e, "cannot check canary chain");
                false
            }
        }
    }

    async fn observe(
        &self,
        _cfg: &RenderConfig,
        full: bool,
        _known: bool,
    ) -> Result<Self::Observed> {
        if full {
            self.check_jumps().await.map(Some)
        } else {
            Ok(None)
        }
    }

    fn plan(&self, input: &PlanInput<'_>, known: Option<&mut Rendered>) -> Plan {
        let (services, endpoints) = (input.state.service_port_map(), input.state.endpoints_map());
        match known {
            Some(r) if !input.full => {
                Plan::Delta(r.update(services, endpoints, input.changed, input.cfg))
            }
            _ => Plan::Full(Rendered::build(services, endpoints, input.cfg)),
        }
    }

    /// Writes the partial sync's delta, or the whole ruleset with the jump rules found
    /// missing and deletion of the stale chains its nat dump shows.
    async fn apply(
        &mut self,
        plan: Plan,
        observed: Self::Observed,
        input: ApplyInput<'_>,
        known: &mut Option<Rendered>,
    ) -> Result<String> {
        debug!(
            full = input.full,
            changed = input.changed,
            "syncing iptables rules"
        );
        let (text, desired) = match plan {
            Plan::Delta(text) => (text, None),
            Plan::Full(desired) => {
                let jumps = observed.unwrap_or_default();
                let stale = self
                    .stale_nat_chains(&desired, known.as_ref(), jumps.nat_dump)
                    .await;
                (
                    desired.full_text_with_heads(&stale, &jumps.missing),
                    Some(desired),
                )
            }
        };
        if !text.is_empty() {
            let kind = if desired.is_some() { "full" } else { "partial" };
            self.runner
                .restore(&text, true)
                .await
                .map_err(|source| Error::Restore { kind, source })?;
        }
        if let Some(desired) = desired {
            *known = Some(desired);
        }
        Ok(text)
    }

    fn succeeded(
        &mut self,
        text: &String,
        known: Option<&Rendered>,
        family: IpFamily,
        metrics: &Metrics,
    ) -> usize {
        let fam = family.label();
        if let Some(desired) = known {
            for t in [TableName::Filter, TableName::Nat] {
                let (count, t) = (desired.rule_count(t), t.as_str());
                metrics
                    .iptables_total
                    .with_label_values(&[t, fam])
                    .set(count as f64);
                metrics
                    .iptables_last
                    .with_label_values(&[t, fam])
                    .set(count_appends(text, t) as f64);
            }
            let s = desired.stats();
            metrics.set_no_local_endpoints(
                fam,
                s.no_local_endpoints_internal,
                s.no_local_endpoints_external,
            );
        }
        text.len()
    }

    fn log_synced(&self, text: &String, full: bool, secs: f64) {
        info!(
            full,
            bytes = text.len(),
            elapsed = secs,
            "synced iptables rules"
        );
    }

    fn failed(&mut self, e: &Error, full: bool, family: IpFamily, metrics: &Metrics) -> bool {
        error!(error = %e, "sync failed; next sync will be full");
        if matches!(e, Error::Restore { .. }) {
            let fam = family.label();
            metrics.restore_failures.with_label_values(&[fam]).inc();
            if !full {
                metrics
                    .partial_restore_failures
                    .with_label_values(&[fam])
                    .inc();
            }
        }
        // The change set is consumed and the kernel may hold a mix: forget it.
        true
    }
}

impl<R: IptablesRunner> IptablesBackend<R> {
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
    /// fresh `iptables-save`) or in the last applied state (`applied`) that the desired
    /// state no longer has.
    async fn stale_nat_chains(
        &self,
        desired: &Rendered,
        applied: Option<&Rendered>,
        nat_dump: Option<String>,
    ) -> Vec<String> {
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
        if let Some(applied) = applied {
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
