//! Host-gw routes: every other Node's pod CIDRs via that Node's InternalIP. The kernel edge
//! is the narrow [`Routes`] trait; [`NetlinkRoutes`] is rtnetlink, and the fake lives in
//! `test_util`. Only routes in the main table carrying [`ROUTE_PROTOCOL`] are ever listed,
//! replaced or deleted, so routes of anyone else are never touched.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use cni::ip::IpNet;
use futures::TryStreamExt;
use netlink_packet_route::route::{
    RouteAddress, RouteAttribute, RouteMessage, RouteProtocol, RouteVia,
};
use rtnetlink::RouteMessageBuilder;

use super::{NetworkError, NodeNet};

/// The `rtm_protocol` our routes carry (`ip route show proto 77`): unassigned in iproute2's
/// `rt_protos` and in the kernel's list, so no other daemon claims these routes.
pub const ROUTE_PROTOCOL: u8 = 77;
/// The kernel's main routing table.
const RT_TABLE_MAIN: u32 = 254;
/// Bound on every netlink request.
const NETLINK_TIMEOUT: Duration = Duration::from_secs(10);
const ESRCH: i32 = 3;

/// One route: a pod CIDR via a node address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Route {
    pub dst: IpNet,
    pub via: IpAddr,
}

/// The kernel's routes, as far as this controller is concerned.
#[async_trait::async_trait]
pub trait Routes: Send + Sync {
    /// Every route of ours (both families).
    async fn list(&self) -> Result<Vec<Route>, NetworkError>;
    /// Adds the route, or replaces the one to the same destination.
    async fn replace(&self, route: Route) -> Result<(), NetworkError>;
    /// Deletes the route; one already gone is not an error.
    async fn delete(&self, route: Route) -> Result<(), NetworkError>;
}

/// The routes this node wants: each other Node's pod CIDRs via its first InternalIP of the
/// same family. Nodes without an address of that family get no route for that CIDR.
pub fn desired<'a>(
    own_name: &str,
    nodes: impl IntoIterator<Item = &'a NodeNet>,
) -> BTreeMap<IpNet, IpAddr> {
    let mut out = BTreeMap::new();
    for n in nodes.into_iter().filter(|n| n.name != own_name) {
        for cidr in &n.pod_cidrs {
            if let Some(ip) = n
                .internal_ips
                .iter()
                .find(|ip| ip.is_ipv4() == cidr.is_ipv4())
            {
                out.insert(*cidr, *ip);
            }
        }
    }
    out
}

/// One step that brings the kernel from `current` to `want`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    Replace(Route),
    Delete(Route),
}

/// Deletions first (a CIDR that moved between nodes is a replace, not a delete + add), then
/// additions and changes, each in destination order.
pub fn plan(current: &BTreeMap<IpNet, IpAddr>, want: &BTreeMap<IpNet, IpAddr>) -> Vec<Change> {
    let mut out: Vec<Change> = current
        .iter()
        .filter(|(dst, _)| !want.contains_key(dst))
        .map(|(dst, via)| {
            Change::Delete(Route {
                dst: *dst,
                via: *via,
            })
        })
        .collect();
    out.extend(
        want.iter()
            .filter(|(dst, via)| current.get(dst) != Some(via))
            .map(|(dst, via)| {
                Change::Replace(Route {
                    dst: *dst,
                    via: *via,
                })
            }),
    );
    out
}

/// [`Routes`] over an rtnetlink socket of this process's network namespace. Counts its
/// netlink requests (one per list family, replace or delete).
pub struct NetlinkRoutes {
    handle: rtnetlink::Handle,
    conn: tokio::task::JoinHandle<()>,
    calls: AtomicU64,
}

impl std::fmt::Debug for NetlinkRoutes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NetlinkRoutes")
            .field("calls", &self.calls())
            .finish()
    }
}

impl Drop for NetlinkRoutes {
    fn drop(&mut self) {
        self.conn.abort();
    }
}

fn nl_err(what: impl std::fmt::Display, e: impl std::fmt::Display) -> NetworkError {
    NetworkError::Netlink(format!("{what}: {e}"))
}

