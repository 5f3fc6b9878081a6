//! IPVS over generic netlink (family `IPVS`, linux/ip_vs.h): the family id resolved through
//! nlctrl, then virtual servers (`IPVS_CMD_NEW/SET/DEL_SERVICE`, `GET_SERVICE` dumps), real
//! servers (`IPVS_CMD_NEW/SET/DEL_DEST`, `GET_DEST` dumps) and the connection timeouts
//! (`IPVS_CMD_SET_CONFIG`). Messages are encoded and decoded here (pure, tested byte for byte).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use crate::model::Protocol;
use crate::netlink::{
    self, NLM_F_ACK, NLM_F_DUMP, NLM_F_REQUEST, attrs, put_attr, put_nested, put_str, put_u16,
    put_u32, str_of, u16_of, u32_of,
};

pub const GENL_ID_CTRL: u16 = 0x10;
const CTRL_CMD_GETFAMILY: u8 = 3;
const CTRL_ATTR_FAMILY_ID: u16 = 1;
const CTRL_ATTR_FAMILY_NAME: u16 = 2;
pub const IPVS_GENL_NAME: &str = "IPVS";
const IPVS_GENL_VERSION: u8 = 1;

const IPVS_CMD_NEW_SERVICE: u8 = 1;
const IPVS_CMD_SET_SERVICE: u8 = 2;
const IPVS_CMD_DEL_SERVICE: u8 = 3;
const IPVS_CMD_GET_SERVICE: u8 = 4;
const IPVS_CMD_NEW_DEST: u8 = 5;
const IPVS_CMD_SET_DEST: u8 = 6;
const IPVS_CMD_DEL_DEST: u8 = 7;
const IPVS_CMD_GET_DEST: u8 = 8;
const IPVS_CMD_SET_CONFIG: u8 = 12;

const IPVS_CMD_ATTR_SERVICE: u16 = 1;
const IPVS_CMD_ATTR_DEST: u16 = 2;
const IPVS_CMD_ATTR_TIMEOUT_TCP: u16 = 4;
const IPVS_CMD_ATTR_TIMEOUT_TCP_FIN: u16 = 5;
const IPVS_CMD_ATTR_TIMEOUT_UDP: u16 = 6;

const IPVS_SVC_ATTR_AF: u16 = 1;
const IPVS_SVC_ATTR_PROTOCOL: u16 = 2;
const IPVS_SVC_ATTR_ADDR: u16 = 3;
const IPVS_SVC_ATTR_PORT: u16 = 4;
const IPVS_SVC_ATTR_SCHED_NAME: u16 = 6;
const IPVS_SVC_ATTR_FLAGS: u16 = 7;
const IPVS_SVC_ATTR_TIMEOUT: u16 = 8;
const IPVS_SVC_ATTR_NETMASK: u16 = 9;

const IPVS_DEST_ATTR_ADDR: u16 = 1;
const IPVS_DEST_ATTR_PORT: u16 = 2;
const IPVS_DEST_ATTR_FWD_METHOD: u16 = 3;
const IPVS_DEST_ATTR_WEIGHT: u16 = 4;
const IPVS_DEST_ATTR_U_THRESH: u16 = 5;
const IPVS_DEST_ATTR_L_THRESH: u16 = 6;
const IPVS_DEST_ATTR_ACTIVE_CONNS: u16 = 7;
const IPVS_DEST_ATTR_INACT_CONNS: u16 = 8;
const IPVS_DEST_ATTR_ADDR_FAMILY: u16 = 11;

/// `IP_VS_SVC_F_PERSISTENT`: session affinity (clients stick to one real server for
/// `timeout` seconds).
pub const FLAG_PERSISTENT: u32 = 0x1;
/// `IP_VS_SVC_F_HASHED`: set by the kernel on every service it holds.
pub const FLAG_HASHED: u32 = 0x2;
/// `IP_VS_CONN_F_MASQ`: NAT forwarding, the only method kube-proxy uses.
const FWD_MASQ: u32 = 0;
const AF_INET: u16 = 2;
const AF_INET6: u16 = 10;

/// A virtual server's identity: what DEL and the dest commands name it by.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct VsKey {
    pub addr: IpAddr,
    pub protocol: Protocol,
    pub port: u16,
}

