//! Pure rendering: (service ports, endpoints, node facts, config) → desired filter and nat
//! tables in upstream kube-proxy's iptables layout.
//!
//! The result is structured (`Ruleset`: tables → chains → rules) so that the syncer can both
//! print a full `iptables-restore` input and compute a minimal delta against what it applied
//! last time (see `delta`).
//!
//! The syncer keeps the rules per service port (`Rendered`: each service's own chains and its
//! rules in the top-level chains, around the fixed top-level rules). A partial sync then
//! re-renders only the services the change tracker reports and diffs only those
//! (`Rendered::update`), producing exactly the text `delta(old, render(..))` would, at a cost
//! proportional to the change rather than to the cluster. `render` + `delta` stay as the
//! reference the tests compare against.

use std::borrow::Cow;
use std::cell::OnceCell;
use std::cmp::Ordering;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::fmt::Write as _;
use std::net::IpAddr;

use crate::chains::*;
use crate::model::{
    Cidr, EndpointInfo, IpFamily, NamespacedName, ServicePortInfo, ServicePortName, ports_of,
};
use crate::nodeport::NodePortAddresses;
use crate::topology::categorize;

/// Above this many endpoints, rules stop carrying per-service comments (upstream's
/// "large cluster mode"), which shrinks the ruleset noticeably.
pub const LARGE_CLUSTER_ENDPOINTS_THRESHOLD: usize = 1000;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum TableName {
    Filter,
    Nat,
    Mangle,
}

impl TableName {
    pub fn as_str(self) -> &'static str {
        match self {
            TableName::Filter => "filter",
            TableName::Nat => "nat",
            TableName::Mangle => "mangle",
        }
    }
}

/// Node- and flag-level inputs of the renderer.
#[derive(Clone, Debug)]
pub struct RenderConfig {
    pub family: IpFamily,
    pub node_name: String,
    /// This node's addresses of `family`, primary first. Used for `--nodeport-addresses`
    /// and for loadBalancerSourceRanges that include the node.
    pub node_ips: Vec<IpAddr>,
    /// Bit of the packet mark that requests masquerade (upstream default 14 → 0x4000).
    pub masquerade_bit: u8,
    pub masquerade_all: bool,
    /// Pod CIDR of the cluster; enables the "local traffic" detector (`-s`/`! -s`).
    pub cluster_cidr: Option<Cidr>,
    /// `--nodeport-addresses`: CIDRs or `primary`; empty means all local addresses.
    pub node_port_addresses: Vec<String>,
    /// `--iptables-localhost-nodeports` (IPv4 only; needs route_localnet=1, set elsewhere).
    pub localhost_node_ports: bool,
    /// Whether iptables supports `MASQUERADE --random-fully` (>= 1.6.2).
    pub random_fully: bool,
    /// nf_conntrack_tcp_be_liberal is set: skip the INVALID drop rule.
    pub conntrack_tcp_liberal: bool,
    /// This node's `topology.kubernetes.io/zone` label, for endpoints' zone hints.
    pub zone: Option<String>,
}

impl RenderConfig {
    pub fn new(family: IpFamily, node_name: impl Into<String>) -> Self {
        RenderConfig {
            family,
            node_name: node_name.into(),
            node_ips: Vec::new(),
            masquerade_bit: 14,
            masquerade_all: false,
            cluster_cidr: None,
            node_port_addresses: Vec::new(),
            localhost_node_ports: true,
            random_fully: true,
            conntrack_tcp_liberal: false,
            zone: None,
        }
    }

