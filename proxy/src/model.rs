//! Internal view of Services and EndpointSlices, per service port, for one IP family.
//!
//! `ServiceState` is the change tracker: the watch feeds it whole objects, it keeps the
//! per-port view the renderer needs and records which services changed since the last
//! sync (`take_changes`).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::net::IpAddr;
use std::time::SystemTime;

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
pub use plumbing::cidr::{Cidr, IpFamily};
pub use plumbing::names::is_dns_label;

/// Label that ties an EndpointSlice to its Service.
pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";
/// Annotation the EndpointSlice controller sets to when the change it reflects began
/// (`v1.EndpointsLastChangeTriggerTime`); the network-programming latency starts there.
pub const LAST_CHANGE_TRIGGER_TIME: &str = "endpoints.kubernetes.io/last-change-trigger-time";
/// Default `sessionAffinityConfig.clientIP.timeoutSeconds` (3 hours).
pub const DEFAULT_STICKY_SECONDS: u32 = 10800;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Protocol {
    Tcp,
    Udp,
    Sctp,
}

impl Protocol {
    /// Parses the API spelling (`TCP`, `UDP`, `SCTP`); absent means TCP.
    pub fn from_api(s: Option<&str>) -> Option<Protocol> {
        match s.unwrap_or("TCP") {
            "TCP" => Some(Protocol::Tcp),
            "UDP" => Some(Protocol::Udp),
            "SCTP" => Some(Protocol::Sctp),
            _ => None,
        }
    }

    /// Lower-case name used in chain hashes and in `-m tcp -p tcp`.
    pub fn lower(self) -> &'static str {
        match self {
            Protocol::Tcp => "tcp",
            Protocol::Udp => "udp",
            Protocol::Sctp => "sctp",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NamespacedName {
    pub namespace: String,
    pub name: String,
}

impl NamespacedName {
    pub fn new(namespace: impl Into<String>, name: impl Into<String>) -> Self {
        NamespacedName {
            namespace: namespace.into(),
            name: name.into(),
        }
    }
}

impl fmt::Display for NamespacedName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// One port of one service: the unit that gets a KUBE-SVC chain.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ServicePortName {
    pub service: NamespacedName,
    pub port: String,
    pub protocol: Protocol,
}

impl fmt::Display for ServicePortName {
    /// `ns/name:port`, or `ns/name` for an unnamed port (upstream's ServicePortName.String).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.port.is_empty() {
            write!(f, "{}", self.service)
        } else {
            write!(f, "{}:{}", self.service, self.port)
        }
    }
}

/// Everything the renderer needs about one service port, already filtered to one family.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServicePortInfo {
    pub name: ServicePortName,
    pub cluster_ip: IpAddr,
    pub port: u16,
    /// 0 when the port has no node port.
    pub node_port: u16,
    pub external_ips: Vec<IpAddr>,
    pub load_balancer_vips: Vec<IpAddr>,
    pub load_balancer_source_ranges: Vec<Cidr>,
    /// `Some(timeout_seconds)` for sessionAffinity ClientIP.
    pub session_affinity_seconds: Option<u32>,
    pub external_policy_local: bool,
    pub internal_policy_local: bool,
    /// 0 unless externalTrafficPolicy is Local on an externally reachable service.
    pub health_check_node_port: u16,
}

impl ServicePortInfo {
    pub fn externally_accessible(&self) -> bool {
        self.node_port != 0 || !self.load_balancer_vips.is_empty() || !self.external_ips.is_empty()
    }

    /// Whether any traffic to this port goes to endpoints chosen by "Cluster" policy: with
    /// internal policy Cluster, or whenever the port is externally reachable (even under
    /// external policy Local, the short-circuit rules of KUBE-EXT jump to KUBE-SVC).
    pub fn uses_cluster_endpoints(&self) -> bool {
        !self.internal_policy_local || self.externally_accessible()
    }

    /// Whether any traffic to this port goes to endpoints chosen by "Local" policy.
    pub fn uses_local_endpoints(&self) -> bool {
        self.internal_policy_local || (self.external_policy_local && self.externally_accessible())
    }
}

