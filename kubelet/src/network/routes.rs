//! Host-gw routes: every other Node's pod CIDRs via that Node's InternalIP (which of them,
//! [`super::claims`] decides). The kernel edge is the narrow [`Routes`] trait;
//! [`NetlinkRoutes`] is rtnetlink, and the fake lives in `fake.rs`. Routes are only ever
//! added with `NLM_F_EXCL` (never `NLM_F_REPLACE`: the kernel's replace matches a route by
//! destination and metric whatever its protocol, so it would overwrite a route of anyone
//! else) and deleted with [`ROUTE_PROTOCOL`] and the gateway in the request (the kernel then
//! deletes only a route carrying both). A next hop change is a delete and an add.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::time::Duration;

use netlink_packet_route::AddressFamily;
use netlink_packet_route::route::{
    RouteAttribute, RouteMessage, RouteProtocol, RouteType, RouteVia,
};
use plumbing::cidr::Cidr;
use plumbing::rtnl::{EEXIST, ESRCH, HostChange, Monitor, Rtnl, RtnlError, route_addr};
use rtnetlink::RouteMessageBuilder;

use super::NetworkError;
use super::cidr_claims::HostView;

/// The `rtm_protocol` our routes carry (`ip route show proto 77`): unassigned in iproute2's
/// `rt_protos` and in the kernel's list, so no other daemon claims these routes.
pub const ROUTE_PROTOCOL: u8 = 77;
/// The kernel's main routing table.
const RT_TABLE_MAIN: u32 = 254;
/// The kernel's local table (this host's own addresses).
const RT_TABLE_LOCAL: u32 = 255;
/// Bound on every netlink request.
const NETLINK_TIMEOUT: Duration = Duration::from_secs(10);

/// One route: a pod CIDR via a node address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Route {
    pub dst: Cidr,
    pub via: IpAddr,
}

/// One read of the kernel's routing tables, as far as this controller cares.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KernelRoutes {
    /// Main-table routes carrying [`ROUTE_PROTOCOL`].
    pub ours: Vec<Route>,
    /// What the claims are checked against (other routes, connected prefixes, local
    /// addresses).
    pub host: HostView,
}

/// What an add found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Added {
    Added,
    /// A route to that destination (with the same metric) is already there, ours or not:
    /// nothing was changed.
    Taken,
}

/// The kernel's routes, as far as this controller is concerned.
#[async_trait::async_trait]
pub trait Routes: Send + Sync {
    /// Both families' routes: ours, and the facts claims are checked against.
    async fn list(&self) -> Result<KernelRoutes, NetworkError>;
    /// Adds the route unless any route to the destination is there (never replaces one).
    async fn add(&self, route: Route) -> Result<Added, NetworkError>;
    /// Deletes the route if it is ours with this next hop; one already gone (or not ours)
    /// is not an error.
    async fn delete(&self, route: Route) -> Result<(), NetworkError>;
}

/// Link and address changes as the kernel reports them: what [`KernelRoutes::host`]'s
/// connected prefixes and local addresses are made of. [`Monitor`] is rtnetlink's multicast
/// groups; the fake lives in `fake.rs`.
#[async_trait::async_trait]
pub trait HostChanges: Send + Sync {
    /// The next change; `None` once no further change will be reported.
    async fn next(&mut self) -> Option<HostChange>;
}

#[async_trait::async_trait]
impl HostChanges for Monitor {
    async fn next(&mut self) -> Option<HostChange> {
        Monitor::next(self).await
    }
}

/// One step that brings the kernel from `current` to `want`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    Add(Route),
    /// A destination whose next hop changed: our old route goes, the new one is added.
    Move {
        from: Route,
        to: Route,
    },
    Delete(Route),
}

/// The steps for the destinations `dsts` (every destination of both maps when `None`):
/// deletions first, then additions and moves, each in destination order.
pub fn plan(
    current: &BTreeMap<Cidr, IpAddr>,
    want: &BTreeMap<Cidr, IpAddr>,
    dsts: Option<&BTreeSet<Cidr>>,
) -> Vec<Change> {
    let all: BTreeSet<Cidr>;
    let dsts = match dsts {
        Some(d) => d,
        None => {
            all = current.keys().chain(want.keys()).copied().collect();
            &all
        }
    };
    let route = |dst: &Cidr, via: &IpAddr| Route {
        dst: *dst,
        via: *via,
    };
    let mut out = Vec::new();
    let mut later = Vec::new();
    for dst in dsts {
        match (current.get(dst), want.get(dst)) {
            (Some(v), None) => out.push(Change::Delete(route(dst, v))),
            (None, Some(v)) => later.push(Change::Add(route(dst, v))),
            (Some(a), Some(b)) if a != b => later.push(Change::Move {
                from: route(dst, a),
                to: route(dst, b),
            }),
            _ => {}
        }
    }
    out.extend(later);
    out
}

