//! Pure rendering: (service ports, endpoints, node facts, config) → desired filter and nat
//! tables in upstream kube-proxy's iptables layout.
//!
//! The result is structured (`Ruleset`: tables → chains → rules) so that the syncer can both
//! print a full `iptables-restore` input and compute a minimal delta against what it applied
//! last time (see `delta`).

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::net::IpAddr;

use crate::chains::*;
use crate::model::{Cidr, EndpointInfo, IpFamily, ServicePortInfo, ServicePortName};

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

    fn push(&mut self, chain: &str, args: String) {
        self.push_rule(
            chain,
            Rule {
                args,
                pinned_last: false,
            },
        );
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
/// Ordering inside each table: declarations, then `-D`, then `-A`, then `-X`; so rules that
/// jump to a doomed chain are gone before it is deleted, and a pinned-last rule (the
/// KUBE-NODEPORTS jump) is deleted and re-appended after any rule added to its chain.
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
    let adds_unpinned = added.iter().any(|r| !r.pinned_last);
    if adds_unpinned {
        // New rules are appended; move the pinned rules back behind them.
        for r in &kept_pinned {
            let _ = writeln!(dels, "-D {name} {}", r.args);
        }
    }
    for r in added.iter().filter(|r| !r.pinned_last) {
        let _ = writeln!(adds, "-A {name} {}", r.args);
    }
    if adds_unpinned {
        for r in &kept_pinned {
            let _ = writeln!(adds, "-A {name} {}", r.args);
        }
    }
    for r in added.iter().filter(|r| r.pinned_last) {
        let _ = writeln!(adds, "-A {name} {}", r.args);
    }
}

fn q(s: &str) -> String {
    format!("\"{s}\"")
}

/// Endpoints split by traffic policy (upstream's CategorizeEndpoints, without topology hints).
struct Categorized<'a> {
    cluster: Vec<&'a EndpointInfo>,
    local: Vec<&'a EndpointInfo>,
    all_reachable: Vec<&'a EndpointInfo>,
    has_any: bool,
}

fn categorize<'a>(eps: &'a [EndpointInfo], svc: &ServicePortInfo) -> Categorized<'a> {
    let mut cluster = Vec::new();
    let mut local = Vec::new();
    let mut has_any = false;
    if svc.uses_cluster_endpoints() {
        cluster = eps.iter().filter(|e| e.ready).collect();
        if cluster.is_empty() {
            // No ready endpoints anywhere: fall back to serving-but-terminating ones.
            cluster = eps.iter().filter(|e| e.serving && e.terminating).collect();
        }
        has_any = !cluster.is_empty();
    }
    if !svc.uses_local_endpoints() {
        let all_reachable = cluster.clone();
        return Categorized {
            cluster,
            local,
            all_reachable,
            has_any,
        };
    }
    let mut local_ready = false;
    let mut local_serving_terminating = false;
    for e in eps {
        if e.ready {
            has_any = true;
            local_ready |= e.is_local;
        } else if e.serving && e.terminating {
            has_any = true;
            local_serving_terminating |= e.is_local;
        }
    }
    if local_ready {
        local = eps.iter().filter(|e| e.is_local && e.ready).collect();
    } else if local_serving_terminating {
        local = eps
            .iter()
            .filter(|e| e.is_local && e.serving && e.terminating)
            .collect();
    }
    if !svc.uses_cluster_endpoints() {
        let all_reachable = local.clone();
        return Categorized {
            cluster,
            local,
            all_reachable,
            has_any,
        };
    }
    let mut all_reachable = cluster.clone();
    for e in &local {
        if !all_reachable
            .iter()
            .any(|x| x.ip == e.ip && x.port == e.port)
        {
            all_reachable.push(e);
        }
    }
    Categorized {
        cluster,
        local,
        all_reachable,
        has_any,
    }
}

