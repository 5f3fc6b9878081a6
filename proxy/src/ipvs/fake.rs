//! Fakes of the IPVS backend's OS edges: [`FakeIpvs`] (an in-memory IPVS table and
//! `kube-ipvs0`, recording every operation) and [`FakeIpset`] (records restore texts and
//! keeps the sets' contents).

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::sync::{Arc, Mutex};

use super::genl::{FLAG_HASHED, RealServer, VirtualServer, VsKey};
use super::ipset::{self, Ipset};
use super::kernel::{Answer, Error, IpvsKernel, Op, OpResult};
use crate::netlink::NlError;

type Dests = BTreeMap<(IpAddr, u16), RealServer>;

#[derive(Debug, Default)]
struct IpvsState {
    services: BTreeMap<VsKey, (VirtualServer, Dests)>,
    dummy: Option<BTreeSet<IpAddr>>,
    local: BTreeSet<IpAddr>,
    timeouts: Option<(u32, u32, u32)>,
    ops: Vec<Op>,
    fail: Vec<String>,
    no_ipvs: bool,
}

/// An in-memory kernel. Real servers keep the connection counts a test sets
/// ([`FakeIpvs::set_conns`]).
#[derive(Clone, Debug, Default)]
pub struct FakeIpvs {
    st: Arc<Mutex<IpvsState>>,
}

fn err(op: &Op, errno: i32) -> Error {
    Error::new(
        op,
        NlError::Kernel {
            what: "fake".into(),
            errno,
        },
    )
}

impl FakeIpvs {
    pub fn new() -> Self {
        Self::default()
    }

    fn st(&self) -> std::sync::MutexGuard<'_, IpvsState> {
        self.st.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The node's own addresses (what `Op::LocalAddrs` answers).
    pub fn with_local_addrs(self, ips: &[&str]) -> Self {
        self.st().local = ips.iter().map(|s| s.parse().expect("IP")).collect();
        self
    }

    /// A kernel without the ip_vs module: every IPVS operation fails.
    pub fn without_ipvs(self) -> Self {
        self.st().no_ipvs = true;
        self
    }

    /// Operations whose description contains `needle` fail (EINVAL).
    pub fn fail_ops_containing(&self, needle: &str) {
        self.st().fail.push(needle.to_string());
    }

    pub fn clear_failures(&self) {
        self.st().fail.clear();
    }

    pub fn ops(&self) -> Vec<Op> {
        self.st().ops.clone()
    }

    pub fn clear_ops(&self) {
        self.st().ops.clear();
    }

    /// Only the operations that change something.
    pub fn writes(&self) -> Vec<Op> {
        self.ops()
            .into_iter()
            .filter(|o| {
                !matches!(
                    o,
                    Op::ListServices
                        | Op::ListDests(_)
                        | Op::DummyAddrs(_)
                        | Op::LocalAddrs(_)
                        | Op::EnsureDummy
                )
            })
            .collect()
    }

    pub fn services(&self) -> BTreeMap<VsKey, VirtualServer> {
        self.st()
            .services
            .iter()
            .map(|(k, (v, _))| (*k, v.clone()))
            .collect()
    }

    /// Real servers of `key`: (ip, port) → weight.
    pub fn dests(&self, key: &VsKey) -> BTreeMap<(IpAddr, u16), u32> {
        self.st()
            .services
            .get(key)
            .map(|(_, d)| d.iter().map(|(k, rs)| (*k, rs.weight)).collect())
            .unwrap_or_default()
    }

    pub fn set_conns(&self, key: &VsKey, ip: IpAddr, port: u16, active: u32, inactive: u32) {
        if let Some(rs) = self
            .st()
            .services
            .get_mut(key)
            .and_then(|(_, d)| d.get_mut(&(ip, port)))
        {
            rs.active_conns = active;
            rs.inactive_conns = inactive;
        }
    }

    /// Adds a virtual server someone else made.
    pub fn add_foreign(&self, vs: VirtualServer) {
        self.st().services.insert(vs.key, (vs, BTreeMap::new()));
    }

