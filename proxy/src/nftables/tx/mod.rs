//! What the kernel holds ([`KernelState`], kept by the proxier instead of ever listing the
//! table) and the `nft -f` transactions that change it: a whole table written afresh, or
//! the difference to a new state — the changed services' chains flushed and refilled, map
//! elements added and deleted, emptied chains and sets deleted only in a later transaction
//! (≥ [`STALE_DELAY`] after, so that no packet is still on its way through them).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt::Write as _;
use std::time::Duration;

use tokio::time::Instant;

use super::names::TABLE;
use super::render::{Base, Map, ServiceNft, family_word};
use crate::model::{IpFamily, ServicePortName};

pub mod listing;
mod reconcile;
mod rewrite;
pub use listing::Listed;
pub use rewrite::Existing;

/// How long an emptied chain or set waits before it is deleted (upstream waits a second).
pub const STALE_DELAY: Duration = Duration::from_secs(1);

/// Elements above this many go into several `add element` commands.
const ELEMENTS_PER_COMMAND: usize = 1000;

/// An element of a shared map: the map and the element's key.
type ElementKey = (Map, String);

/// An element's text as written and the number of service ports that add it.
type ElementEntry = (String, u32);

/// A chain or set emptied and no longer referenced, waiting for deletion.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StaleKind {
    Chain,
    Set,
}

/// The table's contents as this process last wrote them.
#[derive(Clone, Debug)]
pub struct KernelState {
    family: IpFamily,
    base: Base,
    services: BTreeMap<ServicePortName, ServiceNft>,
    /// Every element with the number of service ports that add it (two ports of one
    /// service share their cluster IP in `cluster-ips`).
    elements: HashMap<ElementKey, ElementEntry>,
    stale: BTreeMap<String, (StaleKind, Instant)>,
}

/// The transactions (applied in order; none when nothing differs) and the state they lead
/// to, to be kept once they all succeeded.
#[derive(Debug)]
pub struct Planned {
    pub texts: Vec<String>,
    pub next: Next,
}

/// The state after a transaction: a whole new one, or changes to the current one (a diff
/// never copies the state: at 10k services that copy would cost more than the change).
#[derive(Debug)]
pub enum Next {
    Replace(KernelState),
    Apply(Changes),
}

/// What a diff changes in the [`KernelState`] it was computed from.
#[derive(Debug, Default)]
pub struct Changes {
    base: Option<Base>,
    services: Vec<(ServicePortName, Option<ServiceNft>)>,
    /// New reference count and text of each touched element (`None`: deleted).
    elements: Vec<(ElementKey, Option<ElementEntry>)>,
    stale_added: Vec<(String, StaleKind)>,
    /// Stale entries re-added (they exist again) or deleted by the transaction.
    stale_removed: Vec<String>,
}

impl KernelState {
    pub fn services(&self) -> &BTreeMap<ServicePortName, ServiceNft> {
        &self.services
    }

    /// Chains and sets emptied and still waiting for deletion.
    pub fn stale(&self) -> impl Iterator<Item = (&str, StaleKind)> {
        self.stale.iter().map(|(n, (k, _))| (n.as_str(), *k))
    }

    /// Rules of the per-service chains (the `kubeproxy_sync_proxy_rules_nftables_*` gauges
    /// would count objects; this is what the logs show).
    pub fn chain_count(&self) -> usize {
        self.services.values().map(|s| s.chains.len()).sum()
    }

    /// The whole table, written from nothing: `add table` + `delete table` first, so that
    /// whatever an earlier process left is replaced in the same atomic transaction.
    pub fn replace(
        family: IpFamily,
        base: Base,
        services: BTreeMap<ServicePortName, ServiceNft>,
    ) -> Planned {
        Self::build(family, base, services, None)
    }

    /// The whole table in several transactions, for a table that is not there yet: the
    /// first makes the table with its fixed part and empty maps, each next one adds the
    /// chains and rules of `per_step` service ports, the last the map elements that make
    /// them reachable (so no packet meets a half-built service). The kernel binds every
    /// anonymous verdict map (one per service port) by walking the whole transaction, so a
    /// single transaction costs the square of the cluster's size (see nftables/README.md).
    pub fn replace_in_steps(
        family: IpFamily,
        base: Base,
        services: BTreeMap<ServicePortName, ServiceNft>,
        per_step: usize,
    ) -> Planned {
        Self::build(family, base, services, Some(per_step.max(1)))
    }

