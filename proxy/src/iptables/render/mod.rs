//! Pure rendering: (service ports, endpoints, node facts, config) → desired filter and nat
//! tables in upstream kube-proxy's iptables layout.
//!
//! The result is structured (`Ruleset`, in [`super::ruleset`]: tables → chains → rules) so
//! that the syncer can both print a full `iptables-restore` input and compute a minimal delta
//! against what it applied last time (see `delta`).
//!
//! The syncer keeps the rules per service port (`Rendered`: each service's own chains and its
//! rules in the top-level chains, around the fixed top-level rules of [`base`]; one service's
//! rules come from [`service`]). A partial sync then re-renders only the services the change
//! tracker reports and diffs only those (`Rendered::update`), producing exactly the text
//! `delta(old, render(..))` would, at a cost proportional to the change rather than to the
//! cluster. `render` + `delta` stay as the reference the tests compare against.

use std::cmp::Ordering;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::fmt::Write as _;

use crate::iptables::ruleset::push_added;
use crate::model::{EndpointInfo, NamespacedName, ServicePortInfo, ServicePortName, ports_of};
use crate::render_config::RenderConfig;

mod base;
mod service;

use base::Base;
use service::{Ctx, ServiceRules, render_service};

// What rendering produces, here too: the paths of the former top-level `render` module.
pub use crate::iptables::ruleset::{Chain, RenderStats, Rule, Ruleset, TableRules, delta};
pub use plumbing::iptables::TableName;
pub use service::probability;

/// Above this many endpoints, rules stop carrying per-service comments (upstream's
/// "large cluster mode"), which shrinks the ruleset noticeably.
pub const LARGE_CLUSTER_ENDPOINTS_THRESHOLD: usize = 1000;

fn q(s: &str) -> String {
    format!("\"{s}\"")
}

/// Each service port with its endpoints. Both maps are sorted by name, so one walk pairs them
/// (at thousands of services, cheaper than a map lookup per service).
fn with_endpoints<'m>(
    services: &'m BTreeMap<ServicePortName, ServicePortInfo>,
    endpoints: &'m BTreeMap<ServicePortName, Vec<EndpointInfo>>,
) -> impl Iterator<Item = (&'m ServicePortName, &'m ServicePortInfo, &'m [EndpointInfo])> {
    let mut eps = endpoints.iter().peekable();
    services.iter().map(move |(name, svc)| {
        // Skips the endpoints of ports that have no service (one key comparison per step:
        // at this scale they show in a profile).
        while let Some((k, v)) = eps.peek() {
            match k.cmp(&name) {
                Ordering::Less => eps.next(),
                Ordering::Equal => return (name, svc, v.as_slice()),
                Ordering::Greater => break,
            };
        }
        (name, svc, &[][..])
    })
}

fn is_large_cluster(total_endpoints: usize) -> bool {
    total_endpoints > LARGE_CLUSTER_ENDPOINTS_THRESHOLD
}

/// The desired ruleset kept per service port, so that a partial sync re-renders and diffs
/// only the services that changed (`update`) while a full sync prints everything
/// (`full_text`). `to_ruleset` assembles the plain `Ruleset` (same result as `render`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rendered {
    base: Base,
    large_cluster: bool,
    services: BTreeMap<ServicePortName, ServiceRules>,
    stats: RenderStats,
    filter_rules: usize,
    nat_rules: usize,
}

