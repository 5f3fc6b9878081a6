//! Desired state of the IPVS mode (pure): from the service ports and their endpoints, the
//! virtual servers with their real servers, the addresses `kube-ipvs0` holds, the ipsets'
//! contents, and the small fixed iptables part that matches on those sets (upstream's
//! pkg/proxy/ipvs layout).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::net::IpAddr;

use super::genl::{FLAG_PERSISTENT, VirtualServer, VsKey};
use super::ipset::{self, SetContents};
use crate::model::{Cidr, EndpointInfo, IpFamily, Protocol, ServicePortInfo, ServicePortName};
use crate::nodeport::NodePortAddresses;
use crate::render_config::RenderConfig;
use crate::topology::categorize;

/// The IPVS-only settings (`ipvs.*` of KubeProxyConfiguration).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IpvsSettings {
    /// `ipvs.scheduler` ("" means rr).
    pub scheduler: String,
    /// `ipvs.excludeCIDRs`: virtual servers on these addresses are never deleted.
    pub exclude_cidrs: Vec<Cidr>,
    pub strict_arp: bool,
    /// Seconds; 0 leaves the kernel's value.
    pub tcp_timeout: u32,
    pub tcp_fin_timeout: u32,
    pub udp_timeout: u32,
}

impl Default for IpvsSettings {
    fn default() -> Self {
        IpvsSettings {
            scheduler: DEFAULT_SCHEDULER.to_string(),
            exclude_cidrs: Vec::new(),
            strict_arp: false,
            tcp_timeout: 0,
            tcp_fin_timeout: 0,
            udp_timeout: 0,
        }
    }
}

/// Upstream's default scheduler (round robin).
pub const DEFAULT_SCHEDULER: &str = "rr";

/// One desired virtual server and the endpoints it balances over (weight 1 each).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DesiredVs {
    pub vs: VirtualServer,
    pub dests: BTreeSet<(IpAddr, u16)>,
}

type Endpoints = Vec<(IpAddr, u16)>;

/// Everything one sync writes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Desired {
    pub services: BTreeMap<VsKey, DesiredVs>,
    /// Addresses bound to `kube-ipvs0`: cluster IPs, external IPs, load-balancer IPs.
    pub bound: BTreeSet<IpAddr>,
    pub sets: SetContents,
}

fn proto_word(p: Protocol) -> &'static str {
    p.lower()
}

/// `ip,proto:port` (IPv6 addresses as they are: ipset takes them bare).
fn ip_port(ip: &IpAddr, p: Protocol, port: u16) -> String {
    format!("{ip},{}:{port}", proto_word(p))
}

/// The node addresses node ports answer on: the local addresses (not those on
/// `kube-ipvs0`) that `nodePortAddresses` selects.
pub fn node_port_ips(cfg: &RenderConfig, local: &BTreeSet<IpAddr>) -> Vec<IpAddr> {
    let npa = NodePortAddresses::new(cfg.family, &cfg.node_port_addresses, &cfg.node_ips);
    local
        .iter()
        .filter(|ip| cfg.family.matches(ip) && npa.contains(ip))
        // Not loopback (IPVS does not answer there without route_localnet, which this
        // mode leaves alone) nor IPv6 link-local.
        .filter(|ip| !ip.is_loopback())
        .filter(|ip| match ip {
            IpAddr::V6(a) => (a.segments()[0] & 0xffc0) != 0xfe80,
            IpAddr::V4(_) => true,
        })
        .copied()
        .collect()
}

