//! rtnetlink messages for the dummy interface `kube-ipvs0` that holds the service IPs (so
//! that the kernel takes packets to them as local and IPVS sees them): link create / get /
//! delete and address add / delete / dump. Pure; tested byte for byte.

use std::net::IpAddr;

use crate::netlink::{
    self, NLM_F_ACK, NLM_F_CREATE, NLM_F_DUMP, NLM_F_EXCL, NLM_F_REQUEST, attrs, put_nested,
    put_str,
};

pub const RTM_NEWLINK: u16 = 16;
const RTM_DELLINK: u16 = 17;
const RTM_GETLINK: u16 = 18;
pub const RTM_NEWADDR: u16 = 20;
const RTM_DELADDR: u16 = 21;
const RTM_GETADDR: u16 = 22;
const IFLA_IFNAME: u16 = 3;
const IFLA_LINKINFO: u16 = 18;
const IFLA_INFO_KIND: u16 = 1;
const IFA_ADDRESS: u16 = 1;
const IFA_LOCAL: u16 = 2;
const AF_UNSPEC: u8 = 0;
const AF_INET: u8 = 2;
const AF_INET6: u8 = 10;

/// Upstream's name for the interface (`DefaultDummyDevice`).
pub const DUMMY_DEVICE: &str = "kube-ipvs0";

/// struct ifinfomsg with only the family and index set.
fn ifinfomsg(index: i32) -> Vec<u8> {
    let mut b = vec![AF_UNSPEC, 0, 0, 0];
    b.extend_from_slice(&index.to_ne_bytes());
    b.extend_from_slice(&[0; 8]); // flags, change
    b
}

/// `ip link add NAME type dummy` (failing with EEXIST when it is there).
pub fn new_dummy(name: &str, seq: u32) -> Vec<u8> {
    let mut b = ifinfomsg(0);
    put_str(&mut b, IFLA_IFNAME, name);
    put_nested(&mut b, IFLA_LINKINFO, |b| {
        put_str(b, IFLA_INFO_KIND, "dummy")
    });
    netlink::message(
        RTM_NEWLINK,
        NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL,
        seq,
        &b,
    )
}

/// The link named `name` (answered with RTM_NEWLINK, or ENODEV).
pub fn get_link(name: &str, seq: u32) -> Vec<u8> {
    let mut b = ifinfomsg(0);
    put_str(&mut b, IFLA_IFNAME, name);
    netlink::message(RTM_GETLINK, NLM_F_REQUEST, seq, &b)
}

pub fn del_link(index: i32, seq: u32) -> Vec<u8> {
    netlink::message(
        RTM_DELLINK,
        NLM_F_REQUEST | NLM_F_ACK,
        seq,
        &ifinfomsg(index),
    )
}

/// The index and kind of a RTM_NEWLINK answer.
pub fn parse_link(body: &[u8]) -> Option<(i32, String)> {
    let index = i32::from_ne_bytes(body.get(4..8)?.try_into().ok()?);
    let mut kind = String::new();
    for (ty, p) in attrs(body.get(16..)?) {
        if ty == IFLA_LINKINFO {
            for (t, k) in attrs(p) {
                if t == IFLA_INFO_KIND {
                    kind = netlink::str_of(k);
                }
            }
        }
    }
    Some((index, kind))
}

fn addr_msg(ty: u16, flags: u16, index: i32, ip: &IpAddr, seq: u32) -> Vec<u8> {
    let (family, prefix, bytes) = match ip {
        IpAddr::V4(a) => (AF_INET, 32, a.octets().to_vec()),
        IpAddr::V6(a) => (AF_INET6, 128, a.octets().to_vec()),
    };
    // struct ifaddrmsg: family, prefixlen, flags, scope (universe), index.
    let mut b = vec![family, prefix, 0, 0];
    b.extend_from_slice(&(index as u32).to_ne_bytes());
    netlink::put_attr(&mut b, IFA_LOCAL, &bytes);
    netlink::put_attr(&mut b, IFA_ADDRESS, &bytes);
    netlink::message(ty, flags, seq, &b)
}

/// `ip addr add IP/32 dev INDEX` (/128 for IPv6).
pub fn new_addr(index: i32, ip: &IpAddr, seq: u32) -> Vec<u8> {
    addr_msg(
        RTM_NEWADDR,
        NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL,
        index,
        ip,
        seq,
    )
}

pub fn del_addr(index: i32, ip: &IpAddr, seq: u32) -> Vec<u8> {
    addr_msg(RTM_DELADDR, NLM_F_REQUEST | NLM_F_ACK, index, ip, seq)
}

/// Every address of the family (the kernel does not filter dumps by index).
pub fn get_addrs(v6: bool, seq: u32) -> Vec<u8> {
    let family = if v6 { AF_INET6 } else { AF_INET };
    netlink::message(
        RTM_GETADDR,
        NLM_F_REQUEST | NLM_F_DUMP,
        seq,
        &[family, 0, 0, 0, 0, 0, 0, 0],
    )
}

/// (interface index, address) of a RTM_NEWADDR dump message.
pub fn parse_addr(body: &[u8]) -> Option<(i32, IpAddr)> {
    let family = *body.first()?;
    let index = u32::from_ne_bytes(body.get(4..8)?.try_into().ok()?) as i32;
    let mut found = None;
    for (ty, p) in attrs(body.get(8..)?) {
        let ip = match (family, p.len()) {
            (AF_INET, 4) => IpAddr::from(<[u8; 4]>::try_from(p).ok()?),
            (AF_INET6, 16) => IpAddr::from(<[u8; 16]>::try_from(p).ok()?),
            _ => continue,
        };
        // IFA_LOCAL is the address itself; IFA_ADDRESS the peer on point-to-point links.
        if ty == IFA_LOCAL || (ty == IFA_ADDRESS && found.is_none()) {
            found = Some(ip);
        }
    }
    Some((index, found?))
}
