//! The pod cgroup's part in an in-place resize (upstream's pod container manager
//! GetPodCgroupConfig / SetPodCgroupConfig): its CPU quota, CPU shares and memory limit read
//! back from the cgroup, the values the allocated pod asks for, and one of them written at a
//! time, so that the pod worker can order each write against its containers' updates.

use super::cgroups::{CgroupError, CgroupLimits, CgroupVersion};
use super::{ContainerManager, limits};
use crate::podspec::{self, Qos};
use k8s_openapi::api::core::v1::Pod;
use std::collections::BTreeMap;

/// The values of a pod cgroup a resize changes. `None`: not set (left as it is); a quota or
/// memory limit of `-1` is unlimited.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PodCgroupValues {
    pub cpu_quota: Option<i64>,
    pub cpu_shares: Option<u64>,
    pub memory: Option<i64>,
}

/// One value of the pod cgroup, written on its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PodCgroupPart {
    /// The CFS quota and period (the CPU limit).
    CpuLimit,
    /// The CPU shares (the CPU request), with the Burstable tier's.
    CpuRequest,
    /// The memory limit.
    MemoryLimit,
}

/// v1 reports an unlimited memory limit as the largest page-aligned counter; anything this
/// large is unlimited.
const V1_UNLIMITED_FROM: i64 = 1 << 62;

/// Upstream's CpuWeightToCpuShares (cgroup v2 weight back onto v1 shares).
fn weight_to_shares(weight: u64) -> u64 {
    if weight == 0 {
        return 0;
    }
    ((weight - 1) * 262_142) / 9_999 + 2
}

/// Reads the values out of a cgroup's limit files (as [`super::Cgroups::read`] gives them).
pub fn parse_values(files: &BTreeMap<String, String>, v: CgroupVersion) -> PodCgroupValues {
    let int = |name: &str| files.get(name).and_then(|s| s.trim().parse::<i64>().ok());
    match v {
        CgroupVersion::V1 => PodCgroupValues {
            cpu_quota: int("cpu.cfs_quota_us"),
            cpu_shares: int("cpu.shares").map(|s| s.max(0) as u64),
            memory: int("memory.limit_in_bytes")
                .map(|m| if m >= V1_UNLIMITED_FROM { -1 } else { m }),
        },
        CgroupVersion::V2 => {
            let max_or = |s: &str| {
                if s.trim() == "max" {
                    Some(-1)
                } else {
                    s.trim().parse::<i64>().ok()
                }
            };
            PodCgroupValues {
                cpu_quota: files
                    .get("cpu.max")
                    .and_then(|s| max_or(s.split(' ').next().unwrap_or(""))),
                cpu_shares: int("cpu.weight").map(|w| weight_to_shares(w.max(0) as u64)),
                memory: files.get("memory.max").and_then(|s| max_or(s)),
            }
        }
    }
}

impl ContainerManager {
    fn pod_cgroup_path(&self, pod: &Pod) -> Option<String> {
        let spec = pod.spec.clone().unwrap_or_default();
        let qos = podspec::qos_class_with(&spec, self.cfg.pod_limits.pod_level_resources);
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        self.cfg.namer.pod_path(qos, &uid)
    }

    /// The pod cgroup's values now; None when the pod has no cgroup of its own here.
    pub fn pod_values(&self, pod: &Pod) -> Result<Option<PodCgroupValues>, CgroupError> {
        let Some(path) = self.pod_cgroup_path(pod).filter(|p| self.cgroups.exists(p)) else {
            return Ok(None);
        };
        let files = self.cgroups.read(&path)?;
        Ok(Some(parse_values(&files, self.cgroups.version())))
    }

    /// The values `pod` (at its allocation) asks of its cgroup, as the cgroup would read them
    /// back (on v2 the shares go through the weight and back).
    pub fn wanted_pod_values(&self, pod: &Pod) -> PodCgroupValues {
        let l = self.pod_limits(pod);
        let shares = match self.cgroups.version() {
            CgroupVersion::V1 => l.cpu_shares,
            CgroupVersion::V2 => l
                .cpu_shares
                .map(|s| weight_to_shares(super::shares_to_weight(s))),
        };
        PodCgroupValues {
            cpu_quota: l.cpu_quota,
            cpu_shares: shares,
            memory: l.memory,
        }
    }

    /// Writes one of `pod`'s values to its cgroup; a new CPU request updates the Burstable
    /// tier's shares first, as at the pod's start.
    pub fn set_pod_value(&self, pod: &Pod, part: PodCgroupPart) -> Result<(), CgroupError> {
        let Some(path) = self.pod_cgroup_path(pod) else {
            return Ok(());
        };
        let all = self.pod_limits(pod);
        let one = match part {
            PodCgroupPart::CpuLimit => CgroupLimits {
                cpu_quota: all.cpu_quota,
                cpu_period: all.cpu_quota.and(all.cpu_period),
                ..Default::default()
            },
            PodCgroupPart::CpuRequest => {
                let spec = pod.spec.clone().unwrap_or_default();
                let gate = self.cfg.pod_limits.pod_level_resources;
                if podspec::qos_class_with(&spec, gate) == Qos::Burstable {
                    let uid = pod.metadata.uid.clone().unwrap_or_default();
                    let cpu = limits::pod_amounts(pod, false, gate)
                        .get("cpu")
                        .copied()
                        .unwrap_or(0);
                    let changed = self.burstable.lock().unwrap().insert(uid, cpu) != Some(cpu);
                    if changed {
                        self.update_tiers()?;
                    }
                }
                CgroupLimits {
                    cpu_shares: all.cpu_shares,
                    ..Default::default()
                }
            }
            PodCgroupPart::MemoryLimit => CgroupLimits {
                memory: all.memory,
                ..Default::default()
            },
        };
        self.cgroups.set(&path, &one)
    }
}

#[cfg(test)]
mod tests;
