//! Which other Nodes' pod CIDRs this node routes to, and why the others are refused.
//!
//! A Node's `spec.podCIDRs` and `status.addresses` are not trusted: NodeRestriction does not
//! constrain `spec.podCIDR` at create and a node sets its own addresses, so a route taken
//! from them as they are could send any traffic anywhere. A claim (one pod CIDR of one
//! Node, via that Node's first InternalIP of the same family) is routed only when
//! - the CIDR is not `/0` and lies inside the configured cluster CIDR of its family (a
//!   family without one gets no routes at all: a setting, not a Node's fault);
//! - it does not overlap this node's own pod CIDRs;
//! - the next hop is on-link (inside a prefix the main table reaches without a gateway),
//!   not an address of this node, and not inside the pod network;
//! - no route that is not ours holds that destination in the main table;
//! - no claim of an older Node (by `creationTimestamp`, then name) that passed the same
//!   checks overlaps it. Ties go to the older Node deterministically, whatever order the
//!   watch delivers them in.
//!
//! [`Claims`] keeps the outcome incrementally: one Node's change re-examines that Node's
//! claims and only the claims that overlap them (the oldest-wins rule may hand a CIDR to
//! another Node when one goes), so a new Node costs a few map lookups at any cluster size.
//! The result is the same as [`Claims::rebuild`] over every Node, which the periodic full
//! pass uses.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::IpAddr;

use plumbing::cidr::Cidr;

use super::NodeNet;

/// What this node knows of its own kernel, from the last full read of its routes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HostView {
    /// Main-table destinations held by a route that is not ours (any protocol or metric).
    pub foreign: BTreeSet<Cidr>,
    /// Prefixes reached without a gateway (connected routes): a next hop must be inside one.
    pub on_link: Vec<Cidr>,
    /// This node's own addresses (local-table routes: local, broadcast, anycast).
    pub local: Vec<Cidr>,
}

/// What a claim is judged against.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Policy {
    /// The configured cluster CIDRs (at most one per family).
    pub cluster_cidrs: Vec<Cidr>,
    /// This node's own pod CIDRs.
    pub own_cidrs: Vec<Cidr>,
    pub host: HostView,
}

/// Why a claim is not routed. Each has its own Event reason.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// A `/0`: every destination.
    TooBroad,
    /// Outside the cluster CIDR of its family.
    OutsideClusterCidr(Cidr),
    /// Overlaps one of this node's pod CIDRs.
    OverlapsOwn(Cidr),
    /// Overlaps a CIDR accepted for an older Node (or an earlier CIDR of the same Node).
    OverlapsNode { node: String, cidr: Cidr },
    /// The next hop is not inside any prefix this node reaches directly.
    NextHopNotOnLink(IpAddr),
    /// The next hop is one of this node's own addresses.
    NextHopIsLocal(IpAddr),
    /// The next hop is inside the pod network (the cluster CIDR or this node's pod CIDRs).
    NextHopInPodNetwork(IpAddr),
    /// A route that is not ours already holds the destination.
    RouteConflict,
}

impl Refusal {
    /// The Event reason (ours; upstream has no such controller).
    pub fn reason(&self) -> &'static str {
        match self {
            Refusal::TooBroad => "PodCIDRTooBroad",
            Refusal::OutsideClusterCidr(_) => "PodCIDROutsideClusterCIDR",
            Refusal::OverlapsOwn(_) | Refusal::OverlapsNode { .. } => "PodCIDROverlap",
            Refusal::NextHopNotOnLink(_) => "NextHopNotOnLink",
            Refusal::NextHopIsLocal(_) => "NextHopIsLocal",
            Refusal::NextHopInPodNetwork(_) => "NextHopInPodNetwork",
            Refusal::RouteConflict => "RouteConflict",
        }
    }

    /// The Event message, about `node`'s pod CIDR `cidr`.
    pub fn message(&self, node: &str, cidr: Cidr, own_node: &str) -> String {
        let why = match self {
            Refusal::TooBroad => "a /0 would take every destination".to_string(),
            Refusal::OutsideClusterCidr(c) => format!("it is not inside the cluster CIDR {c}"),
            Refusal::OverlapsOwn(c) => format!("it overlaps pod CIDR {c} of this node"),
            Refusal::OverlapsNode { node: other, cidr } if other == node => {
                format!("it overlaps its own pod CIDR {cidr}")
            }
            Refusal::OverlapsNode { node: other, cidr } => {
                format!("it overlaps pod CIDR {cidr} of the older Node {other}")
            }
            Refusal::NextHopNotOnLink(ip) => {
                format!("its InternalIP {ip} is not on a network this node reaches directly")
            }
            Refusal::NextHopIsLocal(ip) => {
                format!("its InternalIP {ip} is an address of this node")
            }
            Refusal::NextHopInPodNetwork(ip) => {
                format!("its InternalIP {ip} is inside the pod network")
            }
            Refusal::RouteConflict => {
                "a route that node-agent does not own already holds that destination".to_string()
            }
        };
        format!(
            "node-agent network on {own_node}: not routing pod CIDR {cidr} of Node {node}: {why}"
        )
    }
}

