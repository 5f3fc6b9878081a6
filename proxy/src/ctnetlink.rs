//! Conntrack through ctnetlink (`NETLINK_NETFILTER`, subsystem `NFNL_SUBSYS_CTNETLINK`), the
//! way upstream's conntrack cleanup talks to the kernel: one dump of the family's flows, then
//! one `IPCTNL_MSG_CT_DELETE` per matching flow, all on one socket, instead of a `conntrack`
//! process per filter.
//!
//! The messages are encoded and decoded here (pure functions, tested byte for byte); the
//! socket is `netlink-sys`'s, used on the blocking pool with a receive timeout.
//! [`NodeConntrack`] is what the proxy runs: netlink first, the `conntrack` binary when
//! netlink fails (one warning), and the binary alone when commands run through a prefix
//! (another namespace than this process's).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use netlink_sys::{Socket, SocketAddr, protocols::NETLINK_NETFILTER};
use tracing::{debug, warn};

use crate::conntrack::{
    COMMAND_TIMEOUT, Conntrack, Error, ExecConntrack, Filter, FlowEntry, Result,
};
use crate::model::IpFamily;
use crate::netlink::{
    NLM_F_ACK, NLM_F_DUMP, NLM_F_REQUEST, NLMSG_DONE, NLMSG_ERROR, attrs, frames, put_attr,
    put_nested,
};

const NFGENMSG_LEN: usize = 4;
const NFNL_SUBSYS_CTNETLINK: u16 = 1;
const IPCTNL_MSG_CT_GET: u16 = 1;
const IPCTNL_MSG_CT_DELETE: u16 = 2;
const CTA_TUPLE_ORIG: u16 = 1;
const CTA_TUPLE_REPLY: u16 = 2;
const CTA_ZONE: u16 = 18;
const CTA_TUPLE_IP: u16 = 1;
const CTA_TUPLE_PROTO: u16 = 2;
const CTA_IP_V4_SRC: u16 = 1;
const CTA_IP_V4_DST: u16 = 2;
const CTA_IP_V6_SRC: u16 = 3;
const CTA_IP_V6_DST: u16 = 4;
const CTA_PROTO_NUM: u16 = 1;
const CTA_PROTO_SRC_PORT: u16 = 2;
const CTA_PROTO_DST_PORT: u16 = 3;
const IPPROTO_UDP: u8 = 17;
const AF_INET: u8 = 2;
const AF_INET6: u8 = 10;
const ENOENT: i32 = 2;

/// One direction of a flow.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tuple {
    pub src: IpAddr,
    pub dst: IpAddr,
    pub proto: u8,
    pub sport: u16,
    pub dport: u16,
}

/// A flow as the dump reports it: what deleting it needs, and what the cleanup matches on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Flow {
    pub orig: Tuple,
    pub reply: Tuple,
    pub zone: Option<u16>,
}

impl Flow {
    pub fn entry(&self) -> FlowEntry {
        FlowEntry {
            orig_dst: self.orig.dst,
            orig_dst_port: self.orig.dport,
            reply_src: self.reply.src,
        }
    }

    /// The `conntrack -D` filter semantics: every given field matches.
    pub fn matches(&self, f: &Filter) -> bool {
        self.orig.proto == IPPROTO_UDP
            && f.orig_dst.is_none_or(|d| d == self.orig.dst)
            && f.orig_dst_port == self.orig.dport
            && f.reply_src == self.reply.src
    }
}

fn family_byte(f: IpFamily) -> u8 {
    match f {
        IpFamily::V4 => AF_INET,
        IpFamily::V6 => AF_INET6,
    }
}

fn message(ty: u16, flags: u16, seq: u32, family: u8, attrs: &[u8]) -> Vec<u8> {
    // nfgenmsg: family, NFNETLINK_V0, res_id (big endian) 0; then the attributes.
    let mut body = Vec::with_capacity(NFGENMSG_LEN + attrs.len());
    body.extend_from_slice(&[family, 0, 0, 0]);
    body.extend_from_slice(attrs);
    crate::netlink::message((NFNL_SUBSYS_CTNETLINK << 8) | ty, flags, seq, &body)
}

