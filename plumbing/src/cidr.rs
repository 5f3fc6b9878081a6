//! IP prefixes (CIDRs): parsing `a.b.c.d/n`, membership, and walking the addresses of a subnet.
//! The one CIDR type of the CNI plugin, the kubelet's network code and kube-proxy.

use std::borrow::Borrow;
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::str::FromStr;

/// An address with a prefix length, e.g. `10.244.1.5/24` (an address on a subnet) or
/// `10.244.1.0/24` (the subnet itself).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Cidr {
    pub addr: IpAddr,
    pub prefix: u8,
}

impl Cidr {
    pub fn new(addr: IpAddr, prefix: u8) -> Option<Self> {
        (prefix <= max_prefix(addr)).then_some(Self { addr, prefix })
    }

    pub fn is_ipv4(&self) -> bool {
        self.addr.is_ipv4()
    }

    pub fn family(&self) -> IpFamily {
        if self.addr.is_ipv4() {
            IpFamily::V4
        } else {
            IpFamily::V6
        }
    }

    /// The subnet this address is on (host bits cleared).
    pub fn network(&self) -> Cidr {
        Cidr {
            addr: from_u128(self.addr, to_u128(self.addr) & self.mask()),
            prefix: self.prefix,
        }
    }

    /// Whether `ip` (an `IpAddr` or a reference to one) is inside.
    pub fn contains(&self, ip: impl Borrow<IpAddr>) -> bool {
        let ip = *ip.borrow();
        ip.is_ipv4() == self.addr.is_ipv4()
            && (to_u128(ip) & self.mask()) == (to_u128(self.addr) & self.mask())
    }

    /// The `n`th address of the subnet (0 = the network address), if it is inside.
    pub fn nth(&self, n: u128) -> Option<IpAddr> {
        if n > self.host_span() {
            return None;
        }
        Some(from_u128(self.addr, (to_u128(self.addr) & self.mask()) + n))
    }

    /// The offset of `ip` inside the subnet.
    pub fn offset(&self, ip: IpAddr) -> Option<u128> {
        self.contains(ip)
            .then(|| to_u128(ip) - (to_u128(self.addr) & self.mask()))
    }

    /// Number of addresses in the subnet minus one (the last offset).
    pub fn host_span(&self) -> u128 {
        let bits = u32::from(max_prefix(self.addr) - self.prefix);
        if bits >= 128 {
            u128::MAX
        } else {
            (1u128 << bits) - 1
        }
    }

    fn mask(&self) -> u128 {
        let width = u32::from(max_prefix(self.addr));
        let host = u32::from(max_prefix(self.addr) - self.prefix);
        let all = if width == 128 {
            u128::MAX
        } else {
            (1u128 << width) - 1
        };
        if host >= 128 {
            0
        } else {
            all & !((1u128 << host) - 1)
        }
    }
}

/// An IP family: the one a proxier instance handles (iptables vs ip6tables), a CIDR's.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum IpFamily {
    V4,
    V6,
}

impl IpFamily {
    pub fn matches(self, ip: &IpAddr) -> bool {
        matches!(
            (self, ip),
            (IpFamily::V4, IpAddr::V4(_)) | (IpFamily::V6, IpAddr::V6(_))
        )
    }

    /// Value of the `ip_family` metric label, as upstream spells it.
    pub fn label(self) -> &'static str {
        match self {
            IpFamily::V4 => "IPv4",
            IpFamily::V6 => "IPv6",
        }
    }

    pub fn host_prefix(self) -> u8 {
        match self {
            IpFamily::V4 => 32,
            IpFamily::V6 => 128,
        }
    }

    /// The other family (the secondary one of a dual-stack node).
    pub fn other(self) -> IpFamily {
        match self {
            IpFamily::V4 => IpFamily::V6,
            IpFamily::V6 => IpFamily::V4,
        }
    }
}

fn max_prefix(addr: IpAddr) -> u8 {
    if addr.is_ipv4() { 32 } else { 128 }
}

fn to_u128(ip: IpAddr) -> u128 {
    match ip {
        IpAddr::V4(v4) => u128::from(u32::from(v4)),
        IpAddr::V6(v6) => u128::from(v6),
    }
}

