//! Pod volumes on the node: the volume manager ([`manager`]) sets up each kind (emptyDir,
//! hostPath in [`host_path`], configMap, secret, downwardAPI, projected from
//! [`projection`], written by [`atomic_writer`]) and keeps them current; subPath mounts are
//! resolved beneath their volume ([`subpath`]). Block PVs are mapped for a container's
//! `volumeDevices` ([`block`]). CSI drivers register through the plugin
//! manager and serve CSI volumes ([`csi`]).

pub mod atomic_writer;
pub mod block;
pub mod csi;
pub mod host_path;
pub mod hugepages;
pub mod manager;
pub mod ownership;
pub mod projection;
pub mod selinux;
pub mod selinux_registry;
pub mod shared;
pub mod stats;
pub mod subpath;
pub mod volume_claims;

#[cfg(test)]
mod bench_tests;

pub use manager::{GIT_REPO_DISABLED, VolumeError, VolumeManager, runtime_mounts_images};
pub use selinux::SeLinuxHost;
pub use selinux_registry::{SeLinuxVolumes, VolumeRef as SeLinuxVolumeRef};
pub use shared::make_root_dir_rshared;
pub use subpath::{Binder, KernelBinder, SubpathMount};
pub use volume_claims::{KubeStorageApi, Storage};
