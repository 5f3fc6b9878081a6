//! Pure rendering of upstream's nftables layout: the fixed part of the `kube-proxy` table
//! ([`Base`]) and each service port's own objects ([`ServiceNft`]: affinity sets, chains,
//! and its elements in the shared maps). Nothing here talks to the kernel; the `tx` module
//! turns these into `nft -f` transactions (full, or the difference between two states).

use std::fmt::Write as _;
use std::net::IpAddr;

use super::names::*;
use crate::model::{EndpointInfo, IpFamily, ServicePortInfo, ServicePortName};
use crate::nodeport::NodePortAddresses;
use crate::render_config::RenderConfig;
use crate::topology::{Categorized, categorize};

/// The shared sets and verdict maps a service port puts elements into.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Map {
    ClusterIps,
    NodeportIps,
    ServiceIps,
    ServiceNodeports,
    NoEndpointServices,
    NoEndpointNodeports,
    FirewallIps,
}

impl Map {
    pub const ALL: [Map; 7] = [
        Map::ClusterIps,
        Map::NodeportIps,
        Map::FirewallIps,
        Map::NoEndpointNodeports,
        Map::NoEndpointServices,
        Map::ServiceIps,
        Map::ServiceNodeports,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Map::ClusterIps => CLUSTER_IPS,
            Map::NodeportIps => NODEPORT_IPS,
            Map::ServiceIps => SERVICE_IPS,
            Map::ServiceNodeports => SERVICE_NODEPORTS,
            Map::NoEndpointServices => NO_ENDPOINT_SERVICES,
            Map::NoEndpointNodeports => NO_ENDPOINT_NODEPORTS,
            Map::FirewallIps => FIREWALL_IPS,
        }
    }
}

/// One element of a set or verdict map: `key [comment "…"] [: value]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Element {
    pub map: Map,
    pub key: String,
    pub comment: Option<String>,
    /// The verdict (`goto <chain>`, `drop`); `None` in a plain set.
    pub value: Option<String>,
}

impl Element {
    /// The element as `add element` writes it (without the braces).
    pub fn text(&self) -> String {
        let mut s = self.key.clone();
        if let Some(c) = &self.comment {
            let _ = write!(s, " comment \"{c}\"");
        }
        if let Some(v) = &self.value {
            let _ = write!(s, " : {v}");
        }
        s
    }
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Chain {
    pub name: String,
    pub rules: Vec<String>,
}

/// Everything one service port owns or adds: names hash the service port, so no two ports
/// share a chain or set (elements of the shared maps may coincide: the kernel state counts their users).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ServiceNft {
    /// Affinity sets: `(name, declaration body)`.
    pub sets: Vec<(String, String)>,
    pub chains: Vec<Chain>,
    pub elements: Vec<Element>,
    pub endpoints: usize,
    pub no_local_internal: bool,
    pub no_local_external: bool,
}

/// `ip`/`ip6`: the table family, and the address match keyword.
pub fn family_word(f: IpFamily) -> &'static str {
    match f {
        IpFamily::V4 => "ip",
        IpFamily::V6 => "ip6",
    }
}

fn addr_type(f: IpFamily) -> &'static str {
    match f {
        IpFamily::V4 => "ipv4_addr",
        IpFamily::V6 => "ipv6_addr",
    }
}

/// The fixed part of the table: sets, maps, base and helper chains with their rules
/// (`fixed`, a transaction text), and the node-port addresses (elements of `nodeport-ips`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Base {
    pub fixed: String,
    pub nodeport_ips: Vec<String>,
    /// The rules of `cluster-ips-check` (they follow the service CIDRs, which change without
    /// the rest of the table).
    pub cluster_ips_check: String,
}

const NODEPORT_PRIMARY: &str = "primary";

