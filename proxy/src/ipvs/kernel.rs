//! The IPVS backend's OS edge: IPVS virtual/real servers and the dummy interface, as one
//! batch of operations per call ([`IpvsKernel::batch`]), so that a sync costs a few trips to
//! the blocking pool, not one per service. [`NetlinkIpvs`] is the real side (generic netlink
//! + rtnetlink on sockets it keeps open); the fake is `test_util::FakeIpvs`.

use std::collections::BTreeSet;
use std::future::Future;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use netlink_sys::protocols::{NETLINK_GENERIC, NETLINK_ROUTE};
use tracing::debug;

use super::genl::{self, RealServer, VirtualServer, VsKey};
use super::rtnl::{self, DUMMY_DEVICE};
use crate::model::{IpFamily, Protocol};
use crate::netlink::{EADDRNOTAVAIL, EEXIST, ENODEV, ENOENT, ESRCH, NlError, NlSocket};

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

struct Conns {
    ipvs: Option<(NlSocket, u16)>,
    route: Option<NlSocket>,
}

/// IPVS and `kube-ipvs0` over netlink in this process's network namespace; sockets are
/// opened on first use and kept (a failed request drops them, the next batch reopens).
#[derive(Clone)]
pub struct NetlinkIpvs {
    conns: Arc<Mutex<Conns>>,
}

impl std::fmt::Debug for NetlinkIpvs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NetlinkIpvs").finish_non_exhaustive()
    }
}

impl Default for NetlinkIpvs {
    fn default() -> Self {
        NetlinkIpvs {
            conns: Arc::new(Mutex::new(Conns {
                ipvs: None,
                route: None,
            })),
        }
    }
}

impl NetlinkIpvs {
    pub fn new() -> Self {
        Self::default()
    }
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

fn dummy_index(route: &mut NlSocket) -> Result<Option<i32>, NlError> {
    match route.request("get link", |seq| rtnl::get_link(DUMMY_DEVICE, seq)) {
        Ok(msgs) => Ok(msgs
            .first()
            .and_then(|(_, b)| rtnl::parse_link(b))
            .map(|l| l.0)),
        Err(e) if e.errno() == Some(ENODEV) => Ok(None),
        Err(e) => Err(e),
    }
}

fn run_one(conns: &mut Conns, op: &Op) -> Result<Answer, NlError> {
    let ipvs_op = !matches!(
        op,
        Op::EnsureDummy
            | Op::DummyAddrs(_)
            | Op::LocalAddrs(_)
            | Op::AddAddr(_)
            | Op::DelAddr(_)
            | Op::DeleteDummy
    );
    if ipvs_op {
        if conns.ipvs.is_none() {
            conns.ipvs = Some(open_ipvs()?);
        }
        let (s, fam) = conns.ipvs.as_mut().expect("opened above");
        let fam = *fam;
        let what = describe(op);
        return match op {
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
            _ => unreachable!("rtnetlink operations are handled below"),
        };
    }
    if conns.route.is_none() {
        conns.route = Some(NlSocket::open(NETLINK_ROUTE, REQUEST_TIMEOUT)?);
    }
    let r = conns.route.as_mut().expect("opened above");
    let what = describe(op);
    match op {
        Op::EnsureDummy => {
            if dummy_index(r)?.is_some() {
                return Ok(Answer::Done);
            }
            match r.request(&what, |q| rtnl::new_dummy(DUMMY_DEVICE, q)) {
                Ok(_) => Ok(Answer::Done),
                Err(e) if e.errno() == Some(EEXIST) => Ok(Answer::Done),
                // No `dummy` module: the kernel knows no link kind "dummy".
                Err(e) if e.errno() == Some(95) => Err(NlError::Protocol(format!(
                    "{what}: the kernel has no dummy interfaces: the dummy module is not loaded (modprobe dummy) or not built"
                ))),
                Err(e) => Err(e),
            }
        }
        Op::DummyAddrs(family) | Op::LocalAddrs(family) => {
            let index = dummy_index(r)?;
            let on_dummy = matches!(op, Op::DummyAddrs(_));
            if on_dummy && index.is_none() {
                return Ok(Answer::Addrs(None));
            }
            let v6 = *family == IpFamily::V6;
            let addrs = r
                .request(&what, |q| rtnl::get_addrs(v6, q))?
                .iter()
                .filter(|(ty, _)| *ty == rtnl::RTM_NEWADDR)
                .filter_map(|(_, b)| rtnl::parse_addr(b))
                .filter(|(i, _)| (Some(*i) == index) == on_dummy)
                .map(|(_, ip)| ip)
                .collect();
            Ok(Answer::Addrs(Some(addrs)))
        }
        Op::AddAddr(ip) | Op::DelAddr(ip) => {
            let index = dummy_index(r)?.ok_or(NlError::Kernel {
                what: what.clone(),
                errno: ENODEV,
            })?;
            let add = matches!(op, Op::AddAddr(_));
            let res = r.request(&what, |q| {
                if add {
                    rtnl::new_addr(index, ip, q)
                } else {
                    rtnl::del_addr(index, ip, q)
                }
            });
            match res {
                Ok(_) => Ok(Answer::Done),
                Err(e) if add && e.errno() == Some(EEXIST) => Ok(Answer::Done),
                Err(e) if !add && e.errno() == Some(EADDRNOTAVAIL) => Ok(Answer::Done),
                Err(e) => Err(e),
            }
        }
        Op::DeleteDummy => match dummy_index(r)? {
            None => Ok(Answer::Existed(false)),
            Some(i) => {
                r.request(&what, |q| rtnl::del_link(i, q))?;
                Ok(Answer::Existed(true))
            }
        },
        _ => unreachable!("IPVS operations are handled above"),
    }
}

fn done(r: Result<Vec<(u16, Vec<u8>)>, NlError>) -> Result<Answer, NlError> {
    r.map(|_| Answer::Done)
}

impl IpvsKernel for NetlinkIpvs {
    async fn batch(&self, ops: Vec<Op>) -> Vec<OpResult> {
        let conns = self.conns.clone();
        let n = ops.len();
        let ops_copy = ops.clone();
        let work = tokio::task::spawn_blocking(move || {
            let mut c = conns.lock().unwrap_or_else(|p| p.into_inner());
            ops.iter()
                .map(|op| {
                    let r = run_one(&mut c, op);
                    if let Err(e) = &r {
                        debug!(op = %describe(op), error = %e, "netlink operation failed");
                        // A socket that timed out may hold a late answer: start afresh.
                        if matches!(e, NlError::Io { .. }) {
                            c.ipvs = None;
                            c.route = None;
                        }
                    }
                    r.map_err(|e| Error::new(op, e))
                })
                .collect::<Vec<_>>()
        });
        match tokio::time::timeout(BATCH_TIMEOUT, work).await {
            Ok(Ok(v)) => v,
            Ok(Err(join)) => ops_copy
                .iter()
                .map(|op| Err(Error::new(op, NlError::Protocol(join.to_string()))))
                .collect(),
            Err(_) => ops_copy
                .iter()
                .take(n)
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
