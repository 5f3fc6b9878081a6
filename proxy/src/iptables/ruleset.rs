//! The desired iptables rules as data (`Ruleset`: tables → chains → rules), printed whole as
//! `iptables-restore --noflush` input (`Ruleset::full_text`) or as the minimal change from
//! what was applied before (`delta`). `delta` is the reference the per-service
//! `Rendered::update` (in the `render` module) is tested against.

use std::collections::HashMap;
use std::fmt::Write as _;

use super::chains::is_service_chain;
use plumbing::iptables::TableName;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rule {
    /// Everything after `-A CHAIN `.
    pub args: String,
    /// Must stay after all other rules of its chain (the KUBE-NODEPORTS jump).
    pub pinned_last: bool,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Chain {
    pub name: String,
    /// Per-service chain (rewritten whole on change, deleted when unused), as opposed to a
    /// top-level chain that is patched rule by rule.
    pub service_owned: bool,
    pub rules: Vec<Rule>,
}

/// The chains of one table, in declaration order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TableRules {
    chains: Vec<Chain>,
    index: HashMap<String, usize>,
}

impl TableRules {
    pub(super) fn declare(&mut self, name: &str, service_owned: bool) {
        if !self.index.contains_key(name) {
            self.index.insert(name.to_string(), self.chains.len());
            self.chains.push(Chain {
                name: name.to_string(),
                service_owned,
                rules: Vec::new(),
            });
        }
    }

    pub(super) fn push_rule(&mut self, chain: &str, rule: Rule) {
        let i = match self.index.get(chain) {
            Some(i) => *i,
            None => {
                self.declare(chain, is_service_chain(chain));
                self.chains.len() - 1
            }
        };
        self.chains[i].rules.push(rule);
    }

    pub fn chains(&self) -> &[Chain] {
        &self.chains
    }

    pub fn chain(&self, name: &str) -> Option<&Chain> {
        self.index.get(name).map(|i| &self.chains[*i])
    }

    pub fn rule_count(&self) -> usize {
        self.chains.iter().map(|c| c.rules.len()).sum()
    }
}

/// Counters the syncer turns into metrics.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RenderStats {
    pub total_endpoints: usize,
    pub no_local_endpoints_internal: usize,
    pub no_local_endpoints_external: usize,
}

/// The complete desired state of kube-proxy's chains.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Ruleset {
    pub filter: TableRules,
    pub nat: TableRules,
    pub stats: RenderStats,
}

impl Ruleset {
    pub fn table(&self, t: TableName) -> Option<&TableRules> {
        match t {
            TableName::Filter => Some(&self.filter),
            TableName::Nat => Some(&self.nat),
            TableName::Mangle => None,
        }
    }

    /// Full `iptables-restore --noflush` input: every chain declared (hence flushed) and
    /// refilled, plus deletion of `stale_nat_chains` (per-service chains found in the kernel
    /// that are no longer wanted).
    pub fn full_text(&self, stale_nat_chains: &[String]) -> String {
        let mut out = String::new();
        write_full_table(&mut out, TableName::Filter, &self.filter, &[]);
        write_full_table(&mut out, TableName::Nat, &self.nat, stale_nat_chains);
        out
    }
}

fn write_full_table(out: &mut String, t: TableName, table: &TableRules, stale: &[String]) {
    let _ = writeln!(out, "*{}", t.as_str());
    for c in &table.chains {
        let _ = writeln!(out, ":{} - [0:0]", c.name);
    }
    for c in stale {
        let _ = writeln!(out, ":{c} - [0:0]");
    }
    for c in &table.chains {
        for r in &c.rules {
            let _ = writeln!(out, "-A {} {}", c.name, r.args);
        }
    }
    for c in stale {
        let _ = writeln!(out, "-X {c}");
    }
    out.push_str("COMMIT\n");
}

