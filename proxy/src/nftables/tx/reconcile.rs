//! A restart over a table that is there: what the kernel holds ([`Listed`], read once) is
//! compared with the whole desired table, and one transaction writes only what differs —
//! chains that are missing or whose rules changed (added, or flushed and refilled), sets
//! that are missing or declared otherwise, map and set elements added and deleted, and the
//! service chains the new table no longer has flushed (deleted ≥ `STALE_DELAY` later, as
//! any emptied chain; stale affinity sets with them). The table is never deleted or
//! flushed, so its services keep answering, and nft applies the transaction atomically.
//!
//! What it leads to is what a first sync into an empty table writes (upstream's restart
//! flushes and refills every chain it keeps, in one transaction; the result is the same),
//! except that affinity sets whose declaration did not change keep their entries, as
//! upstream's do (it adds, never flushes, an existing set).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;

use tokio::time::Instant;

use super::listing::{Listed, SetDecl, canon_element, canon_rule};
use super::{KernelState, Next, Planned, StaleKind, Tally, write_elements};
use crate::model::{IpFamily, ServicePortName};
use crate::nftables::names::TABLE;
use crate::nftables::render::{Base, Map, ServiceNft, family_word};

/// The fixed part written over an existing table: its objects added (a no-op where they
/// exist), the fixed chains flushed before their rules are added again, in the same
/// transaction. Returns the text and the fixed chains' names.
pub(super) fn fixed_rewrite(base: &Base, f: &str) -> (String, Vec<String>) {
    let mut out = String::with_capacity(base.fixed.len() + 1024);
    let mut fixed_chains: Vec<String> = Vec::new();
    let mut flushed = false;
    for line in base.fixed.lines() {
        if let Some(rest) = line.strip_prefix("add chain ")
            && let Some(name) = rest.split_whitespace().nth(2)
        {
            fixed_chains.push(name.to_string());
        }
        if !flushed && line.starts_with("add rule ") {
            for c in &fixed_chains {
                let _ = writeln!(out, "flush chain {f} {TABLE} {c}");
            }
            flushed = true;
        }
        out.push_str(line);
        out.push('\n');
    }
    out.push_str(&base.cluster_ips_check);
    (out, fixed_chains)
}

/// Whether the listed table has every object of the fixed part and the fixed chains hold
/// exactly the rules `base` gives them.
fn fixed_matches(base: &Base, f: &str, listed: &Listed) -> bool {
    let prefix = format!("add rule {f} {TABLE} ");
    let mut want: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    for line in base.fixed.lines().chain(base.cluster_ips_check.lines()) {
        let mut w = line.split_whitespace();
        match (w.next(), w.next(), w.nth(2)) {
            (Some("add"), Some("chain"), Some(name)) => {
                want.entry(name).or_default();
            }
            (Some("add"), Some("set" | "map"), Some(name)) if !listed.sets.contains_key(name) => {
                return false;
            }
            _ => {}
        }
        if let Some(rest) = line.strip_prefix(&prefix)
            && let Some((chain, rule)) = rest.split_once(' ')
        {
            want.entry(chain).or_default().push(canon_rule(rule));
        }
    }
    want.iter()
        .all(|(chain, rules)| listed.chains.get(*chain) == Some(rules))
}

/// Chains upstream treats as a service's own (their names hold a `/`).
fn is_service_chain(name: &str) -> bool {
    name.contains('/')
}

fn is_affinity_set(name: &str) -> bool {
    name.starts_with("affinity-")
}