/// Base chains: name, type, hook, priority (upstream's nftablesBaseChains).
const BASE_CHAINS: &[(&str, &str, &str, &str)] = &[
    ("filter-prerouting-pre-dnat", "filter", "prerouting", "-110"),
    ("filter-output-pre-dnat", "filter", "output", "-110"),
    ("filter-forward", "filter", "forward", "0"),
    ("filter-input", "filter", "input", "0"),
    ("filter-output", "filter", "output", "0"),
    ("nat-output", "nat", "output", "-100"),
    ("nat-postrouting", "nat", "postrouting", "100"),
    ("nat-prerouting", "nat", "prerouting", "-100"),
];

impl Base {
    pub fn new(cfg: &RenderConfig) -> Base {
        let f = family_word(cfg.family);
        let np = node_port_addresses(cfg);
        let mut o = declarations(cfg.family);
        for (chain, rule) in base_rules(cfg, np.match_all()) {
            let _ = writeln!(o, "add rule {f} {TABLE} {chain} {rule}");
        }
        let nodeport_ips = if np.match_all() {
            Vec::new()
        } else {
            // Never loopback: this mode leaves route_localnet off, as upstream's, which
            // skips such addresses with "localhost NodePorts are not supported".
            cfg.node_ips
                .iter()
                .filter(|ip| cfg.family.matches(ip) && np.contains(ip) && !ip.is_loopback())
                .map(IpAddr::to_string)
                .collect()
        };
        Base {
            fixed: o,
            nodeport_ips,
            cluster_ips_check: cluster_ips_check(cfg),
        }
    }
}

/// The addresses node ports are taken on.
fn node_port_addresses(cfg: &RenderConfig) -> NodePortAddresses {
    // Upstream's nftables mode takes node ports on the node's primary IPs by default
    // (`--nodeport-addresses=primary`), not on every local address.
    let primary = [NODEPORT_PRIMARY.to_string()];
    let np_flag = if cfg.node_port_addresses.is_empty() {
        &primary[..]
    } else {
        &cfg.node_port_addresses[..]
    };
    NodePortAddresses::new(cfg.family, np_flag, &cfg.node_ips)
}

/// The table, its sets, maps and chains (a transaction text without rules).
fn declarations(family: IpFamily) -> String {
    let f = family_word(family);
    let t = addr_type(family);
    let mut o = String::with_capacity(4096);
    let mut add = |what: &str| {
        let _ = writeln!(o, "add {what}");
    };
    add(&format!(
        "table {f} {TABLE} {{ comment \"rules for kube-proxy\" ; }}"
    ));
    let sets = [
        (CLUSTER_IPS, "Active ClusterIPs"),
        (NODEPORT_IPS, "IPs that accept NodePort traffic"),
    ];
    for (name, c) in sets {
        add(&format!(
            "set {f} {TABLE} {name} {{ type {t} ; comment \"{c}\" ; }}"
        ));
    }
    let maps = [
        (
            FIREWALL_IPS,
            true,
            "destinations that are subject to LoadBalancerSourceRanges",
        ),
        (
            NO_ENDPOINT_NODEPORTS,
            false,
            "vmap to drop or reject packets to service nodeports with no endpoints",
        ),
        (
            NO_ENDPOINT_SERVICES,
            true,
            "vmap to drop or reject packets to services with no endpoints",
        ),
        (
            SERVICE_IPS,
            true,
            "ClusterIP, ExternalIP and LoadBalancer IP traffic",
        ),
        (SERVICE_NODEPORTS, false, "NodePort traffic"),
    ];
    for (name, with_ip, c) in maps {
        let key = if with_ip {
            format!("{t} . inet_proto . inet_service")
        } else {
            "inet_proto . inet_service".to_string()
        };
        add(&format!(
            "map {f} {TABLE} {name} {{ type {key} : verdict ; comment \"{c}\" ; }}"
        ));
    }
    let plain = [
        "cluster-ips-check",
        "firewall-check",
        MARK_MASQ,
        "masquerading",
        "nodeport-endpoints-check",
        SERVICES,
        "service-endpoints-check",
    ];
    for (name, ty, hook, prio) in BASE_CHAINS {
        add(&format!(
            "chain {f} {TABLE} {name} {{ type {ty} hook {hook} priority {prio} ; }}"
        ));
    }
    for name in plain {
        add(&format!("chain {f} {TABLE} {name}"));
    }
    add(&format!(
        "chain {f} {TABLE} {REJECT_CHAIN} {{ comment \"helper for @no-endpoint-services / @no-endpoint-nodeports\" ; }}"
    ));
    o
}