impl Rendered {
    /// Renders every service.
    pub fn build(
        services: &BTreeMap<ServicePortName, ServicePortInfo>,
        endpoints: &BTreeMap<ServicePortName, Vec<EndpointInfo>>,
        cfg: &RenderConfig,
    ) -> Rendered {
        let base = Base::new(cfg);
        let inputs: Vec<_> = with_endpoints(services, endpoints).collect();
        let total_endpoints: usize = inputs.iter().map(|(_, _, eps)| eps.len()).sum();
        let large_cluster = is_large_cluster(total_endpoints);
        let mut ctx = Ctx::new(cfg, large_cluster);
        let mut r = Rendered {
            filter_rules: base.rule_count(TableName::Filter),
            nat_rules: base.rule_count(TableName::Nat),
            base,
            large_cluster,
            services: BTreeMap::new(),
            stats: RenderStats::default(),
        };
        let mut rendered = Vec::with_capacity(inputs.len());
        for (name, svc, eps) in inputs {
            let s = render_service(name, svc, eps, &mut ctx);
            r.count(&s, true);
            rendered.push((name.clone(), s));
        }
        // Already in key order: collecting builds the map in one pass, without a search per
        // insertion.
        r.services = rendered.into_iter().collect();
        r
    }

    fn count(&mut self, s: &ServiceRules, add: bool) {
        let (f, n) = (s.filter_top.len(), s.nat_rule_count());
        let st = &mut self.stats;
        let (ni, ne) = (
            usize::from(s.no_local_internal),
            usize::from(s.no_local_external),
        );
        if add {
            self.filter_rules += f;
            self.nat_rules += n;
            st.total_endpoints += s.endpoints;
            st.no_local_endpoints_internal += ni;
            st.no_local_endpoints_external += ne;
        } else {
            self.filter_rules -= f;
            self.nat_rules -= n;
            st.total_endpoints -= s.endpoints;
            st.no_local_endpoints_internal -= ni;
            st.no_local_endpoints_external -= ne;
        }
    }

    pub fn stats(&self) -> &RenderStats {
        &self.stats
    }

    /// Number of rules of table `t` (0 for mangle).
    pub fn rule_count(&self, t: TableName) -> usize {
        match t {
            TableName::Filter => self.filter_rules,
            TableName::Nat => self.nat_rules,
            TableName::Mangle => 0,
        }
    }

    /// Names of all desired nat chains.
    pub fn nat_chain_names(&self) -> impl Iterator<Item = &str> {
        self.base.nat.iter().map(|c| c.name).chain(
            self.services
                .values()
                .flat_map(|s| s.chains.iter().map(|c| c.name.as_str())),
        )
    }

    /// The plain ruleset (identical to `render` over the same inputs).
    pub fn to_ruleset(&self) -> Ruleset {
        let mut filter = TableRules::default();
        let mut nat = TableRules::default();
        for (t, table) in [(TableName::Filter, &mut filter), (TableName::Nat, &mut nat)] {
            let base = self.base.table(t);
            for c in base {
                table.declare(c.name, false);
            }
            for c in base {
                for r in &c.head {
                    table.push_rule(c.name, r.clone());
                }
                for s in self.services.values() {
                    for (ch, args) in s.top(t) {
                        if *ch == c.name {
                            table.push_rule(
                                ch,
                                Rule {
                                    args: args.clone(),
                                    pinned_last: false,
                                },
                            );
                        }
                    }
                }
                for r in &c.tail {
                    table.push_rule(c.name, r.clone());
                }
            }
        }
        for s in self.services.values() {
            for c in &s.chains {
                nat.declare(&c.name, c.service_owned);
                for r in &c.rules {
                    nat.push_rule(&c.name, r.clone());
                }
            }
        }
        Ruleset {
            filter,
            nat,
            stats: self.stats.clone(),
        }
    }

    /// Full `iptables-restore --noflush` input; the same text as
    /// `self.to_ruleset().full_text(stale_nat_chains)`, written without building it.
    pub fn full_text(&self, stale_nat_chains: &[String]) -> String {
        self.full_text_with_heads(stale_nat_chains, &[])
    }