/// One backend of a service port, merged from all the service's slices.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EndpointInfo {
    pub ip: IpAddr,
    pub port: u16,
    pub ready: bool,
    pub serving: bool,
    pub terminating: bool,
    /// Whether the endpoint's nodeName is this node.
    pub is_local: bool,
    pub node_name: Option<String>,
    pub zone: Option<String>,
    /// `hints.forZones`: zones whose nodes should prefer this endpoint (topology-aware
    /// routing, trafficDistribution PreferSameZone / PreferClose).
    pub zone_hints: Vec<String>,
    /// `hints.forNodes` (trafficDistribution PreferSameNode).
    pub node_hints: Vec<String>,
}

impl fmt::Display for EndpointInfo {
    /// `ip:port` (`[ip]:port` for IPv6), as Go's net.JoinHostPort.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.ip {
            IpAddr::V4(ip) => write!(f, "{ip}:{}", self.port),
            IpAddr::V6(ip) => write!(f, "[{ip}]:{}", self.port),
        }
    }
}

fn parse_ip(s: &str) -> Option<IpAddr> {
    s.trim().parse().ok()
}

fn service_type_externally_accessible(svc: &Service) -> bool {
    let spec = match &svc.spec {
        Some(s) => s,
        None => return false,
    };
    match spec.type_.as_deref() {
        Some("LoadBalancer") | Some("NodePort") => true,
        Some("ClusterIP") | None => spec.external_ips.as_ref().is_some_and(|v| !v.is_empty()),
        _ => false,
    }
}

/// Converts a Service to its per-port infos for `family`. Returns an empty list for services
/// kube-proxy ignores (headless, ExternalName, no cluster IP of this family).
pub fn service_ports(svc: &Service, family: IpFamily) -> Vec<ServicePortInfo> {
    let Some(spec) = &svc.spec else {
        return Vec::new();
    };
    if spec.type_.as_deref() == Some("ExternalName") {
        return Vec::new();
    }
    let primary = spec.cluster_ip.as_deref().unwrap_or("");
    if primary.is_empty() || primary == "None" {
        return Vec::new();
    }
    let cluster_ips: Vec<&str> = match &spec.cluster_ips {
        Some(v) if !v.is_empty() => v.iter().map(String::as_str).collect(),
        _ => vec![primary],
    };
    let Some(cluster_ip) = cluster_ips
        .iter()
        .filter_map(|s| parse_ip(s))
        .find(|ip| family.matches(ip))
    else {
        return Vec::new();
    };
    let namespace = svc.metadata.namespace.clone().unwrap_or_default();
    let name = svc.metadata.name.clone().unwrap_or_default();
    // Names end up in rule comments and chain hashes: what the apiserver would never accept
    // (a file under --static-services-dir, a non-validating apiserver) is not programmed.
    let bad_port = spec.ports.iter().flatten().find(|p| {
        p.name
            .as_deref()
            .is_some_and(|n| !n.is_empty() && !is_dns_label(n))
    });
    if !is_dns_label(&namespace) || !is_dns_label(&name) || bad_port.is_some() {
        tracing::warn!(
            namespace = %namespace.escape_debug(),
            name = %name.escape_debug(),
            port = ?bad_port.and_then(|p| p.name.as_deref()),
            "ignoring Service: namespace, name and port names must be RFC 1123 labels"
        );
        return Vec::new();
    }

    let external_ips: Vec<IpAddr> = spec
        .external_ips
        .iter()
        .flatten()
        .filter_map(|s| parse_ip(s))
        .filter(|ip| family.matches(ip))
        .collect();
    let mut load_balancer_vips = Vec::new();
    if spec.type_.as_deref() == Some("LoadBalancer") {
        let ingress = svc
            .status
            .as_ref()
            .and_then(|s| s.load_balancer.as_ref())
            .and_then(|lb| lb.ingress.as_ref());
        for ing in ingress.into_iter().flatten() {
            // ipMode Proxy means the load balancer does not deliver packets with the VIP as
            // destination, so kube-proxy must not capture it.
            if ing.ip_mode.as_deref() == Some("Proxy") {
                continue;
            }
            if let Some(ip) = ing.ip.as_deref().and_then(parse_ip)
                && family.matches(&ip)
            {
                load_balancer_vips.push(ip);
            }
        }
    }
    let load_balancer_source_ranges: Vec<Cidr> = spec
        .load_balancer_source_ranges
        .iter()
        .flatten()
        .filter_map(|s| Cidr::parse_or_host(s).ok())
        .filter(|c| c.family() == family)
        .collect();
    let session_affinity_seconds = if spec.session_affinity.as_deref() == Some("ClientIP") {
        let t = spec
            .session_affinity_config
            .as_ref()
            .and_then(|c| c.client_ip.as_ref())
            .and_then(|c| c.timeout_seconds)
            .filter(|t| *t > 0)
            .map(|t| t as u32);
        Some(t.unwrap_or(DEFAULT_STICKY_SECONDS))
    } else {
        None
    };
    let external_policy_local = service_type_externally_accessible(svc)
        && spec.external_traffic_policy.as_deref() == Some("Local");
    let internal_policy_local = spec.internal_traffic_policy.as_deref() == Some("Local");
    let health_check_node_port =
        if external_policy_local && spec.type_.as_deref() == Some("LoadBalancer") {
            spec.health_check_node_port.unwrap_or(0).clamp(0, 65535) as u16
        } else {
            0
        };

    let mut out = Vec::new();
    for p in spec.ports.iter().flatten() {
        let Some(protocol) = Protocol::from_api(p.protocol.as_deref()) else {
            continue;
        };
        if !(1..=65535).contains(&p.port) {
            continue;
        }
        out.push(ServicePortInfo {
            name: ServicePortName {
                service: NamespacedName::new(namespace.clone(), name.clone()),
                port: p.name.clone().unwrap_or_default(),
                protocol,
            },
            cluster_ip,
            port: p.port as u16,
            node_port: p.node_port.unwrap_or(0).clamp(0, 65535) as u16,
            external_ips: external_ips.clone(),
            load_balancer_vips: load_balancer_vips.clone(),
            load_balancer_source_ranges: load_balancer_source_ranges.clone(),
            session_affinity_seconds,
            external_policy_local,
            internal_policy_local,
            health_check_node_port,
        });
    }
    out
}

