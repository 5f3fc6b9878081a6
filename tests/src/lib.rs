//! End-to-end tests and their helpers: the node rig and a test control plane.

pub mod controlplane;
pub mod registry;
