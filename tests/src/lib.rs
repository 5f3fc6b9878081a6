//! The end-to-end test harness and what the crates' root-only tests share:
//!
//! - [`rig`]: the node rig (a private containerd in its own network namespace, tests/rig);
//! - [`kubelet`]: our kubelet process in a rig, one [`Kubelet::builder`];
//! - [`joined`]: a node as `kubeadm join` leaves it, and the agent started from it;
//! - [`netns`]: network namespaces (named, anonymous per thread, entering one) and the
//!   proxy's traffic topology;
//! - [`controlplane`]: a test apiserver (also served from inside a namespace:
//!   [`NetnsControlPlane`]);
//! - [`registry`]: a test image registry;
//! - [`csi_driver`]: a CSI node plugin that registers as node-driver-registrar does;
//! - [`dra_driver`]: a DRA kubelet plugin; both register through [`registrar`];
//! - [`util`]: polling and pod-JSON helpers.
//!
//! The e2e tests live in `tests/tests/` (one binary each); `proxy` and `cni` use this crate as
//! a dev-dependency for their namespace tests.

pub mod controlplane;
pub mod csi_driver;
pub mod dra_driver;
pub mod joined;
pub mod kubelet;
pub mod netns;
pub mod python;
pub mod registrar;
pub mod registry;
pub mod rig;
pub mod util;

pub use controlplane::NetnsControlPlane;
pub use kubelet::{Kubelet, KubeletBuilder, LOG_LINKS_DIR_ENV, TEST_EVICTION_HARD};
pub use netns::enter_netns;
pub use rig::{
    Rig, RuntimeFeatures, bin, cri_status, import_grpc_health_image, repo_root, skip_reason,
};
pub use util::{container, mounts_below, pod_condition, unmount_below, wait_for};