impl KernelState {
    /// See the module's text. When more than `max_changed` service ports differ, the
    /// services are handed back (one transaction that large costs the kernel more than
    /// the table written in steps, see [`KernelState::rewrite_in_steps`]). `now` dates the
    /// chains and sets that became stale.
    pub fn reconcile(
        family: IpFamily,
        base: Base,
        services: BTreeMap<ServicePortName, ServiceNft>,
        listed: &Listed,
        max_changed: usize,
        now: Instant,
    ) -> Result<Planned, BTreeMap<ServicePortName, ServiceNft>> {
        let f = family_word(family);
        let fixed = if fixed_matches(&base, f, listed) {
            String::new()
        } else {
            fixed_rewrite(&base, f).0
        };

        let mut new_objects = String::new();
        let mut flushes = String::new();
        let mut set_renewals = String::new();
        let mut rules = String::new();
        let mut wanted_chains: BTreeSet<&str> = BTreeSet::new();
        let mut wanted_sets: BTreeSet<&str> = BTreeSet::new();
        let mut changed = 0usize;
        let mut tally = Tally::new(&base, services.len());
        for s in services.values() {
            tally.add_all(s);
            let mut renewed = false;
            let mut touched = false;
            for (name, decl) in &s.sets {
                wanted_sets.insert(name);
                match listed.sets.get(name) {
                    None => {
                        let _ = writeln!(new_objects, "add set {f} {TABLE} {name} {decl}");
                        touched = true;
                    }
                    Some(l) if l.decl != SetDecl::from_rendered(decl) => {
                        let _ = writeln!(set_renewals, "delete set {f} {TABLE} {name}");
                        let _ = writeln!(set_renewals, "add set {f} {TABLE} {name} {decl}");
                        renewed = true;
                    }
                    Some(_) => {}
                }
            }
            for c in &s.chains {
                wanted_chains.insert(&c.name);
                match listed.chains.get(&c.name) {
                    None => {
                        let _ = writeln!(new_objects, "add chain {f} {TABLE} {}", c.name);
                    }
                    Some(have)
                        if !renewed
                            && have.len() == c.rules.len()
                            && have.iter().zip(&c.rules).all(|(h, r)| *h == canon_rule(r)) =>
                    {
                        continue;
                    }
                    // An emptied chain (stale in the process before) needs no flush.
                    Some(have) if have.is_empty() => {}
                    Some(_) => {
                        let _ = writeln!(flushes, "flush chain {f} {TABLE} {}", c.name);
                    }
                }
                touched = true;
                for r in &c.rules {
                    let _ = writeln!(rules, "add rule {f} {TABLE} {} {r}", c.name);
                }
            }
            if touched || renewed {
                changed += 1;
                if changed > max_changed {
                    break;
                }
            }
        }
        if changed > max_changed {
            return Err(services);
        }

        // The shared maps' and sets' elements.
        let mut want: BTreeMap<Map, BTreeMap<&str, &str>> = BTreeMap::new();
        for ((map, key), (text, _)) in &tally.entries {
            want.entry(*map).or_default().insert(key, text);
        }
        let (mut deletes, mut adds) = (String::new(), String::new());
        let empty = BTreeMap::new();
        for m in Map::ALL {
            let have = listed.sets.get(m.name()).map_or(&empty, |s| &s.elements);
            let want = want.remove(&m).unwrap_or_default();
            let gone: Vec<&str> = have
                .iter()
                .filter(|(k, text)| {
                    want.get(k.as_str())
                        .is_none_or(|w| canon_element(w) != **text)
                })
                .map(|(k, _)| k.as_str())
                .collect();
            let new: Vec<&str> = want
                .iter()
                .filter(|(k, text)| have.get(**k).is_none_or(|h| *h != canon_element(text)))
                .map(|(_, text)| *text)
                .collect();
            write_elements(&mut deletes, f, "delete", m, &gone);
            write_elements(&mut adds, f, "add", m, &new);
        }

        // What the old table has and the new one does not: service chains emptied now,
        // deleted later with the affinity sets.
        let mut stale = BTreeMap::new();
        for c in listed.chains.keys() {
            if is_service_chain(c) && !wanted_chains.contains(c.as_str()) {
                // One already empty (stale in the process before) needs no flush.
                if !listed.chains[c].is_empty() {
                    let _ = writeln!(flushes, "flush chain {f} {TABLE} {c}");
                }
                stale.insert(c.clone(), (StaleKind::Chain, now));
            }
        }
        for s in listed.sets.keys() {
            if is_affinity_set(s) && !wanted_sets.contains(s.as_str()) {
                stale.insert(s.clone(), (StaleKind::Set, now));
            }
        }

        let mut text = fixed;
        text.push_str(&new_objects);
        text.push_str(&deletes);
        text.push_str(&flushes);
        text.push_str(&set_renewals);
        text.push_str(&rules);
        text.push_str(&adds);
        Ok(Planned {
            texts: if text.is_empty() {
                Vec::new()
            } else {
                vec![text]
            },
            next: Next::Replace(KernelState {
                family,
                base,
                services,
                elements: tally.entries,
                stale,
            }),
        })
    }
}

#[cfg(test)]
mod tests;