/// Renders the desired state of every service port.
pub fn desired(
    cfg: &RenderConfig,
    ipvs: &IpvsSettings,
    services: &BTreeMap<ServicePortName, ServicePortInfo>,
    endpoints: &BTreeMap<ServicePortName, Vec<EndpointInfo>>,
    node_ips: &[IpAddr],
) -> Desired {
    let mut d = Desired::default();
    let mut add = |set: &'static str, e: String| {
        d.sets.entry(set).or_default().insert(e);
    };
    // (virtual server, bound to kube-ipvs0, endpoints, affinity timeout)
    let mut vss: Vec<(VsKey, bool, Endpoints, Option<u32>)> = Vec::new();
    for (name, svc) in services {
        let eps = endpoints.get(name).map_or(&[][..], Vec::as_slice);
        let cat = categorize(eps, svc, &cfg.node_name, cfg.zone.as_deref());
        let pick = |local: bool| -> Vec<(IpAddr, u16)> {
            let v = if local { &cat.local } else { &cat.cluster };
            v.iter().map(|e| (e.ip, e.port)).collect()
        };
        let internal = pick(svc.internal_policy_local);
        let external = pick(svc.external_policy_local);
        let p = svc.name.protocol;
        let affinity = svc.session_affinity_seconds;

        for e in eps.iter().filter(|e| e.is_local) {
            add(
                ipset::LOOP_BACK,
                format!("{},{}:{},{}", e.ip, proto_word(p), e.port, e.ip),
            );
        }
        add(ipset::CLUSTER_IP, ip_port(&svc.cluster_ip, p, svc.port));
        vss.push((
            key(svc.cluster_ip, p, svc.port),
            true,
            internal.clone(),
            affinity,
        ));
        for ip in &svc.external_ips {
            add(ipset::EXTERNAL_IP, ip_port(ip, p, svc.port));
            if svc.external_policy_local {
                add(ipset::EXTERNAL_IP_LOCAL, ip_port(ip, p, svc.port));
            }
            vss.push((key(*ip, p, svc.port), true, external.clone(), affinity));
        }
        for ip in &svc.load_balancer_vips {
            add(ipset::LOAD_BALANCER, ip_port(ip, p, svc.port));
            if svc.external_policy_local {
                add(ipset::LOAD_BALANCER_LOCAL, ip_port(ip, p, svc.port));
            }
            if !svc.load_balancer_source_ranges.is_empty() {
                add(ipset::LOAD_BALANCER_FW, ip_port(ip, p, svc.port));
                for c in &svc.load_balancer_source_ranges {
                    add(
                        ipset::LOAD_BALANCER_SOURCE_CIDR,
                        format!("{},{c}", ip_port(ip, p, svc.port)),
                    );
                }
            }
            vss.push((key(*ip, p, svc.port), true, external.clone(), affinity));
        }
        if svc.node_port != 0 {
            let np = svc.node_port;
            match p {
                Protocol::Tcp | Protocol::Udp => {
                    let (all, local) = if p == Protocol::Tcp {
                        (ipset::NODE_PORT_TCP, ipset::NODE_PORT_LOCAL_TCP)
                    } else {
                        (ipset::NODE_PORT_UDP, ipset::NODE_PORT_LOCAL_UDP)
                    };
                    add(all, np.to_string());
                    if svc.external_policy_local {
                        add(local, np.to_string());
                    }
                }
                Protocol::Sctp => {
                    for ip in node_ips {
                        add(ipset::NODE_PORT_SCTP, ip_port(ip, p, np));
                        if svc.external_policy_local {
                            add(ipset::NODE_PORT_LOCAL_SCTP, ip_port(ip, p, np));
                        }
                    }
                }
            }
            for ip in node_ips {
                vss.push((key(*ip, p, np), false, external.clone(), affinity));
            }
        }
        if svc.health_check_node_port != 0 {
            add(
                ipset::HEALTH_CHECK_NODE_PORT,
                svc.health_check_node_port.to_string(),
            );
        }
    }
    for (k, bind, dests, affinity) in vss {
        if bind {
            d.bound.insert(k.addr);
        }
        let entry = d.services.entry(k).or_insert_with(|| DesiredVs {
            vs: VirtualServer {
                key: k,
                scheduler: ipvs.scheduler.clone(),
                flags: if affinity.is_some() {
                    FLAG_PERSISTENT
                } else {
                    0
                },
                timeout: affinity.unwrap_or(0),
            },
            dests: BTreeSet::new(),
        });
        entry.dests.extend(dests);
    }
    d
}

