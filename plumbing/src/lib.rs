//! Shared plumbing of the node agent's binaries (kubelet, kube-proxy, the CNI plugin): the
//! mechanisms each of them needs once, kept here so there is one of each.

pub mod backoff;
pub mod cidr;
pub mod duration;
#[cfg(feature = "fd-limit")]
pub mod fd_limit;
#[cfg(feature = "settings")]
pub mod feature_gates;
pub mod go;
#[cfg(feature = "http-server")]
pub mod http_server;
#[cfg(feature = "iptables")]
pub mod iptables;
#[cfg(feature = "logging")]
pub mod logging;
#[cfg(feature = "metrics")]
pub mod metrics;
pub mod names;
pub mod oom_score;
pub mod process;
#[cfg(feature = "quantity")]
pub mod quantity;
#[cfg(feature = "rtnl")]
pub mod rtnl;
#[cfg(feature = "settings")]
pub mod settings;
#[cfg(feature = "store")]
pub mod store;
pub mod version;

pub use backoff::Backoff;
pub use cidr::Cidr;