fn errno(e: &rtnetlink::Error) -> Option<i32> {
    match e {
        rtnetlink::Error::NetlinkError(m) => Some(m.raw_code().abs()),
        _ => None,
    }
}

impl NetlinkRoutes {
    /// Opens the socket; must be called inside a tokio runtime (the connection is a task
    /// owned by the returned value and aborted with it).
    pub fn new() -> Result<NetlinkRoutes, NetworkError> {
        let (conn, handle, _) =
            rtnetlink::new_connection().map_err(|e| nl_err("open netlink socket", e))?;
        Ok(NetlinkRoutes {
            handle,
            conn: tokio::spawn(conn),
            calls: AtomicU64::new(0),
        })
    }

    /// Netlink requests made so far.
    pub fn calls(&self) -> u64 {
        self.calls.load(Ordering::Relaxed)
    }

    async fn timed<T>(
        &self,
        what: &str,
        fut: impl std::future::Future<Output = Result<T, rtnetlink::Error>>,
    ) -> Result<Result<T, rtnetlink::Error>, NetworkError> {
        self.calls.fetch_add(1, Ordering::Relaxed);
        tokio::time::timeout(NETLINK_TIMEOUT, fut)
            .await
            .map_err(|_| nl_err(what, format!("no answer within {NETLINK_TIMEOUT:?}")))
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

/// A dumped route of ours, or `None` for anything else.
fn ours(m: &RouteMessage) -> Option<Route> {
    if u8::from(m.header.protocol) != ROUTE_PROTOCOL {
        return None;
    }
    let table = m
        .attributes
        .iter()
        .find_map(|a| match a {
            RouteAttribute::Table(t) => Some(*t),
            _ => None,
        })
        .unwrap_or(u32::from(m.header.table));
    if table != RT_TABLE_MAIN {
        return None;
    }
    let addr = |a: &RouteAddress| match a {
        RouteAddress::Inet(v4) => Some(IpAddr::V4(*v4)),
        RouteAddress::Inet6(v6) => Some(IpAddr::V6(*v6)),
        _ => None,
    };
    let mut dst = None;
    let mut via = None;
    for a in &m.attributes {
        match a {
            RouteAttribute::Destination(d) => dst = addr(d),
            RouteAttribute::Gateway(g) => via = addr(g),
            RouteAttribute::Via(RouteVia::Inet(v4)) => via = Some(IpAddr::V4(*v4)),
            RouteAttribute::Via(RouteVia::Inet6(v6)) => via = Some(IpAddr::V6(*v6)),
            _ => {}
        }
    }
    Some(Route {
        dst: IpNet::new(dst?, m.header.destination_prefix_length)?,
        via: via?,
    })
}

#[async_trait::async_trait]
impl Routes for NetlinkRoutes {
    async fn list(&self) -> Result<Vec<Route>, NetworkError> {
        let mut out = Vec::new();
        for v4 in [true, false] {
            let query = if v4 {
                RouteMessageBuilder::<Ipv4Addr>::new().build()
            } else {
                RouteMessageBuilder::<Ipv6Addr>::new().build()
            };
            let h = self.handle.clone();
            let msgs: Vec<RouteMessage> = self
                .timed("list routes", async move {
                    h.route().get(query).execute().try_collect().await
                })
                .await?
                .map_err(|e| nl_err("list routes", e))?;
            out.extend(msgs.iter().filter_map(ours));
        }
        Ok(out)
    }

    async fn replace(&self, route: Route) -> Result<(), NetworkError> {
        let msg = Self::message(route)?;
        let h = self.handle.clone();
        self.timed("replace route", async move {
            h.route().add(msg).replace().execute().await
        })
        .await?
        .map_err(|e| nl_err(format!("route {} via {}", route.dst, route.via), e))
    }

    async fn delete(&self, route: Route) -> Result<(), NetworkError> {
        let msg = Self::message(route)?;
        let h = self.handle.clone();
        match self
            .timed(
                "delete route",
                async move { h.route().del(msg).execute().await },
            )
            .await?
        {
            Ok(()) => Ok(()),
            Err(e) if errno(&e) == Some(ESRCH) => Ok(()),
            Err(e) => Err(nl_err(format!("delete route {}", route.dst), e)),
        }
    }
}