    /// `kube-ipvs0`'s addresses (None: no link).
    pub fn dummy_addrs(&self) -> Option<BTreeSet<IpAddr>> {
        self.st().dummy.clone()
    }

    pub fn timeouts(&self) -> Option<(u32, u32, u32)> {
        self.st().timeouts
    }

    fn run(&self, op: &Op) -> OpResult {
        let mut st = self.st();
        st.ops.push(op.clone());
        let d = super::kernel::describe(op);
        if st.fail.iter().any(|f| d.contains(f.as_str())) {
            return Err(err(op, 22));
        }
        let ipvs_op = !matches!(
            op,
            Op::EnsureDummy
                | Op::DummyAddrs(_)
                | Op::LocalAddrs(_)
                | Op::AddAddr(_)
                | Op::DelAddr(_)
                | Op::DeleteDummy
        );
        if ipvs_op && st.no_ipvs {
            return Err(Error::new(
                op,
                NlError::Protocol("the kernel has no IPVS generic netlink family".into()),
            ));
        }
        match op {
            Op::ListServices => Ok(Answer::Services(
                st.services
                    .values()
                    .map(|(v, _)| VirtualServer {
                        flags: v.flags | FLAG_HASHED,
                        ..v.clone()
                    })
                    .collect(),
            )),
            Op::AddService(vs) => {
                if st.services.contains_key(&vs.key) {
                    return Err(err(op, 17));
                }
                st.services.insert(vs.key, (vs.clone(), BTreeMap::new()));
                Ok(Answer::Done)
            }
            Op::UpdateService(vs) => match st.services.get_mut(&vs.key) {
                Some((v, _)) => {
                    *v = vs.clone();
                    Ok(Answer::Done)
                }
                None => Err(err(op, 3)),
            },
            Op::DeleteService(k) => match st.services.remove(k) {
                Some(_) => Ok(Answer::Done),
                None => Err(err(op, 3)),
            },
            Op::ListDests(k) => match st.services.get(k) {
                Some((_, d)) => Ok(Answer::Dests(d.values().copied().collect())),
                None => Err(err(op, 3)),
            },
            Op::AddDest(k, rs) | Op::UpdateDest(k, rs) => {
                let add = matches!(op, Op::AddDest(..));
                let Some((_, d)) = st.services.get_mut(k) else {
                    return Err(err(op, 3));
                };
                match (add, d.get_mut(&(rs.addr, rs.port))) {
                    (true, Some(_)) => Err(err(op, 17)),
                    (false, None) => Err(err(op, 2)),
                    (_, Some(cur)) => {
                        cur.weight = rs.weight;
                        Ok(Answer::Done)
                    }
                    (true, None) => {
                        d.insert(
                            (rs.addr, rs.port),
                            RealServer::new(rs.addr, rs.port, rs.weight),
                        );
                        Ok(Answer::Done)
                    }
                }
            }
            Op::DeleteDest(k, rs) => {
                let Some((_, d)) = st.services.get_mut(k) else {
                    return Err(err(op, 3));
                };
                match d.remove(&(rs.addr, rs.port)) {
                    Some(_) => Ok(Answer::Done),
                    None => Err(err(op, 2)),
                }
            }
            Op::SetTimeouts { tcp, tcp_fin, udp } => {
                st.timeouts = Some((*tcp, *tcp_fin, *udp));
                Ok(Answer::Done)
            }
            Op::EnsureDummy => {
                st.dummy.get_or_insert_with(BTreeSet::new);
                Ok(Answer::Done)
            }
            Op::DummyAddrs(f) => {
                Ok(Answer::Addrs(st.dummy.as_ref().map(|s| {
                    s.iter().filter(|ip| f.matches(ip)).copied().collect()
                })))
            }
            Op::LocalAddrs(f) => Ok(Answer::Addrs(Some(
                st.local
                    .iter()
                    .filter(|ip| f.matches(ip))
                    .copied()
                    .collect(),
            ))),
            Op::AddAddr(ip) => match st.dummy.as_mut() {
                Some(s) => {
                    s.insert(*ip);
                    Ok(Answer::Done)
                }
                None => Err(err(op, 19)),
            },
            Op::DelAddr(ip) => match st.dummy.as_mut() {
                Some(s) => {
                    s.remove(ip);
                    Ok(Answer::Done)
                }
                None => Err(err(op, 19)),
            },
            Op::DeleteDummy => Ok(Answer::Existed(st.dummy.take().is_some())),
        }
    }
}

