//! The dummy interface `kube-ipvs0` that holds the service IPs (so that the kernel takes
//! packets to them as local and IPVS sees them), over the shared rtnetlink wrapper
//! [`plumbing::rtnl::Rtnl`]: the requests are built here (pure: [`dummy_link`],
//! [`address`]), each operation's logic (create when absent, list, bind, unbind, delete,
//! with the kernel's "already there" / "not there" answers) runs over the narrow
//! [`Links`] edge, whose real side is `Rtnl` and whose fake is `FakeLinks` in `rtnl/fake.rs`.

use std::collections::BTreeSet;
use std::future::Future;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use futures::TryStreamExt;
use plumbing::rtnl::rtnetlink::packet_route::AddressFamily;
use plumbing::rtnl::rtnetlink::packet_route::address::{AddressAttribute, AddressMessage};
use plumbing::rtnl::rtnetlink::packet_route::link::LinkMessage;
use plumbing::rtnl::rtnetlink::{AddressMessageBuilder, LinkDummy};
use plumbing::rtnl::{Rtnl, RtnlError};

use crate::model::IpFamily;
use crate::netlink::{EADDRNOTAVAIL, EEXIST, ENODEV, NlError};

/// Upstream's name for the interface (`DefaultDummyDevice`).
pub const DUMMY_DEVICE: &str = "kube-ipvs0";

/// `EOPNOTSUPP`: the kernel knows no link kind "dummy" (no `dummy` module).
const EOPNOTSUPP: i32 = 95;

/// `ip link add NAME type dummy`.
pub fn dummy_link(name: &str) -> LinkMessage {
    LinkDummy::new(name).build()
}

/// `IP/32` (`/128` for IPv6) on link `index`: the address as local and peer address, as
/// `ip addr add` sends it.
pub fn address(index: u32, ip: IpAddr) -> AddressMessage {
    match ip {
        IpAddr::V4(a) => AddressMessageBuilder::<Ipv4Addr>::new()
            .index(index)
            .address(a, 32)
            .build(),
        IpAddr::V6(a) => AddressMessageBuilder::<Ipv6Addr>::new()
            .index(index)
            .address(a, 128)
            .build(),
    }
}

/// (link index, address) of an address the kernel listed: its local address
/// (`IFA_LOCAL`), else its address (`IFA_ADDRESS`, the peer on point-to-point links).
pub fn listed_address(m: &AddressMessage) -> Option<(u32, IpAddr)> {
    let local = m.attributes.iter().find_map(|a| match a {
        AddressAttribute::Local(ip) => Some(*ip),
        _ => None,
    });
    let addr = m.attributes.iter().find_map(|a| match a {
        AddressAttribute::Address(ip) => Some(*ip),
        _ => None,
    });
    Some((m.header.index, local.or(addr)?))
}

/// The rtnetlink requests the IPVS mode makes. Errors carry the kernel's errno (`what`
/// names the request).
pub trait Links: Send + Sync {
    /// The index of the link named `name`; `None` when there is none.
    fn link_index(&self, name: &str) -> impl Future<Output = Result<Option<u32>, NlError>> + Send;

    fn add_link(
        &self,
        what: &str,
        msg: LinkMessage,
    ) -> impl Future<Output = Result<(), NlError>> + Send;

    fn delete_link(
        &self,
        what: &str,
        index: u32,
    ) -> impl Future<Output = Result<(), NlError>> + Send;

    /// Every address of `family`, on every link.
    fn addresses(
        &self,
        what: &str,
        family: IpFamily,
    ) -> impl Future<Output = Result<Vec<AddressMessage>, NlError>> + Send;

    fn add_address(
        &self,
        what: &str,
        msg: AddressMessage,
    ) -> impl Future<Output = Result<(), NlError>> + Send;

    fn delete_address(
        &self,
        what: &str,
        msg: AddressMessage,
    ) -> impl Future<Output = Result<(), NlError>> + Send;
}

/// Creates `kube-ipvs0` (a dummy link, left down as upstream leaves it) when absent.
pub async fn ensure_dummy<L: Links>(links: &L, what: &str) -> Result<(), NlError> {
    if links.link_index(DUMMY_DEVICE).await?.is_some() {
        return Ok(());
    }
    match links.add_link(what, dummy_link(DUMMY_DEVICE)).await {
        Ok(()) => Ok(()),
        Err(e) if e.errno() == Some(EEXIST) => Ok(()),
        Err(e) if e.errno() == Some(EOPNOTSUPP) => Err(NlError::Protocol(format!(
            "{what}: the kernel has no dummy interfaces: the dummy module is not loaded (modprobe dummy) or not built"
        ))),
        Err(e) => Err(e),
    }
}