/// The base and helper chains' rules: `(chain, rule)`. Node ports on every local address
/// (`--nodeport-addresses` holding a zero-length prefix, `np_match_all`) match by routing
/// type; otherwise by the `nodeport-ips` set.
fn base_rules(cfg: &RenderConfig, np_match_all: bool) -> Vec<(&'static str, String)> {
    let f = family_word(cfg.family);
    let mark = format!("0x{:x}", 1u32 << cfg.masquerade_bit);
    let (np_match, np_check) = if np_match_all {
        let lo = match cfg.family {
            IpFamily::V4 => "ip daddr != 127.0.0.0/8",
            IpFamily::V6 => "ip6 daddr != ::1",
        };
        (
            format!("fib daddr type local {lo}"),
            format!("fib daddr type local {lo}"),
        )
    } else {
        (
            format!("{f} daddr @{NODEPORT_IPS}"),
            format!("{f} daddr @{NODEPORT_IPS}"),
        )
    };
    vec![
        (
            "filter-prerouting-pre-dnat",
            "ct state new jump firewall-check".into(),
        ),
        (
            "filter-forward",
            "ct state new jump service-endpoints-check".into(),
        ),
        (
            "filter-forward",
            "ct state new jump cluster-ips-check".into(),
        ),
        (
            "filter-input",
            "ct state new jump nodeport-endpoints-check".into(),
        ),
        (
            "filter-input",
            "ct state new jump service-endpoints-check".into(),
        ),
        (
            "filter-output",
            "ct state new jump service-endpoints-check".into(),
        ),
        (
            "filter-output-pre-dnat",
            "ct state new jump firewall-check".into(),
        ),
        (
            "filter-output",
            "ct state new jump cluster-ips-check".into(),
        ),
        (
            "firewall-check",
            format!("{f} daddr . meta l4proto . th dport vmap @{FIREWALL_IPS}"),
        ),
        (MARK_MASQ, format!("mark set mark or {mark}")),
        ("masquerading", format!("mark and {mark} == 0 return")),
        ("masquerading", format!("mark set mark xor {mark}")),
        ("masquerading", "masquerade fully-random".into()),
        ("nat-output", format!("jump {SERVICES}")),
        ("nat-postrouting", "jump masquerading".into()),
        ("nat-prerouting", format!("jump {SERVICES}")),
        (
            "nodeport-endpoints-check",
            format!("{np_check} meta l4proto . th dport vmap @{NO_ENDPOINT_NODEPORTS}"),
        ),
        (REJECT_CHAIN, "reject".into()),
        (
            SERVICES,
            format!("{f} daddr . meta l4proto . th dport vmap @{SERVICE_IPS}"),
        ),
        (
            SERVICES,
            format!("{np_match} meta l4proto . th dport vmap @{SERVICE_NODEPORTS}"),
        ),
        (
            "service-endpoints-check",
            format!("{f} daddr . meta l4proto . th dport vmap @{NO_ENDPOINT_SERVICES}"),
        ),
    ]
}

/// The rules of `cluster-ips-check`: traffic to the cluster IPs' other ports is rejected;
/// to the service CIDRs' unallocated addresses dropped (upstream, when ServiceCIDRs are
/// known).
fn cluster_ips_check(cfg: &RenderConfig) -> String {
    let f = family_word(cfg.family);
    let mut check = format!(
        "add rule {f} {TABLE} cluster-ips-check {f} daddr @{CLUSTER_IPS} reject comment \"Reject traffic to invalid ports of ClusterIPs\"\n"
    );
    if !cfg.service_cidrs.is_empty() {
        let cidrs: Vec<String> = cfg.service_cidrs.iter().map(|c| c.to_string()).collect();
        let _ = writeln!(
            check,
            "add rule {f} {TABLE} cluster-ips-check {f} daddr {{ {} }} drop comment \"Drop traffic to unallocated ClusterIPs\"",
            cidrs.join(", ")
        );
    }
    check
}