impl std::fmt::Display for VsKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.addr {
            IpAddr::V4(a) => write!(f, "{a}:{}/{}", self.port, self.protocol.lower()),
            IpAddr::V6(a) => write!(f, "[{a}]:{}/{}", self.port, self.protocol.lower()),
        }
    }
}

/// A virtual server as kube-proxy writes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VirtualServer {
    pub key: VsKey,
    pub scheduler: String,
    /// `FLAG_PERSISTENT` or 0 (the kernel's `FLAG_HASHED` is ignored when comparing).
    pub flags: u32,
    /// Persistence timeout in seconds (0 without affinity).
    pub timeout: u32,
}

impl VirtualServer {
    /// Whether the kernel's copy needs an update to become `self`.
    pub fn differs(&self, kernel: &VirtualServer) -> bool {
        self.scheduler != kernel.scheduler
            || self.flags != kernel.flags & !FLAG_HASHED
            || self.timeout != kernel.timeout
    }
}

/// A real server of a virtual server.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RealServer {
    pub addr: IpAddr,
    pub port: u16,
    pub weight: u32,
    /// Read from the kernel (0 when writing).
    pub active_conns: u32,
    pub inactive_conns: u32,
}

impl RealServer {
    pub fn new(addr: IpAddr, port: u16, weight: u32) -> Self {
        RealServer {
            addr,
            port,
            weight,
            active_conns: 0,
            inactive_conns: 0,
        }
    }
}

fn af(ip: &IpAddr) -> u16 {
    if ip.is_ipv4() { AF_INET } else { AF_INET6 }
}

fn ip_bytes(ip: &IpAddr) -> Vec<u8> {
    match ip {
        IpAddr::V4(a) => a.octets().to_vec(),
        IpAddr::V6(a) => a.octets().to_vec(),
    }
}

fn proto_num(p: Protocol) -> u16 {
    match p {
        Protocol::Tcp => 6,
        Protocol::Udp => 17,
        Protocol::Sctp => 132,
    }
}

fn proto_of(n: u16) -> Option<Protocol> {
    match n {
        6 => Some(Protocol::Tcp),
        17 => Some(Protocol::Udp),
        132 => Some(Protocol::Sctp),
        _ => None,
    }
}

fn genl(family: u16, cmd: u8, version: u8, flags: u16, seq: u32, attrs: &[u8]) -> Vec<u8> {
    let mut body = Vec::with_capacity(4 + attrs.len());
    body.extend_from_slice(&[cmd, version, 0, 0]);
    body.extend_from_slice(attrs);
    netlink::message(family, flags, seq, &body)
}

/// `CTRL_CMD_GETFAMILY` for `name` (answered with the family's id).
pub fn get_family_request(name: &str, seq: u32) -> Vec<u8> {
    let mut a = Vec::new();
    put_str(&mut a, CTRL_ATTR_FAMILY_NAME, name);
    genl(GENL_ID_CTRL, CTRL_CMD_GETFAMILY, 1, NLM_F_REQUEST, seq, &a)
}

/// The family id in a `CTRL_CMD_NEWFAMILY` answer's body (genl header included).
pub fn parse_family_id(body: &[u8]) -> Option<u16> {
    attrs(body.get(4..)?)
        .find(|(ty, _)| *ty == CTRL_ATTR_FAMILY_ID)
        .and_then(|(_, p)| u16_of(p))
}

fn put_service_id(a: &mut Vec<u8>, key: &VsKey) {
    put_u16(a, IPVS_SVC_ATTR_AF, af(&key.addr));
    put_u16(a, IPVS_SVC_ATTR_PROTOCOL, proto_num(key.protocol));
    put_attr(a, IPVS_SVC_ATTR_ADDR, &ip_bytes(&key.addr));
    put_attr(a, IPVS_SVC_ATTR_PORT, &key.port.to_be_bytes());
}

fn put_service(a: &mut Vec<u8>, vs: &VirtualServer) {
    put_nested(a, IPVS_CMD_ATTR_SERVICE, |a| {
        put_service_id(a, &vs.key);
        put_str(a, IPVS_SVC_ATTR_SCHED_NAME, &vs.scheduler);
        // struct ip_vs_flags { flags, mask }: every bit given.
        let mut f = vs.flags.to_ne_bytes().to_vec();
        f.extend_from_slice(&u32::MAX.to_ne_bytes());
        put_attr(a, IPVS_SVC_ATTR_FLAGS, &f);
        put_u32(a, IPVS_SVC_ATTR_TIMEOUT, vs.timeout);
        let netmask = if vs.key.addr.is_ipv4() { u32::MAX } else { 128 };
        put_u32(a, IPVS_SVC_ATTR_NETMASK, netmask);
    });
}