/// Parsed `--nodeport-addresses` for one family.
struct NodePortAddresses {
    cidrs: Vec<Cidr>,
    match_all: bool,
}

impl NodePortAddresses {
    fn new(cfg: &RenderConfig) -> Self {
        let mut cidrs = Vec::new();
        for s in &cfg.node_port_addresses {
            if s == "primary" {
                if let Some(ip) = cfg.node_ips.first() {
                    cidrs.push(Cidr {
                        addr: *ip,
                        prefix: cfg.family.host_prefix(),
                    });
                }
            } else if let Ok(c) = s.parse::<Cidr>()
                && c.family() == cfg.family
            {
                cidrs.push(c);
            }
        }
        if cidrs.is_empty() {
            let zero = match cfg.family {
                IpFamily::V4 => "0.0.0.0/0",
                IpFamily::V6 => "::/0",
            };
            cidrs.push(zero.parse().expect("constant CIDR"));
        }
        let match_all = cidrs.iter().any(|c| c.prefix == 0);
        NodePortAddresses { cidrs, match_all }
    }

    fn contains_ipv4_loopback(&self) -> bool {
        let lo: IpAddr = IpAddr::V4(std::net::Ipv4Addr::LOCALHOST);
        self.cidrs.iter().any(|c| c.contains(&lo))
    }
}

struct ChainNames {
    cluster: String,
    local: String,
    firewall: String,
    external: String,
}

