//! `--nodeport-addresses` for one IP family, shared by every backend (upstream's
//! pkg/proxy/util/nodeport_addresses.go).

use std::net::{IpAddr, Ipv4Addr};

use crate::model::{Cidr, IpFamily};

/// Parsed `--nodeport-addresses`: the CIDRs of `family` whose addresses accept node-port
/// traffic (every local address when none is given).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodePortAddresses {
    cidrs: Vec<Cidr>,
    match_all: bool,
}

impl NodePortAddresses {
    /// `cidr_strings` are the flag's values: CIDRs (those of the other family are ignored)
    /// or `primary`, which stands for the first of `node_ips`.
    pub fn new(family: IpFamily, cidr_strings: &[String], node_ips: &[IpAddr]) -> Self {
        let mut cidrs = Vec::new();
        for s in cidr_strings {
            if s == "primary" {
                if let Some(ip) = node_ips.first() {
                    cidrs.push(Cidr {
                        addr: *ip,
                        prefix: family.host_prefix(),
                    });
                }
            } else if let Ok(c) = Cidr::parse_or_host(s)
                && c.family() == family
            {
                cidrs.push(c);
            }
        }
        if cidrs.is_empty() {
            let zero = match family {
                IpFamily::V4 => "0.0.0.0/0",
                IpFamily::V6 => "::/0",
            };
            cidrs.push(zero.parse().expect("constant CIDR"));
        }
        let match_all = cidrs.iter().any(|c| c.prefix == 0);
        NodePortAddresses { cidrs, match_all }
    }

    /// True when some CIDR is a zero-length prefix: every local address qualifies.
    pub fn match_all(&self) -> bool {
        self.match_all
    }

    /// Whether `ip` is in one of the CIDRs.
    pub fn contains(&self, ip: &IpAddr) -> bool {
        self.cidrs.iter().any(|c| c.contains(ip))
    }

    pub fn contains_ipv4_loopback(&self) -> bool {
        self.contains(&IpAddr::V4(Ipv4Addr::LOCALHOST))
    }
}