/// `IPCTNL_MSG_CT_GET` with `NLM_F_DUMP`: every flow of `family` (the kernel filters on the
/// nfgenmsg family).
pub fn dump_request(family: IpFamily, seq: u32) -> Vec<u8> {
    message(
        IPCTNL_MSG_CT_GET,
        NLM_F_REQUEST | NLM_F_DUMP,
        seq,
        family_byte(family),
        &[],
    )
}

fn put_tuple(buf: &mut Vec<u8>, ty: u16, t: &Tuple) {
    put_nested(buf, ty, |b| {
        put_nested(b, CTA_TUPLE_IP, |b| match (t.src, t.dst) {
            (IpAddr::V4(s), IpAddr::V4(d)) => {
                put_attr(b, CTA_IP_V4_SRC, &s.octets());
                put_attr(b, CTA_IP_V4_DST, &d.octets());
            }
            (s, d) => {
                put_attr(b, CTA_IP_V6_SRC, &v6(s).octets());
                put_attr(b, CTA_IP_V6_DST, &v6(d).octets());
            }
        });
        put_nested(b, CTA_TUPLE_PROTO, |b| {
            put_attr(b, CTA_PROTO_NUM, &[t.proto]);
            put_attr(b, CTA_PROTO_SRC_PORT, &t.sport.to_be_bytes());
            put_attr(b, CTA_PROTO_DST_PORT, &t.dport.to_be_bytes());
        });
    });
}

fn v6(ip: IpAddr) -> Ipv6Addr {
    match ip {
        IpAddr::V6(a) => a,
        IpAddr::V4(a) => a.to_ipv6_mapped(),
    }
}

/// `IPCTNL_MSG_CT_DELETE` of one flow, by its original tuple (and zone), acked.
pub fn delete_request(flow: &Flow, seq: u32) -> Vec<u8> {
    let family = if flow.orig.src.is_ipv4() {
        AF_INET
    } else {
        AF_INET6
    };
    let mut attrs = Vec::with_capacity(64);
    put_tuple(&mut attrs, CTA_TUPLE_ORIG, &flow.orig);
    if let Some(z) = flow.zone {
        put_attr(&mut attrs, CTA_ZONE, &z.to_be_bytes());
    }
    message(
        IPCTNL_MSG_CT_DELETE,
        NLM_F_REQUEST | NLM_F_ACK,
        seq,
        family,
        &attrs,
    )
}

fn parse_tuple(buf: &[u8]) -> Option<Tuple> {
    let (mut src, mut dst, mut proto, mut sport, mut dport) = (None, None, None, 0, 0);
    for (ty, p) in attrs(buf) {
        match ty {
            CTA_TUPLE_IP => {
                for (ty, a) in attrs(p) {
                    let ip = match a.len() {
                        4 => IpAddr::V4(Ipv4Addr::from(<[u8; 4]>::try_from(a).ok()?)),
                        16 => IpAddr::V6(Ipv6Addr::from(<[u8; 16]>::try_from(a).ok()?)),
                        _ => continue,
                    };
                    match ty {
                        CTA_IP_V4_SRC | CTA_IP_V6_SRC => src = Some(ip),
                        CTA_IP_V4_DST | CTA_IP_V6_DST => dst = Some(ip),
                        _ => {}
                    }
                }
            }
            CTA_TUPLE_PROTO => {
                for (ty, a) in attrs(p) {
                    match (ty, a) {
                        (CTA_PROTO_NUM, [n, ..]) => proto = Some(*n),
                        (CTA_PROTO_SRC_PORT, [a, b, ..]) => sport = u16::from_be_bytes([*a, *b]),
                        (CTA_PROTO_DST_PORT, [a, b, ..]) => dport = u16::from_be_bytes([*a, *b]),
                        _ => {}
                    }
                }
            }
            _ => {}
        }
    }
    Some(Tuple {
        src: src?,
        dst: dst?,
        proto: proto?,
        sport,
        dport,
    })
}

/// What one netlink message of a reply says.
#[derive(Debug, PartialEq, Eq)]
pub enum Reply {
    Flow(Flow),
    /// An ack (0) or an error (a negative errno) for the request `seq`.
    Ack {
        seq: u32,
        errno: i32,
    },
    Done,
    Other,
}

