//! One rtnetlink wrapper for links, addresses and routes (the `rtnetlink` crate underneath),
//! used by the CNI plugin's dataplane and the kubelet's host-gw routes: one socket whose
//! connection task lives and dies with the value, every request bounded by one timeout and
//! counted, and the kernel's "already there" / "not there" answers told apart by errno.
//!
//! Callers keep their own error types and messages: they map [`RtnlError`] into them.
//!
//! [`Monitor`] is the other direction: a socket subscribed to the kernel's link and address
//! multicast groups, for callers that follow those changes as they happen.

use std::future::Future;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use futures::TryStreamExt;
use netlink_packet_route::address::{
    AddressAttribute, AddressFlags, AddressHeaderFlags, AddressMessage,
};
use netlink_packet_route::link::LinkMessage;
use netlink_packet_route::route::RouteMessage;
use rtnetlink::{Handle, RouteMessageBuilder};
use thiserror::Error;

use crate::cidr::Cidr;

pub use rtnetlink;

pub const ESRCH: i32 = 3;
pub const ENOENT: i32 = 2;
pub const EEXIST: i32 = 17;
pub const ENODEV: i32 = 19;

/// A request that did not get its answer.
#[derive(Debug, Error)]
pub enum RtnlError {
    #[error("no answer within {after:?}")]
    TimedOut { after: Duration },
    #[error("{0}")]
    Kernel(rtnetlink::Error),
}

impl RtnlError {
    /// The kernel's errno (positive), when the kernel refused the request.
    pub fn errno(&self) -> Option<i32> {
        match self {
            RtnlError::Kernel(e) => errno(e),
            RtnlError::TimedOut { .. } => None,
        }
    }
}

/// The errno (positive) of a kernel refusal.
pub fn errno(e: &rtnetlink::Error) -> Option<i32> {
    match e {
        rtnetlink::Error::NetlinkError(m) => Some(m.raw_code().abs()),
        _ => None,
    }
}

/// An rtnetlink socket in the network namespace of the thread that opened it.
pub struct Rtnl {
    handle: Handle,
    conn: tokio::task::JoinHandle<()>,
    timeout: Duration,
    calls: AtomicU64,
}

impl std::fmt::Debug for Rtnl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Rtnl")
            .field("timeout", &self.timeout)
            .field("calls", &self.calls())
            .finish()
    }
}

impl Drop for Rtnl {
    fn drop(&mut self) {
        self.conn.abort();
    }
}

impl Rtnl {
    /// Opens the socket; must be called inside a tokio runtime (the connection is a task
    /// owned by the returned value and aborted with it). Every request gets `timeout`.
    pub fn open(timeout: Duration) -> std::io::Result<Rtnl> {
        let (conn, handle, _) = rtnetlink::new_connection()?;
        Ok(Rtnl {
            handle,
            conn: tokio::spawn(conn),
            timeout,
            calls: AtomicU64::new(0),
        })
    }

    /// The underlying handle, for requests this wrapper has no method for (run them through
    /// [`Rtnl::timed`]).
    pub fn handle(&self) -> Handle {
        self.handle.clone()
    }

    /// Requests made so far.
    pub fn calls(&self) -> u64 {
        self.calls.load(Ordering::Relaxed)
    }

    /// Runs one request with the timeout. The outer error is the timeout; the inner result
    /// is the kernel's answer, errno kept for the caller to inspect.
    pub async fn timed<T>(
        &self,
        fut: impl Future<Output = Result<T, rtnetlink::Error>>,
    ) -> Result<Result<T, rtnetlink::Error>, RtnlError> {
        self.calls.fetch_add(1, Ordering::Relaxed);
        tokio::time::timeout(self.timeout, fut)
            .await
            .map_err(|_| RtnlError::TimedOut {
                after: self.timeout,
            })
    }