/// The order claims win in: the older Node first (`creationTimestamp`, then name), then a
/// Node's CIDRs in their order.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
struct Key {
    created: jiff::Timestamp,
    name: String,
    index: usize,
}

fn keys_of(n: &NodeNet) -> impl Iterator<Item = Key> + '_ {
    (0..n.pod_cidrs.len()).map(|index| Key {
        // A Node without a creation time (no apiserver sends one) counts as the youngest.
        created: n.created.unwrap_or(jiff::Timestamp::MAX),
        name: n.name.clone(),
        index,
    })
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Status {
    /// Competing, not judged yet.
    Pending,
    Accepted,
    Refused(Refusal),
}

#[derive(Debug, Clone)]
struct Claim {
    cidr: Cidr,
    via: IpAddr,
    status: Status,
    /// Passed the checks that do not depend on other Nodes: takes part in oldest-wins.
    competing: bool,
}

/// Whether two networks share an address (one contains the other).
fn overlaps(a: Cidr, b: Cidr) -> bool {
    let (wide, narrow) = if a.prefix <= b.prefix { (a, b) } else { (b, a) };
    wide.contains(narrow.addr)
}

/// `cidr` lies inside `outer`.
pub fn within(cidr: Cidr, outer: Cidr) -> bool {
    outer.prefix <= cidr.prefix && outer.contains(cidr.addr)
}

/// The entries of `map` whose network overlaps `c` (`c` has no host bits set): those inside
/// it by one range scan, the wider ones by one lookup per shorter prefix.
fn overlapping<V>(map: &BTreeMap<Cidr, V>, c: Cidr) -> Vec<(Cidr, &V)> {
    let c = c.network();
    let last = c.nth(c.host_span()).unwrap_or(c.addr);
    let from = Cidr {
        addr: c.addr,
        prefix: 0,
    };
    let to = Cidr {
        addr: last,
        prefix: u8::MAX,
    };
    let mut out: Vec<(Cidr, &V)> = map
        .range(from..=to)
        .filter(|(k, _)| overlaps(**k, c))
        .map(|(k, v)| (*k, v))
        .collect();
    for prefix in 0..c.prefix {
        let wider = Cidr {
            addr: c.addr,
            prefix,
        }
        .network();
        if wider.addr != c.addr
            && let Some(v) = map.get(&wider)
        {
            out.push((wider, v));
        }
    }
    out
}

/// Every Node's claims and their outcome; see the module documentation.
#[derive(Debug, Clone)]
pub struct Claims {
    own_name: String,
    policy: Policy,
    nodes: HashMap<String, NodeNet>,
    claims: BTreeMap<Key, Claim>,
    /// The claims that take part in oldest-wins, by CIDR (several Nodes may claim one).
    competing: BTreeMap<Cidr, BTreeSet<Key>>,
    /// The winners: never overlapping one another.
    accepted: BTreeMap<Cidr, Key>,
    /// The routes wanted: the accepted claims.
    want: BTreeMap<Cidr, IpAddr>,
    /// Destinations whose wanted route changed since [`Claims::take_dirty`].
    dirty: BTreeSet<Cidr>,
    /// Nodes whose refusals may have changed since [`Claims::take_touched`].
    touched: BTreeSet<String>,
}

impl Claims {
    pub fn new(own_name: &str, policy: Policy) -> Claims {
        Claims {
            own_name: own_name.to_string(),
            policy,
            nodes: HashMap::new(),
            claims: BTreeMap::new(),
            competing: BTreeMap::new(),
            accepted: BTreeMap::new(),
            want: BTreeMap::new(),
            dirty: BTreeSet::new(),
            touched: BTreeSet::new(),
        }
    }