/// Renders the desired ruleset. Services are visited in `ServicePortName` order, so the
/// output is deterministic.
pub fn render(
    services: &BTreeMap<ServicePortName, ServicePortInfo>,
    endpoints: &BTreeMap<ServicePortName, Vec<EndpointInfo>>,
    cfg: &RenderConfig,
) -> Ruleset {
    let mut filter = TableRules::default();
    let mut nat = TableRules::default();
    let mut stats = RenderStats::default();
    let mark = cfg.masquerade_mark();
    let npa = NodePortAddresses::new(cfg);
    let is_v6 = cfg.family == IpFamily::V6;
    let localhost_node_ports = cfg.localhost_node_ports && !is_v6 && npa.contains_ipv4_loopback();

    for c in [
        KUBE_SERVICES,
        KUBE_EXTERNAL_SERVICES,
        KUBE_FORWARD,
        KUBE_NODEPORTS,
        KUBE_PROXY_FIREWALL,
    ] {
        filter.declare(c, false);
    }
    for c in [
        KUBE_SERVICES,
        KUBE_NODEPORTS,
        KUBE_POSTROUTING,
        KUBE_MARK_MASQ,
    ] {
        nat.declare(c, false);
    }

    nat.push(
        KUBE_POSTROUTING,
        format!("-m mark ! --mark {mark}/{mark} -j RETURN"),
    );
    nat.push(KUBE_POSTROUTING, format!("-j MARK --xor-mark {mark}"));
    let mut masq = format!(
        "-m comment --comment {} -j MASQUERADE",
        q("kubernetes service traffic requiring SNAT")
    );
    if cfg.random_fully {
        masq.push_str(" --random-fully");
    }
    nat.push(KUBE_POSTROUTING, masq);
    nat.push(KUBE_MARK_MASQ, format!("-j MARK --or-mark {mark}"));

    if localhost_node_ports {
        // Mitigates the route_localnet hole (upstream issue 90259); kubelet keeps an
        // identical copy of this rule.
        filter.declare(KUBE_FIREWALL, false);
        filter.push(
            KUBE_FIREWALL,
            format!(
                "-m comment --comment {} -d 127.0.0.0/8 ! -s 127.0.0.0/8 -m conntrack ! --ctstate RELATED,ESTABLISHED,DNAT -j DROP",
                q("block incoming localnet connections")
            ),
        );
    }

    let total_endpoints: usize = services
        .keys()
        .map(|k| endpoints.get(k).map_or(0, Vec::len))
        .sum();
    stats.total_endpoints = total_endpoints;
    let large_cluster = total_endpoints > LARGE_CLUSTER_ENDPOINTS_THRESHOLD;
    let comment = |text: &str| -> String {
        if large_cluster {
            String::new()
        } else {
            format!(" -m comment --comment {text}")
        }
    };
    let if_local = cfg.cluster_cidr.map(|c| format!("-s {c}"));
    let if_not_local = cfg.cluster_cidr.map(|c| format!("! -s {c}"));

    let no_eps: Vec<EndpointInfo> = Vec::new();
    for (name, svc) in services {
        let proto = name.protocol.lower();
        let spn = name.to_string();
        let names = ChainNames {
            cluster: service_cluster_chain(&spn, proto),
            local: service_local_chain(&spn, proto),
            firewall: service_firewall_chain(&spn, proto),
            external: service_external_chain(&spn, proto),
        };
        let eps = endpoints.get(name).unwrap_or(&no_eps);
        let cat = categorize(eps, svc);

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
                stats.no_local_endpoints_internal += 1;
            }
            if !has_external {
                external_filter = Some(("DROP", q(&format!("{spn} has no local endpoints"))));
                stats.no_local_endpoints_external += 1;
            }
        }

        let port = svc.port;
        let cip = svc.cluster_ip;
        // Cluster IP.
        if has_internal {
            nat.push(
                KUBE_SERVICES,
                format!(
                    "-m comment --comment {} -m {proto} -p {proto} -d {cip} --dport {port} -j {internal_chain}",
                    q(&format!("{spn} cluster IP"))
                ),
            );
        } else if let Some((target, c)) = &internal_filter {
            filter.push(
                KUBE_SERVICES,
                format!("-m comment --comment {c} -m {proto} -p {proto} -d {cip} --dport {port} -j {target}"),
            );
        }
        // External IPs.
        for eip in &svc.external_ips {
            if cat.has_any {
                nat.push(
                    KUBE_SERVICES,
                    format!(
                        "-m comment --comment {} -m {proto} -p {proto} -d {eip} --dport {port} -j {}",
                        q(&format!("{spn} external IP")),
                        names.external
                    ),
                );
            }
            if let (false, Some((target, c))) = (has_external, &external_filter) {
                filter.push(
                    KUBE_EXTERNAL_SERVICES,
                    format!("-m comment --comment {c} -m {proto} -p {proto} -d {eip} --dport {port} -j {target}"),
                );
            }
        }
        // Load-balancer ingress.
        for lbip in &svc.load_balancer_vips {
            if cat.has_any {
                nat.push(
                    KUBE_SERVICES,
                    format!(
                        "-m comment --comment {} -m {proto} -p {proto} -d {lbip} --dport {port} -j {lb_chain}",
                        q(&format!("{spn} loadbalancer IP"))
                    ),
                );
            }
            if uses_fw_chain {
                filter.push(
                    KUBE_PROXY_FIREWALL,
                    format!(
                        "-m comment --comment {} -m {proto} -p {proto} -d {lbip} --dport {port} -j DROP",
                        q(&format!("{spn} traffic not accepted by {}", names.firewall))
                    ),
                );
            }
        }
        if let (false, Some((target, c))) = (has_external, &external_filter) {
            for lbip in &svc.load_balancer_vips {
                filter.push(
                    KUBE_EXTERNAL_SERVICES,
                    format!("-m comment --comment {c} -m {proto} -p {proto} -d {lbip} --dport {port} -j {target}"),
                );
            }
        }
        // Node ports.
        if svc.node_port != 0 {
            let np = svc.node_port;
            if cat.has_any {
                // (The localhost variant of this rule needs an nfacct counter, which we do
                // not manage; upstream skips it in that case too.)
                nat.push(
                    KUBE_NODEPORTS,
                    format!(
                        "-m comment --comment {spn} -m {proto} -p {proto} --dport {np} -j {}",
                        names.external
                    ),
                );
            }
            if let (false, Some((target, c))) = (has_external, &external_filter) {
                filter.push(
                    KUBE_EXTERNAL_SERVICES,
                    format!("-m comment --comment {c} -m addrtype --dst-type LOCAL -m {proto} -p {proto} --dport {np} -j {target}"),
                );
            }
        }
        if svc.health_check_node_port != 0 {
            filter.push(
                KUBE_NODEPORTS,
                format!(
                    "-m comment --comment {} -m tcp -p tcp --dport {} -j ACCEPT",
                    q(&format!("{spn} health check node port")),
                    svc.health_check_node_port
                ),
            );
        }

        // Per-service chains, declared in upstream's order: EXT, FW, SVC, SVL, SEPs.
        if uses_external_chain {
            nat.declare(&names.external, true);
        }
        if uses_fw_chain {
            nat.declare(&names.firewall, true);
        }
        if uses_cluster_chain {
            nat.declare(&names.cluster, true);
        }
        if uses_local_chain {
            nat.declare(&names.local, true);
        }

        if has_internal {
            let base = format!(
                "-m comment --comment {} -m {proto} -p {proto} -d {cip} --dport {port}",
                q(&format!("{spn} cluster IP"))
            );
            if cfg.masquerade_all {
                nat.push(internal_chain, format!("{base} -j {KUBE_MARK_MASQ}"));
            } else if let Some(nl) = &if_not_local {
                // Off-cluster traffic to a service VIP may bounce off-node: masquerade it.
                nat.push(internal_chain, format!("{base} {nl} -j {KUBE_MARK_MASQ}"));
            }
        }

        if uses_external_chain {
            let ext = &names.external;
            if !svc.external_policy_local {
                nat.push(
                    ext,
                    format!(
                        "-m comment --comment {} -j {KUBE_MARK_MASQ}",
                        q(&format!(
                            "masquerade traffic for {spn} external destinations"
                        ))
                    ),
                );
            } else {
                if let Some(l) = &if_local {
                    nat.push(
                        ext,
                        format!(
                            "-m comment --comment {} {l} -j {}",
                            q(&format!("pod traffic for {spn} external destinations")),
                            names.cluster
                        ),
                    );
                }
                nat.push(
                    ext,
                    format!(
                        "-m comment --comment {} -m addrtype --src-type LOCAL -j {KUBE_MARK_MASQ}",
                        q(&format!(
                            "masquerade LOCAL traffic for {spn} external destinations"
                        ))
                    ),
                );
                nat.push(
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
                nat.push(ext, format!("-j {external_policy_chain}"));
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
                nat.push(fw, format!("{head} -s {cidr} -j {}", names.external));
                if cfg.node_ips.first().is_some_and(|ip| cidr.contains(ip)) {
                    allow_from_node = true;
                }
            }
            if allow_from_node {
                for lbip in &svc.load_balancer_vips {
                    nat.push(fw, format!("{head} -s {lbip} -j {}", names.external));
                }
            }
            nat.push(
                fw,
                format!(
                    "-m comment --comment {}",
                    q(&format!(
                        "other traffic to {spn} will be dropped by KUBE-PROXY-FIREWALL"
                    ))
                ),
            );
        }

        if uses_cluster_chain {
            service_to_endpoint_rules(&mut nat, &spn, svc, &names.cluster, &cat.cluster, &comment);
        }
        if uses_local_chain {
            service_to_endpoint_rules(&mut nat, &spn, svc, &names.local, &cat.local, &comment);
        }
        for ep in &cat.all_reachable {
            let sep = service_endpoint_chain(&spn, proto, &ep.to_string());
            nat.declare(&sep, true);
            let head = comment(&spn);
            nat.push(
                &sep,
                format!("{}-s {} -j {KUBE_MARK_MASQ}", trim_lead(&head), ep.ip),
            );
            let mut dnat = trim_lead(&head).to_string();
            if svc.session_affinity_seconds.is_some() {
                let _ = write!(dnat, "-m recent --name {sep} --set ");
            }
            let _ = write!(dnat, "-m {proto} -p {proto} -j DNAT --to-destination {ep}");
            nat.push(&sep, dnat);
        }
    }

    // The jump to KUBE-NODEPORTS must stay the last rule of nat KUBE-SERVICES.
    let np_comment =
        q("kubernetes service nodeports; NOTE: this must be the last rule in this chain");
    if npa.match_all {
        let mut dest = String::from("-m addrtype --dst-type LOCAL");
        if is_v6 {
            dest.push_str(" ! -d ::1/128");
        } else if !localhost_node_ports {
            dest.push_str(" ! -d 127.0.0.0/8");
        }
        nat.push_rule(
            KUBE_SERVICES,
            Rule {
                args: format!("-m comment --comment {np_comment} {dest} -j {KUBE_NODEPORTS}"),
                pinned_last: true,
            },
        );
    } else {
        for ip in cfg
            .node_ips
            .iter()
            .filter(|ip| npa.cidrs.iter().any(|c| c.contains(ip)))
        {
            if ip.is_loopback() && (is_v6 || !localhost_node_ports) {
                continue;
            }
            nat.push_rule(
                KUBE_SERVICES,
                Rule {
                    args: format!("-m comment --comment {np_comment} -d {ip} -j {KUBE_NODEPORTS}"),
                    pinned_last: true,
                },
            );
        }
    }

    if !cfg.conntrack_tcp_liberal {
        filter.push(
            KUBE_FORWARD,
            "-m conntrack --ctstate INVALID -j DROP".to_string(),
        );
    }
    filter.push(
        KUBE_FORWARD,
        format!(
            "-m comment --comment {} -m mark --mark {mark}/{mark} -j ACCEPT",
            q("kubernetes forwarding rules")
        ),
    );
    filter.push(
        KUBE_FORWARD,
        format!(
            "-m comment --comment {} -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT",
            q("kubernetes forwarding conntrack rule")
        ),
    );

    Ruleset { filter, nat, stats }
}

