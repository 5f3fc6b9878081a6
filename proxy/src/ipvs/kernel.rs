//! The IPVS backend's OS edge: IPVS virtual/real servers and the dummy interface, as one
//! batch of operations per call ([`IpvsKernel::batch`]), so that a sync costs a few trips to
//! the blocking pool, not one per service. [`NetlinkIpvs`] is the real side (generic netlink
//! on a socket it keeps open, on the blocking pool; the dummy interface over the shared
//! rtnetlink wrapper, see [`super::rtnl`]); the fake is `FakeIpvs` in `fake.rs`.

use std::collections::BTreeSet;
use std::future::Future;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use netlink_sys::protocols::NETLINK_GENERIC;
use plumbing::rtnl::Rtnl;
use tracing::debug;

use super::genl::{self, RealServer, VirtualServer, VsKey};
use super::rtnl::{self, DUMMY_DEVICE, Links};
use crate::model::{IpFamily, Protocol};
use crate::netlink::{ENOENT, ESRCH, NlError, NlSocket};

/// One operation on the kernel.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Op {
    ListServices,
    AddService(VirtualServer),
    UpdateService(VirtualServer),
    DeleteService(VsKey),
    ListDests(VsKey),
    AddDest(VsKey, RealServer),
    UpdateDest(VsKey, RealServer),
    DeleteDest(VsKey, RealServer),
    /// `ipvs.tcpTimeout`, `tcpFinTimeout`, `udpTimeout` in seconds (0: left alone).
    SetTimeouts {
        tcp: u32,
        tcp_fin: u32,
        udp: u32,
    },
    /// Creates `kube-ipvs0` (a dummy link, left down as upstream leaves it) when absent.
    EnsureDummy,
    /// The addresses of one family on `kube-ipvs0` (`Answer::Addrs(None)`: no such link).
    DummyAddrs(IpFamily),
    /// The node's own addresses of one family: every link's but `kube-ipvs0`'s (where node
    /// ports answer).
    LocalAddrs(IpFamily),
    AddAddr(IpAddr),
    DelAddr(IpAddr),
    /// Removes `kube-ipvs0` (`Answer::Existed`).
    DeleteDummy,
}

/// What an operation answers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Answer {
    Done,
    Services(Vec<VirtualServer>),
    Dests(Vec<RealServer>),
    Addrs(Option<BTreeSet<IpAddr>>),
    Existed(bool),
}

#[derive(Debug, thiserror::Error)]
#[error("{op}: {source}")]
pub struct Error {
    pub op: String,
    #[source]
    pub source: NlError,
}

impl Error {
    pub fn new(op: &Op, source: NlError) -> Self {
        Error {
            op: describe(op),
            source,
        }
    }

    /// The kernel's errno, when the kernel refused.
    pub fn errno(&self) -> Option<i32> {
        self.source.errno()
    }
}

/// How an operation is named in errors and logs.
pub fn describe(op: &Op) -> String {
    match op {
        Op::ListServices => "IPVS list virtual servers".into(),
        Op::AddService(vs) => format!("IPVS add virtual server {}", vs.key),
        Op::UpdateService(vs) => format!("IPVS update virtual server {}", vs.key),
        Op::DeleteService(k) => format!("IPVS delete virtual server {k}"),
        Op::ListDests(k) => format!("IPVS list real servers of {k}"),
        Op::AddDest(k, rs) => format!("IPVS add real server {}:{} to {k}", rs.addr, rs.port),
        Op::UpdateDest(k, rs) => format!("IPVS update real server {}:{} of {k}", rs.addr, rs.port),
        Op::DeleteDest(k, rs) => {
            format!("IPVS delete real server {}:{} of {k}", rs.addr, rs.port)
        }
        Op::SetTimeouts { .. } => "IPVS set timeouts".into(),
        Op::EnsureDummy => format!("create dummy interface {DUMMY_DEVICE}"),
        Op::DummyAddrs(_) => format!("list addresses of {DUMMY_DEVICE}"),
        Op::LocalAddrs(_) => "list local addresses".into(),
        Op::AddAddr(ip) => format!("bind {ip} to {DUMMY_DEVICE}"),
        Op::DelAddr(ip) => format!("unbind {ip} from {DUMMY_DEVICE}"),
        Op::DeleteDummy => format!("delete {DUMMY_DEVICE}"),
    }
}

pub type OpResult = Result<Answer, Error>;

/// The kernel's IPVS and the dummy interface. Every operation of a batch runs, in order,
/// and has its own result (one failed real server does not stop the others).
pub trait IpvsKernel: Send + Sync + 'static {
    fn batch(&self, ops: Vec<Op>) -> impl Future<Output = Vec<OpResult>> + Send;
}

