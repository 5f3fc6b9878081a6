//! The container manager (upstream's pkg/kubelet/cm): the cgroup tree the kubelet owns —
//! `kubepods`, its QoS tiers and the pod cgroups — named for the configured driver.

mod cgroups;

pub use cgroups::*;