/// `comment()` yields " -m comment --comment X" (or ""); rules are built as
/// "<comment> <rest>", so strip the leading space and keep a trailing one.
fn trim_lead(head: &str) -> String {
    if head.is_empty() {
        String::new()
    } else {
        format!("{} ", head.trim_start())
    }
}

fn service_to_endpoint_rules(
    nat: &mut TableRules,
    spn: &str,
    svc: &ServicePortInfo,
    chain: &str,
    eps: &[&EndpointInfo],
    comment: &dyn Fn(&str) -> String,
) {
    let proto = svc.name.protocol.lower();
    if let Some(seconds) = svc.session_affinity_seconds {
        for ep in eps {
            let sep = service_endpoint_chain(spn, proto, &ep.to_string());
            let head = trim_lead(&comment(&q(&format!("{spn} -> {ep}"))));
            nat.push(
                chain,
                format!(
                    "{head}-m recent --name {sep} --rcheck --seconds {seconds} --reap -j {sep}"
                ),
            );
        }
    }
    let n = eps.len();
    for (i, ep) in eps.iter().enumerate() {
        let sep = service_endpoint_chain(spn, proto, &ep.to_string());
        let head = trim_lead(&comment(&q(&format!("{spn} -> {ep}"))));
        if i + 1 < n {
            nat.push(
                chain,
                format!(
                    "{head}-m statistic --mode random --probability {} -j {sep}",
                    probability(n - i)
                ),
            );
        } else {
            nat.push(chain, format!("{head}-j {sep}"));
        }
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
    fn masquerade_mark_formatting() {
        let cfg = RenderConfig::new(IpFamily::V4, "n");
        assert_eq!(cfg.masquerade_mark(), "0x00004000");
    }
}