/// The address upstream probes the scheduler with (TEST-NET-2, never a real service).
pub const PROBE_VS: VsKey = VsKey {
    addr: IpAddr::V4(Ipv4Addr::new(198, 51, 100, 0)),
    protocol: Protocol::Tcp,
    port: 20000,
};

/// How long one batch may take before it is abandoned (its socket calls time out sooner).
pub const BATCH_TIMEOUT: Duration = Duration::from_secs(60);
/// Receive timeout of one netlink request.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// IPVS and `kube-ipvs0` over netlink in this process's network namespace; sockets are
/// opened on first use and kept (a request that timed out drops its socket, the next batch
/// reopens it).
#[derive(Clone, Default)]
pub struct NetlinkIpvs {
    ipvs: Arc<Mutex<Option<(NlSocket, u16)>>>,
    route: Arc<Mutex<Option<Arc<Rtnl>>>>,
}

impl std::fmt::Debug for NetlinkIpvs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NetlinkIpvs").finish_non_exhaustive()
    }
}

impl NetlinkIpvs {
    pub fn new() -> Self {
        Self::default()
    }

    /// A run of IPVS operations, on the blocking pool.
    async fn ipvs_ops(&self, ops: Vec<Op>) -> Vec<OpResult> {
        let conn = self.ipvs.clone();
        let ops_copy = ops.clone();
        let work = tokio::task::spawn_blocking(move || {
            let mut c = conn.lock().unwrap_or_else(|p| p.into_inner());
            ops.iter()
                .map(|op| {
                    let r = run_ipvs(&mut c, op);
                    if let Err(e) = &r {
                        debug!(op = %describe(op), error = %e, "netlink operation failed");
                        // A socket that timed out may hold a late answer: start afresh.
                        if matches!(e, NlError::Io { .. }) {
                            *c = None;
                        }
                    }
                    r.map_err(|e| Error::new(op, e))
                })
                .collect::<Vec<_>>()
        });
        match work.await {
            Ok(v) => v,
            Err(join) => ops_copy
                .iter()
                .map(|op| Err(Error::new(op, NlError::Protocol(join.to_string()))))
                .collect(),
        }
    }

    /// One operation on the dummy interface, over rtnetlink.
    async fn route_op(&self, op: &Op) -> OpResult {
        let opened = {
            let mut g = self.route.lock().unwrap_or_else(|p| p.into_inner());
            match &*g {
                Some(r) => Ok(r.clone()),
                None => Rtnl::open(REQUEST_TIMEOUT)
                    .map(|r| g.insert(Arc::new(r)).clone())
                    .map_err(|source| NlError::Io {
                        what: "open rtnetlink socket".into(),
                        source,
                    }),
            }
        };
        let r = match opened {
            Ok(rtnl) => route_op(&*rtnl, op).await,
            Err(e) => Err(e),
        };
        if let Err(e) = &r {
            debug!(op = %describe(op), error = %e, "netlink operation failed");
            if matches!(e, NlError::Io { .. }) {
                *self.route.lock().unwrap_or_else(|p| p.into_inner()) = None;
            }
        }
        r.map_err(|e| Error::new(op, e))
    }
}

/// One operation on the dummy interface ([`Op::EnsureDummy`], [`Op::DummyAddrs`],
/// [`Op::LocalAddrs`], [`Op::AddAddr`], [`Op::DelAddr`], [`Op::DeleteDummy`]) over `links`.
pub async fn route_op<L: Links>(links: &L, op: &Op) -> Result<Answer, NlError> {
    let what = describe(op);
    match op {
        Op::EnsureDummy => rtnl::ensure_dummy(links, &what)
            .await
            .map(|()| Answer::Done),
        Op::DummyAddrs(f) => rtnl::addresses(links, &what, *f, true)
            .await
            .map(Answer::Addrs),
        Op::LocalAddrs(f) => rtnl::addresses(links, &what, *f, false)
            .await
            .map(Answer::Addrs),
        Op::AddAddr(ip) => rtnl::bind(links, &what, *ip, true)
            .await
            .map(|()| Answer::Done),
        Op::DelAddr(ip) => rtnl::bind(links, &what, *ip, false)
            .await
            .map(|()| Answer::Done),
        Op::DeleteDummy => rtnl::delete_dummy(links, &what).await.map(Answer::Existed),
        _ => Err(NlError::Protocol(format!(
            "{what}: not an rtnetlink operation"
        ))),
    }
}

