//! A large table that is already there (a restart) written in bounded steps without ever
//! deleting or flushing the table, so its services keep answering: the fixed chains
//! refilled; then the service ports' chains, a step at a time (existing ones flushed and
//! refilled: the maps still point at them, now or with their old rules); last, in one
//! transaction, every map and set emptied and refilled and the chains the old table had
//! but the new one does not flushed (deleted ≥ `STALE_DELAY` later, as any emptied chain).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;

use tokio::time::Instant;

use super::{KernelState, Next, Planned, StaleKind, Tally};
use crate::model::{IpFamily, ServicePortName};
use crate::nftables::names::TABLE;
use crate::nftables::render::{Base, Map, ServiceNft, family_word};

/// The names of the chains and sets a table holds (from `nft list chains` / `nft list
/// sets`: headers only are read, never the rules).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Existing {
    pub chains: BTreeSet<String>,
    pub sets: BTreeSet<String>,
}

impl From<&super::Listed> for Existing {
    fn from(l: &super::Listed) -> Self {
        Existing {
            chains: l.chains.keys().cloned().collect(),
            sets: l.sets.keys().cloned().collect(),
        }
    }
}

impl Existing {
    /// The `kube-proxy` table's chains and sets of `family` in `nft list chains|sets`
    /// output (other tables' are skipped).
    pub fn parse(family: IpFamily, listing: &str) -> Existing {
        let header = format!("table {} {TABLE} {{", family_word(family));
        let mut out = Existing::default();
        let mut ours = false;
        for line in listing.lines() {
            let l = line.trim();
            if l.starts_with("table ") {
                ours = l == header;
                continue;
            }
            if !ours {
                continue;
            }
            let mut w = l.split_whitespace();
            match (w.next(), w.next(), w.next()) {
                (Some("chain"), Some(name), Some("{")) => {
                    out.chains.insert(name.to_string());
                }
                (Some("set"), Some(name), Some("{")) => {
                    out.sets.insert(name.to_string());
                }
                _ => {}
            }
        }
        out
    }
}

/// Sets among the shared maps (flushed with `flush set`, the others with `flush map`).
fn is_set(m: Map) -> bool {
    matches!(m, Map::ClusterIps | Map::NodeportIps)
}

impl KernelState {
    /// See the module's text. `existing` is what the old table holds; `now` dates its
    /// chains and sets that the new state does not have (they become stale).
    pub fn rewrite_in_steps(
        family: IpFamily,
        base: Base,
        services: BTreeMap<ServicePortName, ServiceNft>,
        per_step: usize,
        existing: &Existing,
        now: Instant,
    ) -> Planned {
        let f = family_word(family);
        let mut texts = Vec::new();

        // 1. The fixed part: objects added (a no-op where they exist), the fixed chains
        //    flushed and refilled in the same transaction.
        let (first, fixed_chains) = super::reconcile::fixed_rewrite(&base, f);
        texts.push(first);

        // 2. The service ports' chains and sets, `per_step` ports a transaction.
        let mut tally = Tally::new(&base, services.len());
        let mut wanted: BTreeSet<&str> = fixed_chains.iter().map(String::as_str).collect();
        let all: Vec<&ServiceNft> = services.values().collect();
        for chunk in all.chunks(per_step.max(1)) {
            let mut t = String::with_capacity(chunk.len() * 1000);
            for s in chunk {
                for (name, decl) in &s.sets {
                    wanted.insert(name);
                    if existing.sets.contains(name) {
                        // Affinity entries start afresh, as they do on any restart.
                        let _ = writeln!(t, "flush set {f} {TABLE} {name}");
                    } else {
                        let _ = writeln!(t, "add set {f} {TABLE} {name} {decl}");
                    }
                }
                for c in &s.chains {
                    wanted.insert(&c.name);
                    let _ = writeln!(t, "add chain {f} {TABLE} {}", c.name);
                    if existing.chains.contains(&c.name) {
                        let _ = writeln!(t, "flush chain {f} {TABLE} {}", c.name);
                    }
                }
            }
            for s in chunk {
                for c in &s.chains {
                    for r in &c.rules {
                        let _ = writeln!(t, "add rule {f} {TABLE} {} {r}", c.name);
                    }
                }
                tally.add_all(s);
            }
            texts.push(t);
        }

        // 3. Every map and set refilled at once; the old table's leftovers emptied.
        let mut last = String::new();
        for m in Map::ALL {
            let kind = if is_set(m) { "set" } else { "map" };
            let _ = writeln!(last, "flush {kind} {f} {TABLE} {}", m.name());
        }
        tally.write_adds(&mut last, f);
        let mut stale = BTreeMap::new();
        for c in existing
            .chains
            .iter()
            .filter(|c| !wanted.contains(c.as_str()))
        {
            let _ = writeln!(last, "flush chain {f} {TABLE} {c}");
            stale.insert(c.clone(), (StaleKind::Chain, now));
        }
        let shared: Vec<&str> = Map::ALL.iter().map(|m| m.name()).collect();
        for s in existing.sets.iter() {
            if !wanted.contains(s.as_str()) && !shared.contains(&s.as_str()) {
                stale.insert(s.clone(), (StaleKind::Set, now));
            }
        }
        texts.push(last);
        Planned {
            texts,
            next: Next::Replace(KernelState {
                family,
                base,
                services,
                elements: tally.entries,
                stale,
            }),
        }
    }
}
