//! [`Dataplane`] over rtnetlink. Host-side work uses a netlink socket opened by the calling
//! thread; pod-side work runs on a short-lived thread that first joins the pod's network
//! namespace (`setns`) and opens its own socket there, then ends: no thread is ever left in
//! the wrong namespace, and the calling thread never moves.

use std::fs::File;
use std::future::Future;
use std::net::IpAddr;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::time::Duration;

use netlink_packet_route::AddressFamily;
use netlink_packet_route::link::{
    InfoData, InfoKind, InfoVeth, LinkAttribute, LinkFlags, LinkMessage,
};
use netlink_packet_route::route::{RouteAddress, RouteAttribute, RouteMessage};
use nix::sched::CloneFlags;
use rtnetlink::{
    Handle, LinkBridge, LinkBridgePort, LinkMessageBuilder, LinkUnspec, LinkVeth,
    RouteMessageBuilder,
};
use sha2::{Digest, Sha256};
use tokio::runtime::Runtime;

use super::{Attached, Dataplane, PodLink, format_mac};
use crate::error::{Error, Result};
use crate::result::Route;
use plumbing::cidr::Cidr;
use plumbing::rtnl::{EEXIST, Rtnl, RtnlError, errno};

/// Bound on every netlink request.
const NETLINK_TIMEOUT: Duration = Duration::from_secs(10);

/// The real dataplane.
#[derive(Debug, Default)]
pub struct Netlink {
    /// Writes `ip_forward` / `forwarding` in the plugin's (host) namespace, as the bridge
    /// plugin does for a gateway bridge.
    pub enable_forwarding: bool,
}

/// A netlink socket in the namespace of the thread that opened it, with a current-thread
/// runtime to drive it.
struct Session {
    // Dropped before the runtime: its connection task is aborted while the runtime lives.
    rtnl: Rtnl,
    handle: Handle,
    rt: Runtime,
}

fn nl_err(what: &str, e: impl std::fmt::Display) -> Error {
    Error::Netlink(format!("{what}: {e}"))
}

fn timed_out() -> Error {
    Error::TryAgainLater(format!("netlink request took over {NETLINK_TIMEOUT:?}"))
}

/// A wrapper error: a timeout is "try again later", a refusal names `what` failed.
fn rtnl_err(what: &str, e: RtnlError) -> Error {
    match e {
        RtnlError::TimedOut { .. } => timed_out(),
        e => nl_err(what, e),
    }
}

impl Session {
    fn open() -> Result<Session> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .enable_time()
            .build()
            .map_err(|e| Error::Io(format!("runtime: {e}")))?;
        let rtnl = rt
            .block_on(async { Rtnl::open(NETLINK_TIMEOUT) })
            .map_err(|e| nl_err("open socket", e))?;
        Ok(Session {
            handle: rtnl.handle(),
            rtnl,
            rt,
        })
    }

    /// Runs one request with the timeout; the error keeps its errno for callers to inspect.
    fn run<T>(
        &self,
        fut: impl Future<Output = Result<T, rtnetlink::Error>>,
    ) -> Result<Result<T, rtnetlink::Error>> {
        self.rt
            .block_on(self.rtnl.timed(fut))
            .map_err(|_| timed_out())
    }

    fn must<T>(
        &self,
        what: &str,
        fut: impl Future<Output = Result<T, rtnetlink::Error>>,
    ) -> Result<T> {
        self.run(fut)?.map_err(|e| nl_err(what, e))
    }

    /// The link named `name`, or `None`.
    fn link(&self, name: &str) -> Result<Option<LinkMessage>> {
        self.rt
            .block_on(self.rtnl.link(name))
            .map_err(|e| rtnl_err(&format!("get link {name}"), e))
    }

    fn set(&self, what: &str, msg: LinkMessage) -> Result<()> {
        self.rt
            .block_on(self.rtnl.set_link(msg))
            .map_err(|e| rtnl_err(what, e))
    }

    fn delete(&self, index: u32) -> Result<()> {
        self.rt
            .block_on(self.rtnl.delete_link(index))
            .map_err(|e| rtnl_err("delete link", e))
    }

    fn addresses(&self, index: u32) -> Result<Vec<Cidr>> {
        self.rt
            .block_on(self.rtnl.addresses(index))
            .map_err(|e| rtnl_err("list addresses", e))
    }

    /// Adds `addr` to the link; an address already there is fine. IPv6 skips duplicate
    /// address detection so the address (and routes through it) work at once.
    fn add_address(&self, index: u32, addr: Cidr) -> Result<()> {
        self.rt
            .block_on(self.rtnl.add_address(index, addr))
            .map_err(|e| rtnl_err(&format!("add address {addr}"), e))
    }

    fn add_route(&self, index: u32, route: &Route) -> Result<()> {
        let msg = route_message(index, route)?;
        match self.rt.block_on(self.rtnl.add_route(msg)) {
            Ok(()) => Ok(()),
            Err(e) if e.errno() == Some(EEXIST) => Ok(()),
            Err(e) => Err(rtnl_err(&format!("add route {}", route.dst), e)),
        }
    }

    fn routes(&self, v4: bool) -> Result<Vec<RouteMessage>> {
        self.rt
            .block_on(self.rtnl.routes(v4))
            .map_err(|e| rtnl_err("list routes", e))
    }
}