/// `ns/name:port` (or `ns/name`), the element comments' text.
fn spn_text(name: &ServicePortName) -> String {
    name.to_string()
}

/// One service port's sets, chains and elements, as upstream's syncProxyRules renders them.
pub fn render_service(
    name: &ServicePortName,
    svc: &ServicePortInfo,
    eps: &[EndpointInfo],
    cfg: &RenderConfig,
) -> ServiceNft {
    let cat = categorize(eps, svc, &cfg.node_name, cfg.zone.as_deref());
    let has_any = cat.has_any;
    let has_internal = has_any && !(svc.internal_policy_local && cat.local.is_empty());
    let has_external = has_any && !(svc.external_policy_local && cat.local.is_empty());
    let cx = ServiceCtx {
        svc,
        cfg,
        f: family_word(cfg.family),
        names: ServiceNames::new(name),
        proto: name.protocol.lower(),
        spn: spn_text(name),
        has_internal,
        has_external,
        uses_external: has_any && svc.externally_accessible(),
        uses_fw: !svc.load_balancer_vips.is_empty() && !svc.load_balancer_source_ranges.is_empty(),
        no_endpoint_verdict: if has_any {
            "drop".to_string()
        } else {
            format!("goto {REJECT_CHAIN}")
        },
    };
    let ep_names = cx.endpoint_names(&cat);
    let mut chains = cx.policy_chains(&cat, &ep_names);
    chains.extend(cx.external_chain());
    chains.extend(cx.endpoint_chains(&ep_names));
    chains.extend(cx.firewall_chain());
    ServiceNft {
        sets: cx.affinity_sets(&ep_names),
        chains,
        elements: cx.elements(),
        endpoints: eps.len(),
        no_local_internal: has_any && !has_internal,
        no_local_external: has_any && !has_external,
    }
}

/// An endpoint reached by the service port, with its chain's and affinity set's names.
type EndpointNames<'e> = (&'e EndpointInfo, String, String);

/// What [`render_service`] decides once and each of its pieces reads.
struct ServiceCtx<'a> {
    svc: &'a ServicePortInfo,
    cfg: &'a RenderConfig,
    /// `ip`/`ip6`.
    f: &'static str,
    names: ServiceNames,
    proto: &'static str,
    /// The element comments' text.
    spn: String,
    /// Whether traffic under the internal (external) policy has an endpoint to go to.
    has_internal: bool,
    has_external: bool,
    /// Whether external IPs, load-balancer IPs and the node port lead to the service.
    uses_external: bool,
    /// Whether load-balancer source ranges filter the load-balancer IPs.
    uses_fw: bool,
    /// What the filter hooks do with traffic that has no endpoint under its policy.
    no_endpoint_verdict: String,
}