fn service_cmd(family: u16, cmd: u8, vs: &VirtualServer, seq: u32) -> Vec<u8> {
    let mut a = Vec::new();
    put_service(&mut a, vs);
    genl(
        family,
        cmd,
        IPVS_GENL_VERSION,
        NLM_F_REQUEST | NLM_F_ACK,
        seq,
        &a,
    )
}

pub fn new_service(family: u16, vs: &VirtualServer, seq: u32) -> Vec<u8> {
    service_cmd(family, IPVS_CMD_NEW_SERVICE, vs, seq)
}

pub fn set_service(family: u16, vs: &VirtualServer, seq: u32) -> Vec<u8> {
    service_cmd(family, IPVS_CMD_SET_SERVICE, vs, seq)
}

pub fn del_service(family: u16, key: &VsKey, seq: u32) -> Vec<u8> {
    let mut a = Vec::new();
    put_nested(&mut a, IPVS_CMD_ATTR_SERVICE, |a| put_service_id(a, key));
    genl(
        family,
        IPVS_CMD_DEL_SERVICE,
        IPVS_GENL_VERSION,
        NLM_F_REQUEST | NLM_F_ACK,
        seq,
        &a,
    )
}

pub fn get_services(family: u16, seq: u32) -> Vec<u8> {
    genl(
        family,
        IPVS_CMD_GET_SERVICE,
        IPVS_GENL_VERSION,
        NLM_F_REQUEST | NLM_F_DUMP,
        seq,
        &[],
    )
}

fn dest_cmd(family: u16, cmd: u8, key: &VsKey, rs: &RealServer, full: bool, seq: u32) -> Vec<u8> {
    let mut a = Vec::new();
    put_nested(&mut a, IPVS_CMD_ATTR_SERVICE, |a| put_service_id(a, key));
    put_nested(&mut a, IPVS_CMD_ATTR_DEST, |a| {
        put_attr(a, IPVS_DEST_ATTR_ADDR, &ip_bytes(&rs.addr));
        put_attr(a, IPVS_DEST_ATTR_PORT, &rs.port.to_be_bytes());
        if full {
            put_u32(a, IPVS_DEST_ATTR_FWD_METHOD, FWD_MASQ);
            put_u32(a, IPVS_DEST_ATTR_WEIGHT, rs.weight);
            put_u32(a, IPVS_DEST_ATTR_U_THRESH, 0);
            put_u32(a, IPVS_DEST_ATTR_L_THRESH, 0);
        }
        put_u16(a, IPVS_DEST_ATTR_ADDR_FAMILY, af(&rs.addr));
    });
    genl(
        family,
        cmd,
        IPVS_GENL_VERSION,
        NLM_F_REQUEST | NLM_F_ACK,
        seq,
        &a,
    )
}

pub fn new_dest(family: u16, key: &VsKey, rs: &RealServer, seq: u32) -> Vec<u8> {
    dest_cmd(family, IPVS_CMD_NEW_DEST, key, rs, true, seq)
}

pub fn set_dest(family: u16, key: &VsKey, rs: &RealServer, seq: u32) -> Vec<u8> {
    dest_cmd(family, IPVS_CMD_SET_DEST, key, rs, true, seq)
}

pub fn del_dest(family: u16, key: &VsKey, rs: &RealServer, seq: u32) -> Vec<u8> {
    dest_cmd(family, IPVS_CMD_DEL_DEST, key, rs, false, seq)
}

pub fn get_dests(family: u16, key: &VsKey, seq: u32) -> Vec<u8> {
    let mut a = Vec::new();
    put_nested(&mut a, IPVS_CMD_ATTR_SERVICE, |a| put_service_id(a, key));
    genl(
        family,
        IPVS_CMD_GET_DEST,
        IPVS_GENL_VERSION,
        NLM_F_REQUEST | NLM_F_DUMP,
        seq,
        &a,
    )
}

