//! The kernel edge of the plugin: a bridge, a veth pair per pod, addresses and routes. The
//! trait is what the command logic needs; [`netlink::Netlink`] does it over rtnetlink and
//! [`fake::FakeDataplane`] records it for tests.

use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::error::Result;
use crate::result::Route;
use plumbing::cidr::Cidr;

#[cfg(any(test, feature = "test-util"))]
pub mod fake;
pub mod netlink;

/// What ADD asks of the kernel for one pod.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodLink {
    pub bridge: String,
    pub mtu: u32,
    /// Gateway addresses for the bridge, with the subnet's prefix (`10.244.1.1/24`).
    pub gateways: Vec<Cidr>,
    pub netns: PathBuf,
    pub ifname: String,
    /// The host end of the veth pair.
    pub host_veth: String,
    /// The pod's addresses, with the subnet's prefix.
    pub addresses: Vec<Cidr>,
    pub routes: Vec<Route>,
}

/// MAC addresses of what ADD created or joined (`aa:bb:..`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Attached {
    pub bridge_mac: String,
    pub host_veth_mac: String,
    pub pod_mac: String,
}

pub trait Dataplane {
    /// Creates (or reuses) the bridge, creates the veth pair, moves one end into the pod's
    /// namespace as `ifname`, sets addresses, routes, MTU and hairpin mode. On failure,
    /// what it created for this pod is removed again.
    fn attach(&self, link: &PodLink) -> Result<Attached>;
    /// Removes the pod's interface (and so its veth peer); missing namespace or interface is
    /// not an error.
    fn detach(&self, netns: Option<&Path>, ifname: &str, host_veth: &str) -> Result<()>;
    /// Verifies the pod's interface, addresses and routes and the host end on the bridge.
    fn check(&self, link: &PodLink) -> Result<()>;
}

/// The host end's name: `veth` + 8 hex digits of a hash of the attachment, so DEL and CHECK
/// find it again and two pods never collide on a name.
pub fn host_veth_name(container_id: &str, ifname: &str) -> String {
    let digest = Sha256::digest(format!("{container_id}/{ifname}").as_bytes());
    format!("veth{}", &hex::encode(digest)[..8])
}

/// `aa:bb:cc:dd:ee:ff`.
pub fn format_mac(bytes: &[u8]) -> String {
    bytes
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_stable_short_and_distinct() {
        let a = host_veth_name("abc", "eth0");
        assert_eq!(a, host_veth_name("abc", "eth0"));
        assert_ne!(a, host_veth_name("abd", "eth0"));
        assert_ne!(a, host_veth_name("abc", "eth1"));
        assert_eq!(a.len(), 12);
        assert_eq!(format_mac(&[0xaa, 1, 2, 3, 4, 0xff]), "aa:01:02:03:04:ff");
    }
}