/// Minimal `iptables-restore --noflush` input turning `applied` into `desired`:
/// per-service chains that are new or differ are declared (flushed) and refilled, unused ones
/// are flushed and deleted, and top-level chains get only `-D`/`-A` for the rules that changed
/// (never redeclared: on iptables-nft that costs 100× more at scale). Returns an empty string
/// when nothing changed.
///
/// Ordering inside each table: declarations, then `-D`, then `-A`/`-I`, then `-X`; so rules
/// that jump to a doomed chain are gone before it is deleted. Rules added to a chain whose
/// last rule must stay last (the KUBE-NODEPORTS jump) are inserted at its head.
pub fn delta(applied: &Ruleset, desired: &Ruleset) -> String {
    let mut out = String::new();
    for t in [TableName::Filter, TableName::Nat] {
        let (Some(old), Some(new)) = (applied.table(t), desired.table(t)) else {
            continue;
        };
        let body = table_delta(old, new);
        if !body.is_empty() {
            let _ = writeln!(out, "*{}", t.as_str());
            out.push_str(&body);
            out.push_str("COMMIT\n");
        }
    }
    out
}

fn table_delta(old: &TableRules, new: &TableRules) -> String {
    let mut decl = String::new();
    let mut dels = String::new();
    let mut adds = String::new();
    let mut xs = String::new();
    for chain in &new.chains {
        match old.chain(&chain.name) {
            None => {
                let _ = writeln!(decl, ":{} - [0:0]", chain.name);
                for r in &chain.rules {
                    let _ = writeln!(adds, "-A {} {}", chain.name, r.args);
                }
            }
            Some(prev) if chain.service_owned => {
                if prev.rules != chain.rules {
                    let _ = writeln!(decl, ":{} - [0:0]", chain.name);
                    for r in &chain.rules {
                        let _ = writeln!(adds, "-A {} {}", chain.name, r.args);
                    }
                }
            }
            Some(prev) => patch_chain(&chain.name, &prev.rules, &chain.rules, &mut dels, &mut adds),
        }
    }
    for chain in &old.chains {
        if new.chain(&chain.name).is_none() {
            let _ = writeln!(decl, ":{} - [0:0]", chain.name);
            let _ = writeln!(xs, "-X {}", chain.name);
        }
    }
    decl + &dels + &adds + &xs
}

/// Rule-level patch of a top-level chain (multiset difference, order of `new` kept).
fn patch_chain(name: &str, old: &[Rule], new: &[Rule], dels: &mut String, adds: &mut String) {
    let mut remaining: HashMap<&str, usize> = HashMap::new();
    for r in old {
        *remaining.entry(r.args.as_str()).or_default() += 1;
    }
    let mut added: Vec<&Rule> = Vec::new();
    let mut kept_pinned: Vec<&Rule> = Vec::new();
    for r in new {
        match remaining.get_mut(r.args.as_str()) {
            Some(n) if *n > 0 => {
                *n -= 1;
                if r.pinned_last {
                    kept_pinned.push(r);
                }
            }
            _ => added.push(r),
        }
    }
    // What is left in `remaining` is gone from the desired state.
    for r in old {
        if let Some(n) = remaining.get_mut(r.args.as_str())
            && *n > 0
        {
            *n -= 1;
            let _ = writeln!(dels, "-D {name} {}", r.args);
        }
    }
    let unpinned: Vec<&str> = added
        .iter()
        .filter(|r| !r.pinned_last)
        .map(|r| r.args.as_str())
        .collect();
    push_added(name, &unpinned, !kept_pinned.is_empty(), adds);
    for r in added.iter().filter(|r| r.pinned_last) {
        let _ = writeln!(adds, "-A {name} {}", r.args);
    }
}

/// Adds `rules` to top-level chain `name`: appended, or, when the chain keeps a rule that
/// must stay last (`pinned`), inserted at its head in their order. (Moving the pinned rule
/// instead would take a `-D`, for which iptables-nft reads every rule of the chain: ~3×
/// the cost of the whole change at 5k services. The order of service rules among
/// themselves does not matter: each matches its own address and port.)
pub(super) fn push_added(name: &str, rules: &[&str], pinned: bool, adds: &mut String) {
    if pinned {
        for r in rules.iter().rev() {
            let _ = writeln!(adds, "-I {name} {r}");
        }
    } else {
        for r in rules {
            let _ = writeln!(adds, "-A {name} {r}");
        }
    }
}
