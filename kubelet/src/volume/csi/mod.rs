//! CSI volumes on the node (upstream's `pkg/volume/csi`): the registration handler that CSI
//! drivers reach through the plugin manager ([`drivers`]), the `csi.v1` Node client
//! ([`client`]), and the node's record of its drivers in the cluster: the CSINode object and
//! the Node's `csi.volume.kubernetes.io/nodeid` annotation and topology labels
//! ([`nodeinfo`]); what the CSIDriver object asks ([`driver_spec`]) and what a mount needs
//! from the cluster first ([`prepare`]: attach, secrets, pod info, tokens); staging and
//! publishing at upstream's paths ([`mounter`]); online expansion of mounted volumes
//! ([`expand`]).

pub mod api;
pub mod client;
pub mod driver_spec;
pub mod drivers;
pub mod expand;
pub mod mounter;
pub mod nodeinfo;
pub mod prepare;

#[cfg(any(test, feature = "test-util"))]
pub mod fake;

pub use api::CsiApi;
pub use client::{CsiError, CsiNode, GrpcCsiNode};
pub use driver_spec::{DriverSpec, Prepared, SecretRef};
pub use drivers::{CsiDrivers, Driver, RegistrationHandler};
pub use mounter::CsiMounter;
pub use nodeinfo::{KubeNodeInfo, NodeInfoApi};

/// Upstream's plugin name of CSI volumes (metrics label, the `kubernetes.io~csi` directory).
pub const CSI_PLUGIN_NAME: &str = "kubernetes.io/csi";

/// Prefixes a message as upstream's csi package logs and reports it.
pub(crate) fn log(msg: impl std::fmt::Display) -> String {
    format!("{CSI_PLUGIN_NAME}: {msg}")
}