    fn build(
        family: IpFamily,
        base: Base,
        services: BTreeMap<ServicePortName, ServiceNft>,
        per_step: Option<usize>,
    ) -> Planned {
        let f = family_word(family);
        let mut texts = Vec::new();
        let mut text = String::with_capacity(match per_step {
            Some(n) => n.min(services.len()) * 900 + base.fixed.len() + 256,
            None => services.len() * 900 + base.fixed.len() + 256,
        });
        let _ = writeln!(text, "add table {f} {TABLE}");
        let _ = writeln!(text, "delete table {f} {TABLE}");
        text.push_str(&base.fixed);
        text.push_str(&base.cluster_ips_check);
        let mut tally = Tally::new(&base, services.len());
        let all: Vec<&ServiceNft> = services.values().collect();
        for chunk in all.chunks(per_step.unwrap_or(all.len().max(1))) {
            if per_step.is_some() {
                texts.push(std::mem::take(&mut text));
            }
            for s in chunk {
                for (name, decl) in &s.sets {
                    let _ = writeln!(text, "add set {f} {TABLE} {name} {decl}");
                }
                for c in &s.chains {
                    let _ = writeln!(text, "add chain {f} {TABLE} {}", c.name);
                }
            }
            for s in chunk {
                for c in &s.chains {
                    for r in &c.rules {
                        let _ = writeln!(text, "add rule {f} {TABLE} {} {r}", c.name);
                    }
                }
                tally.add_all(s);
            }
        }
        if per_step.is_some() {
            texts.push(std::mem::take(&mut text));
        }
        tally.write_adds(&mut text, f);
        texts.push(text);
        texts.retain(|t| !t.is_empty());
        Planned {
            texts,
            next: Next::Replace(KernelState {
                family,
                base,
                services,
                elements: tally.entries,
                stale: BTreeMap::new(),
            }),
        }
    }

    /// Keeps what a successful diff's transaction did; `now` dates the newly stale.
    pub fn commit(&mut self, c: Changes, now: Instant) {
        if let Some(b) = c.base {
            self.base = b;
        }
        for (k, v) in c.services {
            match v {
                Some(s) => {
                    self.services.insert(k, s);
                }
                None => {
                    self.services.remove(&k);
                }
            }
        }
        for (k, v) in c.elements {
            match v {
                Some(e) => {
                    self.elements.insert(k, e);
                }
                None => {
                    self.elements.remove(&k);
                }
            }
        }
        for n in c.stale_removed {
            self.stale.remove(&n);
        }
        for (n, kind) in c.stale_added {
            self.stale.insert(n, (kind, now));
        }
    }

    /// Whether a new `base` can be reached by element changes alone (else the table is
    /// replaced).
    pub fn base_compatible(&self, base: &Base) -> bool {
        self.base.fixed == base.fixed
    }

    /// The transaction from this state to the one where the service ports in `updates`
    /// are as given (`None`: gone) and the node-port addresses are `base`'s, plus the
    /// deletion of chains and sets stale for at least [`STALE_DELAY`] at `now`: one
    /// transaction, or none when nothing differs. `self` is untouched: the caller keeps `next` only once the
    /// transaction succeeded (see [`KernelState::commit`]).
    pub fn diff(
        &self,
        base: &Base,
        updates: Vec<(ServicePortName, Option<ServiceNft>)>,
        now: Instant,
    ) -> Planned {
        let f = family_word(self.family);
        let mut p = DiffParts::default();
        self.diff_base(f, base, &mut p);
        for (name, new) in updates {
            let old = self.services.get(&name);
            if old == new.as_ref() {
                continue;
            }
            let empty = ServiceNft::default();
            let (o, n) = (old.unwrap_or(&empty), new.as_ref().unwrap_or(&empty));
            let renewed = diff_sets(f, o, n, &mut p);
            diff_chains(f, o, n, renewed, &mut p);
            for e in &o.elements {
                p.touch(e.map, &e.key, None, -1);
            }
            for e in &n.elements {
                p.touch(e.map, &e.key, Some(e.text()), 1);
            }
            p.next.services.push((name, new));
        }
        let (deletes, adds) = self.element_changes(&mut p);
        self.stale_removals(f, now, &mut p);

        let mut text = std::mem::take(&mut p.new_objects);
        for (map, mut keys) in deletes {
            keys.sort();
            let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
            write_elements(&mut text, f, "delete", map, &refs);
        }
        text.push_str(&p.flushes);
        text.push_str(&p.check_rules);
        text.push_str(&p.set_renewals);
        text.push_str(&p.rules);
        for (map, mut list) in adds {
            list.sort();
            let refs: Vec<&str> = list.iter().map(String::as_str).collect();
            write_elements(&mut text, f, "add", map, &refs);
        }
        text.push_str(&p.removals);
        p.next.stale_removed.extend(p.revived);
        Planned {
            texts: if text.is_empty() {
                Vec::new()
            } else {
                vec![text]
            },
            next: Next::Apply(p.next),
        }
    }