    /// The outcome over every Node at once (the full pass).
    pub fn rebuild<'a>(
        own_name: &str,
        policy: Policy,
        nodes: impl IntoIterator<Item = &'a NodeNet>,
    ) -> Claims {
        let mut c = Claims::new(own_name, policy);
        let mut queue = BTreeSet::new();
        for n in nodes {
            c.insert(n.clone(), &mut queue);
        }
        c.settle(queue);
        c
    }

    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// The same Nodes judged under another policy (new kernel facts, this node's CIDRs
    /// changed): CPU only, nothing is read from the kernel.
    pub fn with_policy(&self, policy: Policy) -> Claims {
        Claims::rebuild(&self.own_name, policy, self.nodes.values())
    }

    /// A Node, as last given.
    pub fn node(&self, name: &str) -> Option<&NodeNet> {
        self.nodes.get(name)
    }

    /// One Node added, changed (`Some`) or deleted (`None`): only its claims and those
    /// overlapping them are looked at again.
    pub fn set_node(&mut self, name: &str, node: Option<NodeNet>) {
        let mut queue = BTreeSet::new();
        if let Some(old) = self.nodes.remove(name) {
            for k in keys_of(&old) {
                self.remove(&k, &mut queue);
            }
            self.touched.insert(name.to_string());
        }
        if let Some(n) = node {
            self.insert(n, &mut queue);
        }
        self.settle(queue);
    }

    /// The routes wanted now: destination → next hop.
    pub fn want(&self) -> &BTreeMap<Cidr, IpAddr> {
        &self.want
    }

    /// The destinations whose wanted route changed since the last call.
    pub fn take_dirty(&mut self) -> BTreeSet<Cidr> {
        std::mem::take(&mut self.dirty)
    }

    /// The Nodes whose refusals may have changed since the last call.
    pub fn take_touched(&mut self) -> BTreeSet<String> {
        std::mem::take(&mut self.touched)
    }

    /// `node`'s refused CIDRs and why.
    pub fn refusals(&self, node: &str) -> Vec<(Cidr, Refusal)> {
        let Some(n) = self.nodes.get(node) else {
            return Vec::new();
        };
        keys_of(n)
            .filter_map(|k| self.claims.get(&k))
            .filter_map(|c| match &c.status {
                Status::Refused(r) => Some((c.cidr, r.clone())),
                Status::Accepted | Status::Pending => None,
            })
            .collect()
    }

    /// The checks that do not depend on other Nodes, against the cluster CIDR of the
    /// claim's family; `None`: the claim competes.
    fn check(&self, cidr: Cidr, via: IpAddr, cluster: Cidr) -> Option<Refusal> {
        let p = &self.policy;
        if cidr.prefix == 0 {
            return Some(Refusal::TooBroad);
        }
        if !within(cidr, cluster) {
            return Some(Refusal::OutsideClusterCidr(cluster));
        }
        if let Some(own) = p.own_cidrs.iter().find(|o| overlaps(**o, cidr)) {
            return Some(Refusal::OverlapsOwn(*own));
        }
        let odd = via.is_unspecified() || via.is_multicast() || via.is_loopback();
        if !odd && p.host.local.iter().any(|l| l.contains(via)) {
            return Some(Refusal::NextHopIsLocal(via));
        }
        if p.cluster_cidrs
            .iter()
            .chain(&p.own_cidrs)
            .any(|c| c.contains(via))
        {
            return Some(Refusal::NextHopInPodNetwork(via));
        }
        if odd || !p.host.on_link.iter().any(|l| l.contains(via)) {
            return Some(Refusal::NextHopNotOnLink(via));
        }
        if p.host.foreign.contains(&cidr) {
            return Some(Refusal::RouteConflict);
        }
        None
    }

    fn insert(&mut self, n: NodeNet, queue: &mut BTreeSet<Key>) {
        if n.name != self.own_name {
            for (k, cidr) in keys_of(&n).zip(n.pod_cidrs.iter().copied()) {
                // A family without a cluster CIDR, or a Node without an address of the
                // family: no claim (nothing to refuse either).
                let family = |ip: &IpAddr| ip.is_ipv4() == cidr.is_ipv4();
                let Some(cluster) = self
                    .policy
                    .cluster_cidrs
                    .iter()
                    .copied()
                    .find(|c| family(&c.addr))
                else {
                    continue;
                };
                let Some(via) = n.internal_ips.iter().copied().find(family) else {
                    continue;
                };
                let refusal = self.check(cidr, via, cluster);
                let competing = refusal.is_none();
                let status = refusal.map_or(Status::Pending, Status::Refused);
                if competing {
                    self.competing.entry(cidr).or_default().insert(k.clone());
                    queue.insert(k.clone());
                }
                self.claims.insert(
                    k,
                    Claim {
                        cidr,
                        via,
                        status,
                        competing,
                    },
                );
            }
            self.touched.insert(n.name.clone());
        }
        self.nodes.insert(n.name.clone(), n);
    }

    fn remove(&mut self, k: &Key, queue: &mut BTreeSet<Key>) {
        let Some(c) = self.claims.remove(k) else {
            return;
        };
        if let Some(set) = self.competing.get_mut(&c.cidr) {
            set.remove(k);
            if set.is_empty() {
                self.competing.remove(&c.cidr);
            }
        }
        queue.remove(k);
        if c.status == Status::Accepted {
            self.unaccept(c.cidr);
            self.enqueue_younger(c.cidr, k, queue);
        }
    }

    fn unaccept(&mut self, cidr: Cidr) {
        self.accepted.remove(&cidr);
        self.want.remove(&cidr);
        self.dirty.insert(cidr);
    }

    /// Queues the competing claims younger than `than` that overlap `cidr`.
    fn enqueue_younger(&self, cidr: Cidr, than: &Key, queue: &mut BTreeSet<Key>) {
        for (_, keys) in overlapping(&self.competing, cidr) {
            queue.extend(keys.iter().filter(|k| *k > than).cloned());
        }
    }

    fn set_status(&mut self, k: &Key, status: Status) {
        if let Some(c) = self.claims.get_mut(k)
            && c.status != status
        {
            c.status = status;
            self.touched.insert(k.name.clone());
        }
    }

    /// Judges the queued claims oldest first. A claim's outcome depends only on older
    /// claims, and whatever a judgement queues is younger than the claim judged, so each
    /// claim is judged after every older one that changed: the result is the same as
    /// judging every claim in order from scratch.
    fn settle(&mut self, mut queue: BTreeSet<Key>) {
        while let Some(k) = queue.pop_first() {
            let Some(c) = self.claims.get(&k) else {
                continue;
            };
            if !c.competing {
                continue;
            }
            let (cidr, via, was) = (c.cidr, c.via, c.status.clone());
            let blocker = overlapping(&self.accepted, cidr)
                .into_iter()
                .filter(|(_, bk)| **bk < k)
                .min_by(|a, b| a.1.cmp(b.1))
                .map(|(bc, bk)| Refusal::OverlapsNode {
                    node: bk.name.clone(),
                    cidr: bc,
                });
            match blocker {
                Some(r) => {
                    if was == Status::Accepted {
                        self.unaccept(cidr);
                        self.enqueue_younger(cidr, &k, &mut queue);
                    }
                    self.set_status(&k, Status::Refused(r));
                }
                None if was != Status::Accepted => {
                    // The younger winners it overlaps lose to it.
                    let evicted: Vec<(Cidr, Key)> = overlapping(&self.accepted, cidr)
                        .into_iter()
                        .map(|(ec, ek)| (ec, ek.clone()))
                        .collect();
                    for (ec, ek) in evicted {
                        self.unaccept(ec);
                        self.set_status(
                            &ek,
                            Status::Refused(Refusal::OverlapsNode {
                                node: k.name.clone(),
                                cidr,
                            }),
                        );
                        self.enqueue_younger(ec, &ek, &mut queue);
                    }
                    // Younger claims refused because of others now name the right winner.
                    self.enqueue_younger(cidr, &k, &mut queue);
                    self.accepted.insert(cidr, k.clone());
                    self.want.insert(cidr, via);
                    self.dirty.insert(cidr);
                    self.set_status(&k, Status::Accepted);
                }
                None => {}
            }
        }
    }
}

/// The refusals already reported, so that each (Node, reason) is reported once while it
/// lasts, not on every pass; reported again if it clears and comes back.
#[derive(Debug, Default)]
pub struct Reported {
    by_node: HashMap<String, BTreeSet<&'static str>>,
}

impl Reported {
    /// `node`'s refusals now; returns those whose reason was not reported yet.
    pub fn update(&mut self, node: &str, now: Vec<(Cidr, Refusal)>) -> Vec<(Cidr, Refusal)> {
        let reasons: BTreeSet<&'static str> = now.iter().map(|(_, r)| r.reason()).collect();
        let before = self.by_node.remove(node).unwrap_or_default();
        let mut seen = BTreeSet::new();
        let fresh = now
            .into_iter()
            .filter(|(_, r)| !before.contains(r.reason()) && seen.insert(r.reason()))
            .collect();
        if !reasons.is_empty() {
            self.by_node.insert(node.to_string(), reasons);
        }
        fresh
    }

    /// Forgets Nodes that are gone.
    pub fn retain(&mut self, keep: impl Fn(&str) -> bool) {
        self.by_node.retain(|n, _| keep(n));
    }
}