/// [`Routes`] over an rtnetlink socket of this process's network namespace. Counts its
/// netlink requests (one per list family, replace or delete).
#[derive(Debug)]
pub struct NetlinkRoutes {
    rtnl: Rtnl,
}

fn nl_err(what: impl std::fmt::Display, e: impl std::fmt::Display) -> NetworkError {
    NetworkError::Netlink(format!("{what}: {e}"))
}

impl NetlinkRoutes {
    /// Opens the socket; must be called inside a tokio runtime (the connection is a task
    /// owned by the returned value and aborted with it).
    pub fn new() -> Result<NetlinkRoutes, NetworkError> {
        let rtnl = Rtnl::open(NETLINK_TIMEOUT).map_err(|e| nl_err("open netlink socket", e))?;
        Ok(NetlinkRoutes { rtnl })
    }

    /// Netlink requests made so far.
    pub fn calls(&self) -> u64 {
        self.rtnl.calls()
    }

    fn message(route: Route) -> Result<RouteMessage, NetworkError> {
        let bad = |e| nl_err(format!("route {}", route.dst), e);
        Ok(RouteMessageBuilder::<IpAddr>::new()
            .destination_prefix(route.dst.addr, route.dst.prefix)
            .map_err(bad)?
            .gateway(route.via)
            .map_err(bad)?
            .table_id(RT_TABLE_MAIN)
            .protocol(RouteProtocol::Other(ROUTE_PROTOCOL))
            .build())
    }
}

/// Sorts one dumped route into `out`.
fn sort_route(m: &RouteMessage, out: &mut KernelRoutes) {
    let table = m
        .attributes
        .iter()
        .find_map(|a| match a {
            RouteAttribute::Table(t) => Some(*t),
            _ => None,
        })
        .unwrap_or(u32::from(m.header.table));
    let unspecified = match m.header.address_family {
        AddressFamily::Inet => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
        AddressFamily::Inet6 => IpAddr::V6(Ipv6Addr::UNSPECIFIED),
        _ => return,
    };
    let mut dst = unspecified;
    let mut via = None;
    let mut oif = false;
    let mut multipath = false;
    for a in &m.attributes {
        match a {
            RouteAttribute::Destination(d) => dst = route_addr(d).unwrap_or(unspecified),
            RouteAttribute::Gateway(g) => via = route_addr(g),
            RouteAttribute::Via(RouteVia::Inet(v4)) => via = Some(IpAddr::V4(*v4)),
            RouteAttribute::Via(RouteVia::Inet6(v6)) => via = Some(IpAddr::V6(*v6)),
            RouteAttribute::Oif(_) => oif = true,
            RouteAttribute::MultiPath(_) => multipath = true,
            _ => {}
        }
    }
    let Some(dst) = Cidr::new(dst, m.header.destination_prefix_length) else {
        return;
    };
    let dst = dst.network();
    match table {
        RT_TABLE_MAIN if u8::from(m.header.protocol) == ROUTE_PROTOCOL => {
            if let Some(via) = via {
                out.ours.push(Route { dst, via });
            }
        }
        RT_TABLE_MAIN => {
            out.host.foreign.insert(dst);
            let direct = m.header.kind == RouteType::Unicast && via.is_none() && !multipath;
            if direct && oif && dst.prefix > 0 {
                out.host.on_link.push(dst);
            }
        }
        RT_TABLE_LOCAL
            if matches!(
                m.header.kind,
                RouteType::Local | RouteType::Broadcast | RouteType::Anycast
            ) =>
        {
            out.host.local.push(dst);
        }
        _ => {}
    }
}

#[async_trait::async_trait]
impl Routes for NetlinkRoutes {
    async fn list(&self) -> Result<KernelRoutes, NetworkError> {
        let mut out = KernelRoutes::default();
        for v4 in [true, false] {
            let msgs = self
                .rtnl
                .routes(v4)
                .await
                .map_err(|e| nl_err("list routes", e))?;
            for m in &msgs {
                sort_route(m, &mut out);
            }
        }
        Ok(out)
    }

    async fn add(&self, route: Route) -> Result<Added, NetworkError> {
        let msg = Self::message(route)?;
        match self.rtnl.add_route(msg).await {
            Ok(()) => Ok(Added::Added),
            Err(e @ RtnlError::TimedOut { .. }) => Err(nl_err("add route", e)),
            Err(e) if e.errno() == Some(EEXIST) => Ok(Added::Taken),
            Err(e) => Err(nl_err(format!("route {} via {}", route.dst, route.via), e)),
        }
    }

    async fn delete(&self, route: Route) -> Result<(), NetworkError> {
        let msg = Self::message(route)?;
        match self.rtnl.delete_route(msg).await {
            Ok(()) => Ok(()),
            Err(e @ RtnlError::TimedOut { .. }) => Err(nl_err("delete route", e)),
            Err(e) if e.errno() == Some(ESRCH) => Ok(()),
            Err(e) => Err(nl_err(format!("delete route {}", route.dst), e)),
        }
    }
}