    /// The node-port addresses' elements, and `cluster-ips-check` rewritten when the
    /// service CIDRs changed.
    fn diff_base(&self, f: &str, base: &Base, p: &mut DiffParts) {
        if self.base.nodeport_ips != base.nodeport_ips {
            for ip in &self.base.nodeport_ips {
                p.touch(Map::NodeportIps, ip, None, -1);
            }
            for ip in &base.nodeport_ips {
                p.touch(Map::NodeportIps, ip, Some(ip.clone()), 1);
            }
            p.next.base = Some(base.clone());
        }
        if self.base.cluster_ips_check != base.cluster_ips_check {
            let _ = writeln!(p.check_rules, "flush chain {f} {TABLE} cluster-ips-check");
            p.check_rules.push_str(&base.cluster_ips_check);
            p.next.base = Some(base.clone());
        }
    }

    /// Element changes by reference count: the elements to delete and to add, by map.
    fn element_changes(&self, p: &mut DiffParts) -> (ElementsByMap, ElementsByMap) {
        let mut deletes = ElementsByMap::new();
        let mut adds = ElementsByMap::new();
        for ((map, key), (text, d)) in std::mem::take(&mut p.el_delta) {
            let k = (map, key);
            let before = self.elements.get(&k);
            let count = before.map_or(0, |b| i64::from(b.1)) + d;
            match (before, count > 0) {
                (Some(_), false) => {
                    deletes.entry(map).or_default().push(k.1.clone());
                    p.next.elements.push((k, None));
                }
                (Some((old_text, _)), true) => {
                    let text = text.unwrap_or_else(|| old_text.clone());
                    if text != *old_text {
                        deletes.entry(map).or_default().push(k.1.clone());
                        adds.entry(map).or_default().push(text.clone());
                    }
                    p.next.elements.push((k, Some((text, count as u32))));
                }
                (None, true) => {
                    let text = text.unwrap_or_else(|| k.1.clone());
                    adds.entry(map).or_default().push(text.clone());
                    p.next.elements.push((k, Some((text, count as u32))));
                }
                (None, false) => {}
            }
        }
        (deletes, adds)
    }

    /// Chains and sets stale long enough go now (never one re-added by this diff).
    fn stale_removals(&self, f: &str, now: Instant, p: &mut DiffParts) {
        let due: Vec<String> = self
            .stale
            .iter()
            .filter(|(n, (_, since))| {
                now.duration_since(*since) >= STALE_DELAY && !p.revived.contains(*n)
            })
            .map(|(n, _)| n.clone())
            .collect();
        // Chains first: a chain may still name a set in a rule only until it is flushed,
        // which happened in an earlier transaction.
        for kind in [StaleKind::Chain, StaleKind::Set] {
            for n in due.iter().filter(|n| self.stale[*n].0 == kind) {
                let what = match kind {
                    StaleKind::Chain => "chain",
                    StaleKind::Set => "set",
                };
                let _ = writeln!(p.removals, "delete {what} {f} {TABLE} {n}");
                p.next.stale_removed.push(n.clone());
            }
        }
    }
}

/// Element texts (or keys, to delete) by the map they go to.
type ElementsByMap = BTreeMap<Map, Vec<String>>;

/// A diff's transaction in the making: its parts (written in the order [`KernelState::diff`]
/// joins them) and the changes to the state.
#[derive(Default)]
struct DiffParts {
    new_objects: String,
    flushes: String,
    check_rules: String,
    set_renewals: String,
    rules: String,
    removals: String,
    /// Each touched element: its new text (when a service port adds it) and the change of
    /// its reference count.
    el_delta: HashMap<ElementKey, (Option<String>, i64)>,
    /// Chains and sets made again while they were stale.
    revived: HashSet<String>,
    next: Changes,
}

impl DiffParts {
    fn touch(&mut self, map: Map, key: &str, text: Option<String>, d: i64) {
        let e = self
            .el_delta
            .entry((map, key.to_string()))
            .or_insert((None, 0));
        e.1 += d;
        if text.is_some() {
            e.0 = text;
        }
    }
}