/// Splits a datagram into its netlink messages.
pub fn parse_replies(buf: &[u8]) -> Vec<Reply> {
    frames(buf)
        .map(|(ty, seq, body)| match ty {
            NLMSG_DONE => Reply::Done,
            NLMSG_ERROR if body.len() >= 4 => Reply::Ack {
                seq,
                errno: i32::from_ne_bytes(body[0..4].try_into().expect("4 bytes")),
            },
            t if t >> 8 == NFNL_SUBSYS_CTNETLINK && body.len() >= NFGENMSG_LEN => {
                parse_flow(&body[NFGENMSG_LEN..]).map_or(Reply::Other, Reply::Flow)
            }
            _ => Reply::Other,
        })
        .collect()
}

fn parse_flow(buf: &[u8]) -> Option<Flow> {
    let (mut orig, mut reply, mut zone) = (None, None, None);
    for (ty, p) in attrs(buf) {
        match (ty, p) {
            (CTA_TUPLE_ORIG, _) => orig = parse_tuple(p),
            (CTA_TUPLE_REPLY, _) => reply = parse_tuple(p),
            (CTA_ZONE, [a, b, ..]) => zone = Some(u16::from_be_bytes([*a, *b])),
            _ => {}
        }
    }
    Some(Flow {
        orig: orig?,
        reply: reply?,
        zone,
    })
}

/// A ctnetlink socket of this process's network namespace.
struct CtSocket {
    sock: Socket,
    seq: u32,
    buf: Vec<u8>,
}

fn io(context: &str, e: std::io::Error) -> Error {
    Error::Netlink(format!("ctnetlink {context}: {e}"))
}

impl CtSocket {
    fn open(timeout: Duration) -> Result<Self> {
        let mut sock = Socket::new(NETLINK_NETFILTER).map_err(|e| io("socket", e))?;
        sock.bind_auto().map_err(|e| io("bind", e))?;
        sock.connect(&SocketAddr::new(0, 0))
            .map_err(|e| io("connect", e))?;
        socket2::SockRef::from(&sock)
            .set_read_timeout(Some(timeout))
            .map_err(|e| io("timeout", e))?;
        Ok(CtSocket {
            sock,
            seq: 1,
            buf: Vec::with_capacity(256 * 1024),
        })
    }

    fn next_seq(&mut self) -> u32 {
        self.seq = self.seq.wrapping_add(1);
        self.seq
    }

    fn recv(&mut self) -> Result<Vec<Reply>> {
        self.buf.clear();
        self.sock
            .recv(&mut self.buf, 0)
            .map_err(|e| io("recv", e))?;
        Ok(parse_replies(&self.buf))
    }

    fn dump(&mut self, family: IpFamily) -> Result<Vec<Flow>> {
        let seq = self.next_seq();
        self.sock
            .send(&dump_request(family, seq), 0)
            .map_err(|e| io("send", e))?;
        let mut flows = Vec::new();
        loop {
            for r in self.recv()? {
                match r {
                    Reply::Flow(f) => flows.push(f),
                    Reply::Done => return Ok(flows),
                    Reply::Ack { errno, .. } if errno != 0 => {
                        return Err(io("dump", std::io::Error::from_raw_os_error(-errno)));
                    }
                    _ => {}
                }
            }
        }
    }

    /// Deletes `flows`, a window of requests in flight at a time; returns how many went (a
    /// flow already gone is not an error).
    fn delete(&mut self, flows: &[Flow]) -> Result<usize> {
        const WINDOW: usize = 64;
        let mut deleted = 0;
        for chunk in flows.chunks(WINDOW) {
            let mut batch = Vec::with_capacity(chunk.len() * 80);
            for f in chunk {
                let seq = self.next_seq();
                batch.extend_from_slice(&delete_request(f, seq));
            }
            self.sock.send(&batch, 0).map_err(|e| io("send", e))?;
            let mut acks = 0;
            while acks < chunk.len() {
                for r in self.recv()? {
                    if let Reply::Ack { errno, .. } = r {
                        acks += 1;
                        match errno {
                            0 => deleted += 1,
                            e if -e == ENOENT => {}
                            e => {
                                return Err(io("delete", std::io::Error::from_raw_os_error(-e)));
                            }
                        }
                    }
                }
            }
        }
        Ok(deleted)
    }
}

/// Conntrack over ctnetlink in this process's network namespace.
#[derive(Clone, Debug)]
pub struct NetlinkConntrack {
    timeout: Duration,
}

impl Default for NetlinkConntrack {
    fn default() -> Self {
        NetlinkConntrack {
            timeout: COMMAND_TIMEOUT,
        }
    }
}