/// The addresses of `family` on `kube-ipvs0` (`on_dummy`; `None` when there is no such
/// link), or on every other link (the node's own, where node ports answer).
pub async fn addresses<L: Links>(
    links: &L,
    what: &str,
    family: IpFamily,
    on_dummy: bool,
) -> Result<Option<BTreeSet<IpAddr>>, NlError> {
    let index = links.link_index(DUMMY_DEVICE).await?;
    if on_dummy && index.is_none() {
        return Ok(None);
    }
    Ok(Some(
        links
            .addresses(what, family)
            .await?
            .iter()
            .filter_map(listed_address)
            .filter(|(i, ip)| family.matches(ip) && (Some(*i) == index) == on_dummy)
            .map(|(_, ip)| ip)
            .collect(),
    ))
}

/// Binds `ip` to `kube-ipvs0` (`add`) or unbinds it; bound already, or not bound, is
/// fine. No `kube-ipvs0` is `ENODEV`.
pub async fn bind<L: Links>(links: &L, what: &str, ip: IpAddr, add: bool) -> Result<(), NlError> {
    let index = links
        .link_index(DUMMY_DEVICE)
        .await?
        .ok_or(NlError::Kernel {
            what: what.to_string(),
            errno: ENODEV,
        })?;
    let msg = address(index, ip);
    let res = if add {
        links.add_address(what, msg).await
    } else {
        links.delete_address(what, msg).await
    };
    match res {
        Err(e) if add && e.errno() == Some(EEXIST) => Ok(()),
        Err(e) if !add && e.errno() == Some(EADDRNOTAVAIL) => Ok(()),
        r => r,
    }
}

/// Removes `kube-ipvs0`; whether it existed.
pub async fn delete_dummy<L: Links>(links: &L, what: &str) -> Result<bool, NlError> {
    match links.link_index(DUMMY_DEVICE).await? {
        None => Ok(false),
        Some(i) => links.delete_link(what, i).await.map(|()| true),
    }
}

/// The wrapper's error as the IPVS edge reports it: the kernel's errno, or a timeout (an
/// I/O error, after which the socket is opened afresh).
pub fn nl_error(what: &str, e: RtnlError) -> NlError {
    match e.errno() {
        Some(errno) => NlError::Kernel {
            what: what.to_string(),
            errno,
        },
        None => match e {
            RtnlError::TimedOut { .. } => NlError::Io {
                what: what.to_string(),
                source: std::io::Error::new(std::io::ErrorKind::TimedOut, e.to_string()),
            },
            RtnlError::Kernel(_) => NlError::Protocol(format!("{what}: {e}")),
        },
    }
}

impl Links for Rtnl {
    async fn link_index(&self, name: &str) -> Result<Option<u32>, NlError> {
        self.link(name)
            .await
            .map(|l| l.map(|l| l.header.index))
            .map_err(|e| nl_error("get link", e))
    }

    async fn add_link(&self, what: &str, msg: LinkMessage) -> Result<(), NlError> {
        Rtnl::add_link(self, msg)
            .await
            .map_err(|e| nl_error(what, e))
    }

    /// Unlike [`Rtnl::delete_link`], a link already gone is an error (`ENODEV`), as the
    /// kernel answers it.
    async fn delete_link(&self, what: &str, index: u32) -> Result<(), NlError> {
        let h = self.handle();
        self.timed(async move { h.link().del(index).execute().await })
            .await
            .and_then(|r| r.map_err(RtnlError::Kernel))
            .map_err(|e| nl_error(what, e))
    }

    async fn addresses(
        &self,
        what: &str,
        family: IpFamily,
    ) -> Result<Vec<AddressMessage>, NlError> {
        let h = self.handle();
        let mut req = h.address().get();
        req.message_mut().header.family = match family {
            IpFamily::V4 => AddressFamily::Inet,
            IpFamily::V6 => AddressFamily::Inet6,
        };
        self.timed(req.execute().try_collect::<Vec<_>>())
            .await
            .and_then(|r| r.map_err(RtnlError::Kernel))
            .map_err(|e| nl_error(what, e))
    }

    /// Unlike [`Rtnl::add_address`], an address already there is an error (`EEXIST`) and
    /// no flag is added: the request is [`address`]'s message as it is.
    async fn add_address(&self, what: &str, msg: AddressMessage) -> Result<(), NlError> {
        let h = self.handle();
        self.timed(async move {
            let mut req = h
                .address()
                .add(msg.header.index, IpAddr::V4(Ipv4Addr::UNSPECIFIED), 0);
            *req.message_mut() = msg;
            req.execute().await
        })
        .await
        .and_then(|r| r.map_err(RtnlError::Kernel))
        .map_err(|e| nl_error(what, e))
    }

    async fn delete_address(&self, what: &str, msg: AddressMessage) -> Result<(), NlError> {
        let h = self.handle();
        self.timed(async move { h.address().del(msg).execute().await })
            .await
            .and_then(|r| r.map_err(RtnlError::Kernel))
            .map_err(|e| nl_error(what, e))
    }
}

#[cfg(any(test, feature = "test-util"))]
pub mod fake;

#[cfg(test)]
mod tests;