/// A service port's sets from `o` to `n`; whether any set was renewed (deleted and made
/// again because its declaration changed: every chain of the service, which may refer to
/// it, is then rewritten around that).
fn diff_sets(f: &str, o: &ServiceNft, n: &ServiceNft, p: &mut DiffParts) -> bool {
    let renewed_sets: Vec<&(String, String)> = n
        .sets
        .iter()
        .filter(|s| o.sets.iter().any(|x| x.0 == s.0 && x.1 != s.1))
        .collect();
    for s in &n.sets {
        if !o.sets.iter().any(|x| x.0 == s.0) {
            let _ = writeln!(p.new_objects, "add set {f} {TABLE} {} {}", s.0, s.1);
            p.revived.insert(s.0.clone());
        }
    }
    for s in &renewed_sets {
        let _ = writeln!(p.set_renewals, "delete set {f} {TABLE} {}", s.0);
        let _ = writeln!(p.set_renewals, "add set {f} {TABLE} {} {}", s.0, s.1);
    }
    for s in &o.sets {
        if !n.sets.iter().any(|x| x.0 == s.0) {
            p.next.stale_added.push((s.0.clone(), StaleKind::Set));
        }
    }
    !renewed_sets.is_empty()
}

/// A service port's chains from `o` to `n`: changed ones flushed and refilled (all of them
/// when a set was `renewed`), new ones added, gone ones flushed and left to go stale.
fn diff_chains(f: &str, o: &ServiceNft, n: &ServiceNft, renewed: bool, p: &mut DiffParts) {
    for c in &n.chains {
        let before = o.chains.iter().find(|x| x.name == c.name);
        match before {
            Some(b) if b.rules == c.rules && !renewed => continue,
            Some(_) => {
                let _ = writeln!(p.flushes, "flush chain {f} {TABLE} {}", c.name);
            }
            None => {
                // An emptied chain still waiting for deletion exists already.
                let _ = writeln!(p.new_objects, "add chain {f} {TABLE} {}", c.name);
                p.revived.insert(c.name.clone());
            }
        }
        for r in &c.rules {
            let _ = writeln!(p.rules, "add rule {f} {TABLE} {} {r}", c.name);
        }
    }
    for c in &o.chains {
        if !n.chains.iter().any(|x| x.name == c.name) {
            let _ = writeln!(p.flushes, "flush chain {f} {TABLE} {}", c.name);
            p.next.stale_added.push((c.name.clone(), StaleKind::Chain));
        }
    }
}

/// The map elements of a whole table: each key once, counted by the service ports that
/// name it (a shared key leaves only with its last user), written in first-seen order.
struct Tally {
    entries: HashMap<ElementKey, ElementEntry>,
    order: Vec<ElementKey>,
}

impl Tally {
    /// Starts with the node port addresses of `base`.
    fn new(base: &Base, services: usize) -> Self {
        let mut t = Tally {
            entries: HashMap::with_capacity(services * 3),
            order: Vec::with_capacity(services * 3),
        };
        for ip in &base.nodeport_ips {
            t.add(Map::NodeportIps, ip, ip.clone());
        }
        t
    }

    fn add(&mut self, map: Map, key: &str, text: String) {
        let k = (map, key.to_string());
        match self.entries.get_mut(&k) {
            Some(e) => e.1 += 1,
            None => {
                self.order.push(k.clone());
                self.entries.insert(k, (text, 1));
            }
        }
    }

    fn add_all(&mut self, s: &ServiceNft) {
        for e in &s.elements {
            self.add(e.map, &e.key, e.text());
        }
    }

    /// `add element` commands, grouped by map.
    fn write_adds(&self, out: &mut String, f: &str) {
        let mut by_map: BTreeMap<Map, Vec<&str>> = BTreeMap::new();
        for k in &self.order {
            by_map.entry(k.0).or_default().push(&self.entries[k].0);
        }
        for (map, list) in by_map {
            write_elements(out, f, "add", map, &list);
        }
    }
}

/// `verb element F kube-proxy MAP { e1, e2, … }`, a command per thousand elements.
fn write_elements(out: &mut String, f: &str, verb: &str, map: Map, list: &[&str]) {
    for chunk in list.chunks(ELEMENTS_PER_COMMAND) {
        let _ = write!(out, "{verb} element {f} {TABLE} {} {{ ", map.name());
        for (i, e) in chunk.iter().enumerate() {
            if i > 0 {
                out.push_str(", ");
            }
            out.push_str(e);
        }
        out.push_str(" }\n");
    }
}