    async fn must<T>(
        &self,
        fut: impl Future<Output = Result<T, rtnetlink::Error>>,
    ) -> Result<T, RtnlError> {
        self.timed(fut).await?.map_err(RtnlError::Kernel)
    }

    /// The link named `name`, or `None` when there is none.
    pub async fn link(&self, name: &str) -> Result<Option<LinkMessage>, RtnlError> {
        let h = self.handle();
        let req = h.link().get().match_name(name.to_string()).execute();
        match self
            .timed(async move {
                futures::pin_mut!(req);
                req.try_next().await
            })
            .await?
        {
            Ok(link) => Ok(link),
            Err(e) if errno(&e) == Some(ENODEV) => Ok(None),
            Err(e) => Err(RtnlError::Kernel(e)),
        }
    }

    /// Creates a link (a bridge, a veth pair …) from a built message.
    pub async fn add_link(&self, msg: LinkMessage) -> Result<(), RtnlError> {
        let h = self.handle();
        self.must(async move { h.link().add(msg).execute().await })
            .await
    }

    /// Changes a link (up, MTU, controller, namespace …).
    pub async fn set_link(&self, msg: LinkMessage) -> Result<(), RtnlError> {
        let h = self.handle();
        self.must(async move { h.link().set(msg).execute().await })
            .await
    }

    /// Deletes the link; one already gone is fine.
    pub async fn delete_link(&self, index: u32) -> Result<(), RtnlError> {
        let h = self.handle();
        match self
            .timed(async move { h.link().del(index).execute().await })
            .await?
        {
            Ok(()) => Ok(()),
            Err(e) if matches!(errno(&e), Some(ENODEV | ENOENT)) => Ok(()),
            Err(e) => Err(RtnlError::Kernel(e)),
        }
    }

    /// The addresses on link `index`, with their prefix lengths.
    pub async fn addresses(&self, index: u32) -> Result<Vec<Cidr>, RtnlError> {
        let h = self.handle();
        let msgs: Vec<AddressMessage> = self
            .must(async move {
                h.address()
                    .get()
                    .set_link_index_filter(index)
                    .execute()
                    .try_collect()
                    .await
            })
            .await?;
        Ok(msgs
            .iter()
            .filter(|m| m.header.index == index)
            .filter_map(|m| {
                m.attributes.iter().find_map(|a| match a {
                    AddressAttribute::Address(ip) => Cidr::new(*ip, m.header.prefix_len),
                    _ => None,
                })
            })
            .collect())
    }

    /// Adds `addr` to link `index`; an address already there is fine. An IPv6 address skips
    /// duplicate address detection, so it (and routes through it) work at once.
    pub async fn add_address(&self, index: u32, addr: Cidr) -> Result<(), RtnlError> {
        let h = self.handle();
        let res = self
            .timed(async move {
                let mut req = h.address().add(index, addr.addr, addr.prefix);
                if !addr.is_ipv4() {
                    let m = req.message_mut();
                    m.header.flags |= AddressHeaderFlags::Nodad;
                    m.attributes
                        .push(AddressAttribute::Flags(AddressFlags::Nodad));
                }
                req.execute().await
            })
            .await?;
        match res {
            Ok(()) => Ok(()),
            Err(e) if errno(&e) == Some(EEXIST) => Ok(()),
            Err(e) => Err(RtnlError::Kernel(e)),
        }
    }

    /// Every route of one family (all tables).
    pub async fn routes(&self, v4: bool) -> Result<Vec<RouteMessage>, RtnlError> {
        let query = if v4 {
            RouteMessageBuilder::<Ipv4Addr>::new().build()
        } else {
            RouteMessageBuilder::<Ipv6Addr>::new().build()
        };
        let h = self.handle();
        self.must(async move { h.route().get(query).execute().try_collect().await })
            .await
    }

