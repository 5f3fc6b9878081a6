//! kube-proxy: Services and EndpointSlices programmed into the kernel, in upstream's three
//! modes (`mode`: iptables, the default on Linux; nftables; ipvs, deprecated upstream).
//!
//! Data flow: [`apiserver`] (list+watch of Services, EndpointSlices, ServiceCIDRs and this
//! Node) or [`source`] (`--static-services-dir`) → [`tracker::ProxyHandles`] (one source
//! fanned out per IP family) → [`tracker::ProxyHandle`] (change tracking over
//! [`model::ServiceState`]) → [`sync_loop::run`] (debounced by `minSyncPeriod`, periodic
//! canary check and retries) over a [`proxier::Proxier`], one per family. The proxier owns
//! what every mode shares (handle, metrics, conntrack, health, node adoption, the full-sync
//! decision, what a successful sync records); its [`proxier::Backend`] is the mode's own
//! part, the plan of a sync's changes and their apply:
//!
//! - [`iptables`]: `iptables::IptablesBackend` renders upstream's chains (pure, re-rendering
//!   only the changed services) and applies the minimal delta with
//!   `iptables-restore --noflush`, one command of the process at a time through
//!   `plumbing::iptables::xtables_lock`;
//! - [`nftables`]: `nftables::NftBackend` renders upstream's `kube-proxy` table and writes
//!   the difference to what it wrote before (`nft -f`); see `nftables/README.md`;
//! - [`ipvs`]: `ipvs::IpvsBackend` reconciles virtual servers over generic netlink, ipsets
//!   and a fixed iptables part; see `ipvs/README.md`.
//!
//! Shared by the three: [`render_config::RenderConfig`] (node and flag inputs of every
//! renderer), [`topology`] (endpoint choice), [`nodeport`] (node-port addresses),
//! [`health`] (healthz state, healthCheckNodePort servers), [`conntrack`] (stale UDP flows,
//! over [`ctnetlink`]), [`metrics`]. [`config`] turns flags + KubeProxyConfiguration into a
//! validated config and [`app`] assembles the role (used by the `kube-proxy` binary and by
//! a kubelet hosting the proxy).

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
pub mod proxier;
pub mod render_config;
pub mod settings;
pub mod source;
mod success;
pub mod sync_loop;
pub mod sysctl;
pub mod topology;
pub mod tracker;

#[cfg(test)]
mod tests;
