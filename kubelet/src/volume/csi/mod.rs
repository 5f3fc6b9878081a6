//! CSI volumes on the node (upstream's `pkg/volume/csi`): the registration handler that CSI
//! drivers reach through the plugin manager ([`drivers`]), the `csi.v1` Node client
//! ([`client`]), and the node's record of its drivers in the cluster: the CSINode object and
//! the Node's `csi.volume.kubernetes.io/nodeid` annotation and topology labels
//! ([`nodeinfo`]); staging and publishing at upstream's paths ([`mounter`]).

pub mod client;
pub mod drivers;
pub mod mounter;
pub mod nodeinfo;

#[cfg(any(test, feature = "test-util"))]
pub mod fake;

pub use client::{CsiError, CsiNode, GrpcCsiNode};
pub use drivers::{CsiDrivers, Driver, RegistrationHandler};
pub use mounter::CsiMounter;
pub use nodeinfo::{KubeNodeInfo, NodeInfoApi};

/// Upstream's plugin name of CSI volumes (metrics label, the `kubernetes.io~csi` directory).
pub const CSI_PLUGIN_NAME: &str = "kubernetes.io/csi";

/// Prefixes a message as upstream's csi package logs and reports it.
pub(crate) fn log(msg: impl std::fmt::Display) -> String {
    format!("{CSI_PLUGIN_NAME}: {msg}")
}
