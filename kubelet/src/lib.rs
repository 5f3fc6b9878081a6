//! The kubelet: pod sources, per-pod workers reconciling against a CRI runtime, and its servers.
//!
//! Data flows one way: sources ([`pod`]: static files, the apiserver) → [`sync_loop`] → one
//! [`pod_worker`] per pod UID → [`runtime`] (CRI). Observations come back on one path: [`pleg`]
//! relists wake workers, workers compute status ([`status`]) and hand it to the status manager,
//! whose writer copies it to the apiserver in cluster mode.
//!
//! In cluster mode (`--kubeconfig`), [`app::cluster`] adds the apiserver: TLS bootstrap and
//! certificate rotation ([`certs`]), the Node object and its Lease ([`node`]), pods bound to this
//! node as a second source, mirror pods ([`pod`]), events ([`objects`]), and the status writer
//! ([`status`]).

pub mod allocation;
pub mod app;
pub mod atomic_file;
pub mod certs;
pub mod clock;
pub mod cm;
pub mod config;
pub mod devices;
pub mod events;
pub mod eviction;
pub mod fs_at;
pub mod host;
pub mod images;
pub mod logs;
pub mod metrics;
pub mod network;
pub mod node;
pub mod node_settings;
pub mod objects;
pub mod oom;
pub mod pleg;
pub mod pluginmanager;
pub mod pod;
pub mod pod_dirs;
pub mod pod_worker;
pub mod podresources;
pub mod podspec;
pub mod probing;
pub mod proxy_role;
pub mod runtime;
pub mod server;
pub mod settings;
pub mod shutdown;
pub mod spec;
pub mod stats;
pub mod status;
pub mod sync_loop;
pub mod systemd;
pub mod userns;
pub mod volume;

/// The upstream Kubernetes release whose kubelet this agent stands in for (one constant for
/// both binaries).
pub use plumbing::version::KUBERNETES_VERSION;