/// What one EndpointSlice contributes: per (port name, protocol, port number), its endpoints.
#[derive(Clone, Debug, PartialEq, Eq)]
struct SliceData {
    ports: Vec<(String, Protocol, u16)>,
    endpoints: Vec<EndpointInfo>,
}

fn slice_data(slice: &EndpointSlice, family: IpFamily, node_name: &str) -> SliceData {
    let mut ports = Vec::new();
    for p in slice.ports.iter().flatten() {
        // Upstream ignores ports with a nil name or a nil/zero number.
        let (Some(name), Some(port)) = (&p.name, p.port) else {
            continue;
        };
        if !name.is_empty() && !is_dns_label(name) {
            continue;
        }
        if !(1..=65535).contains(&port) {
            continue;
        }
        let Some(protocol) = Protocol::from_api(p.protocol.as_deref()) else {
            continue;
        };
        ports.push((name.clone(), protocol, port as u16));
    }
    let mut endpoints = Vec::new();
    for ep in slice.endpoints.iter().flatten() {
        let Some(ip) = ep.addresses.first().and_then(|a| parse_ip(a)) else {
            continue;
        };
        if !family.matches(&ip) {
            continue;
        }
        let cond = ep.conditions.as_ref();
        let ready = cond.and_then(|c| c.ready).unwrap_or(true);
        let serving = cond.and_then(|c| c.serving).unwrap_or(true);
        let terminating = cond.and_then(|c| c.terminating).unwrap_or(false);
        let hints = ep.hints.iter();
        endpoints.push(EndpointInfo {
            ip,
            port: 0,
            ready,
            serving,
            terminating,
            is_local: ep.node_name.as_deref() == Some(node_name),
            node_name: ep.node_name.clone(),
            zone: ep.zone.clone(),
            zone_hints: hint_names(
                hints
                    .clone()
                    .flat_map(|h| h.for_zones.iter().flatten().map(|z| &z.name)),
            ),
            node_hints: hint_names(
                hints.flat_map(|h| h.for_nodes.iter().flatten().map(|n| &n.name)),
            ),
        });
    }
    SliceData { ports, endpoints }
}

