//! Fakes of the network controller's kernel edges: [`FakeRoutes`] keeps a main routing table
//! (ours and others' routes) and the host's addresses, behaves as the kernel does for our
//! requests, and records every call; [`FakeMasquerade`] records what it was asked to apply;
//! [`FakeHostChanges`] reports the link and address changes a test sends it.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Mutex;

use plumbing::cidr::Cidr;

use super::NetworkError;
use super::cidr_claims::HostView;
use super::masquerade::Masquerade;
use super::routes::{Added, HostChanges, KernelRoutes, ROUTE_PROTOCOL, Route, Routes};
use plumbing::rtnl::HostChange;

/// One call the fake saw.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RouteCall {
    List,
    Add(Route),
    Delete(Route),
}

/// A route in the fake's main table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FakeRoute {
    pub dst: Cidr,
    /// `None`: a connected route (no gateway).
    pub via: Option<IpAddr>,
    pub protocol: u8,
    pub metric: u32,
}

/// A kernel's main table and local addresses, with the calls made and injectable failures.
/// Like the kernel: an add refuses a destination already held at the same metric (EEXIST)
/// and a gateway outside every connected prefix; a delete removes only a route carrying our
/// protocol and the given gateway.
#[derive(Debug, Default)]
pub struct FakeRoutes {
    pub main: Mutex<Vec<FakeRoute>>,
    /// The local table's addresses (this host's own).
    pub local: Mutex<Vec<Cidr>>,
    pub calls: Mutex<Vec<RouteCall>>,
    /// Destinations whose add fails (as an unreachable gateway would).
    pub fail: Mutex<Vec<Cidr>>,
}

fn net(s: &str) -> Cidr {
    s.parse().expect("a CIDR")
}

impl FakeRoutes {
    /// A host with an interface holding `addr` (`10.250.0.1/16`: the address and its
    /// connected prefix).
    pub fn with_address(addr: &str) -> FakeRoutes {
        let f = FakeRoutes::default();
        f.add_address(addr);
        f
    }

    /// An address on an interface: a local address and a connected route.
    pub fn add_address(&self, addr: &str) {
        let a = net(addr);
        let host = Cidr::new(a.addr, if a.is_ipv4() { 32 } else { 128 }).expect("a host");
        self.local.lock().unwrap().push(host);
        self.main.lock().unwrap().push(FakeRoute {
            dst: a.network(),
            via: None,
            protocol: 2,
            metric: 0,
        });
    }

    /// A route someone else made (`protocol` 4 is `static`, as `ip route add` makes).
    pub fn add_foreign(&self, dst: &str, via: Option<&str>, protocol: u8, metric: u32) {
        self.main.lock().unwrap().push(FakeRoute {
            dst: net(dst),
            via: via.map(|v| v.parse().expect("an address")),
            protocol,
            metric,
        });
    }

    /// Our routes in the table.
    pub fn routes(&self) -> BTreeMap<Cidr, IpAddr> {
        self.main
            .lock()
            .unwrap()
            .iter()
            .filter(|r| r.protocol == ROUTE_PROTOCOL)
            .filter_map(|r| Some((r.dst, r.via?)))
            .collect()
    }

    /// Every route to `dst`, ours or not.
    pub fn routes_to(&self, dst: &str) -> Vec<FakeRoute> {
        let d = net(dst);
        self.main
            .lock()
            .unwrap()
            .iter()
            .filter(|r| r.dst == d)
            .copied()
            .collect()
    }

    /// The calls since the last `take_calls`.
    pub fn take_calls(&self) -> Vec<RouteCall> {
        std::mem::take(&mut *self.calls.lock().unwrap())
    }
}

#[async_trait::async_trait]
impl Routes for FakeRoutes {
    async fn list(&self) -> Result<KernelRoutes, NetworkError> {
        self.calls.lock().unwrap().push(RouteCall::List);
        let mut out = KernelRoutes {
            ours: Vec::new(),
            host: HostView {
                local: self.local.lock().unwrap().clone(),
                ..HostView::default()
            },
        };
        for r in self.main.lock().unwrap().iter() {
            match (r.protocol == ROUTE_PROTOCOL, r.via) {
                (true, Some(via)) => out.ours.push(Route { dst: r.dst, via }),
                (true, None) => {}
                (false, via) => {
                    out.host.foreign.insert(r.dst);
                    if via.is_none() && r.dst.prefix > 0 {
                        out.host.on_link.push(r.dst);
                    }
                }
            }
        }
        Ok(out)
    }

    async fn add(&self, route: Route) -> Result<Added, NetworkError> {
        self.calls.lock().unwrap().push(RouteCall::Add(route));
        if self.fail.lock().unwrap().contains(&route.dst) {
            return Err(NetworkError::Netlink(format!(
                "route {}: network is unreachable",
                route.dst
            )));
        }
        let mut main = self.main.lock().unwrap();
        if !main
            .iter()
            .any(|r| r.via.is_none() && r.dst.prefix > 0 && r.dst.contains(route.via))
        {
            return Err(NetworkError::Netlink(format!(
                "route {} via {}: Nexthop has invalid gateway",
                route.dst, route.via
            )));
        }
        if main.iter().any(|r| r.dst == route.dst && r.metric == 0) {
            return Ok(Added::Taken);
        }
        main.push(FakeRoute {
            dst: route.dst,
            via: Some(route.via),
            protocol: ROUTE_PROTOCOL,
            metric: 0,
        });
        Ok(Added::Added)
    }

    async fn delete(&self, route: Route) -> Result<(), NetworkError> {
        self.calls.lock().unwrap().push(RouteCall::Delete(route));
        self.main.lock().unwrap().retain(|r| {
            !(r.dst == route.dst && r.protocol == ROUTE_PROTOCOL && r.via == Some(route.via))
        });
        Ok(())
    }
}

/// Records each `apply`.
#[derive(Debug, Default)]
pub struct FakeMasquerade {
    pub applied: Mutex<Vec<Vec<Cidr>>>,
}

#[async_trait::async_trait]
impl Masquerade for FakeMasquerade {
    async fn apply(&self, cluster_cidrs: &[Cidr]) -> Result<(), NetworkError> {
        self.applied.lock().unwrap().push(cluster_cidrs.to_vec());
        Ok(())
    }
}

/// Kernel notifications a test sends by hand through the paired sender (dropping it ends
/// them, as a closed socket would).
#[derive(Debug)]
pub struct FakeHostChanges(tokio::sync::mpsc::UnboundedReceiver<HostChange>);

impl FakeHostChanges {
    pub fn new() -> (
        tokio::sync::mpsc::UnboundedSender<HostChange>,
        FakeHostChanges,
    ) {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        (tx, FakeHostChanges(rx))
    }
}

#[async_trait::async_trait]
impl HostChanges for FakeHostChanges {
    async fn next(&mut self) -> Option<HostChange> {
        self.0.recv().await
    }
}