    /// Adds a route (`NLM_F_EXCL`: one to that destination already there is `EEXIST`).
    pub async fn add_route(&self, msg: RouteMessage) -> Result<(), RtnlError> {
        let h = self.handle();
        self.must(async move { h.route().add(msg).execute().await })
            .await
    }

    /// Deletes the route the message matches (`ESRCH` when there is none).
    pub async fn delete_route(&self, msg: RouteMessage) -> Result<(), RtnlError> {
        let h = self.handle();
        self.must(async move { h.route().del(msg).execute().await })
            .await
    }
}

/// What a [`Monitor`] saw change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HostChange {
    /// A link appeared, went, or changed (up, down, carrier, name …): `RTM_NEWLINK` or
    /// `RTM_DELLINK`.
    Link,
    /// An address was added or removed (or its flags changed, as IPv6 DAD ending does):
    /// `RTM_NEWADDR` or `RTM_DELADDR`.
    Address,
}

/// The multicast groups a [`Monitor`] joins.
pub const MONITOR_GROUPS: [rtnetlink::MulticastGroup; 3] = [
    rtnetlink::MulticastGroup::Link,
    rtnetlink::MulticastGroup::Ipv4Ifaddr,
    rtnetlink::MulticastGroup::Ipv6Ifaddr,
];

/// An rtnetlink socket, in the network namespace of the thread that opened it, that hears
/// the kernel's link and address notifications ([`MONITOR_GROUPS`]). It sends no request.
/// A burst of changes (a veth pair created and brought up) is several notifications: callers
/// coalesce them.
pub struct Monitor {
    messages: futures::channel::mpsc::UnboundedReceiver<(
        rtnetlink::packet_core::NetlinkMessage<netlink_packet_route::RouteNetlinkMessage>,
        rtnetlink::sys::SocketAddr,
    )>,
    conn: tokio::task::JoinHandle<()>,
}

impl std::fmt::Debug for Monitor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Monitor").finish_non_exhaustive()
    }
}

impl Drop for Monitor {
    fn drop(&mut self) {
        self.conn.abort();
    }
}

impl Monitor {
    /// Opens the socket and joins [`MONITOR_GROUPS`] (`RTNLGRP_LINK`, `RTNLGRP_IPV4_IFADDR`,
    /// `RTNLGRP_IPV6_IFADDR`); must be called inside a tokio runtime
    /// (the connection is a task owned by the returned value and aborted with it).
    pub fn open() -> std::io::Result<Monitor> {
        let (conn, _, messages) = rtnetlink::new_multicast_connection(&MONITOR_GROUPS)?;
        Ok(Monitor {
            messages,
            conn: tokio::spawn(conn),
        })
    }

    /// The next change the kernel reports; `None` once the socket is gone (its connection
    /// task ended: no further change will be heard).
    pub async fn next(&mut self) -> Option<HostChange> {
        use futures::StreamExt;
        use netlink_packet_route::RouteNetlinkMessage as M;
        use rtnetlink::packet_core::NetlinkPayload;
        loop {
            let (msg, _) = self.messages.next().await?;
            match msg.payload {
                NetlinkPayload::InnerMessage(M::NewLink(_) | M::DelLink(_)) => {
                    return Some(HostChange::Link);
                }
                NetlinkPayload::InnerMessage(M::NewAddress(_) | M::DelAddress(_)) => {
                    return Some(HostChange::Address);
                }
                // The socket's buffer overflowed: changes were lost, so report one.
                NetlinkPayload::Overrun(_) => return Some(HostChange::Link),
                _ => {}
            }
        }
    }
}

/// The address of a route attribute, when it is one.
pub fn route_addr(a: &netlink_packet_route::route::RouteAddress) -> Option<IpAddr> {
    use netlink_packet_route::route::RouteAddress;
    match a {
        RouteAddress::Inet(v4) => Some(IpAddr::V4(*v4)),
        RouteAddress::Inet6(v6) => Some(IpAddr::V6(*v6)),
        _ => None,
    }
}