    /// Upstream formats the mark with Go's `%#08x`: `0x00004000` for bit 14.
    pub fn masquerade_mark(&self) -> String {
        format!("0x{:08x}", 1u32 << self.masquerade_bit)
    }
}

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
    fn declare(&mut self, name: &str, service_owned: bool) {
        if !self.index.contains_key(name) {
            self.index.insert(name.to_string(), self.chains.len());
            self.chains.push(Chain {
                name: name.to_string(),
                service_owned,
                rules: Vec::new(),
            });
        }
    }

    fn push_rule(&mut self, chain: &str, rule: Rule) {
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
fn push_added(name: &str, rules: &[&str], pinned: bool, adds: &mut String) {
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

fn q(s: &str) -> String {
    format!("\"{s}\"")
}

/// Node- and flag-level values shared by every service's rules.
struct Ctx<'a> {
    cfg: &'a RenderConfig,
    large_cluster: bool,
    if_local: Option<String>,
    if_not_local: Option<String>,
    /// `probability(n)` at index n, filled on demand: float formatting is slow, and the
    /// services of a cluster mostly need the same few values.
    probabilities: Vec<String>,
}

impl<'a> Ctx<'a> {
    fn new(cfg: &'a RenderConfig, large_cluster: bool) -> Self {
        Ctx {
            cfg,
            large_cluster,
            if_local: cfg.cluster_cidr.map(|c| format!("-s {c}")),
            if_not_local: cfg.cluster_cidr.map(|c| format!("! -s {c}")),
            probabilities: Vec::new(),
        }
    }

    /// `probability(n)`, formatted once per render.
    fn probability(&mut self, n: usize) -> &str {
        while self.probabilities.len() <= n {
            let p = probability(self.probabilities.len());
            self.probabilities.push(p);
        }
        &self.probabilities[n]
    }

    /// `-m comment --comment "<spn> -> <ip:port>" ` heading an endpoint's jump rule in the
    /// SVC/SVL chain; nothing in large-cluster mode.
    fn endpoint_jump_comment(&self, spn: &str, addr: &str) -> String {
        if self.large_cluster {
            String::new()
        } else {
            format!("-m comment --comment \"{spn} -> {addr}\" ")
        }
    }

    /// `-m comment --comment <spn> ` (unquoted, as upstream) heading the rules of an endpoint
    /// chain; nothing in large-cluster mode.
    fn endpoint_chain_comment(&self, spn: &str) -> String {
        if self.large_cluster {
            String::new()
        } else {
            format!("-m comment --comment {spn} ")
        }
    }
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

/// Everything one service port contributes to the ruleset: its rules in the top-level chains
/// and its own nat chains. Rule texts embed the service port name, so no two services share
/// a rule or a chain; that is what lets a partial sync diff changed services only.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct ServiceRules {
    /// Rules in top-level filter chains, in render order.
    filter_top: Vec<(&'static str, String)>,
    /// Rules in top-level nat chains, in render order.
    nat_top: Vec<(&'static str, String)>,
    /// The service's own nat chains (EXT, FW, SVC, SVL, SEPs), in declaration order.
    chains: Vec<Chain>,
    endpoints: usize,
    no_local_internal: bool,
    no_local_external: bool,
}

impl ServiceRules {
    fn top(&self, t: TableName) -> &[(&'static str, String)] {
        match t {
            TableName::Filter => &self.filter_top,
            _ => &self.nat_top,
        }
    }

    fn top_rules(&self, t: TableName, chain: &str) -> Vec<&str> {
        self.top(t)
            .iter()
            .filter(|(ch, _)| *ch == chain)
            .map(|(_, a)| a.as_str())
            .collect()
    }

    fn declare(&mut self, name: &str) {
        if !self.chains.iter().any(|c| c.name == name) {
            self.declare_new(name.to_string());
        }
    }

    /// Declares a chain known not to exist yet (endpoint chains: endpoints are unique).
    fn declare_new(&mut self, name: String) {
        debug_assert!(!self.chains.iter().any(|c| c.name == name));
        self.chains.push(Chain {
            name,
            service_owned: true,
            rules: Vec::new(),
        });
    }

    fn push(&mut self, chain: &str, args: String) {
        let rule = Rule {
            args,
            pinned_last: false,
        };
        match self.chains.iter().rposition(|c| c.name == chain) {
            Some(i) => self.chains[i].rules.push(rule),
            None => self.chains.push(Chain {
                name: chain.to_string(),
                service_owned: is_service_chain(chain),
                rules: vec![rule],
            }),
        }
    }

    /// Appends to the chain declared last.
    fn push_last(&mut self, args: String) {
        if let Some(c) = self.chains.last_mut() {
            c.rules.push(Rule {
                args,
                pinned_last: false,
            });
        }
    }

    fn nat_rule_count(&self) -> usize {
        self.nat_top.len() + self.chains.iter().map(|c| c.rules.len()).sum::<usize>()
    }
}

/// A top-level chain: fixed rules around the services' rules.
#[derive(Clone, Debug, PartialEq, Eq)]
struct BaseChain {
    name: &'static str,
    head: Vec<Rule>,
    tail: Vec<Rule>,
}

impl BaseChain {
    fn new(name: &'static str) -> Self {
        BaseChain {
            name,
            head: Vec::new(),
            tail: Vec::new(),
        }
    }

    fn rules(&self) -> impl Iterator<Item = &Rule> {
        self.head.iter().chain(&self.tail)
    }
}

/// The top-level chains of both tables, which depend on the configuration only.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Base {
    filter: Vec<BaseChain>,
    nat: Vec<BaseChain>,
}

impl Base {
    fn new(cfg: &RenderConfig) -> Self {
        let mark = cfg.masquerade_mark();
        let npa = NodePortAddresses::new(cfg.family, &cfg.node_port_addresses, &cfg.node_ips);
        let is_v6 = cfg.family == IpFamily::V6;
        let localhost_node_ports =
            cfg.localhost_node_ports && !is_v6 && npa.contains_ipv4_loopback();
        let plain = |args: String| Rule {
            args,
            pinned_last: false,
        };

        let mut filter: Vec<BaseChain> = [
            KUBE_SERVICES,
            KUBE_EXTERNAL_SERVICES,
            KUBE_FORWARD,
            KUBE_NODEPORTS,
            KUBE_PROXY_FIREWALL,
        ]
        .into_iter()
        .map(BaseChain::new)
        .collect();
        let mut nat: Vec<BaseChain> = [
            KUBE_SERVICES,
            KUBE_NODEPORTS,
            KUBE_POSTROUTING,
            KUBE_MARK_MASQ,
        ]
        .into_iter()
        .map(BaseChain::new)
        .collect();

        let postrouting = &mut nat[2].head;
        postrouting.push(plain(format!("-m mark ! --mark {mark}/{mark} -j RETURN")));
        postrouting.push(plain(format!("-j MARK --xor-mark {mark}")));
        let mut masq = format!(
            "-m comment --comment {} -j MASQUERADE",
            q("kubernetes service traffic requiring SNAT")
        );
        if cfg.random_fully {
            masq.push_str(" --random-fully");
        }
        postrouting.push(plain(masq));
        nat[3].head.push(plain(format!("-j MARK --or-mark {mark}")));

        if localhost_node_ports {
            // Mitigates the route_localnet hole (upstream issue 90259); kubelet keeps an
            // identical copy of this rule.
            let mut fw = BaseChain::new(KUBE_FIREWALL);
            fw.head.push(plain(format!(
                "-m comment --comment {} -d 127.0.0.0/8 ! -s 127.0.0.0/8 -m conntrack ! --ctstate RELATED,ESTABLISHED,DNAT -j DROP",
                q("block incoming localnet connections")
            )));
            filter.push(fw);
        }

        // The jump to KUBE-NODEPORTS must stay the last rule of nat KUBE-SERVICES.
        let np_comment =
            q("kubernetes service nodeports; NOTE: this must be the last rule in this chain");
        let pinned = |args: String| Rule {
            args,
            pinned_last: true,
        };
        let services_tail = &mut nat[0].tail;
        if npa.match_all() {
            let mut dest = String::from("-m addrtype --dst-type LOCAL");
            if is_v6 {
                dest.push_str(" ! -d ::1/128");
            } else if !localhost_node_ports {
                dest.push_str(" ! -d 127.0.0.0/8");
            }
            services_tail.push(pinned(format!(
                "-m comment --comment {np_comment} {dest} -j {KUBE_NODEPORTS}"
            )));
        } else {
            for ip in cfg.node_ips.iter().filter(|ip| npa.contains(ip)) {
                if ip.is_loopback() && (is_v6 || !localhost_node_ports) {
                    continue;
                }
                services_tail.push(pinned(format!(
                    "-m comment --comment {np_comment} -d {ip} -j {KUBE_NODEPORTS}"
                )));
            }
        }

        let forward = &mut filter[2].tail;
        if !cfg.conntrack_tcp_liberal {
            forward.push(plain("-m conntrack --ctstate INVALID -j DROP".to_string()));
        }
        forward.push(plain(format!(
            "-m comment --comment {} -m mark --mark {mark}/{mark} -j ACCEPT",
            q("kubernetes forwarding rules")
        )));
        forward.push(plain(format!(
            "-m comment --comment {} -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT",
            q("kubernetes forwarding conntrack rule")
        )));
        Base { filter, nat }
    }

    fn table(&self, t: TableName) -> &[BaseChain] {
        match t {
            TableName::Filter => &self.filter,
            _ => &self.nat,
        }
    }

    fn rule_count(&self, t: TableName) -> usize {
        self.table(t).iter().map(|c| c.rules().count()).sum()
    }
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

/// One service port's rules (upstream's per-service part of syncProxyRules).
fn render_service(
    name: &ServicePortName,
    svc: &ServicePortInfo,
    eps: &[EndpointInfo],
    ctx: &mut Ctx<'_>,
) -> ServiceRules {
    let cfg = ctx.cfg;
    let cat = categorize(eps, svc, &cfg.node_name, cfg.zone.as_deref());
    let mut out = ServiceRules {
        endpoints: eps.len(),
        // EXT, FW, SVC and SVL at most, then one chain per endpoint.
        chains: Vec::with_capacity(4 + cat.all_reachable.len()),
        ..ServiceRules::default()
    };
    let proto = name.protocol.lower();
    let spn = service_port_text(name);
    let names = ServiceChainNames::new(&spn, proto);

    let uses_cluster_chain = !cat.cluster.is_empty() && svc.uses_cluster_endpoints();
    let uses_local_chain = !cat.local.is_empty() && svc.uses_local_endpoints();

    let mut internal_chain = &names.cluster;
    let mut has_internal = cat.has_any;
    if svc.internal_policy_local {
        internal_chain = &names.local;
        if cat.local.is_empty() {
            has_internal = false;
        }
    }
    let mut external_policy_chain = &names.cluster;
    let mut has_external = cat.has_any;
    if svc.external_policy_local {
        external_policy_chain = &names.local;
        if cat.local.is_empty() {
            has_external = false;
        }
    }
    let uses_external_chain = cat.has_any && svc.externally_accessible();
    let uses_fw_chain = cat.has_any
        && !svc.load_balancer_vips.is_empty()
        && !svc.load_balancer_source_ranges.is_empty();
    let lb_chain = if uses_fw_chain {
        &names.firewall
    } else {
        &names.external
    };

    let (mut internal_filter, mut external_filter) = (None, None);
    if !cat.has_any {
        let c = q(&format!("{spn} has no endpoints"));
        internal_filter = Some(("REJECT", c.clone()));
        external_filter = Some(("REJECT", c));
    } else {
        if !has_internal {
            internal_filter = Some(("DROP", q(&format!("{spn} has no local endpoints"))));
            out.no_local_internal = true;
        }
        if !has_external {
            external_filter = Some(("DROP", q(&format!("{spn} has no local endpoints"))));
            out.no_local_external = true;
        }
    }

    let port = svc.port;
    let cip = svc.cluster_ip;
    // Cluster IP. Its match is shared by the jump here and the masquerade rule below.
    let cluster_ip_match = has_internal.then(|| {
        // Room for the longest address and port.
        let mut m = String::with_capacity(spn.len() + 112);
        let _ = write!(
            m,
            "-m comment --comment \"{spn} cluster IP\" -m {proto} -p {proto} -d "
        );
        push_ip(&mut m, cip);
        let _ = write!(m, " --dport {port}");
        m
    });
    if let Some(m) = &cluster_ip_match {
        out.nat_top
            .push((KUBE_SERVICES, [m, " -j ", internal_chain].concat()));
    } else if let Some((target, c)) = &internal_filter {
        out.filter_top.push((
            KUBE_SERVICES,
            format!(
                "-m comment --comment {c} -m {proto} -p {proto} -d {cip} --dport {port} -j {target}"
            ),
        ));
    }
    // External IPs.
    for eip in &svc.external_ips {
        if cat.has_any {
            out.nat_top.push((
                KUBE_SERVICES,
                format!(
                    "-m comment --comment {} -m {proto} -p {proto} -d {eip} --dport {port} -j {}",
                    q(&format!("{spn} external IP")),
                    names.external
                ),
            ));
        }
        if let (false, Some((target, c))) = (has_external, &external_filter) {
            out.filter_top.push((
                KUBE_EXTERNAL_SERVICES,
                format!("-m comment --comment {c} -m {proto} -p {proto} -d {eip} --dport {port} -j {target}"),
            ));
        }
    }
    // Load-balancer ingress.
    for lbip in &svc.load_balancer_vips {
        if cat.has_any {
            out.nat_top.push((
                KUBE_SERVICES,
                format!(
                    "-m comment --comment {} -m {proto} -p {proto} -d {lbip} --dport {port} -j {lb_chain}",
                    q(&format!("{spn} loadbalancer IP"))
                ),
            ));
        }
        if uses_fw_chain {
            out.filter_top.push((
                KUBE_PROXY_FIREWALL,
                format!(
                    "-m comment --comment {} -m {proto} -p {proto} -d {lbip} --dport {port} -j DROP",
                    q(&format!("{spn} traffic not accepted by {}", names.firewall))
                ),
            ));
        }
    }
    if let (false, Some((target, c))) = (has_external, &external_filter) {
        for lbip in &svc.load_balancer_vips {
            out.filter_top.push((
                KUBE_EXTERNAL_SERVICES,
                format!("-m comment --comment {c} -m {proto} -p {proto} -d {lbip} --dport {port} -j {target}"),
            ));
        }
    }
    // Node ports.
    if svc.node_port != 0 {
        let np = svc.node_port;
        if cat.has_any {
            // (The localhost variant of this rule needs an nfacct counter, which we do
            // not manage; upstream skips it in that case too.)
            out.nat_top.push((
                KUBE_NODEPORTS,
                format!(
                    "-m comment --comment {spn} -m {proto} -p {proto} --dport {np} -j {}",
                    names.external
                ),
            ));
        }
        if let (false, Some((target, c))) = (has_external, &external_filter) {
            out.filter_top.push((
                KUBE_EXTERNAL_SERVICES,
                format!("-m comment --comment {c} -m addrtype --dst-type LOCAL -m {proto} -p {proto} --dport {np} -j {target}"),
            ));
        }
    }
    if svc.health_check_node_port != 0 {
        out.filter_top.push((
            KUBE_NODEPORTS,
            format!(
                "-m comment --comment {} -m tcp -p tcp --dport {} -j ACCEPT",
                q(&format!("{spn} health check node port")),
                svc.health_check_node_port
            ),
        ));
    }

    // Per-service chains, declared in upstream's order: EXT, FW, SVC, SVL, SEPs.
    if uses_external_chain {
        out.declare(&names.external);
    }
    if uses_fw_chain {
        out.declare(&names.firewall);
    }
    if uses_cluster_chain {
        out.declare(&names.cluster);
    }
    if uses_local_chain {
        out.declare(&names.local);
    }

    if let Some(m) = &cluster_ip_match {
        if cfg.masquerade_all {
            out.push(internal_chain, [m, " -j ", KUBE_MARK_MASQ].concat());
        } else if let Some(nl) = &ctx.if_not_local {
            // Off-cluster traffic to a service VIP may bounce off-node: masquerade it.
            out.push(
                internal_chain,
                [m, " ", nl, " -j ", KUBE_MARK_MASQ].concat(),
            );
        }
    }

    if uses_external_chain {
        let ext = &names.external;
        if !svc.external_policy_local {
            out.push(
                ext,
                format!(
                    "-m comment --comment {} -j {KUBE_MARK_MASQ}",
                    q(&format!(
                        "masquerade traffic for {spn} external destinations"
                    ))
                ),
            );
        } else {
            if let Some(l) = &ctx.if_local {
                out.push(
                    ext,
                    format!(
                        "-m comment --comment {} {l} -j {}",
                        q(&format!("pod traffic for {spn} external destinations")),
                        names.cluster
                    ),
                );
            }
            out.push(
                ext,
                format!(
                    "-m comment --comment {} -m addrtype --src-type LOCAL -j {KUBE_MARK_MASQ}",
                    q(&format!(
                        "masquerade LOCAL traffic for {spn} external destinations"
                    ))
                ),
            );
            out.push(
                ext,
                format!(
                    "-m comment --comment {} -m addrtype --src-type LOCAL -j {}",
                    q(&format!(
                        "route LOCAL traffic for {spn} external destinations"
                    )),
                    names.cluster
                ),
            );
        }
        if has_external {
            out.push(ext, format!("-j {external_policy_chain}"));
        }
    }

    if uses_fw_chain {
        let fw = &names.firewall;
        let head = format!(
            "-m comment --comment {}",
            q(&format!("{spn} loadbalancer IP"))
        );
        let mut allow_from_node = false;
        for cidr in &svc.load_balancer_source_ranges {
            out.push(fw, format!("{head} -s {cidr} -j {}", names.external));
            if cfg.node_ips.first().is_some_and(|ip| cidr.contains(ip)) {
                allow_from_node = true;
            }
        }
        if allow_from_node {
            for lbip in &svc.load_balancer_vips {
                out.push(fw, format!("{head} -s {lbip} -j {}", names.external));
            }
        }
        out.push(
            fw,
            format!(
                "-m comment --comment {}",
                q(&format!(
                    "other traffic to {spn} will be dropped by KUBE-PROXY-FIREWALL"
                ))
            ),
        );
    }

    let seps = ServiceEndpoints::new(&spn, proto, &cat.all_reachable);
    if uses_cluster_chain {
        service_to_endpoint_rules(&mut out, svc, &names.cluster, &cat.cluster, &seps, ctx);
    }
    if uses_local_chain {
        service_to_endpoint_rules(&mut out, svc, &names.local, &cat.local, &seps, ctx);
    }
    let head = ctx.endpoint_chain_comment(&spn);
    for e in seps.entries {
        let affinity = if svc.session_affinity_seconds.is_some() {
            ["-m recent --name ", &e.chain, " --set "].concat()
        } else {
            String::new()
        };
        let masq = [&head, "-s ", &e.ip, " -j ", KUBE_MARK_MASQ].concat();
        let dnat = [
            &head,
            &affinity,
            "-m ",
            proto,
            " -p ",
            proto,
            " -j DNAT --to-destination ",
            &e.addr,
        ]
        .concat();
        out.declare_new(e.chain);
        out.push_last(masq);
        out.push_last(dnat);
    }
    out
}

/// `name`'s text (`ns/name:port`, or `ns/name` for an unnamed port) as its Display, assembled
/// without the formatting machinery: once per service, it showed in profiles.
fn service_port_text(name: &ServicePortName) -> String {
    let nn = &name.service;
    let mut s = String::with_capacity(nn.namespace.len() + nn.name.len() + name.port.len() + 2);
    s.push_str(&nn.namespace);
    s.push('/');
    s.push_str(&nn.name);
    if !name.port.is_empty() {
        s.push(':');
        s.push_str(&name.port);
    }
    debug_assert_eq!(s, name.to_string());
    s
}

/// What the rules of one endpoint of a service need, formatted once per service: the SVC and
/// SVL jump rules and the endpoint's own KUBE-SEP chain all use them.
#[derive(Clone)]
struct EndpointStrings<'a> {
    ep: &'a EndpointInfo,
    /// The address alone (`-s <ip>`).
    ip: String,
    /// `ip:port` (`[ip]:port` for IPv6), as `EndpointInfo`'s Display.
    addr: String,
    /// `KUBE-SEP-…`.
    chain: String,
}

impl<'a> EndpointStrings<'a> {
    fn new(spn: &str, proto: &str, ep: &'a EndpointInfo) -> Self {
        // Sized for the longest address text (`to_string` grows the string step by step).
        let mut ip = String::with_capacity(45);
        push_ip(&mut ip, ep.ip);
        let mut addr = String::with_capacity(ip.len() + 8);
        match ep.ip {
            IpAddr::V4(_) => addr.push_str(&ip),
            IpAddr::V6(_) => {
                addr.push('[');
                addr.push_str(&ip);
                addr.push(']');
            }
        }
        let _ = write!(addr, ":{}", ep.port);
        debug_assert_eq!(addr, ep.to_string());
        let chain = service_endpoint_chain(spn, proto, &addr);
        EndpointStrings {
            ep,
            ip,
            addr,
            chain,
        }
    }
}

/// Appends `ip` as its Display does. IPv4 addresses are written digit by digit: `Ipv4Addr`'s
/// Display runs the formatting machinery for each octet, a tenth of a full render's time when
/// formatting every endpoint of a large cluster.
fn push_ip(out: &mut String, ip: IpAddr) {
    match ip {
        IpAddr::V4(v4) => {
            for (i, octet) in v4.octets().into_iter().enumerate() {
                if i > 0 {
                    out.push('.');
                }
                if octet >= 100 {
                    out.push(char::from(b'0' + octet / 100));
                }
                if octet >= 10 {
                    out.push(char::from(b'0' + octet / 10 % 10));
                }
                out.push(char::from(b'0' + octet % 10));
            }
        }
        IpAddr::V6(v6) => {
            let _ = write!(out, "{v6}");
        }
    }
}

/// The `EndpointStrings` of every endpoint a service reaches (`all_reachable`, in order).
struct ServiceEndpoints<'a> {
    spn: &'a str,
    proto: &'a str,
    entries: Vec<EndpointStrings<'a>>,
    /// Position of each (ip, port) in `entries`, built on first need (see `get`).
    index: OnceCell<HashMap<(IpAddr, u16), usize>>,
}

impl<'a> ServiceEndpoints<'a> {
    fn new(spn: &'a str, proto: &'a str, all_reachable: &[&'a EndpointInfo]) -> Self {
        ServiceEndpoints {
            spn,
            proto,
            entries: all_reachable
                .iter()
                .map(|ep| EndpointStrings::new(spn, proto, ep))
                .collect(),
            index: OnceCell::new(),
        }
    }

    /// The strings of `ep`, the `i`-th endpoint of the cluster or local endpoints. Both lists
    /// are part of `all_reachable`; usually `ep` also sits at position `i` there (a service
    /// using one policy only, or `all_reachable`'s cluster endpoints coming first), otherwise
    /// it is looked up by address. An endpoint missing from `all_reachable` is formatted
    /// afresh.
    fn get(&self, i: usize, ep: &'a EndpointInfo) -> Cow<'_, EndpointStrings<'a>> {
        let same = |e: &EndpointStrings<'_>| e.ep.ip == ep.ip && e.ep.port == ep.port;
        if let Some(e) = self.entries.get(i).filter(|e| same(e)) {
            return Cow::Borrowed(e);
        }
        let index = self.index.get_or_init(|| {
            let addrs = self.entries.iter().map(|e| (e.ep.ip, e.ep.port));
            addrs.enumerate().map(|(i, a)| (a, i)).collect()
        });
        match index.get(&(ep.ip, ep.port)) {
            Some(&i) => Cow::Borrowed(&self.entries[i]),
            None => Cow::Owned(EndpointStrings::new(self.spn, self.proto, ep)),
        }
    }
}

/// The jumps from a service's SVC or SVL `chain` to its endpoints' chains.
fn service_to_endpoint_rules<'a>(
    out: &mut ServiceRules,
    svc: &ServicePortInfo,
    chain: &str,
    eps: &[&'a EndpointInfo],
    seps: &ServiceEndpoints<'a>,
    ctx: &mut Ctx<'_>,
) {
    if let Some(seconds) = svc.session_affinity_seconds {
        for (i, ep) in eps.iter().enumerate() {
            let e = seps.get(i, ep);
            let (head, sep) = (ctx.endpoint_jump_comment(seps.spn, &e.addr), &e.chain);
            out.push(
                chain,
                format!(
                    "{head}-m recent --name {sep} --rcheck --seconds {seconds} --reap -j {sep}"
                ),
            );
        }
    }
    let n = eps.len();
    for (i, ep) in eps.iter().enumerate() {
        let e = seps.get(i, ep);
        let head = ctx.endpoint_jump_comment(seps.spn, &e.addr);
        let rule = if i + 1 < n {
            [
                &head,
                "-m statistic --mode random --probability ",
                ctx.probability(n - i),
                " -j ",
                &e.chain,
            ]
            .concat()
        } else {
            [&head, "-j ", &e.chain].concat()
        };
        out.push(chain, rule);
    }
}

/// `1/n` with ten decimals, as upstream's `fmt.Sprintf("%0.10f", 1.0/float64(n))`.
pub fn probability(n: usize) -> String {
    format!("{:.10}", 1.0 / n as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probability_formatting_matches_upstream() {
        assert_eq!(probability(2), "0.5000000000");
        assert_eq!(probability(3), "0.3333333333");
        assert_eq!(probability(1), "1.0000000000");
        assert_eq!(probability(7), "0.1428571429");
    }

    #[test]
    fn push_ip_matches_display() {
        for s in [
            "0.0.0.0",
            "9.10.99.100",
            "255.254.200.109",
            "10.128.0.1",
            "::1",
            "fd00::10:180:0:12",
            "::ffff:1.2.3.4",
        ] {
            let ip: IpAddr = s.parse().unwrap();
            let mut out = String::from("x");
            push_ip(&mut out, ip);
            assert_eq!(out, format!("x{ip}"));
        }
        for octet in 0..=255u8 {
            let ip = IpAddr::V4(std::net::Ipv4Addr::new(octet, 0, 255 - octet, octet));
            let mut out = String::new();
            push_ip(&mut out, ip);
            assert_eq!(out, ip.to_string());
        }
    }

    #[test]
    fn masquerade_mark_formatting() {
        let cfg = RenderConfig::new(IpFamily::V4, "n");
        assert_eq!(cfg.masquerade_mark(), "0x00004000");
    }
}
