//! The kubelet: pod sources, per-pod workers reconciling against a CRI runtime, and its servers.
//!
//! Data flows one way: sources ([`pod::static_pods`]) → [`sync_loop`] → one [`pod_worker`] per pod
//! UID → [`runtime`] (CRI). Observations come back on one path: [`pleg`] relists wake workers,
//! workers compute status ([`status`]) and hand it to the [`status_manager`].
//!
//! In cluster mode (`--kubeconfig`), [`cluster`] adds the apiserver: TLS bootstrap and
//! certificate rotation, the Node object and its Lease, pods bound to this node as a second
//! source, mirror pods, events, and the status writer that copies the [`status_manager`] to the
//! apiserver.

pub mod app;
pub mod atomic_file;
pub mod certs;
pub mod clock;
pub mod cluster;
pub mod cm;
pub mod config;
pub mod events;
pub mod eviction;
pub mod flags;
pub mod host;
pub mod images;
pub mod logs;
pub mod metrics;
pub mod network;
pub mod objects;
pub mod oom;
pub mod pleg;
pub mod pod;
pub mod pod_dirs;
pub mod pod_worker;
pub mod probing;
pub mod proxy_role;
pub mod runtime;
pub mod server;
pub mod settings;
pub mod shutdown;
pub mod spec;
pub mod stats;
pub mod status;
pub mod status_manager;
pub mod sync_loop;
pub mod systemd;
pub mod volume;

/// The upstream Kubernetes release whose kubelet this agent stands in for (one constant for
/// both binaries).
pub use plumbing::version::KUBERNETES_VERSION;