/// `IPVS_CMD_SET_CONFIG`: the TCP, TCP FIN_WAIT and UDP timeouts in seconds (the kernel
/// leaves a zero one as it is).
pub fn set_config(family: u16, tcp: u32, tcp_fin: u32, udp: u32, seq: u32) -> Vec<u8> {
    let mut a = Vec::new();
    put_u32(&mut a, IPVS_CMD_ATTR_TIMEOUT_TCP, tcp);
    put_u32(&mut a, IPVS_CMD_ATTR_TIMEOUT_TCP_FIN, tcp_fin);
    put_u32(&mut a, IPVS_CMD_ATTR_TIMEOUT_UDP, udp);
    genl(
        family,
        IPVS_CMD_SET_CONFIG,
        IPVS_GENL_VERSION,
        NLM_F_REQUEST | NLM_F_ACK,
        seq,
        &a,
    )
}

/// The kernel sends addresses as 16 bytes (`union nf_inet_addr`); the family says how many
/// of them are the address.
fn addr_of(p: &[u8], family: u16) -> Option<IpAddr> {
    if family == AF_INET6 {
        Some(IpAddr::V6(Ipv6Addr::from(
            <[u8; 16]>::try_from(p.get(..16)?).ok()?,
        )))
    } else {
        Some(IpAddr::V4(Ipv4Addr::from(
            <[u8; 4]>::try_from(p.get(..4)?).ok()?,
        )))
    }
}

fn port_of(p: &[u8]) -> Option<u16> {
    Some(u16::from_be_bytes(p.get(..2)?.try_into().ok()?))
}

/// A `GET_SERVICE` dump message's body (genl header included) → the virtual server; None
/// for fwmark services and protocols kube-proxy does not use.
pub fn parse_service(body: &[u8]) -> Option<VirtualServer> {
    let nested = attrs(body.get(4..)?).find(|(ty, _)| *ty == IPVS_CMD_ATTR_SERVICE)?;
    let (mut family, mut proto, mut addr, mut port) = (AF_INET, None, None, None);
    let (mut scheduler, mut flags, mut timeout) = (String::new(), 0, 0);
    for (ty, p) in attrs(nested.1) {
        match ty {
            IPVS_SVC_ATTR_AF => family = u16_of(p)?,
            IPVS_SVC_ATTR_PROTOCOL => proto = u16_of(p).and_then(proto_of),
            IPVS_SVC_ATTR_ADDR => addr = Some(p.to_vec()),
            IPVS_SVC_ATTR_PORT => port = port_of(p),
            IPVS_SVC_ATTR_SCHED_NAME => scheduler = str_of(p),
            IPVS_SVC_ATTR_FLAGS => flags = u32_of(p).unwrap_or(0),
            IPVS_SVC_ATTR_TIMEOUT => timeout = u32_of(p).unwrap_or(0),
            _ => {}
        }
    }
    Some(VirtualServer {
        key: VsKey {
            addr: addr_of(&addr?, family)?,
            protocol: proto?,
            port: port?,
        },
        scheduler,
        flags,
        timeout,
    })
}

/// A `GET_DEST` dump message's body → the real server with its connection counts.
pub fn parse_dest(body: &[u8]) -> Option<RealServer> {
    let nested = attrs(body.get(4..)?).find(|(ty, _)| *ty == IPVS_CMD_ATTR_DEST)?;
    let (mut family, mut addr, mut port) = (None, None, None);
    let mut rs = RealServer::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), 0, 0);
    for (ty, p) in attrs(nested.1) {
        match ty {
            IPVS_DEST_ATTR_ADDR => addr = Some(p.to_vec()),
            IPVS_DEST_ATTR_PORT => port = port_of(p),
            IPVS_DEST_ATTR_WEIGHT => rs.weight = u32_of(p).unwrap_or(0),
            IPVS_DEST_ATTR_ACTIVE_CONNS => rs.active_conns = u32_of(p).unwrap_or(0),
            IPVS_DEST_ATTR_INACT_CONNS => rs.inactive_conns = u32_of(p).unwrap_or(0),
            IPVS_DEST_ATTR_ADDR_FAMILY => family = u16_of(p),
            _ => {}
        }
    }
    let addr = addr?;
    // Kernels before 4.x send no ADDR_FAMILY: the dest's family is its service's, which a
    // 16-byte address with zeros after the first four cannot tell; assume IPv4 then.
    let family = family.unwrap_or(if addr.len() >= 16 && addr[4..].iter().any(|b| *b != 0) {
        AF_INET6
    } else {
        AF_INET
    });
    rs.addr = addr_of(&addr, family)?;
    rs.port = port?;
    Some(rs)
}

#[cfg(test)]
mod tests;