fn from_u128(like: IpAddr, value: u128) -> IpAddr {
    match like {
        // The value came from a v4 address plus an offset bounded by the v4 host span.
        IpAddr::V4(_) => IpAddr::V4(Ipv4Addr::from(u32::try_from(value).unwrap_or(u32::MAX))),
        IpAddr::V6(_) => IpAddr::V6(Ipv6Addr::from(value)),
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

/// Why a prefix did not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid CIDR {0:?}")]
pub struct ParseError(String);

impl FromStr for Cidr {
    type Err = ParseError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || ParseError(s.to_string());
        let (addr, prefix) = s.split_once('/').ok_or_else(bad)?;
        let addr: IpAddr = addr.parse().map_err(|_| bad())?;
        if prefix.is_empty() || !prefix.bytes().all(|b| b.is_ascii_digit()) {
            return Err(bad());
        }
        let prefix: u8 = prefix.parse().map_err(|_| bad())?;
        Cidr::new(addr, prefix).ok_or_else(bad)
    }
}

impl Cidr {
    /// Parses a prefix the way kube-proxy's flags and config take one: surrounding spaces
    /// ignored, and a bare address is that one address (`/32`, `/128`).
    pub fn parse_or_host(s: &str) -> Result<Self, ParseError> {
        let bad = || ParseError(s.to_string());
        let (addr, prefix) = match s.trim().split_once('/') {
            Some((a, p)) => {
                let addr: IpAddr = a.parse().map_err(|_| bad())?;
                (addr, p.parse::<u8>().map_err(|_| bad())?)
            }
            None => {
                let addr: IpAddr = s.trim().parse().map_err(|_| bad())?;
                (addr, max_prefix(addr))
            }
        };
        Cidr::new(addr, prefix).ok_or_else(bad)
    }
}

impl serde::Serialize for Cidr {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for Cidr {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_walks_a_v4_subnet() {
        let net: Cidr = "10.244.1.0/24".parse().unwrap();
        assert_eq!(net.nth(1), Some("10.244.1.1".parse().unwrap()));
        assert_eq!(net.nth(255), Some("10.244.1.255".parse().unwrap()));
        assert_eq!(net.nth(256), None);
        assert_eq!(net.host_span(), 255);
        assert!(net.contains("10.244.1.77".parse::<IpAddr>().unwrap()));
        assert!(!net.contains("10.244.2.1".parse::<IpAddr>().unwrap()));
        assert_eq!(net.offset("10.244.1.77".parse().unwrap()), Some(77));
        let host: Cidr = "10.244.1.9/24".parse().unwrap();
        assert_eq!(host.network(), net);
    }

    #[test]
    fn parses_v6_and_rejects_garbage() {
        let net: Cidr = "fd00:10:244:1::/64".parse().unwrap();
        assert_eq!(net.nth(1), Some("fd00:10:244:1::1".parse().unwrap()));
        assert_eq!(net.host_span(), u128::from(u64::MAX));
        assert!(!net.contains("10.0.0.1".parse::<IpAddr>().unwrap()));
        for bad in [
            "10.0.0.0",
            "10.0.0.0/33",
            "10.0.0.0/-1",
            "x/8",
            "10.0.0.0/",
            "::/129",
        ] {
            assert!(bad.parse::<Cidr>().is_err(), "{bad}");
        }
        let all: Cidr = "::/0".parse().unwrap();
        assert_eq!(all.host_span(), u128::MAX);
    }

    #[test]
    fn parse_or_host_takes_a_bare_address_and_spaces() {
        let p = |s: &str| Cidr::parse_or_host(s).map(|c| c.to_string()).ok();
        assert_eq!(p(" 10.0.0.0/8 ").as_deref(), Some("10.0.0.0/8"));
        assert_eq!(p("10.1.2.3").as_deref(), Some("10.1.2.3/32"));
        assert_eq!(p("fd00::1").as_deref(), Some("fd00::1/128"));
        for bad in ["10.0.0.0/33", "x/8", "10.0.0.0/", "::/129", ""] {
            assert_eq!(p(bad), None, "{bad}");
        }
        // The strict form wants the prefix length.
        assert!("10.1.2.3".parse::<Cidr>().is_err());
    }
}