/// Whether `op` is one on the dummy interface (rtnetlink) rather than on IPVS.
fn is_route_op(op: &Op) -> bool {
    matches!(
        op,
        Op::EnsureDummy
            | Op::DummyAddrs(_)
            | Op::LocalAddrs(_)
            | Op::AddAddr(_)
            | Op::DelAddr(_)
            | Op::DeleteDummy
    )
}

/// Resolves the IPVS generic netlink family; its absence means no `ip_vs` module.
fn open_ipvs() -> Result<(NlSocket, u16), NlError> {
    let mut s = NlSocket::open(NETLINK_GENERIC, REQUEST_TIMEOUT)?;
    let answer = s
        .request("resolve generic netlink family IPVS", |seq| {
            genl::get_family_request(genl::IPVS_GENL_NAME, seq)
        })
        .map_err(|e| match e.errno() {
            Some(ENOENT) => NlError::Protocol(
                "the kernel has no IPVS generic netlink family: the ip_vs module is not loaded (modprobe ip_vs) or not built".into(),
            ),
            _ => e,
        })?;
    let id = answer
        .first()
        .and_then(|(_, body)| genl::parse_family_id(body))
        .ok_or_else(|| NlError::Protocol("nlctrl answered without a family id".into()))?;
    Ok((s, id))
}

fn run_ipvs(conn: &mut Option<(NlSocket, u16)>, op: &Op) -> Result<Answer, NlError> {
    if conn.is_none() {
        *conn = Some(open_ipvs()?);
    }
    let (s, fam) = conn.as_mut().expect("opened above");
    let fam = *fam;
    let what = describe(op);
    match op {
        Op::ListServices => Ok(Answer::Services(
            s.request(&what, |q| genl::get_services(fam, q))?
                .iter()
                .filter_map(|(_, b)| genl::parse_service(b))
                .collect(),
        )),
        Op::ListDests(k) => Ok(Answer::Dests(
            s.request(&what, |q| genl::get_dests(fam, k, q))?
                .iter()
                .filter_map(|(_, b)| genl::parse_dest(b))
                .collect(),
        )),
        Op::AddService(vs) => done(s.request(&what, |q| genl::new_service(fam, vs, q))),
        Op::UpdateService(vs) => done(s.request(&what, |q| genl::set_service(fam, vs, q))),
        Op::DeleteService(k) => done(s.request(&what, |q| genl::del_service(fam, k, q))),
        Op::AddDest(k, rs) => done(s.request(&what, |q| genl::new_dest(fam, k, rs, q))),
        Op::UpdateDest(k, rs) => done(s.request(&what, |q| genl::set_dest(fam, k, rs, q))),
        Op::DeleteDest(k, rs) => done(s.request(&what, |q| genl::del_dest(fam, k, rs, q))),
        Op::SetTimeouts { tcp, tcp_fin, udp } => {
            done(s.request(&what, |q| genl::set_config(fam, *tcp, *tcp_fin, *udp, q)))
        }
        _ => Err(NlError::Protocol(format!("{what}: not an IPVS operation"))),
    }
}

fn done(r: Result<Vec<(u16, Vec<u8>)>, NlError>) -> Result<Answer, NlError> {
    r.map(|_| Answer::Done)
}

impl IpvsKernel for NetlinkIpvs {
    /// Runs of IPVS operations go to the blocking pool together; the dummy interface's
    /// operations run over rtnetlink in between, in the batch's order.
    async fn batch(&self, ops: Vec<Op>) -> Vec<OpResult> {
        let work = async {
            let mut out = Vec::with_capacity(ops.len());
            let mut i = 0;
            while i < ops.len() {
                if is_route_op(&ops[i]) {
                    out.push(self.route_op(&ops[i]).await);
                    i += 1;
                } else {
                    let end = ops[i..]
                        .iter()
                        .position(is_route_op)
                        .map_or(ops.len(), |n| i + n);
                    out.extend(self.ipvs_ops(ops[i..end].to_vec()).await);
                    i = end;
                }
            }
            out
        };
        match tokio::time::timeout(BATCH_TIMEOUT, work).await {
            Ok(v) => v,
            Err(_) => ops
                .iter()
                .map(|op| {
                    Err(Error::new(
                        op,
                        NlError::Protocol(format!("timed out after {BATCH_TIMEOUT:?}")),
                    ))
                })
                .collect(),
        }
    }
}

/// Whether an error means "already gone" (deleting what is not there).
pub fn is_gone(e: &Error) -> bool {
    matches!(e.errno(), Some(ENOENT) | Some(ESRCH))
}