impl NetlinkConntrack {
    pub fn new() -> Self {
        Self::default()
    }

    async fn blocking<T: Send + 'static>(
        &self,
        what: &str,
        f: impl FnOnce(Duration) -> Result<T> + Send + 'static,
    ) -> Result<T> {
        let timeout = self.timeout;
        match tokio::time::timeout(timeout, tokio::task::spawn_blocking(move || f(timeout))).await {
            Ok(Ok(r)) => r,
            Ok(Err(e)) => Err(Error::Netlink(format!("ctnetlink {what}: {e}"))),
            Err(_) => Err(Error::Timeout {
                cmd: format!("ctnetlink {what}"),
                after: timeout,
            }),
        }
    }

    /// Deletes the UDP flows matching any of `filters` after one dump.
    pub async fn delete_matching(&self, family: IpFamily, filters: Vec<Filter>) -> Result<usize> {
        self.blocking("delete", move |t| {
            let mut s = CtSocket::open(t)?;
            let flows: Vec<Flow> = s
                .dump(family)?
                .into_iter()
                .filter(|f| filters.iter().any(|x| f.matches(x)))
                .collect();
            s.delete(&flows)
        })
        .await
    }
}

impl Conntrack for NetlinkConntrack {
    async fn list_udp(&self, family: IpFamily) -> Result<Vec<FlowEntry>> {
        self.blocking("dump", move |t| {
            let flows = CtSocket::open(t)?.dump(family)?;
            Ok(flows
                .iter()
                .filter(|f| f.orig.proto == IPPROTO_UDP)
                .map(Flow::entry)
                .collect())
        })
        .await
    }

    async fn delete_udp(&self, family: IpFamily, filter: &Filter) -> Result<usize> {
        self.delete_matching(family, vec![filter.clone()]).await
    }

    async fn delete_udp_many(&self, family: IpFamily, filters: &[Filter]) -> Result<usize> {
        self.delete_matching(family, filters.to_vec()).await
    }
}

/// What the proxy runs: ctnetlink in its own namespace with the `conntrack` binary as the
/// fallback (one warning the first time netlink fails), or the binary alone through a
/// command prefix.
#[derive(Clone, Debug)]
pub struct NodeConntrack {
    netlink: Option<NetlinkConntrack>,
    exec: ExecConntrack,
    warned: Arc<AtomicBool>,
}

impl NodeConntrack {
    pub fn for_prefix(prefix: &[String]) -> Self {
        NodeConntrack {
            netlink: prefix.is_empty().then(NetlinkConntrack::new),
            exec: ExecConntrack::new().with_prefix(prefix.to_vec()),
            warned: Arc::new(AtomicBool::new(false)),
        }
    }

    /// Whether netlink failed once and the binary took over (the warning was logged).
    pub fn fell_back_once(&self) -> bool {
        self.warned.load(Ordering::Relaxed)
    }

    fn fell_back(&self, e: &Error) {
        if !self.warned.swap(true, Ordering::Relaxed) {
            warn!(error = %e, "conntrack over netlink failed; using the conntrack binary");
        } else {
            debug!(error = %e, "conntrack over netlink failed; using the conntrack binary");
        }
    }
}

impl Conntrack for NodeConntrack {
    async fn list_udp(&self, family: IpFamily) -> Result<Vec<FlowEntry>> {
        if let Some(n) = &self.netlink {
            match n.list_udp(family).await {
                Ok(v) => return Ok(v),
                Err(e) => self.fell_back(&e),
            }
        }
        self.exec.list_udp(family).await
    }

    async fn delete_udp(&self, family: IpFamily, filter: &Filter) -> Result<usize> {
        if let Some(n) = &self.netlink {
            match n.delete_udp(family, filter).await {
                Ok(v) => return Ok(v),
                Err(e) => self.fell_back(&e),
            }
        }
        self.exec.delete_udp(family, filter).await
    }

    async fn delete_udp_many(&self, family: IpFamily, filters: &[Filter]) -> Result<usize> {
        if let Some(n) = &self.netlink {
            match n.delete_matching(family, filters.to_vec()).await {
                Ok(v) => return Ok(v),
                Err(e) => self.fell_back(&e),
            }
        }
        self.exec.delete_udp_many(family, filters).await
    }
}

#[cfg(test)]
mod tests;