/// Hint names, sorted and without duplicates.
fn hint_names<'a>(names: impl Iterator<Item = &'a String>) -> Vec<String> {
    let mut names: Vec<String> = names.cloned().collect();
    names.sort();
    names.dedup();
    names
}

/// What the rules take from this proxy's own Node object.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeFacts {
    /// The `topology.kubernetes.io/zone` label (topology-aware routing).
    pub zone: Option<String>,
    /// `status.addresses`, InternalIPs first then ExternalIPs (upstream's GetNodeHostIPs
    /// order); the first of a family is the node's IP of that family.
    pub ips: Vec<IpAddr>,
    /// `spec.podCIDRs` (`detectLocalMode: NodeCIDR`).
    pub pod_cidrs: Vec<Cidr>,
}

impl NodeFacts {
    /// The node's IP of `family`, if the Node lists one.
    pub fn ip_of(&self, family: IpFamily) -> Option<IpAddr> {
        self.ips.iter().copied().find(|ip| family.matches(ip))
    }
}

/// Desired-state store and change tracker for one IP family.
#[derive(Debug)]
pub struct ServiceState {
    family: IpFamily,
    node_name: String,
    service_ports: BTreeMap<NamespacedName, Vec<ServicePortInfo>>,
    slices: BTreeMap<NamespacedName, BTreeMap<String, SliceData>>,
    ports: BTreeMap<ServicePortName, ServicePortInfo>,
    endpoints: BTreeMap<ServicePortName, Vec<EndpointInfo>>,
    /// Services whose ports changed since the last `take_changes`.
    changed_services: BTreeSet<NamespacedName>,
    /// Services whose endpoints changed since the last `take_changes`.
    changed_endpoints: BTreeSet<NamespacedName>,
    /// Per service, the `last-change-trigger-time`s of the slice changes not synced yet.
    trigger_times: BTreeMap<NamespacedName, Vec<SystemTime>>,
    /// Trigger times before this (changes made before the proxy started) are not measured.
    started: SystemTime,
    node: NodeFacts,
    /// The cluster's service CIDRs of this family (ServiceCIDR objects' `spec.cidrs`).
    service_cidrs: Vec<Cidr>,
}

impl ServiceState {
    pub fn new(family: IpFamily, node_name: impl Into<String>) -> Self {
        ServiceState {
            family,
            node_name: node_name.into(),
            service_ports: BTreeMap::new(),
            slices: BTreeMap::new(),
            ports: BTreeMap::new(),
            endpoints: BTreeMap::new(),
            changed_services: BTreeSet::new(),
            changed_endpoints: BTreeSet::new(),
            trigger_times: BTreeMap::new(),
            started: SystemTime::now(),
            node: NodeFacts::default(),
            service_cidrs: Vec::new(),
        }
    }

    /// Records what the Node says. Returns true if it differs from what was known (the
    /// proxier then re-renders everything: topology and node IPs touch every service).
    pub fn set_node(&mut self, node: NodeFacts) -> bool {
        if self.node == node {
            return false;
        }
        self.node = node;
        true
    }

    pub fn node(&self) -> &NodeFacts {
        &self.node
    }

    /// Records the cluster's service CIDRs (those of other families are dropped). Returns
    /// true if they differ from what was known.
    pub fn set_service_cidrs(&mut self, cidrs: &[Cidr]) -> bool {
        let mut mine: Vec<Cidr> = cidrs
            .iter()
            .filter(|c| c.family() == self.family)
            .copied()
            .collect();
        mine.sort();
        mine.dedup();
        if mine == self.service_cidrs {
            return false;
        }
        self.service_cidrs = mine;
        true
    }