impl ServiceCtx<'_> {
    fn internal_chain(&self) -> &str {
        if self.svc.internal_policy_local {
            &self.names.local
        } else {
            &self.names.cluster
        }
    }

    fn external_policy_chain(&self) -> &str {
        if self.svc.external_policy_local {
            &self.names.local
        } else {
            &self.names.cluster
        }
    }

    /// `ip . proto . port`: the key of a service address in the shared maps.
    fn key(&self, ip: &IpAddr) -> String {
        format!("{ip} . {} . {}", self.proto, self.svc.port)
    }

    fn el(&self, map: Map, key: String, comment: bool, value: Option<String>) -> Element {
        Element {
            map,
            key,
            comment: comment.then(|| self.spn.clone()),
            value,
        }
    }

    /// An element of a no-endpoint map: the verdict, commented with the service port.
    fn no_endpoint(&self, map: Map, key: String) -> Element {
        self.el(map, key, true, Some(self.no_endpoint_verdict.clone()))
    }

    /// The service port's elements in the shared maps: its cluster IP, external and
    /// load-balancer IPs, the firewall and the node port.
    fn elements(&self) -> Vec<Element> {
        let svc = self.svc;
        let to_external = || Some(format!("goto {}", self.names.external));
        let cip = svc.cluster_ip;
        let mut els = vec![self.el(Map::ClusterIps, cip.to_string(), false, None)];
        if self.has_internal {
            let to = Some(format!("goto {}", self.internal_chain()));
            els.push(self.el(Map::ServiceIps, self.key(&cip), false, to));
        } else {
            els.push(self.no_endpoint(Map::NoEndpointServices, self.key(&cip)));
        }
        for ip in svc.external_ips.iter().chain(&svc.load_balancer_vips) {
            if self.uses_external {
                els.push(self.el(Map::ServiceIps, self.key(ip), false, to_external()));
            }
            if !self.has_external {
                els.push(self.no_endpoint(Map::NoEndpointServices, self.key(ip)));
            }
        }
        if self.uses_fw {
            for ip in &svc.load_balancer_vips {
                let to = Some(format!("goto {}", self.names.firewall));
                els.push(self.el(Map::FirewallIps, self.key(ip), false, to));
            }
        }
        if svc.node_port != 0 {
            let k = format!("{} . {}", self.proto, svc.node_port);
            if self.uses_external {
                els.push(self.el(Map::ServiceNodeports, k.clone(), false, to_external()));
            }
            if !self.has_external {
                els.push(self.no_endpoint(Map::NoEndpointNodeports, k));
            }
        }
        els
    }

    /// Every reachable endpoint with its chain and affinity set names.
    fn endpoint_names<'e>(&self, cat: &Categorized<'e>) -> Vec<EndpointNames<'e>> {
        cat.all_reachable
            .iter()
            .map(|e| {
                let (c, a) = self.names.endpoint(&e.ip.to_string(), e.port);
                (*e, c, a)
            })
            .collect()
    }

    fn endpoint_name(&self, ep_names: &[EndpointNames], e: &EndpointInfo) -> (String, String) {
        ep_names
            .iter()
            .find(|(x, _, _)| x.ip == e.ip && x.port == e.port)
            .map(|(_, c, a)| (c.clone(), a.clone()))
            .unwrap_or_else(|| self.names.endpoint(&e.ip.to_string(), e.port))
    }

    /// One affinity set per endpoint when the service has session affinity.
    fn affinity_sets(&self, ep_names: &[EndpointNames]) -> Vec<(String, String)> {
        let Some(secs) = self.svc.session_affinity_seconds else {
            return Vec::new();
        };
        let t = addr_type(self.cfg.family);
        ep_names
            .iter()
            .map(|(_, _, set)| {
                let body = format!("{{ type {t} ; flags dynamic,timeout ; timeout {secs}s ; }}");
                (set.clone(), body)
            })
            .collect()
    }

    /// A policy chain: affinity, then the random choice among `list`.
    fn policy_chain(
        &self,
        chain: &str,
        list: &[&EndpointInfo],
        ep_names: &[EndpointNames],
    ) -> Chain {
        let f = self.f;
        let mut rules = Vec::new();
        if self.svc.session_affinity_seconds.is_some() {
            for e in list {
                let (c, a) = self.endpoint_name(ep_names, e);
                rules.push(format!("{f} saddr @{a} goto {c}"));
            }
        }
        let mut vmap = format!("numgen random mod {} vmap {{ ", list.len());
        for (i, e) in list.iter().enumerate() {
            if i > 0 {
                vmap.push_str(" , ");
            }
            let _ = write!(vmap, "{i} : goto {}", self.endpoint_name(ep_names, e).0);
        }
        vmap.push_str(" }");
        rules.push(vmap);
        Chain {
            name: chain.to_string(),
            rules,
        }
    }

    /// The cluster and local policy chains in use, the internal policy's one starting with
    /// the masquerade of cluster-IP traffic.
    fn policy_chains(&self, cat: &Categorized, ep_names: &[EndpointNames]) -> Vec<Chain> {
        let svc = self.svc;
        let uses_cluster = !cat.cluster.is_empty() && svc.uses_cluster_endpoints();
        let uses_local = !cat.local.is_empty() && svc.uses_local_endpoints();
        let mut cluster =
            uses_cluster.then(|| self.policy_chain(&self.names.cluster, &cat.cluster, ep_names));
        let mut local =
            uses_local.then(|| self.policy_chain(&self.names.local, &cat.local, ep_names));
        let target = if svc.internal_policy_local {
            local.as_mut()
        } else {
            cluster.as_mut()
        };
        if let (Some(m), Some(ch)) = (self.internal_masquerade(), target) {
            ch.rules.insert(0, m);
        }
        cluster.into_iter().chain(local).collect()
    }

    /// Masquerade of cluster-IP traffic from outside the cluster (or all of it).
    fn internal_masquerade(&self) -> Option<String> {
        if !self.has_internal {
            return None;
        }
        let (f, cip) = (self.f, self.svc.cluster_ip);
        if self.cfg.masquerade_all {
            let (proto, port) = (self.proto, self.svc.port);
            Some(format!(
                "{f} daddr {cip} {proto} dport {port} jump {MARK_MASQ}"
            ))
        } else {
            self.cfg
                .nft_local(true)
                .map(|nl| format!("{f} daddr {cip} {nl} jump {MARK_MASQ}"))
        }
    }

    /// The external chain: masquerade (or the local policy's short-circuits), then the
    /// external policy's chain.
    fn external_chain(&self) -> Option<Chain> {
        if !self.uses_external {
            return None;
        }
        let mut rules = Vec::new();
        if !self.svc.external_policy_local {
            rules.push(format!("jump {MARK_MASQ}"));
        } else {
            if let Some(l) = self.cfg.nft_local(false) {
                rules.push(format!(
                    "{l} goto {} comment \"short-circuit pod traffic\"",
                    self.names.cluster
                ));
            }
            rules.push(format!(
                "fib saddr type local jump {MARK_MASQ} comment \"masquerade local traffic\""
            ));
            rules.push(format!(
                "fib saddr type local goto {} comment \"short-circuit local traffic\"",
                self.names.cluster
            ));
        }
        if self.has_external {
            rules.push(format!("goto {}", self.external_policy_chain()));
        }
        Some(Chain {
            name: self.names.external.clone(),
            rules,
        })
    }

    /// One chain per endpoint: hairpin masquerade, affinity update, DNAT.
    fn endpoint_chains(&self, ep_names: &[EndpointNames]) -> Vec<Chain> {
        let (f, proto) = (self.f, self.proto);
        let mut chains = Vec::new();
        for (e, chain, set) in ep_names {
            let ip = e.ip;
            let mut rules = vec![format!("{f} saddr {ip} jump {MARK_MASQ}")];
            if self.svc.session_affinity_seconds.is_some() {
                rules.push(format!("update @{set} {{ {f} saddr }}"));
            }
            let to = match ip {
                IpAddr::V4(_) => format!("{ip}:{}", e.port),
                IpAddr::V6(_) => format!("[{ip}]:{}", e.port),
            };
            rules.push(format!("meta l4proto {proto} dnat to {to}"));
            chains.push(Chain {
                name: chain.clone(),
                rules,
            });
        }
        chains
    }

    /// The firewall chain: drop what the load-balancer source ranges do not allow.
    fn firewall_chain(&self) -> Option<Chain> {
        if !self.uses_fw {
            return None;
        }
        let ranges = &self.svc.load_balancer_source_ranges;
        let mut allowed: Vec<String> = ranges.iter().map(|c| c.to_string()).collect();
        if self
            .cfg
            .node_ips
            .first()
            .is_some_and(|ip| ranges.iter().any(|c| c.contains(ip)))
        {
            allowed.extend(self.svc.load_balancer_vips.iter().map(IpAddr::to_string));
        }
        Some(Chain {
            name: self.names.firewall.clone(),
            rules: vec![format!(
                "{} saddr != {{ {} }} drop",
                self.f,
                allowed.join(", ")
            )],
        })
    }
}