fn key(addr: IpAddr, protocol: Protocol, port: u16) -> VsKey {
    VsKey {
        addr,
        protocol,
        port,
    }
}

/// Jumps from the built-in chains into ours: (table, from, to, comment), upstream's.
pub const JUMPS: &[(&str, &str, &str, &str)] = &[
    (
        "nat",
        "OUTPUT",
        "KUBE-SERVICES",
        "kubernetes service portals",
    ),
    (
        "nat",
        "PREROUTING",
        "KUBE-SERVICES",
        "kubernetes service portals",
    ),
    (
        "nat",
        "POSTROUTING",
        "KUBE-POSTROUTING",
        "kubernetes postrouting rules",
    ),
    (
        "filter",
        "FORWARD",
        "KUBE-FORWARD",
        "kubernetes forwarding rules",
    ),
    (
        "filter",
        "INPUT",
        "KUBE-NODE-PORT",
        "kubernetes health check rules",
    ),
    (
        "filter",
        "INPUT",
        "KUBE-PROXY-FIREWALL",
        "kube-proxy firewall rules",
    ),
    (
        "filter",
        "FORWARD",
        "KUBE-PROXY-FIREWALL",
        "kube-proxy firewall rules",
    ),
];

/// The fixed iptables part (`iptables-restore --noflush` input: our chains declared, so
/// flushed, then filled). Which rules appear depends only on which sets are non-empty and
/// on the configuration, never on the number of services.
pub fn iptables_text(cfg: &RenderConfig, sets: &SetContents) -> String {
    let t = IptText {
        cfg,
        sets,
        bit: cfg.masquerade_mark(),
    };
    let mut o = String::new();
    o.push_str("*nat\n");
    t.nat_head(&mut o);
    t.nat_services(&mut o);
    t.nat_node_ports(&mut o);
    let _ = writeln!(
        o,
        "-A KUBE-SERVICES -m set --match-set {} dst,dst -j ACCEPT",
        t.n(ipset::CLUSTER_IP)
    );
    if t.has(ipset::LOAD_BALANCER) {
        let _ = writeln!(
            o,
            "-A KUBE-SERVICES -m set --match-set {} dst,dst -j ACCEPT",
            t.n(ipset::LOAD_BALANCER)
        );
    }
    o.push_str("COMMIT\n*filter\n");
    t.filter(&mut o);
    o.push_str("COMMIT\n");
    o
}

/// `-m comment --comment "…"`.
fn comment(s: &str) -> String {
    format!("-m comment --comment \"{s}\"")
}

/// What the fixed iptables part is rendered from.
struct IptText<'a> {
    cfg: &'a RenderConfig,
    sets: &'a SetContents,
    /// The masquerade mark bit.
    bit: String,
}