    pub fn service_cidrs(&self) -> &[Cidr] {
        &self.service_cidrs
    }

    pub fn family(&self) -> IpFamily {
        self.family
    }

    /// Adds or updates a Service. Returns true if anything kube-proxy renders changed.
    pub fn upsert_service(&mut self, svc: &Service) -> bool {
        let nn = NamespacedName::new(
            svc.metadata.namespace.clone().unwrap_or_default(),
            svc.metadata.name.clone().unwrap_or_default(),
        );
        let ports = service_ports(svc, self.family);
        if self
            .service_ports
            .get(&nn)
            .map(Vec::as_slice)
            .unwrap_or(&[])
            == ports.as_slice()
        {
            return false;
        }
        if ports.is_empty() {
            self.service_ports.remove(&nn);
        } else {
            self.service_ports.insert(nn.clone(), ports);
        }
        self.recompute_ports(&nn);
        self.changed_services.insert(nn);
        true
    }

    pub fn delete_service(&mut self, namespace: &str, name: &str) -> bool {
        let nn = NamespacedName::new(namespace, name);
        if self.service_ports.remove(&nn).is_none() {
            return false;
        }
        self.recompute_ports(&nn);
        self.changed_services.insert(nn);
        true
    }

    /// Adds or updates an EndpointSlice. Returns true if the merged endpoints changed.
    pub fn upsert_endpoint_slice(&mut self, slice: &EndpointSlice) -> bool {
        let Some((nn, slice_name)) = slice_key(slice) else {
            return false;
        };
        let data = slice_data(slice, self.family, &self.node_name);
        let slices = self.slices.entry(nn.clone()).or_default();
        if slices.get(&slice_name) == Some(&data) {
            return false;
        }
        slices.insert(slice_name, data);
        let changed = self.recompute_endpoints(&nn);
        if changed && let Some(t) = trigger_time(slice).filter(|t| *t > self.started) {
            self.trigger_times.entry(nn).or_default().push(t);
        }
        changed
    }

    pub fn delete_endpoint_slice(&mut self, slice: &EndpointSlice) -> bool {
        let Some((nn, slice_name)) = slice_key(slice) else {
            return false;
        };
        let Some(slices) = self.slices.get_mut(&nn) else {
            return false;
        };
        if slices.remove(&slice_name).is_none() {
            return false;
        }
        if slices.is_empty() {
            self.slices.remove(&nn);
        }
        // A deleted slice's trigger time is that of its last update: not measured (as
        // upstream), and the service's pending ones are dropped.
        self.trigger_times.remove(&nn);
        self.recompute_endpoints(&nn)
    }

    /// Services changed since the last call: every service whose ports (`service_port_map`)
    /// or merged endpoints (`endpoints_map`) differ in any way, deleted ones included. The
    /// affected service ports are that service's entries before and after the change.
    pub fn take_changes(&mut self) -> BTreeSet<NamespacedName> {
        let mut all = std::mem::take(&mut self.changed_services);
        all.append(&mut self.changed_endpoints);
        all
    }

    pub fn has_changes(&self) -> bool {
        !self.changed_services.is_empty() || !self.changed_endpoints.is_empty()
    }

    /// Services with changed ports / with changed endpoints, not synced yet (upstream's
    /// `service_changes_pending` / `endpoint_changes_pending`).
    pub fn pending(&self) -> (usize, usize) {
        (self.changed_services.len(), self.changed_endpoints.len())
    }

    /// The trigger times of the endpoint changes since the last call (what a successful sync
    /// turns into network-programming latencies).
    pub fn take_trigger_times(&mut self) -> Vec<(NamespacedName, SystemTime)> {
        std::mem::take(&mut self.trigger_times)
            .into_iter()
            .flat_map(|(nn, ts)| ts.into_iter().map(move |t| (nn.clone(), t)))
            .collect()
    }

    pub fn service_port_map(&self) -> &BTreeMap<ServicePortName, ServicePortInfo> {
        &self.ports
    }

