//! kube-proxy: Services and EndpointSlices rendered into kernel NAT rules.
//!
//! Data flow: watch → [`model::ServiceState`] (change tracker) → [`proxier::run`] (debounced
//! loop) → [`proxier::Proxier::sync`] → [`render::render`] (pure) → full text or minimal
//! [`render::delta`] → [`iptables::IptablesRunner`] (`iptables-restore --noflush`).

pub mod chains;
pub mod iptables;
pub mod metrics;
pub mod model;
pub mod proxier;
pub mod render;

#[cfg(test)]
mod tests;

pub use iptables::{Backend, ExecRunner, IptablesRunner};
pub use model::{IpFamily, ServiceState};
pub use proxier::{Proxier, ProxyHandle, SyncConfig};
pub use render::RenderConfig;
