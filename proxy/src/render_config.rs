//! What every backend's renderer takes from the node and the flags ([`RenderConfig`]):
//! the IP family, the node's name, addresses and zone, masquerade, the cluster and service
//! CIDRs, node-port addresses.

use std::net::IpAddr;

use tracing::info;

use crate::model::{Cidr, IpFamily, NodeFacts};

/// `detectLocalMode`: what makes traffic "local" (from this node's pods), as upstream's
/// LocalTrafficDetector.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum LocalDetect {
    /// Source in `clusterCIDR`.
    #[default]
    ClusterCidr,
    /// Source in the Node's `spec.podCIDRs`.
    NodeCidr,
    /// Arriving on this bridge (`detectLocal.bridgeInterface`).
    BridgeInterface(String),
    /// Arriving on an interface whose name starts with this (`detectLocal.interfaceNamePrefix`).
    InterfaceNamePrefix(String),
}

/// Node- and flag-level inputs of the renderers (iptables, nftables, ipvs).
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
    /// How traffic from this node's pods is told apart (`detectLocalMode`).
    pub local_detect: LocalDetect,
    /// The pod CIDR the CIDR modes match on: the cluster's (`ClusterCIDR`) or this node's
    /// `spec.podCIDRs` entry of the family (`NodeCIDR`, taken from the Node object). None:
    /// no local detection in the CIDR modes.
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
    /// The cluster's service CIDRs of `family` (ServiceCIDR objects): the nftables mode
    /// drops traffic to their addresses that are no allocated ClusterIP.
    pub service_cidrs: Vec<Cidr>,
}

impl RenderConfig {
    pub fn new(family: IpFamily, node_name: impl Into<String>) -> Self {
        RenderConfig {
            family,
            node_name: node_name.into(),
            node_ips: Vec::new(),
            masquerade_bit: 14,
            masquerade_all: false,
            local_detect: LocalDetect::ClusterCidr,
            cluster_cidr: None,
            node_port_addresses: Vec::new(),
            localhost_node_ports: true,
            random_fully: true,
            conntrack_tcp_liberal: false,
            zone: None,
            service_cidrs: Vec::new(),
        }
    }

    /// Takes from the Node object what this configuration follows (the same in every
    /// backend): its `topology.kubernetes.io/zone` (endpoints' zone hints) and, when no node
    /// IP was configured (`ips_from_node`), its address of this family. True when either
    /// changed: the next sync is a full one.
    pub fn adopt_node(&mut self, node: &NodeFacts, ips_from_node: bool) -> bool {
        let mut changed = false;
        if self.zone != node.zone {
            info!(zone = ?node.zone, "node topology zone changed");
            self.zone = node.zone.clone();
            changed = true;
        }
        if self.local_detect == LocalDetect::NodeCidr {
            let cidr = node
                .pod_cidrs
                .iter()
                .copied()
                .find(|c| c.family() == self.family);
            if self.cluster_cidr != cidr {
                info!(pod_cidr = ?cidr, "local traffic detected by the node's pod CIDR");
                self.cluster_cidr = cidr;
                changed = true;
            }
        }
        if ips_from_node {
            let ips: Vec<IpAddr> = node.ip_of(self.family).into_iter().collect();
            if self.node_ips != ips {
                info!(node_ips = ?ips, "node IPs taken from the Node object");
                self.node_ips = ips;
                changed = true;
            }
        }
        changed
    }

    /// The iptables match for local traffic (`negate`: for traffic that is not local), as
    /// upstream's IfLocal/IfNotLocal; None: no local detection.
    pub fn ipt_local(&self, negate: bool) -> Option<String> {
        let not = if negate { "! " } else { "" };
        match &self.local_detect {
            LocalDetect::ClusterCidr | LocalDetect::NodeCidr => {
                self.cluster_cidr.map(|c| format!("{not}-s {c}"))
            }
            LocalDetect::BridgeInterface(i) => Some(format!("{not}-i {i}")),
            LocalDetect::InterfaceNamePrefix(p) => Some(format!("{not}-i {p}+")),
        }
    }

    /// The nftables match for local traffic, as upstream's IfLocalNFT/IfNotLocalNFT.
    pub fn nft_local(&self, negate: bool) -> Option<String> {
        let not = if negate { "!= " } else { "" };
        let f = match self.family {
            IpFamily::V4 => "ip",
            IpFamily::V6 => "ip6",
        };
        match &self.local_detect {
            LocalDetect::ClusterCidr | LocalDetect::NodeCidr => {
                self.cluster_cidr.map(|c| format!("{f} saddr {not}{c}"))
            }
            LocalDetect::BridgeInterface(i) => Some(format!("iifname {not}{i}")),
            LocalDetect::InterfaceNamePrefix(p) => Some(format!("iifname {not}{p}*")),
        }
    }

    /// Upstream formats the mark with Go's `%#08x`: `0x00004000` for bit 14.
    pub fn masquerade_mark(&self) -> String {
        format!("0x{:08x}", 1u32 << self.masquerade_bit)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn masquerade_mark_formatting() {
        let cfg = RenderConfig::new(IpFamily::V4, "n");
        assert_eq!(cfg.masquerade_mark(), "0x00004000");
    }
}
