//! Netlink framing, hand-encoded on `netlink-sys`: attributes, message headers, splitting a
//! datagram into messages, and a blocking socket that sends one request and collects its answer
//! (acks, errors, dump parts). Used by the IPVS backend (generic netlink; its dummy interface
//! goes through `plumbing::rtnl` instead) and by `ctnetlink` (conntrack flows).

use std::time::Duration;

use netlink_sys::{Socket, SocketAddr};

pub const NLMSG_HDRLEN: usize = 16;
pub const NLMSG_ERROR: u16 = 2;
pub const NLMSG_DONE: u16 = 3;
pub const NLM_F_REQUEST: u16 = 0x1;
pub const NLM_F_MULTI: u16 = 0x2;
pub const NLM_F_ACK: u16 = 0x4;
pub const NLM_F_DUMP: u16 = 0x300;
pub const NLA_F_NESTED: u16 = 0x8000;
const NLA_TYPE_MASK: u16 = 0x3fff;

/// A netlink failure: the kernel's errno (positive), or a local I/O problem.
#[derive(Debug, thiserror::Error)]
pub enum NlError {
    #[error("{what}: {}", std::io::Error::from_raw_os_error(*errno))]
    Kernel { what: String, errno: i32 },
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{0}")]
    Protocol(String),
}

impl NlError {
    pub fn errno(&self) -> Option<i32> {
        match self {
            NlError::Kernel { errno, .. } => Some(*errno),
            NlError::Io { source, .. } => source.raw_os_error(),
            NlError::Protocol(_) => None,
        }
    }
}

pub const ENOENT: i32 = 2;
pub const ESRCH: i32 = 3;
pub const ENODEV: i32 = 19;
pub const EEXIST: i32 = 17;
pub const EADDRNOTAVAIL: i32 = 99;

pub fn put_attr(buf: &mut Vec<u8>, ty: u16, payload: &[u8]) {
    buf.extend_from_slice(&((4 + payload.len()) as u16).to_ne_bytes());
    buf.extend_from_slice(&ty.to_ne_bytes());
    buf.extend_from_slice(payload);
    while !buf.len().is_multiple_of(4) {
        buf.push(0);
    }
}

pub fn put_u16(buf: &mut Vec<u8>, ty: u16, v: u16) {
    put_attr(buf, ty, &v.to_ne_bytes());
}

pub fn put_u32(buf: &mut Vec<u8>, ty: u16, v: u32) {
    put_attr(buf, ty, &v.to_ne_bytes());
}

/// A NUL-terminated string attribute.
pub fn put_str(buf: &mut Vec<u8>, ty: u16, s: &str) {
    let mut p = Vec::with_capacity(s.len() + 1);
    p.extend_from_slice(s.as_bytes());
    p.push(0);
    put_attr(buf, ty, &p);
}

pub fn put_nested(buf: &mut Vec<u8>, ty: u16, inner: impl FnOnce(&mut Vec<u8>)) {
    let start = buf.len();
    buf.extend_from_slice(&[0; 4]);
    inner(buf);
    let len = (buf.len() - start) as u16;
    buf[start..start + 2].copy_from_slice(&len.to_ne_bytes());
    buf[start + 2..start + 4].copy_from_slice(&(ty | NLA_F_NESTED).to_ne_bytes());
}

/// A whole message: header (length filled in), then `body` (family header + attributes).
pub fn message(ty: u16, flags: u16, seq: u32, body: &[u8]) -> Vec<u8> {
    let len = NLMSG_HDRLEN + body.len();
    let mut m = Vec::with_capacity(len);
    m.extend_from_slice(&(len as u32).to_ne_bytes());
    m.extend_from_slice(&ty.to_ne_bytes());
    m.extend_from_slice(&flags.to_ne_bytes());
    m.extend_from_slice(&seq.to_ne_bytes());
    m.extend_from_slice(&0u32.to_ne_bytes());
    m.extend_from_slice(body);
    m
}

/// Attributes of `buf`: (type without flags, payload).
pub fn attrs(mut buf: &[u8]) -> impl Iterator<Item = (u16, &[u8])> {
    std::iter::from_fn(move || {
        if buf.len() < 4 {
            return None;
        }
        let len = u16::from_ne_bytes([buf[0], buf[1]]) as usize;
        let ty = u16::from_ne_bytes([buf[2], buf[3]]) & NLA_TYPE_MASK;
        if len < 4 || len > buf.len() {
            return None;
        }
        let payload = &buf[4..len];
        buf = &buf[len.next_multiple_of(4).min(buf.len())..];
        Some((ty, payload))
    })
}