fn route_message(index: u32, route: &Route) -> Result<RouteMessage> {
    let bad = |e| Error::InvalidConfig(format!("route {}: {e}", route.dst));
    let mut b = RouteMessageBuilder::<IpAddr>::new()
        .destination_prefix(route.dst.addr, route.dst.prefix)
        .map_err(|e| bad(e.to_string()))?
        .output_interface(index);
    if let Some(gw) = route.gw {
        b = b.gateway(gw).map_err(|e| bad(e.to_string()))?;
    }
    Ok(b.build())
}

fn index_of(link: &LinkMessage) -> u32 {
    link.header.index
}

fn mac_of(link: &LinkMessage) -> String {
    link.attributes
        .iter()
        .find_map(|a| match a {
            LinkAttribute::Address(bytes) => Some(format_mac(bytes)),
            _ => None,
        })
        .unwrap_or_default()
}

fn controller_of(link: &LinkMessage) -> Option<u32> {
    link.attributes.iter().find_map(|a| match a {
        LinkAttribute::Controller(i) => Some(*i),
        _ => None,
    })
}

/// Runs `work` on a thread that has joined the network namespace at `netns`, with its own
/// netlink socket there. The thread ends with the work.
fn in_netns<T: Send>(netns: &Path, work: impl FnOnce(&Session) -> Result<T> + Send) -> Result<T> {
    let file = File::open(netns).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => {
            Error::UnknownContainer(format!("netns {}: {e}", netns.display()))
        }
        _ => Error::Io(format!("open netns {}: {e}", netns.display())),
    })?;
    std::thread::scope(|s| {
        s.spawn(move || {
            nix::sched::setns(&file, CloneFlags::CLONE_NEWNET).map_err(|e| match e {
                // The path is there but no longer a namespace (its bind mount is gone).
                nix::errno::Errno::EINVAL => Error::UnknownContainer(format!(
                    "{} is not a network namespace",
                    netns.display()
                )),
                _ => Error::Io(format!("setns {}: {e}", netns.display())),
            })?;
            let session = Session::open()?;
            work(&session)
        })
        .join()
        .unwrap_or_else(|_| Err(Error::Netlink("namespace worker panicked".into())))
    })
}

/// A locally administered unicast MAC derived from the bridge's name.
fn bridge_mac(name: &str) -> Vec<u8> {
    let digest = Sha256::digest(format!("node-agent-cni/{name}").as_bytes());
    let mut mac = digest[..6].to_vec();
    mac[0] = (mac[0] & 0xfe) | 0x02;
    mac
}

fn write_sysctl(path: &str) -> Result<()> {
    match std::fs::read_to_string(path) {
        Ok(v) if v.trim() == "1" => Ok(()),
        _ => std::fs::write(path, "1").map_err(|e| Error::Io(format!("write {path}: {e}"))),
    }
}