    /// `full_text` with, in each table, `heads`' lines for that table first (a table the
    /// rules do not use gets a block of its own). The syncer puts the missing jump rules
    /// there, so that they go in the same transaction as the rules.
    pub fn full_text_with_heads(
        &self,
        stale_nat_chains: &[String],
        heads: &[(TableName, String)],
    ) -> String {
        let mut out = String::with_capacity(self.nat_rules * 96 + self.filter_rules * 128);
        let line = |out: &mut String, parts: &[&str]| {
            for p in parts {
                out.push_str(p);
            }
            out.push('\n');
        };
        let tables = [TableName::Filter, TableName::Nat];
        for (t, head) in heads.iter().filter(|(t, _)| !tables.contains(t)) {
            line(&mut out, &["*", t.as_str()]);
            out.push_str(head);
            out.push_str("COMMIT\n");
        }
        for t in tables {
            let base = self.base.table(t);
            line(&mut out, &["*", t.as_str()]);
            for (_, head) in heads.iter().filter(|(h, _)| *h == t) {
                out.push_str(head);
            }
            for c in base {
                line(&mut out, &[":", c.name, " - [0:0]"]);
            }
            if t == TableName::Nat {
                for s in self.services.values() {
                    for c in &s.chains {
                        line(&mut out, &[":", &c.name, " - [0:0]"]);
                    }
                }
                for c in stale_nat_chains {
                    line(&mut out, &[":", c, " - [0:0]"]);
                }
            }
            for c in base {
                for r in &c.head {
                    line(&mut out, &["-A ", c.name, " ", &r.args]);
                }
                for s in self.services.values() {
                    for (ch, args) in s.top(t) {
                        if *ch == c.name {
                            line(&mut out, &["-A ", ch, " ", args]);
                        }
                    }
                }
                for r in &c.tail {
                    line(&mut out, &["-A ", c.name, " ", &r.args]);
                }
            }
            if t == TableName::Nat {
                for s in self.services.values() {
                    for c in &s.chains {
                        for r in &c.rules {
                            line(&mut out, &["-A ", &c.name, " ", &r.args]);
                        }
                    }
                }
                for c in stale_nat_chains {
                    line(&mut out, &["-X ", c]);
                }
            }
            out.push_str("COMMIT\n");
        }
        out
    }

    /// Brings the rendered state up to date after the services in `changed` (and only those)
    /// changed, and returns the minimal `iptables-restore --noflush` input from the previous
    /// state to the new one: the same text as `delta(&old.to_ruleset(), &new.to_ruleset())`,
    /// at a cost proportional to the changed services. (If the change flips large-cluster
    /// mode, every rule's comments change: then everything is re-rendered and diffed.)
    /// `cfg` must be the configuration `build` was given.
    pub fn update(
        &mut self,
        services: &BTreeMap<ServicePortName, ServicePortInfo>,
        endpoints: &BTreeMap<ServicePortName, Vec<EndpointInfo>>,
        changed: &BTreeSet<NamespacedName>,
        cfg: &RenderConfig,
    ) -> String {
        let mut affected: BTreeSet<ServicePortName> = BTreeSet::new();
        for nn in changed {
            affected.extend(ports_of(&self.services, nn).map(|(k, _)| k.clone()));
            affected.extend(ports_of(services, nn).map(|(k, _)| k.clone()));
        }
        if affected.is_empty() {
            return String::new();
        }
        let mut total = self.stats.total_endpoints;
        for k in &affected {
            if let Some(old) = self.services.get(k) {
                total -= old.endpoints;
            }
            if services.contains_key(k) {
                total += endpoints.get(k).map_or(0, Vec::len);
            }
        }
        if is_large_cluster(total) != self.large_cluster {
            let new = Rendered::build(services, endpoints, cfg);
            let text = delta(&self.to_ruleset(), &new.to_ruleset());
            *self = new;
            return text;
        }

        let mut ctx = Ctx::new(cfg, self.large_cluster);
        let no_eps: Vec<EndpointInfo> = Vec::new();
        let renewed: Vec<(ServicePortName, Option<ServiceRules>)> = affected
            .into_iter()
            .map(|k| {
                let s = services.get(&k).map(|svc| {
                    let eps = endpoints.get(&k).unwrap_or(&no_eps);
                    render_service(&k, svc, eps, &mut ctx)
                });
                (k, s)
            })
            .collect();
        let empty = ServiceRules::default();
        let pairs: Vec<(&ServiceRules, &ServiceRules)> = renewed
            .iter()
            .map(|(k, s)| {
                (
                    self.services.get(k).unwrap_or(&empty),
                    s.as_ref().unwrap_or(&empty),
                )
            })
            .collect();

        let mut out = String::new();
        for t in [TableName::Filter, TableName::Nat] {
            let body = self.partial_table_delta(t, &pairs);
            if !body.is_empty() {
                let _ = writeln!(out, "*{}", t.as_str());
                out.push_str(&body);
                out.push_str("COMMIT\n");
            }
        }

        for (k, s) in renewed {
            if let Some(old) = self.services.remove(&k) {
                self.count(&old, false);
            }
            if let Some(s) = s {
                self.count(&s, true);
                self.services.insert(k, s);
            }
        }
        out
    }