pub fn u16_of(p: &[u8]) -> Option<u16> {
    Some(u16::from_ne_bytes(p.get(..2)?.try_into().ok()?))
}

pub fn u32_of(p: &[u8]) -> Option<u32> {
    Some(u32::from_ne_bytes(p.get(..4)?.try_into().ok()?))
}

pub fn str_of(p: &[u8]) -> String {
    let end = p.iter().position(|b| *b == 0).unwrap_or(p.len());
    String::from_utf8_lossy(&p[..end]).into_owned()
}

/// One message of a reply.
#[derive(Debug, PartialEq, Eq)]
pub enum Reply {
    /// A data message: its type and body (family header included).
    Data {
        ty: u16,
        body: Vec<u8>,
    },
    /// An ack (0) or an error (a negative errno).
    Ack {
        seq: u32,
        errno: i32,
    },
    Done,
}

/// The messages of a datagram: (type, sequence number, body after the header). Stops at the
/// first truncated or malformed header.
pub fn frames(mut buf: &[u8]) -> impl Iterator<Item = (u16, u32, &[u8])> {
    std::iter::from_fn(move || {
        if buf.len() < NLMSG_HDRLEN {
            return None;
        }
        let len = u32::from_ne_bytes(buf[0..4].try_into().expect("4 bytes")) as usize;
        if len < NLMSG_HDRLEN || len > buf.len() {
            return None;
        }
        let ty = u16::from_ne_bytes([buf[4], buf[5]]);
        let seq = u32::from_ne_bytes(buf[8..12].try_into().expect("4 bytes"));
        let body = &buf[NLMSG_HDRLEN..len];
        buf = &buf[len.next_multiple_of(4).min(buf.len())..];
        Some((ty, seq, body))
    })
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
            ty => Reply::Data {
                ty,
                body: body.to_vec(),
            },
        })
        .collect()
}

/// A blocking netlink socket of this process's network namespace, with a receive timeout.
pub struct NlSocket {
    sock: Socket,
    seq: u32,
    buf: Vec<u8>,
}

fn io(what: &str, source: std::io::Error) -> NlError {
    NlError::Io {
        what: what.to_string(),
        source,
    }
}

impl NlSocket {
    pub fn open(protocol: isize, timeout: Duration) -> Result<Self, NlError> {
        let mut sock = Socket::new(protocol).map_err(|e| io("netlink socket", e))?;
        sock.bind_auto().map_err(|e| io("netlink bind", e))?;
        sock.connect(&SocketAddr::new(0, 0))
            .map_err(|e| io("netlink connect", e))?;
        socket2::SockRef::from(&sock)
            .set_read_timeout(Some(timeout))
            .map_err(|e| io("netlink timeout", e))?;
        Ok(NlSocket {
            sock,
            seq: 1,
            buf: Vec::with_capacity(64 * 1024),
        })
    }

    pub fn next_seq(&mut self) -> u32 {
        self.seq = self.seq.wrapping_add(1);
        self.seq
    }

    /// Sends the request built by `build(seq)` and returns its data messages; an error ack
    /// is the error. A request is expected to carry `NLM_F_ACK` or `NLM_F_DUMP`.
    pub fn request(
        &mut self,
        what: &str,
        build: impl FnOnce(u32) -> Vec<u8>,
    ) -> Result<Vec<(u16, Vec<u8>)>, NlError> {
        let seq = self.next_seq();
        let msg = build(seq);
        let flags = u16::from_ne_bytes([msg[6], msg[7]]);
        let dump = flags & NLM_F_DUMP == NLM_F_DUMP;
        self.sock.send(&msg, 0).map_err(|e| io(what, e))?;
        let mut data = Vec::new();
        loop {
            self.buf.clear();
            self.sock.recv(&mut self.buf, 0).map_err(|e| io(what, e))?;
            for r in parse_replies(&self.buf) {
                match r {
                    Reply::Ack { seq: s, .. } if s != seq => {}
                    Reply::Ack { errno: 0, .. } => return Ok(data),
                    Reply::Ack { errno, .. } => {
                        return Err(NlError::Kernel {
                            what: what.to_string(),
                            errno: -errno,
                        });
                    }
                    Reply::Done => return Ok(data),
                    Reply::Data { ty, body } => {
                        data.push((ty, body));
                        if !dump {
                            // A non-dump answer with data (a GET) ends with that message
                            // unless an ack follows; GETs here are sent without NLM_F_ACK.
                            return Ok(data);
                        }
                    }
                }
            }
        }
    }
}