impl IpvsKernel for FakeIpvs {
    async fn batch(&self, ops: Vec<Op>) -> Vec<OpResult> {
        ops.iter().map(|op| self.run(op)).collect()
    }
}

#[derive(Debug, Default)]
struct IpsetState {
    restores: Vec<String>,
    sets: BTreeMap<String, BTreeSet<String>>,
    fail_next: usize,
    missing_binary: bool,
}

/// Records `ipset restore` texts and applies them to in-memory sets (create, add, del,
/// flush, swap, destroy).
#[derive(Clone, Debug, Default)]
pub struct FakeIpset {
    st: Arc<Mutex<IpsetState>>,
}

impl FakeIpset {
    pub fn new() -> Self {
        Self::default()
    }

    fn st(&self) -> std::sync::MutexGuard<'_, IpsetState> {
        self.st.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// No `ipset` binary: every call fails.
    pub fn missing(self) -> Self {
        self.st().missing_binary = true;
        self
    }

    pub fn restores(&self) -> Vec<String> {
        self.st().restores.clone()
    }

    pub fn fail_next_restores(&self, n: usize) {
        self.st().fail_next = n;
    }

    /// The entries of set `name` (None when it does not exist).
    pub fn set(&self, name: &str) -> Option<BTreeSet<String>> {
        self.st().sets.get(name).cloned()
    }

    pub fn names(&self) -> Vec<String> {
        self.st().sets.keys().cloned().collect()
    }

    fn missing_err(cmd: &str) -> ipset::Error {
        ipset::Error::Spawn {
            cmd: cmd.into(),
            source: std::io::Error::from(std::io::ErrorKind::NotFound),
        }
    }
}

impl Ipset for FakeIpset {
    async fn restore(&self, text: &str) -> ipset::Result<()> {
        let mut st = self.st();
        if st.missing_binary {
            return Err(Self::missing_err("ipset restore"));
        }
        st.restores.push(text.to_string());
        if st.fail_next > 0 {
            st.fail_next -= 1;
            return Err(ipset::Error::Failed {
                cmd: "ipset restore".into(),
                status: "exit status: 1".into(),
                stderr: "injected failure".into(),
            });
        }
        for line in text.lines() {
            let w: Vec<&str> = line.split_whitespace().collect();
            match w.as_slice() {
                ["create", name, ..] => {
                    st.sets.entry(name.to_string()).or_default();
                }
                ["add", name, e, ..] => {
                    st.sets
                        .entry(name.to_string())
                        .or_default()
                        .insert(e.to_string());
                }
                ["del", name, e, ..] => {
                    if let Some(s) = st.sets.get_mut(*name) {
                        s.remove(*e);
                    }
                }
                ["flush", name] => {
                    if let Some(s) = st.sets.get_mut(*name) {
                        s.clear();
                    }
                }
                ["swap", a, b] => {
                    let x = st.sets.remove(*a).unwrap_or_default();
                    let y = st.sets.remove(*b).unwrap_or_default();
                    st.sets.insert(a.to_string(), y);
                    st.sets.insert(b.to_string(), x);
                }
                ["destroy", name] => {
                    st.sets.remove(*name);
                }
                _ => {}
            }
        }
        Ok(())
    }

    async fn list_names(&self) -> ipset::Result<Vec<String>> {
        if self.st().missing_binary {
            return Err(Self::missing_err("ipset list -n"));
        }
        Ok(self.names())
    }

    async fn version(&self) -> ipset::Result<String> {
        if self.st().missing_binary {
            return Err(Self::missing_err("ipset version"));
        }
        Ok("ipset v7.17, protocol version: 7\n".into())
    }
}
