//! Eviction signals observed in one stats snapshot (upstream's makeSignalObservations) and the
//! usage figures pods are ranked by. Pure.

use crate::cm::Signal;
use crate::stats::{FsStats, NodeStats, PodStats, Summary};
use k8s_openapi::api::core::v1::Pod;
use std::collections::BTreeMap;

/// What one signal looked like: `available` and `capacity` in the signal's unit (bytes,
/// inodes, pids), `time` of the reading (ns since the epoch).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Observation {
    pub available: i128,
    pub capacity: i128,
    pub time: i64,
}

pub type Observations = BTreeMap<Signal, Observation>;

fn fs_bytes(fs: Option<&FsStats>) -> Option<Observation> {
    let fs = fs?;
    Some(Observation {
        available: fs.available_bytes? as i128,
        capacity: fs.capacity_bytes? as i128,
        time: fs.time.0,
    })
}

fn fs_inodes(fs: Option<&FsStats>) -> Option<Observation> {
    let fs = fs?;
    Some(Observation {
        available: fs.inodes_free? as i128,
        capacity: fs.inodes? as i128,
        time: fs.time.0,
    })
}

/// Whether images live on a filesystem of their own (upstream's HasDedicatedImageFs compares
/// devices; the Summary gives sizes, and two filesystems of one size are taken as one).
pub fn dedicated_image_fs(node: &NodeStats) -> bool {
    let image = node
        .runtime
        .as_ref()
        .and_then(|r| r.image_fs.as_ref())
        .and_then(|f| f.capacity_bytes);
    let root = node.fs.as_ref().and_then(|f| f.capacity_bytes);
    matches!((image, root), (Some(i), Some(r)) if i != r)
}

/// The signals a snapshot shows. `allocatable_memory` is the node's allocatable memory
/// (the `pods` cgroup's limit): allocatableMemory.available is it minus the pods' working sets.
pub fn observe(summary: &Summary, allocatable_memory: Option<i128>) -> Observations {
    let mut out = Observations::new();
    let node = &summary.node;
    if let Some(m) = &node.memory
        && let (Some(avail), Some(ws)) = (m.available_bytes, m.working_set_bytes)
    {
        out.insert(
            Signal::MemoryAvailable,
            Observation {
                available: avail as i128,
                capacity: avail as i128 + ws as i128,
                time: m.time.0,
            },
        );
        if let Some(alloc) = allocatable_memory {
            let used: i128 = summary
                .pods
                .iter()
                .map(|p| {
                    p.memory
                        .as_ref()
                        .and_then(|m| m.working_set_bytes)
                        .map_or_else(|| pod_memory_usage(p), i128::from)
                })
                .sum();
            out.insert(
                Signal::AllocatableMemoryAvailable,
                Observation {
                    available: (alloc - used).max(0),
                    capacity: alloc,
                    time: m.time.0,
                },
            );
        }
    }
    let root = node.fs.as_ref();
    let runtime = node.runtime.as_ref();
    let image = runtime.and_then(|r| r.image_fs.as_ref());
    let container = runtime.and_then(|r| r.container_fs.as_ref()).or(image);
    for (signal, o) in [
        (Signal::NodeFsAvailable, fs_bytes(root)),
        (Signal::NodeFsInodesFree, fs_inodes(root)),
        (Signal::ImageFsAvailable, fs_bytes(image)),
        (Signal::ImageFsInodesFree, fs_inodes(image)),
        (Signal::ContainerFsAvailable, fs_bytes(container)),
        (Signal::ContainerFsInodesFree, fs_inodes(container)),
    ] {
        if let Some(o) = o {
            out.insert(signal, o);
        }
    }
    if let Some(r) = &node.rlimit
        && let (Some(max), Some(cur)) = (r.maxpid, r.curproc)
    {
        out.insert(
            Signal::PidAvailable,
            Observation {
                available: i128::from(max) - i128::from(cur),
                capacity: i128::from(max),
                time: r.time.0,
            },
        );
    }
    out
}

/// Which parts of a pod's disk use count (upstream's fsStatsType).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FsPart {
    Root,
    Logs,
    LocalVolumes,
}

/// Bytes or inodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DiskUnit {
    Bytes,
    Inodes,
}

fn used(fs: Option<&FsStats>, unit: DiskUnit) -> i128 {
    fs.and_then(|f| match unit {
        DiskUnit::Bytes => f.used_bytes,
        DiskUnit::Inodes => f.inodes_used,
    })
    .map_or(0, i128::from)
}

/// The names of a pod's volumes that live on the node's disk, as upstream's
/// localEphemeralVolumeNames: gitRepo, emptyDir not in memory, configMap, downwardAPI.
fn local_volumes(pod: &Pod) -> Vec<&str> {
    pod.spec
        .iter()
        .flat_map(|s| s.volumes.iter().flatten())
        .filter(|v| {
            v.git_repo.is_some()
                || v.config_map.is_some()
                || v.downward_api.is_some()
                || v.empty_dir
                    .as_ref()
                    .is_some_and(|e| e.medium.as_deref() != Some("Memory"))
        })
        .map(|v| v.name.as_str())
        .collect()
}

/// A pod's disk use over the given parts (upstream's podDiskUsage / podLocalVolumeUsage).
pub fn pod_disk_usage(pod: &Pod, stats: &PodStats, parts: &[FsPart], unit: DiskUnit) -> i128 {
    let mut total = 0;
    for c in &stats.containers {
        if parts.contains(&FsPart::Root) {
            total += used(c.rootfs.as_ref(), unit);
        }
        if parts.contains(&FsPart::Logs) {
            total += used(c.logs.as_ref(), unit);
        }
    }
    if parts.contains(&FsPart::LocalVolumes) {
        let local = local_volumes(pod);
        total += stats
            .volume
            .iter()
            .filter(|v| local.contains(&v.name.as_str()))
            .map(|v| used(Some(&v.fs), unit))
            .sum::<i128>();
    }
    total
}

/// A pod's memory working set (the sum of its containers', as upstream).
pub fn pod_memory_usage(stats: &PodStats) -> i128 {
    stats
        .containers
        .iter()
        .filter_map(|c| c.memory.as_ref()?.working_set_bytes)
        .map(i128::from)
        .sum()
}

/// A pod's process count.
pub fn pod_processes(stats: &PodStats) -> i128 {
    stats
        .process_stats
        .as_ref()
        .and_then(|p| p.process_count)
        .map_or(0, i128::from)
}
