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
use crate::topology::categorize;

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
        let t = addr_type(cfg.family);
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
        let mark = format!("0x{:x}", 1u32 << cfg.masquerade_bit);
        // Upstream's nftables mode takes node ports on the node's primary IPs by default
        // (`--nodeport-addresses=primary`), not on every local address.
        let primary = [NODEPORT_PRIMARY.to_string()];
        let np_flag = if cfg.node_port_addresses.is_empty() {
            &primary[..]
        } else {
            &cfg.node_port_addresses[..]
        };
        let np = NodePortAddresses::new(cfg.family, np_flag, &cfg.node_ips);
        // Node ports on every local address (`--nodeport-addresses` holding a zero-length
        // prefix) match by routing type; otherwise by the `nodeport-ips` set.
        let (np_match, np_check) = if np.match_all() {
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
        let rules: Vec<(&str, String)> = vec![
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
        ];
        for (chain, rule) in rules {
            add(&format!("rule {f} {TABLE} {chain} {rule}"));
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
        // Traffic to the cluster IPs' other ports is rejected; to the service CIDRs'
        // unallocated addresses dropped (upstream, when ServiceCIDRs are known).
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
        Base {
            fixed: o,
            nodeport_ips,
            cluster_ips_check: check,
        }
    }
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
    let f = family_word(cfg.family);
    let names = ServiceNames::new(name);
    let cat = categorize(eps, svc, &cfg.node_name, cfg.zone.as_deref());
    let proto = name.protocol.lower();
    let port = svc.port;
    let spn = spn_text(name);
    let has_any = cat.has_any;

    let (mut internal_chain, mut has_internal) = (&names.cluster, has_any);
    if svc.internal_policy_local {
        internal_chain = &names.local;
        has_internal &= !cat.local.is_empty();
    }
    let (mut external_policy_chain, mut has_external) = (&names.cluster, has_any);
    if svc.external_policy_local {
        external_policy_chain = &names.local;
        has_external &= !cat.local.is_empty();
    }
    let uses_cluster = !cat.cluster.is_empty() && svc.uses_cluster_endpoints();
    let uses_local = !cat.local.is_empty() && svc.uses_local_endpoints();
    let uses_external = has_any && svc.externally_accessible();
    let uses_fw = !svc.load_balancer_vips.is_empty() && !svc.load_balancer_source_ranges.is_empty();
    // What the filter hooks do with traffic that has no endpoint under its policy.
    let no_endpoint_verdict = if has_any {
        "drop".to_string()
    } else {
        format!("goto {REJECT_CHAIN}")
    };

    let mut out = ServiceNft {
        endpoints: eps.len(),
        no_local_internal: has_any && !has_internal,
        no_local_external: has_any && !has_external,
        ..ServiceNft::default()
    };
    let key = |ip: &IpAddr| format!("{ip} . {proto} . {port}");
    let el = |map, key: String, comment: bool, value: Option<String>| Element {
        map,
        key,
        comment: comment.then(|| spn.clone()),
        value,
    };

    // Cluster IP.
    let cip = svc.cluster_ip;
    out.elements
        .push(el(Map::ClusterIps, cip.to_string(), false, None));
    if has_internal {
        out.elements.push(el(
            Map::ServiceIps,
            key(&cip),
            false,
            Some(format!("goto {internal_chain}")),
        ));
    } else {
        out.elements.push(el(
            Map::NoEndpointServices,
            key(&cip),
            true,
            Some(no_endpoint_verdict.clone()),
        ));
    }
    // External IPs and load-balancer IPs.
    for ip in svc.external_ips.iter().chain(&svc.load_balancer_vips) {
        if uses_external {
            out.elements.push(el(
                Map::ServiceIps,
                key(ip),
                false,
                Some(format!("goto {}", names.external)),
            ));
        }
        if !has_external {
            out.elements.push(el(
                Map::NoEndpointServices,
                key(ip),
                true,
                Some(no_endpoint_verdict.clone()),
            ));
        }
    }
    if uses_fw {
        for ip in &svc.load_balancer_vips {
            out.elements.push(el(
                Map::FirewallIps,
                key(ip),
                false,
                Some(format!("goto {}", names.firewall)),
            ));
        }
    }
    // Node port.
    if svc.node_port != 0 {
        let k = format!("{proto} . {}", svc.node_port);
        if uses_external {
            out.elements.push(el(
                Map::ServiceNodeports,
                k.clone(),
                false,
                Some(format!("goto {}", names.external)),
            ));
        }
        if !has_external {
            out.elements.push(el(
                Map::NoEndpointNodeports,
                k,
                true,
                Some(no_endpoint_verdict.clone()),
            ));
        }
    }

    // Endpoint names, affinity sets.
    let affinity = svc.session_affinity_seconds;
    let ep_names: Vec<(&EndpointInfo, String, String)> = cat
        .all_reachable
        .iter()
        .map(|e| {
            let (c, a) = names.endpoint(&e.ip.to_string(), e.port);
            (*e, c, a)
        })
        .collect();
    let ep_name = |e: &EndpointInfo| {
        ep_names
            .iter()
            .find(|(x, _, _)| x.ip == e.ip && x.port == e.port)
            .map(|(_, c, a)| (c.clone(), a.clone()))
            .unwrap_or_else(|| names.endpoint(&e.ip.to_string(), e.port))
    };
    if let Some(secs) = affinity {
        for (_, _, set) in &ep_names {
            out.sets.push((
                set.clone(),
                format!(
                    "{{ type {} ; flags dynamic,timeout ; timeout {secs}s ; }}",
                    addr_type(cfg.family)
                ),
            ));
        }
    }

    // Policy chains: affinity, then the random choice.
    let policy_chain = |chain: &str, list: &[&EndpointInfo]| {
        let mut rules = Vec::new();
        if affinity.is_some() {
            for e in list {
                let (c, a) = ep_name(e);
                rules.push(format!("{f} saddr @{a} goto {c}"));
            }
        }
        let mut vmap = format!("numgen random mod {} vmap {{ ", list.len());
        for (i, e) in list.iter().enumerate() {
            if i > 0 {
                vmap.push_str(" , ");
            }
            let _ = write!(vmap, "{i} : goto {}", ep_name(e).0);
        }
        vmap.push_str(" }");
        rules.push(vmap);
        Chain {
            name: chain.to_string(),
            rules,
        }
    };
    let mut cluster = uses_cluster.then(|| policy_chain(&names.cluster, &cat.cluster));
    let mut local = uses_local.then(|| policy_chain(&names.local, &cat.local));
    // Masquerade of cluster-IP traffic from outside the cluster (or all of it).
    if has_internal {
        let masq = if cfg.masquerade_all {
            Some(format!(
                "{f} daddr {cip} {proto} dport {port} jump {MARK_MASQ}"
            ))
        } else {
            cfg.nft_local(true)
                .map(|nl| format!("{f} daddr {cip} {nl} jump {MARK_MASQ}"))
        };
        let target = if svc.internal_policy_local {
            local.as_mut()
        } else {
            cluster.as_mut()
        };
        if let (Some(m), Some(ch)) = (masq, target) {
            ch.rules.insert(0, m);
        }
    }
    if let Some(c) = cluster {
        out.chains.push(c);
    }
    if let Some(c) = local {
        out.chains.push(c);
    }

    if uses_external {
        let mut rules = Vec::new();
        if !svc.external_policy_local {
            rules.push(format!("jump {MARK_MASQ}"));
        } else {
            if let Some(l) = cfg.nft_local(false) {
                rules.push(format!(
                    "{l} goto {} comment \"short-circuit pod traffic\"",
                    names.cluster
                ));
            }
            rules.push(format!(
                "fib saddr type local jump {MARK_MASQ} comment \"masquerade local traffic\""
            ));
            rules.push(format!(
                "fib saddr type local goto {} comment \"short-circuit local traffic\"",
                names.cluster
            ));
        }
        if has_external {
            rules.push(format!("goto {external_policy_chain}"));
        }
        out.chains.push(Chain {
            name: names.external.clone(),
            rules,
        });
    }

    for (e, chain, set) in &ep_names {
        let ip = e.ip;
        let mut rules = vec![format!("{f} saddr {ip} jump {MARK_MASQ}")];
        if affinity.is_some() {
            rules.push(format!("update @{set} {{ {f} saddr }}"));
        }
        let to = match ip {
            IpAddr::V4(_) => format!("{ip}:{}", e.port),
            IpAddr::V6(_) => format!("[{ip}]:{}", e.port),
        };
        rules.push(format!("meta l4proto {proto} dnat to {to}"));
        out.chains.push(Chain {
            name: chain.clone(),
            rules,
        });
    }

    if uses_fw {
        let mut allowed: Vec<String> = svc
            .load_balancer_source_ranges
            .iter()
            .map(|c| c.to_string())
            .collect();
        if cfg.node_ips.first().is_some_and(|ip| {
            svc.load_balancer_source_ranges
                .iter()
                .any(|c| c.contains(ip))
        }) {
            allowed.extend(svc.load_balancer_vips.iter().map(IpAddr::to_string));
        }
        out.chains.push(Chain {
            name: names.firewall.clone(),
            rules: vec![format!("{f} saddr != {{ {} }} drop", allowed.join(", "))],
        });
    }
    out
}