    pub fn endpoints_map(&self) -> &BTreeMap<ServicePortName, Vec<EndpointInfo>> {
        &self.endpoints
    }

    fn recompute_ports(&mut self, nn: &NamespacedName) {
        let old: Vec<ServicePortName> = ports_of(&self.ports, nn).map(|(k, _)| k.clone()).collect();
        for k in &old {
            self.ports.remove(k);
        }
        for p in self.service_ports.get(nn).into_iter().flatten() {
            self.ports.insert(p.name.clone(), p.clone());
        }
    }

    fn recompute_endpoints(&mut self, nn: &NamespacedName) -> bool {
        let mut merged: BTreeMap<ServicePortName, Vec<EndpointInfo>> = BTreeMap::new();
        for data in self.slices.get(nn).into_iter().flat_map(|m| m.values()) {
            for (port_name, protocol, port) in &data.ports {
                let key = ServicePortName {
                    service: nn.clone(),
                    port: port_name.clone(),
                    protocol: *protocol,
                };
                let list = merged.entry(key).or_default();
                for ep in &data.endpoints {
                    let ep = EndpointInfo {
                        port: *port,
                        ..ep.clone()
                    };
                    // The same address may briefly appear in two slices; prefer a ready copy.
                    match list.iter_mut().find(|e| e.ip == ep.ip && e.port == ep.port) {
                        Some(existing) => {
                            if ep.ready && !existing.ready {
                                *existing = ep;
                            }
                        }
                        None => list.push(ep),
                    }
                }
            }
        }
        merged.retain(|_, v| !v.is_empty());
        for list in merged.values_mut() {
            // Upstream sorts by the endpoint's "ip:port" string.
            list.sort_by_key(|e| e.to_string());
        }
        let old: BTreeMap<&ServicePortName, &Vec<EndpointInfo>> =
            ports_of(&self.endpoints, nn).collect();
        let new: BTreeMap<&ServicePortName, &Vec<EndpointInfo>> = merged.iter().collect();
        if old == new {
            return false;
        }
        let old: Vec<ServicePortName> = old.into_keys().cloned().collect();
        for k in &old {
            self.endpoints.remove(k);
        }
        self.endpoints.extend(merged);
        self.changed_endpoints.insert(nn.clone());
        true
    }
}

/// The entries of `map` that belong to service `nn`, found by range (ports sort by service
/// first), so a change costs O(log n) rather than a scan of every service.
pub fn ports_of<'m, V>(
    map: &'m BTreeMap<ServicePortName, V>,
    nn: &NamespacedName,
) -> impl Iterator<Item = (&'m ServicePortName, &'m V)> {
    let lowest = ServicePortName {
        service: nn.clone(),
        port: String::new(),
        protocol: Protocol::Tcp,
    };
    map.range(lowest..)
        .take_while(move |(k, _)| &k.service == nn)
}

/// The slice's `last-change-trigger-time` (RFC 3339, fractional seconds allowed).
fn trigger_time(slice: &EndpointSlice) -> Option<SystemTime> {
    let v = slice
        .metadata
        .annotations
        .as_ref()?
        .get(LAST_CHANGE_TRIGGER_TIME)?;
    v.parse::<jiff::Timestamp>().ok().map(SystemTime::from)
}

fn slice_key(slice: &EndpointSlice) -> Option<(NamespacedName, String)> {
    let svc = slice.metadata.labels.as_ref()?.get(SERVICE_NAME_LABEL)?;
    let ns = slice.metadata.namespace.clone().unwrap_or_default();
    let name = slice.metadata.name.clone()?;
    if slice.address_type == "FQDN" {
        return None;
    }
    if !is_dns_label(&ns) || !is_dns_label(svc) {
        tracing::warn!(
            namespace = %ns.escape_debug(),
            service = %svc.escape_debug(),
            "ignoring EndpointSlice: its namespace and service name must be RFC 1123 labels"
        );
        return None;
    }
    Some((NamespacedName::new(ns, svc.clone()), name))
}
