//! The node's own CNI plugin, `node-agent-cni`: a bridge with the node's pod subnet(s), a veth
//! pair per pod and host-local style address allocation, all over rtnetlink (CNI spec 1.1,
//! also answering 0.3.0–1.0.0 configs).

pub mod config;
pub mod dataplane;
pub mod env;
pub mod error;
pub mod ipam;
pub mod plugin;
pub mod result;

pub use error::{Error, Result};