    /// `table_delta` restricted to the (old, new) rules of the changed services; the same
    /// text, since unchanged services contribute identical rules on both sides and no rule
    /// or chain is shared between services.
    fn partial_table_delta(
        &self,
        t: TableName,
        pairs: &[(&ServiceRules, &ServiceRules)],
    ) -> String {
        let mut decl = String::new();
        let mut dels = String::new();
        let mut adds = String::new();
        let mut xs = String::new();

        // Top-level chains: rule-level patch, as `patch_chain`.
        for c in self.base.table(t) {
            let mut added: Vec<&str> = Vec::new();
            for (old, new) in pairs {
                let (o, n) = (old.top_rules(t, c.name), new.top_rules(t, c.name));
                if o == n {
                    continue;
                }
                let mut remaining: HashMap<&str, usize> = HashMap::new();
                for a in &o {
                    *remaining.entry(a).or_default() += 1;
                }
                for a in &n {
                    match remaining.get_mut(a) {
                        Some(k) if *k > 0 => *k -= 1,
                        _ => added.push(a),
                    }
                }
                for a in &o {
                    if let Some(k) = remaining.get_mut(a)
                        && *k > 0
                    {
                        *k -= 1;
                        let _ = writeln!(dels, "-D {} {a}", c.name);
                    }
                }
            }
            let pinned = c.rules().any(|r| r.pinned_last);
            push_added(c.name, &added, pinned, &mut adds);
        }

        if t == TableName::Nat {
            // The services' own chains: rewritten whole when new or different.
            for (old, new) in pairs {
                let prev: HashMap<&str, &Chain> =
                    old.chains.iter().map(|c| (c.name.as_str(), c)).collect();
                for c in &new.chains {
                    if prev
                        .get(c.name.as_str())
                        .is_some_and(|p| p.rules == c.rules)
                    {
                        continue;
                    }
                    let _ = writeln!(decl, ":{} - [0:0]", c.name);
                    for r in &c.rules {
                        let _ = writeln!(adds, "-A {} {}", c.name, r.args);
                    }
                }
            }
            // Unused ones: flushed, then deleted after every jump to them is gone.
            for (old, new) in pairs {
                let keep: HashSet<&str> = new.chains.iter().map(|c| c.name.as_str()).collect();
                for c in old
                    .chains
                    .iter()
                    .filter(|c| !keep.contains(c.name.as_str()))
                {
                    let _ = writeln!(decl, ":{} - [0:0]", c.name);
                    let _ = writeln!(xs, "-X {}", c.name);
                }
            }
        }
        decl + &dels + &adds + &xs
    }
}

/// Renders the desired ruleset. Services are visited in `ServicePortName` order, so the
/// output is deterministic.
pub fn render(
    services: &BTreeMap<ServicePortName, ServicePortInfo>,
    endpoints: &BTreeMap<ServicePortName, Vec<EndpointInfo>>,
    cfg: &RenderConfig,
) -> Ruleset {
    Rendered::build(services, endpoints, cfg).to_ruleset()
}
