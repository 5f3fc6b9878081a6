//! One service port's rules (upstream's per-service part of syncProxyRules): its rules in
//! the top-level chains and its own chains (EXT, FW, SVC, SVL, one SEP per endpoint).

use std::borrow::Cow;
use std::cell::OnceCell;
use std::collections::HashMap;
use std::fmt::Write as _;
use std::net::IpAddr;

use super::{RenderConfig, q};
use crate::iptables::chains::*;
use crate::iptables::ruleset::{Chain, Rule};
use crate::model::{EndpointInfo, ServicePortInfo, ServicePortName};
use crate::topology::{Categorized, categorize};
use plumbing::iptables::TableName;

/// Node- and flag-level values shared by every service's rules.
pub(super) struct Ctx<'a> {
    cfg: &'a RenderConfig,
    large_cluster: bool,
    if_local: Option<String>,
    if_not_local: Option<String>,
    /// `probability(n)` at index n, filled on demand: float formatting is slow, and the
    /// services of a cluster mostly need the same few values.
    probabilities: Vec<String>,
}

impl<'a> Ctx<'a> {
    pub(super) fn new(cfg: &'a RenderConfig, large_cluster: bool) -> Self {
        Ctx {
            cfg,
            large_cluster,
            if_local: cfg.ipt_local(false),
            if_not_local: cfg.ipt_local(true),
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

/// Everything one service port contributes to the ruleset: its rules in the top-level chains
/// and its own nat chains. Rule texts embed the service port name, so no two services share
/// a rule or a chain; that is what lets a partial sync diff changed services only.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(super) struct ServiceRules {
    /// Rules in top-level filter chains, in render order.
    pub(super) filter_top: Vec<(&'static str, String)>,
    /// Rules in top-level nat chains, in render order.
    pub(super) nat_top: Vec<(&'static str, String)>,
    /// The service's own nat chains (EXT, FW, SVC, SVL, SEPs), in declaration order.
    pub(super) chains: Vec<Chain>,
    pub(super) endpoints: usize,
    pub(super) no_local_internal: bool,
    pub(super) no_local_external: bool,
}

impl ServiceRules {
    pub(super) fn top(&self, t: TableName) -> &[(&'static str, String)] {
        match t {
            TableName::Filter => &self.filter_top,
            _ => &self.nat_top,
        }
    }

    pub(super) fn top_rules(&self, t: TableName, chain: &str) -> Vec<&str> {
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

    pub(super) fn nat_rule_count(&self) -> usize {
        self.nat_top.len() + self.chains.iter().map(|c| c.rules.len()).sum::<usize>()
    }
}

/// One service port's rules (upstream's per-service part of syncProxyRules), in upstream's
/// order: its rules in the top-level chains (cluster IP, external IPs, load balancer, node
/// ports), then its own chains (EXT, FW, SVC and SVL declared in that order, their rules, then
/// one SEP chain per endpoint).
pub(super) fn render_service(
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
    let p = Plan::new(svc, &cat, &spn, proto, &names);
    out.no_local_internal = p.has_any && !p.has_internal;
    out.no_local_external = p.has_any && !p.has_external;

    let cluster_ip_match = cluster_ip_rules(&mut out, &p);
    external_ip_rules(&mut out, &p);
    load_balancer_rules(&mut out, &p);
    node_port_rules(&mut out, &p);

    declare_service_chains(&mut out, &p);
    if let Some(m) = &cluster_ip_match {
        cluster_ip_masquerade(&mut out, &p, m, ctx);
    }
    if p.uses_external_chain {
        external_chain_rules(&mut out, &p, ctx);
    }
    if p.uses_fw_chain {
        firewall_chain_rules(&mut out, &p, cfg);
    }
    endpoint_chains(&mut out, &p, &cat, ctx);
    out
}

/// What the rules of one service port share: its texts and chain names, and the choices its
/// traffic policies and endpoints make.
struct Plan<'a> {
    svc: &'a ServicePortInfo,
    /// `ns/name:port`.
    spn: &'a str,
    /// Lower-case protocol (`tcp`, `udp`, `sctp`).
    proto: &'static str,
    names: &'a ServiceChainNames,
    /// Where cluster-IP traffic goes: SVC, or SVL under internalTrafficPolicy=Local.
    internal_chain: &'a str,
    /// Where EXT sends external traffic: SVC, or SVL under externalTrafficPolicy=Local.
    external_policy_chain: &'a str,
    /// Some endpoint is usable (ready, or serving and terminating).
    has_any: bool,
    /// Cluster-IP traffic has endpoints under its policy.
    has_internal: bool,
    /// External traffic has endpoints under its policy.
    has_external: bool,
    uses_cluster_chain: bool,
    uses_local_chain: bool,
    uses_external_chain: bool,
    uses_fw_chain: bool,
    /// Target and quoted comment of the filter rule for cluster-IP traffic without endpoints.
    internal_filter: Option<(&'static str, String)>,
    /// The same for external traffic (external IPs, load-balancer IPs, node ports).
    external_filter: Option<(&'static str, String)>,
}

impl<'a> Plan<'a> {
    fn new(
        svc: &'a ServicePortInfo,
        cat: &Categorized<'_>,
        spn: &'a str,
        proto: &'static str,
        names: &'a ServiceChainNames,
    ) -> Self {
        let mut internal_chain = names.cluster.as_str();
        let mut has_internal = cat.has_any;
        if svc.internal_policy_local {
            internal_chain = &names.local;
            if cat.local.is_empty() {
                has_internal = false;
            }
        }
        let mut external_policy_chain = names.cluster.as_str();
        let mut has_external = cat.has_any;
        if svc.external_policy_local {
            external_policy_chain = &names.local;
            if cat.local.is_empty() {
                has_external = false;
            }
        }

        let (mut internal_filter, mut external_filter) = (None, None);
        if !cat.has_any {
            let c = q(&format!("{spn} has no endpoints"));
            internal_filter = Some(("REJECT", c.clone()));
            external_filter = Some(("REJECT", c));
        } else {
            if !has_internal {
                internal_filter = Some(("DROP", q(&format!("{spn} has no local endpoints"))));
            }
            if !has_external {
                external_filter = Some(("DROP", q(&format!("{spn} has no local endpoints"))));
            }
        }

        Plan {
            svc,
            spn,
            proto,
            names,
            internal_chain,
            external_policy_chain,
            has_any: cat.has_any,
            has_internal,
            has_external,
            uses_cluster_chain: !cat.cluster.is_empty() && svc.uses_cluster_endpoints(),
            uses_local_chain: !cat.local.is_empty() && svc.uses_local_endpoints(),
            uses_external_chain: cat.has_any && svc.externally_accessible(),
            uses_fw_chain: cat.has_any
                && !svc.load_balancer_vips.is_empty()
                && !svc.load_balancer_source_ranges.is_empty(),
            internal_filter,
            external_filter,
        }
    }

    /// The chain load-balancer traffic enters: FW when source ranges filter it, else EXT.
    fn lb_chain(&self) -> &'a str {
        if self.uses_fw_chain {
            &self.names.firewall
        } else {
            &self.names.external
        }
    }

    /// The filter rule's target and comment for external traffic that has no endpoints.
    fn external_filter(&self) -> Option<&(&'static str, String)> {
        self.external_filter.as_ref().filter(|_| !self.has_external)
    }
}

/// The cluster IP: the jump to the internal chain, or the REJECT/DROP rule when that chain
/// has no endpoints. Returns the jump's match, which the masquerade rule shares.
fn cluster_ip_rules(out: &mut ServiceRules, p: &Plan<'_>) -> Option<String> {
    let (spn, proto, port, cip) = (p.spn, p.proto, p.svc.port, p.svc.cluster_ip);
    let cluster_ip_match = p.has_internal.then(|| {
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
            .push((KUBE_SERVICES, [m, " -j ", p.internal_chain].concat()));
    } else if let Some((target, c)) = &p.internal_filter {
        out.filter_top.push((
            KUBE_SERVICES,
            format!(
                "-m comment --comment {c} -m {proto} -p {proto} -d {cip} --dport {port} -j {target}"
            ),
        ));
    }
    cluster_ip_match
}

/// External IPs: the jump to EXT, or the REJECT/DROP rule.
fn external_ip_rules(out: &mut ServiceRules, p: &Plan<'_>) {
    let (spn, proto, port) = (p.spn, p.proto, p.svc.port);
    for eip in &p.svc.external_ips {
        if p.has_any {
            out.nat_top.push((
                KUBE_SERVICES,
                format!(
                    "-m comment --comment {} -m {proto} -p {proto} -d {eip} --dport {port} -j {}",
                    q(&format!("{spn} external IP")),
                    p.names.external
                ),
            ));
        }
        if let Some((target, c)) = p.external_filter() {
            out.filter_top.push((
                KUBE_EXTERNAL_SERVICES,
                format!("-m comment --comment {c} -m {proto} -p {proto} -d {eip} --dport {port} -j {target}"),
            ));
        }
    }
}

/// Load-balancer ingress IPs: the jump to FW or EXT, the firewall's DROP for traffic FW did
/// not accept, and the REJECT/DROP rules.
fn load_balancer_rules(out: &mut ServiceRules, p: &Plan<'_>) {
    let (spn, proto, port) = (p.spn, p.proto, p.svc.port);
    let lb_chain = p.lb_chain();
    for lbip in &p.svc.load_balancer_vips {
        if p.has_any {
            out.nat_top.push((
                KUBE_SERVICES,
                format!(
                    "-m comment --comment {} -m {proto} -p {proto} -d {lbip} --dport {port} -j {lb_chain}",
                    q(&format!("{spn} loadbalancer IP"))
                ),
            ));
        }
        if p.uses_fw_chain {
            out.filter_top.push((
                KUBE_PROXY_FIREWALL,
                format!(
                    "-m comment --comment {} -m {proto} -p {proto} -d {lbip} --dport {port} -j DROP",
                    q(&format!("{spn} traffic not accepted by {}", p.names.firewall))
                ),
            ));
        }
    }
    if let Some((target, c)) = p.external_filter() {
        for lbip in &p.svc.load_balancer_vips {
            out.filter_top.push((
                KUBE_EXTERNAL_SERVICES,
                format!("-m comment --comment {c} -m {proto} -p {proto} -d {lbip} --dport {port} -j {target}"),
            ));
        }
    }
}

/// The node port (jump to EXT, or the REJECT/DROP rule) and the health-check node port.
fn node_port_rules(out: &mut ServiceRules, p: &Plan<'_>) {
    let (spn, proto, svc) = (p.spn, p.proto, p.svc);
    if svc.node_port != 0 {
        let np = svc.node_port;
        if p.has_any {
            // (The localhost variant of this rule needs an nfacct counter, which we do
            // not manage; upstream skips it in that case too.)
            out.nat_top.push((
                KUBE_NODEPORTS,
                format!(
                    "-m comment --comment {spn} -m {proto} -p {proto} --dport {np} -j {}",
                    p.names.external
                ),
            ));
        }
        if let Some((target, c)) = p.external_filter() {
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
}

/// Declares the per-service chains in upstream's order: EXT, FW, SVC, SVL.
fn declare_service_chains(out: &mut ServiceRules, p: &Plan<'_>) {
    if p.uses_external_chain {
        out.declare(&p.names.external);
    }
    if p.uses_fw_chain {
        out.declare(&p.names.firewall);
    }
    if p.uses_cluster_chain {
        out.declare(&p.names.cluster);
    }
    if p.uses_local_chain {
        out.declare(&p.names.local);
    }
}

/// Masquerade of cluster-IP traffic (`cluster_ip_match`) that does not come from a pod, or of
/// all of it with `--masquerade-all`.
fn cluster_ip_masquerade(
    out: &mut ServiceRules,
    p: &Plan<'_>,
    cluster_ip_match: &str,
    ctx: &Ctx<'_>,
) {
    let m = cluster_ip_match;
    if ctx.cfg.masquerade_all {
        out.push(p.internal_chain, [m, " -j ", KUBE_MARK_MASQ].concat());
    } else if let Some(nl) = &ctx.if_not_local {
        // Off-cluster traffic to a service VIP may bounce off-node: masquerade it.
        out.push(
            p.internal_chain,
            [m, " ", nl, " -j ", KUBE_MARK_MASQ].concat(),
        );
    }
}

/// The EXT chain: masquerade (all of it, or only node-local sources under
/// externalTrafficPolicy=Local, pods going to SVC), then the jump to the policy's chain.
fn external_chain_rules(out: &mut ServiceRules, p: &Plan<'_>, ctx: &Ctx<'_>) {
    let (spn, ext) = (p.spn, &p.names.external);
    if !p.svc.external_policy_local {
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
                    p.names.cluster
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
                p.names.cluster
            ),
        );
    }
    if p.has_external {
        out.push(ext, format!("-j {}", p.external_policy_chain));
    }
}

/// The FW chain: loadBalancerSourceRanges (and the LB IPs themselves when a range holds the
/// node) go on to EXT; the rest falls through to KUBE-PROXY-FIREWALL's DROP.
fn firewall_chain_rules(out: &mut ServiceRules, p: &Plan<'_>, cfg: &RenderConfig) {
    let (spn, fw) = (p.spn, &p.names.firewall);
    let head = format!(
        "-m comment --comment {}",
        q(&format!("{spn} loadbalancer IP"))
    );
    let mut allow_from_node = false;
    for cidr in &p.svc.load_balancer_source_ranges {
        out.push(fw, format!("{head} -s {cidr} -j {}", p.names.external));
        if cfg.node_ips.first().is_some_and(|ip| cidr.contains(ip)) {
            allow_from_node = true;
        }
    }
    if allow_from_node {
        for lbip in &p.svc.load_balancer_vips {
            out.push(fw, format!("{head} -s {lbip} -j {}", p.names.external));
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

/// SVC and SVL's jumps to the endpoints, then one SEP chain per endpoint (masquerade of
/// hairpin traffic, DNAT, session affinity).
fn endpoint_chains(out: &mut ServiceRules, p: &Plan<'_>, cat: &Categorized<'_>, ctx: &mut Ctx<'_>) {
    let (svc, proto) = (p.svc, p.proto);
    let seps = ServiceEndpoints::new(p.spn, proto, &cat.all_reachable);
    if p.uses_cluster_chain {
        service_to_endpoint_rules(out, svc, &p.names.cluster, &cat.cluster, &seps, ctx);
    }
    if p.uses_local_chain {
        service_to_endpoint_rules(out, svc, &p.names.local, &cat.local, &seps, ctx);
    }
    let head = ctx.endpoint_chain_comment(p.spn);
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
}
