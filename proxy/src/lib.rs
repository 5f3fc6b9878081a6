//! kube-proxy: Services and EndpointSlices rendered into kernel NAT rules.
//!
//! Data flow: watch → [`model::ServiceState`] (change tracker) → [`proxier::run`] (debounced
//! loop) → [`proxier::Proxier::sync`] → [`render::Rendered`] (pure; partial syncs re-render
//! only the changed services with `Rendered::update`) → full text or minimal delta →
//! [`iptables::IptablesRunner`] (`iptables-restore --noflush`, one command of the process at a
//! time through [`xtables_lock`]); after each
//! successful sync: [`health`] (healthz state, healthCheckNodePort servers) and
//! [`conntrack`] (stale UDP flows). [`config`] turns flags + KubeProxyConfiguration into a
//! validated config, [`app`] assembles the role (used by the `kube-proxy` binary), [`apiserver`]
//! list+watches Services/EndpointSlices (and this Node) from the apiserver, [`source`] reads
//! them from a directory instead (`--static-services-dir`).

pub mod apiserver;
pub mod app;
pub mod config;
pub mod conntrack;
pub mod ctnetlink;
pub mod health;
pub mod iptables;
pub mod ipvs;
pub mod metrics;
pub mod model;
pub mod netlink;
pub mod nftables;
pub mod nodeport;
pub mod settings;
pub mod source;
pub mod sync_loop;
pub mod sysctl;
pub mod topology;
pub mod tracker;

#[cfg(test)]
mod tests;

// The old paths of modules that moved into `iptables/`.
pub use iptables::{Backend, ExecRunner, IptablesRunner};
pub use iptables::{proxier, render, xtables_lock};

pub use model::{IpFamily, ServiceState};
pub use proxier::{Proxier, ProxyHandle, SyncConfig};
pub use render::RenderConfig;