impl IptText<'_> {
    /// A set's name in this family.
    fn n(&self, base: &str) -> String {
        ipset::set_name(base, self.cfg.family)
    }

    /// Whether a set holds anything.
    fn has(&self, base: &str) -> bool {
        self.sets.get(base).is_some_and(|s| !s.is_empty())
    }

    /// The nat table's chains, the masquerade of marked and hairpin traffic.
    fn nat_head(&self, o: &mut String) {
        let bit = &self.bit;
        let mark = format!("{bit}/{bit}");
        for ch in [
            "KUBE-SERVICES",
            "KUBE-POSTROUTING",
            "KUBE-NODE-PORT",
            "KUBE-LOAD-BALANCER",
            "KUBE-MARK-MASQ",
        ] {
            let _ = writeln!(o, ":{ch} - [0:0]");
        }
        let _ = writeln!(
            o,
            "-A KUBE-POSTROUTING {} -m set --match-set {} dst,dst,src -j MASQUERADE",
            comment("Kubernetes endpoints dst ip:port, source ip for solving hairpin purpose"),
            self.n(ipset::LOOP_BACK)
        );
        let _ = writeln!(o, "-A KUBE-POSTROUTING -m mark ! --mark {mark} -j RETURN");
        let _ = writeln!(o, "-A KUBE-POSTROUTING -j MARK --xor-mark {bit}");
        let _ = writeln!(
            o,
            "-A KUBE-POSTROUTING {} -j MASQUERADE{}",
            comment("kubernetes service traffic requiring SNAT"),
            if self.cfg.random_fully {
                " --random-fully"
            } else {
                ""
            }
        );
        let _ = writeln!(o, "-A KUBE-MARK-MASQ -j MARK --or-mark {bit}");
    }

    /// Load-balancer, cluster and external IPs: marked for masquerade where due.
    fn nat_services(&self, o: &mut String) {
        if self.has(ipset::LOAD_BALANCER) {
            let _ = writeln!(
                o,
                "-A KUBE-SERVICES {} -m set --match-set {} dst,dst -j KUBE-LOAD-BALANCER",
                comment("Kubernetes service lb portal"),
                self.n(ipset::LOAD_BALANCER)
            );
            if self.has(ipset::LOAD_BALANCER_LOCAL) {
                let _ = writeln!(
                    o,
                    "-A KUBE-LOAD-BALANCER {} -m set --match-set {} dst,dst -j RETURN",
                    comment(
                        "Kubernetes service load balancer ip + port with externalTrafficPolicy=local"
                    ),
                    self.n(ipset::LOAD_BALANCER_LOCAL)
                );
            }
            let _ = writeln!(o, "-A KUBE-LOAD-BALANCER -j KUBE-MARK-MASQ");
        }
        let cluster = comment("Kubernetes service cluster ip + port for masquerade purpose");
        if self.cfg.masquerade_all {
            let _ = writeln!(
                o,
                "-A KUBE-SERVICES {cluster} -m set --match-set {} dst,dst -j KUBE-MARK-MASQ",
                self.n(ipset::CLUSTER_IP)
            );
        } else if let Some(not_local) = self.cfg.ipt_local(true) {
            let _ = writeln!(
                o,
                "-A KUBE-SERVICES {not_local} {cluster} -m set --match-set {} dst,dst -j KUBE-MARK-MASQ",
                self.n(ipset::CLUSTER_IP)
            );
        }
        if self.has(ipset::EXTERNAL_IP) {
            let ext =
                comment("Kubernetes service external ip + port for masquerade and filter purpose");
            if self.has(ipset::EXTERNAL_IP_LOCAL) {
                let _ = writeln!(
                    o,
                    "-A KUBE-SERVICES {} -m set --match-set {} dst,dst -j RETURN",
                    comment(
                        "Kubernetes service external ip + port with externalTrafficPolicy=local"
                    ),
                    self.n(ipset::EXTERNAL_IP_LOCAL)
                );
            }
            let _ = writeln!(
                o,
                "-A KUBE-SERVICES {ext} -m set --match-set {} dst,dst -j KUBE-MARK-MASQ",
                self.n(ipset::EXTERNAL_IP)
            );
            let _ = writeln!(
                o,
                "-A KUBE-SERVICES -m set --match-set {} dst,dst -j ACCEPT",
                self.n(ipset::EXTERNAL_IP)
            );
        }
    }

    /// Node ports on local addresses: marked for masquerade unless of a Local policy.
    fn nat_node_ports(&self, o: &mut String) {
        let node_port_sets = [
            (
                "tcp",
                ipset::NODE_PORT_LOCAL_TCP,
                ipset::NODE_PORT_TCP,
                "dst",
            ),
            (
                "udp",
                ipset::NODE_PORT_LOCAL_UDP,
                ipset::NODE_PORT_UDP,
                "dst",
            ),
            (
                "sctp",
                ipset::NODE_PORT_LOCAL_SCTP,
                ipset::NODE_PORT_SCTP,
                "dst,dst",
            ),
        ];
        if node_port_sets.iter().any(|(_, _, all, _)| self.has(all)) {
            let _ = writeln!(
                o,
                "-A KUBE-SERVICES -m addrtype --dst-type LOCAL -j KUBE-NODE-PORT"
            );
        }
        for (proto, local, all, dir) in node_port_sets {
            if self.has(local) {
                let _ = writeln!(
                    o,
                    "-A KUBE-NODE-PORT -p {proto} {} -m set --match-set {} {dir} -j RETURN",
                    comment(
                        ipset::SETS
                            .iter()
                            .find(|d| d.name == local)
                            .map_or("", |d| d.comment)
                    ),
                    self.n(local)
                );
            }
            if self.has(all) {
                let _ = writeln!(
                    o,
                    "-A KUBE-NODE-PORT -p {proto} {} -m set --match-set {} {dir} -j KUBE-MARK-MASQ",
                    comment(
                        ipset::SETS
                            .iter()
                            .find(|d| d.name == all)
                            .map_or("", |d| d.comment)
                    ),
                    self.n(all)
                );
            }
        }
    }

    /// The filter table: forwarding, health check node ports, load-balancer source ranges.
    fn filter(&self, o: &mut String) {
        let bit = &self.bit;
        let mark = format!("{bit}/{bit}");
        for ch in [
            "KUBE-FORWARD",
            "KUBE-NODE-PORT",
            "KUBE-PROXY-FIREWALL",
            "KUBE-SOURCE-RANGES-FIREWALL",
        ] {
            let _ = writeln!(o, ":{ch} - [0:0]");
        }
        if !self.cfg.conntrack_tcp_liberal {
            let _ = writeln!(o, "-A KUBE-FORWARD -m conntrack --ctstate INVALID -j DROP");
        }
        let _ = writeln!(
            o,
            "-A KUBE-FORWARD {} -m mark --mark {mark} -j ACCEPT",
            comment("kubernetes forwarding rules")
        );
        let _ = writeln!(
            o,
            "-A KUBE-FORWARD {} -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT",
            comment("kubernetes forwarding conntrack rule")
        );
        if self.has(ipset::HEALTH_CHECK_NODE_PORT) {
            let _ = writeln!(
                o,
                "-A KUBE-NODE-PORT {} -m set --match-set {} dst -j ACCEPT",
                comment("Kubernetes health check node port"),
                self.n(ipset::HEALTH_CHECK_NODE_PORT)
            );
        }
        if self.has(ipset::LOAD_BALANCER_FW) {
            let _ = writeln!(
                o,
                "-A KUBE-PROXY-FIREWALL {} -m set --match-set {} dst,dst -j KUBE-SOURCE-RANGES-FIREWALL",
                comment(
                    "Kubernetes service load balancer ip + port for load balancer with sourceRange"
                ),
                self.n(ipset::LOAD_BALANCER_FW)
            );
            let _ = writeln!(
                o,
                "-A KUBE-SOURCE-RANGES-FIREWALL -m set --match-set {} dst,dst,src -j RETURN",
                self.n(ipset::LOAD_BALANCER_SOURCE_CIDR)
            );
            let _ = writeln!(o, "-A KUBE-SOURCE-RANGES-FIREWALL -j DROP");
        }
    }
}

/// Whether `ip` is in one of `cidrs` (`ipvs.excludeCIDRs`).
pub fn excluded(cidrs: &[Cidr], ip: &IpAddr) -> bool {
    cidrs.iter().any(|c| c.contains(ip))
}

/// The family of a proxier's addresses.
pub fn family_of(ip: &IpAddr) -> IpFamily {
    if ip.is_ipv4() {
        IpFamily::V4
    } else {
        IpFamily::V6
    }
}