/// Turns off IPv6 router advertisements on the bridge, as upstream's bridge plugin does since
/// v0.8.6 (CVE-2020-10749): the plugin owns the node's routes on it, and a pod could
/// otherwise make the node route its IPv6 traffic through the pod. A kernel without IPv6
/// has no such key; any other failure fails the ADD rather than leave the node open.
fn refuse_router_advertisements(bridge: &str) -> Result<()> {
    let path = format!("/proc/sys/net/ipv6/conf/{bridge}/accept_ra");
    match std::fs::read_to_string(&path) {
        Ok(v) if v.trim() == "0" => Ok(()),
        Ok(_) => std::fs::write(&path, "0").map_err(|e| Error::Io(format!("write {path}: {e}"))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(Error::Io(format!("read {path}: {e}"))),
    }
}

impl Netlink {
    fn ensure_bridge(&self, host: &Session, link: &PodLink) -> Result<LinkMessage> {
        let bridge = match host.link(&link.bridge)? {
            Some(b) => b,
            None => {
                let h = host.handle.clone();
                // An assigned MAC keeps the gateway's address stable as ports come and go
                // (a bridge without one takes the lowest of its ports').
                let msg = LinkBridge::new(&link.bridge)
                    .mtu(link.mtu)
                    .address(bridge_mac(&link.bridge))
                    .up()
                    .build();
                match host.run(async move { h.link().add(msg).execute().await })? {
                    Ok(()) => {}
                    // Another ADD created it first.
                    Err(e) if errno(&e) == Some(EEXIST) => {}
                    Err(e) => return Err(nl_err(&format!("create bridge {}", link.bridge), e)),
                }
                host.link(&link.bridge)?.ok_or_else(|| {
                    Error::Netlink(format!("bridge {} vanished after creation", link.bridge))
                })?
            }
        };
        let index = index_of(&bridge);
        refuse_router_advertisements(&link.bridge)?;
        if !bridge.header.flags.contains(LinkFlags::Up) {
            host.set("bridge up", LinkUnspec::new_with_index(index).up().build())?;
        }
        let have = host.addresses(index)?;
        for gw in &link.gateways {
            if !have.contains(gw) {
                host.add_address(index, *gw)?;
            }
        }
        Ok(bridge)
    }

    fn attach_inner(
        &self,
        host: &Session,
        link: &PodLink,
        bridge: &LinkMessage,
        ns: &File,
    ) -> Result<Attached> {
        // The pod end is created inside the pod's namespace under its final name (moving a
        // device between namespaces afterwards costs the kernel an RCU grace period); the
        // host end joins the bridge and comes up in the same request.
        let create = || {
            let peer = LinkUnspec::new_with_name(&link.ifname)
                .mtu(link.mtu)
                .setns_by_fd(ns.as_raw_fd())
                .build();
            let msg = LinkMessageBuilder::<LinkVeth>::new_with_info_kind(InfoKind::Veth)
                .name(link.host_veth.clone())
                .mtu(link.mtu)
                .controller(index_of(bridge))
                .up()
                .set_info_data(InfoData::Veth(InfoVeth::Peer(peer)))
                .build();
            let h = host.handle.clone();
            host.run(async move { h.link().add(msg).execute().await })
        };
        let mut res = create()?;
        if matches!(&res, Err(e) if errno(e) == Some(EEXIST)) {
            // A host end left by an ADD that died half-way is replaced, once.
            if let Some(stale) = host.link(&link.host_veth)? {
                host.delete(index_of(&stale))?;
                res = create()?;
            }
        }
        match res {
            Ok(()) => {}
            Err(e) if errno(&e) == Some(EEXIST) => {
                return Err(Error::InvalidConfig(format!(
                    "{} already exists in the pod namespace",
                    link.ifname
                )));
            }
            Err(e) => return Err(nl_err(&format!("create veth {}", link.host_veth), e)),
        }
        let host_end = host
            .link(&link.host_veth)?
            .ok_or_else(|| Error::Netlink(format!("veth {} vanished", link.host_veth)))?;
        let h = host.handle.clone();
        let port = LinkBridgePort::new(index_of(&host_end))
            .hairpin(true)
            .build();
        host.must("set hairpin mode", async move {
            h.link().set_port(port).execute().await
        })?;

        let pod_mac = in_netns(&link.netns, |pod| {
            let inside = pod.link(&link.ifname)?.ok_or_else(|| {
                Error::Netlink(format!("{} not in the pod namespace", link.ifname))
            })?;
            let index = index_of(&inside);
            pod.set(
                "pod interface up",
                LinkUnspec::new_with_index(index).up().build(),
            )?;
            for addr in &link.addresses {
                pod.add_address(index, *addr)?;
            }
            for route in &link.routes {
                pod.add_route(index, route)?;
            }
            Ok(mac_of(&inside))
        })?;
        // A bridge without an assigned MAC takes one from its ports: read it again.
        let bridge_mac = host
            .link(&link.bridge)?
            .map_or_else(|| mac_of(bridge), |b| mac_of(&b));
        Ok(Attached {
            bridge_mac,
            host_veth_mac: mac_of(&host_end),
            pod_mac,
        })
    }
}

impl Dataplane for Netlink {
    fn attach(&self, link: &PodLink) -> Result<Attached> {
        // A missing pod namespace fails the ADD before anything on the host is touched.
        let ns = File::open(&link.netns)
            .map_err(|e| Error::UnknownContainer(format!("netns {}: {e}", link.netns.display())))?;
        if self.enable_forwarding {
            if link.gateways.iter().any(Cidr::is_ipv4) {
                write_sysctl("/proc/sys/net/ipv4/ip_forward")?;
            }
            if link.gateways.iter().any(|g| !g.is_ipv4()) {
                write_sysctl("/proc/sys/net/ipv6/conf/all/forwarding")?;
            }
        }
        let host = Session::open()?;
        let bridge = self.ensure_bridge(&host, link)?;
        let res = self.attach_inner(&host, link, &bridge, &ns);
        if res.is_err() {
            // Deleting the host end removes the pod end too, wherever it is now.
            if let Ok(Some(end)) = host.link(&link.host_veth) {
                let _ = host.delete(index_of(&end));
            }
        }
        res
    }

    fn detach(&self, netns: Option<&Path>, ifname: &str, host_veth: &str) -> Result<()> {
        if let Some(netns) = netns {
            let res = in_netns(netns, |pod| match pod.link(ifname)? {
                Some(l) => pod.delete(index_of(&l)),
                None => Ok(()),
            });
            match res {
                Ok(()) | Err(Error::UnknownContainer(_)) => {}
                Err(e) => return Err(e),
            }
        }
        let host = Session::open()?;
        if let Some(l) = host.link(host_veth)? {
            host.delete(index_of(&l))?;
        }
        Ok(())
    }

    fn check(&self, link: &PodLink) -> Result<()> {
        let host = Session::open()?;
        let bridge = host
            .link(&link.bridge)?
            .ok_or_else(|| Error::CheckFailed(format!("bridge {} is missing", link.bridge)))?;
        let have = host.addresses(index_of(&bridge))?;
        if let Some(gw) = link.gateways.iter().find(|g| !have.contains(g)) {
            return Err(Error::CheckFailed(format!(
                "bridge {} lacks gateway address {gw}",
                link.bridge
            )));
        }
        let end = host.link(&link.host_veth)?.ok_or_else(|| {
            Error::CheckFailed(format!("host veth {} is missing", link.host_veth))
        })?;
        if controller_of(&end) != Some(index_of(&bridge)) {
            return Err(Error::CheckFailed(format!(
                "{} is not a port of {}",
                link.host_veth, link.bridge
            )));
        }
        in_netns(&link.netns, |pod| {
            let inside = pod.link(&link.ifname)?.ok_or_else(|| {
                Error::CheckFailed(format!("{} is missing in the pod namespace", link.ifname))
            })?;
            let index = index_of(&inside);
            let addrs = pod.addresses(index)?;
            if let Some(a) = link.addresses.iter().find(|a| !addrs.contains(a)) {
                return Err(Error::CheckFailed(format!(
                    "{} lacks address {a}",
                    link.ifname
                )));
            }
            for route in &link.routes {
                let found = pod
                    .routes(route.dst.is_ipv4())?
                    .iter()
                    .any(|m| route_matches(m, index, route));
                if !found {
                    return Err(Error::CheckFailed(format!(
                        "route to {} is missing",
                        route.dst
                    )));
                }
            }
            Ok(())
        })
    }
}

fn route_matches(m: &RouteMessage, index: u32, route: &Route) -> bool {
    let family_ok = matches!(
        (m.header.address_family, route.dst.is_ipv4()),
        (AddressFamily::Inet, true) | (AddressFamily::Inet6, false)
    );
    let as_ip = |a: &RouteAddress| match a {
        RouteAddress::Inet(v4) => Some(IpAddr::V4(*v4)),
        RouteAddress::Inet6(v6) => Some(IpAddr::V6(*v6)),
        _ => None,
    };
    let mut dst = None;
    let mut gw = None;
    let mut oif = None;
    for a in &m.attributes {
        match a {
            RouteAttribute::Destination(d) => dst = as_ip(d),
            RouteAttribute::Gateway(g) => gw = as_ip(g),
            RouteAttribute::Oif(i) => oif = Some(*i),
            _ => {}
        }
    }
    let dst_ok = match dst {
        Some(d) => d == route.dst.addr && m.header.destination_prefix_length == route.dst.prefix,
        None => route.dst.prefix == 0 && m.header.destination_prefix_length == 0,
    };
    family_ok && dst_ok && gw == route.gw && oif == Some(index)
}
