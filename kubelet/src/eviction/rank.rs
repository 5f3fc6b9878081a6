//! Which pod goes first (upstream's rankMemoryPressure, rankDiskPressureFunc,
//! rankPIDPressure), the eviction messages, and the local storage limits
//! (localStorageEviction). Pure.

use super::signals::{self, DiskUnit, FsPart};
use crate::cm::{Signal, Threshold};
use crate::podspec::resources;
use crate::stats::{PodStats, Unfinished};
use k8s_openapi::api::core::v1::{Container, Pod};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use std::cmp::Ordering;
use std::collections::BTreeMap;

/// Priorities at or above this make a pod critical (scheduling.SystemCriticalPriority).
pub const SYSTEM_CRITICAL_PRIORITY: i32 = 2_000_000_000;

/// The resource a signal reclaims (upstream's signalToResource).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resource {
    Memory,
    EphemeralStorage,
    Inodes,
    Pids,
}

impl Resource {
    pub fn of(signal: Signal) -> Resource {
        match signal {
            Signal::MemoryAvailable | Signal::AllocatableMemoryAvailable => Resource::Memory,
            Signal::NodeFsAvailable | Signal::ImageFsAvailable | Signal::ContainerFsAvailable => {
                Resource::EphemeralStorage
            }
            Signal::NodeFsInodesFree
            | Signal::ImageFsInodesFree
            | Signal::ContainerFsInodesFree => Resource::Inodes,
            Signal::PidAvailable => Resource::Pids,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Resource::Memory => "memory",
            Resource::EphemeralStorage => "ephemeral-storage",
            Resource::Inodes => "inodes",
            Resource::Pids => "pids",
        }
    }
}

/// A pod's priority (0 when unset).
pub fn priority(pod: &Pod) -> i32 {
    pod.spec.as_ref().and_then(|s| s.priority).unwrap_or(0)
}

/// Upstream's IsCriticalPod: static and mirror pods, and system-critical priorities.
pub fn is_critical(pod: &Pod) -> bool {
    let ann = pod.metadata.annotations.as_ref();
    let is_static = ann
        .and_then(|a| a.get(crate::podspec::ANN_CONFIG_SOURCE))
        .is_some_and(|s| s != "api");
    let is_mirror = ann.is_some_and(|a| a.contains_key(crate::podspec::ANN_CONFIG_MIRROR));
    is_static || is_mirror || priority(pod) >= SYSTEM_CRITICAL_PRIORITY
}

fn container_quantity(c: &Container, limits: bool, resource: &str) -> Option<i128> {
    let r = c.resources.as_ref()?;
    let map = if limits { &r.limits } else { &r.requests };
    plumbing::quantity::value(map.as_ref()?.get(resource)?).ok()
}

/// The pod's request or limit of `resource` as upstream's PodRequests/PodLimits: the
/// pod-level amount when pod-level resources name it (and the `PodLevelResources` gate is on),
/// else the sum over the containers or the largest init container, whichever is larger; None
/// when nothing names it. `pod_level_gate`: the `PodLevelResources` gate.
pub fn pod_amount(pod: &Pod, limits: bool, resource: &str, pod_level_gate: bool) -> Option<i128> {
    let spec = pod.spec.as_ref()?;
    if let Some(r) = resources::pod_level(spec, pod_level_gate) {
        let level = if limits {
            resources::limits(r)
        } else {
            resources::requests(r)
        };
        if let Some(v) = level
            .get(resource)
            .and_then(|q| resources::amount(resource, q))
        {
            return Some(v);
        }
    }
    let sum: Vec<i128> = spec
        .containers
        .iter()
        .filter_map(|c| container_quantity(c, limits, resource))
        .collect();
    let init = spec
        .init_containers
        .iter()
        .flatten()
        .filter_map(|c| container_quantity(c, limits, resource))
        .max();
    if sum.is_empty() && init.is_none() {
        return None;
    }
    let sum: i128 = sum.iter().sum();
    Some(sum.max(init.unwrap_or(0)))
}

/// How pods are ranked for one signal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ranking {
    Memory,
    Disk {
        parts: &'static [FsPart],
        unit: DiskUnit,
    },
    Pids,
}

const ALL_PARTS: &[FsPart] = &[FsPart::Root, FsPart::Logs, FsPart::LocalVolumes];
const NODE_PARTS: &[FsPart] = &[FsPart::Logs, FsPart::LocalVolumes];
const IMAGE_PARTS: &[FsPart] = &[FsPart::Root];

impl Ranking {
    /// Upstream's buildSignalToRankFunc: with a dedicated image filesystem, nodefs ranks by
    /// logs and local volumes and imagefs by writable layers; else both by all three.
    pub fn for_signal(signal: Signal, dedicated_image_fs: bool) -> Ranking {
        let unit = match Resource::of(signal) {
            Resource::Memory => return Ranking::Memory,
            Resource::Pids => return Ranking::Pids,
            Resource::Inodes => DiskUnit::Inodes,
            Resource::EphemeralStorage => DiskUnit::Bytes,
        };
        let parts = match (dedicated_image_fs, signal) {
            (false, _) => ALL_PARTS,
            (true, Signal::NodeFsAvailable | Signal::NodeFsInodesFree) => NODE_PARTS,
            (true, _) => IMAGE_PARTS,
        };
        Ranking::Disk { parts, unit }
    }

    /// Usage and request of the pod for this ranking (None without stats).
    fn usage(self, pod: &Pod, stats: Option<&PodStats>, gate: bool) -> Option<(i128, i128)> {
        let stats = stats?;
        Some(match self {
            Ranking::Memory => (
                signals::pod_memory_usage(stats),
                pod_amount(pod, false, "memory", gate).unwrap_or(0),
            ),
            Ranking::Disk { parts, unit } => (
                signals::pod_disk_usage(pod, stats, parts, unit),
                match unit {
                    DiskUnit::Bytes => {
                        pod_amount(pod, false, "ephemeral-storage", gate).unwrap_or(0)
                    }
                    DiskUnit::Inodes => 0,
                },
            ),
            Ranking::Pids => (signals::pod_processes(stats), 0),
        })
    }
}

/// `true` before `false` (upstream's cmpBool).
fn true_first(a: bool, b: bool) -> Ordering {
    b.cmp(&a)
}

/// Orders `pods` (each with its stats) so the first is evicted first. `pod_level_gate`: the
/// `PodLevelResources` gate (pod-level requests count).
pub fn rank(pods: &mut [(Pod, Option<PodStats>)], how: Ranking, pod_level_gate: bool) {
    pods.sort_by(|(p1, s1), (p2, s2)| {
        let u1 = how.usage(p1, s1.as_ref(), pod_level_gate);
        let u2 = how.usage(p2, s2.as_ref(), pod_level_gate);
        let by_priority = priority(p1).cmp(&priority(p2));
        // Pods without stats go first, as upstream.
        let no_stats = true_first(u1.is_none(), u2.is_none());
        let (Some((use1, req1)), Some((use2, req2))) = (u1, u2) else {
            return match how {
                Ranking::Pids => by_priority.then(no_stats),
                _ => no_stats.then(by_priority),
            };
        };
        match how {
            Ranking::Pids => by_priority.then((use2).cmp(&use1)),
            _ => true_first(use1 > req1, use2 > req2)
                .then(by_priority)
                .then((use2 - req2).cmp(&(use1 - req1))),
        }
    });
}

/// Kubernetes' BinarySI canonical form for bytes (`100Mi`, `1536Ki`, `1000`).
pub fn binary_si(v: i128) -> String {
    plumbing::quantity::format_binary_si(v)
}

/// Kubernetes' DecimalSI canonical form for counts (`5k`, `1234`).
pub fn decimal_si(v: i128) -> String {
    const SUFFIXES: [&str; 6] = ["k", "M", "G", "T", "P", "E"];
    if v == 0 {
        return "0".into();
    }
    let mut n = v;
    let mut idx = None;
    for (i, _) in SUFFIXES.iter().enumerate() {
        if n % 1000 == 0 {
            n /= 1000;
            idx = Some(i);
        } else {
            break;
        }
    }
    match idx {
        Some(i) => format!("{n}{}", SUFFIXES[i]),
        None => n.to_string(),
    }
}

fn show(resource: Resource, v: i128) -> String {
    match resource {
        Resource::Memory | Resource::EphemeralStorage => binary_si(v),
        Resource::Inodes | Resource::Pids => decimal_si(v),
    }
}

/// The threshold's quantity as upstream prints it: as configured, or computed from a
/// percentage of capacity.
fn threshold_text(t: &Threshold, capacity: i128, resource: Resource) -> String {
    show(resource, t.value.of_capacity(capacity))
}

/// The Event annotation keys upstream's eviction manager writes.
pub const OFFENDING_CONTAINERS: &str = "offending_containers";
pub const OFFENDING_CONTAINERS_USAGE: &str = "offending_containers_usage";
pub const OFFENDING_POD: &str = "offending_pod";
pub const OFFENDING_POD_USAGE: &str = "offending_pod_usage";
pub const STARVED_RESOURCE: &str = "starved_resource";

/// A quantity of the spec as Go prints it (canonical form); `0` when absent.
fn spec_quantity_text(q: Option<&Quantity>) -> String {
    q.map_or_else(
        || "0".to_string(),
        |q| plumbing::quantity::canonical(&q.0).unwrap_or_else(|_| q.0.clone()),
    )
}

/// An eviction's message and the Event's annotations (upstream's evictionMessage): the
/// containers (regular and init, in the order the stats list them) using more than they
/// request, for memory and ephemeral-storage; with pod-level resources (memory) the pod's
/// usage and request as well. No pod stats: the message alone, no annotations.
pub fn eviction_message(
    resource: Resource,
    pod: &Pod,
    stats: Option<&PodStats>,
    thresholds: &[Threshold],
    observations: &signals::Observations,
) -> (String, BTreeMap<String, String>) {
    let mut msg = format!("The node was low on resource: {}. ", resource.name());
    let met = thresholds
        .iter()
        .find(|t| Resource::of(t.signal) == resource)
        .and_then(|t| Some((t, observations.get(&t.signal)?)));
    if let Some((t, o)) = met {
        msg += &format!(
            "Threshold quantity: {}, available: {}. ",
            threshold_text(t, o.capacity, resource),
            show(resource, o.available)
        );
    }
    let mut annotations = BTreeMap::new();
    let Some(stats) = stats else {
        return (msg, annotations);
    };
    let spec = pod.spec.as_ref();
    let pod_request = spec
        .and_then(|s| s.resources.as_ref())
        .filter(|r| {
            r.requests.as_ref().is_some_and(|m| !m.is_empty())
                || r.limits.as_ref().is_some_and(|m| !m.is_empty())
        })
        .and_then(|r| r.requests.as_ref()?.get("memory"));
    if let (Resource::Memory, Some(request), Some(mem)) =
        (resource, pod_request, stats.memory.as_ref())
    {
        let usage = binary_si(mem.working_set_bytes.map_or(0, i128::from));
        let name = pod.metadata.name.clone().unwrap_or_default();
        msg += &format!(
            "Pod {name} was using {usage}, request is {}, has larger consumption of memory. ",
            spec_quantity_text(Some(request))
        );
        annotations.insert(OFFENDING_POD.to_string(), name);
        annotations.insert(OFFENDING_POD_USAGE.to_string(), usage);
    }
    let mut names = Vec::new();
    let mut usages = Vec::new();
    let containers: Vec<&Container> = spec
        .into_iter()
        .flat_map(|s| {
            s.containers
                .iter()
                .chain(s.init_containers.iter().flatten())
        })
        .collect();
    for cs in &stats.containers {
        let Some(c) = containers.iter().find(|c| c.name == cs.name) else {
            continue;
        };
        let key = match resource {
            Resource::Memory => "memory",
            Resource::EphemeralStorage => "ephemeral-storage",
            _ => continue,
        };
        let usage = match resource {
            Resource::Memory => cs.memory.as_ref().and_then(|m| m.working_set_bytes),
            _ => match (
                cs.rootfs.as_ref().and_then(|f| f.used_bytes),
                cs.logs.as_ref().and_then(|f| f.used_bytes),
            ) {
                (Some(a), Some(b)) => Some(a + b),
                _ => None,
            },
        };
        let Some(usage) = usage.map(i128::from) else {
            continue;
        };
        let request = c
            .resources
            .as_ref()
            .and_then(|r| r.requests.as_ref()?.get(key));
        // Compared in thousandths: a fractional request is not rounded up.
        let request_milli = request
            .and_then(|q| plumbing::quantity::milli(q).ok())
            .unwrap_or(0);
        if usage * 1000 > request_milli {
            let u = binary_si(usage);
            msg += &format!(
                "Container {} was using {u}, request is {}, has larger consumption of {}. ",
                c.name,
                spec_quantity_text(request),
                resource.name()
            );
            names.push(c.name.clone());
            usages.push(u);
        }
    }
    annotations.insert(OFFENDING_CONTAINERS.to_string(), names.join(","));
    annotations.insert(OFFENDING_CONTAINERS_USAGE.to_string(), usages.join(","));
    annotations.insert(STARVED_RESOURCE.to_string(), resource.name().to_string());
    (msg, annotations)
}

/// Why a pod breaks its local storage limits, and the signal label its eviction counts under
/// (`emptydirfs.limit`, `ephemeralpodfs.limit`, `ephemeralcontainerfs.limit`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StorageViolation {
    pub message: String,
    pub signal: &'static str,
}

/// Upstream's localStorageEviction checks for one pod, in its order: an emptyDir over its
/// `sizeLimit`, the pod over the sum of its containers' `ephemeral-storage` limits, a
/// container over its own (logs, plus the writable layer without a dedicated image fs).
/// A part in `unmeasured` (its walk could not finish: the figure is a floor) counts as over
/// every limit it falls under, so a container cannot hide its usage by making the walk long.
/// `pod_level_gate`: the `PodLevelResources` gate (a pod-level limit counts).
pub fn storage_violation(
    pod: &Pod,
    stats: &PodStats,
    unmeasured: &[(Unfinished, String)],
    dedicated_image_fs: bool,
    pod_level_gate: bool,
) -> Option<StorageViolation> {
    let spec = pod.spec.as_ref()?;
    let why_unmeasured = |part: &Unfinished| {
        unmeasured
            .iter()
            .find(|(p, _)| p == part)
            .map(|(_, why)| why.as_str())
    };
    for v in spec.volumes.iter().flatten() {
        let Some(limit) = v.empty_dir.as_ref().and_then(|e| e.size_limit.as_ref()) else {
            continue;
        };
        let size = plumbing::quantity::value(limit).unwrap_or(0);
        if let Some(why) = why_unmeasured(&Unfinished::Volume(v.name.clone()))
            && size > 0
        {
            return Some(StorageViolation {
                message: format!(
                    "Usage of EmptyDir volume {:?} could not be measured in full ({why}): it counts as over the limit {:?}. ",
                    v.name, limit.0
                ),
                signal: "emptydirfs.limit",
            });
        }
        let used = stats
            .volume
            .iter()
            .find(|s| s.name == v.name)
            .and_then(|s| s.fs.used_bytes);
        if let Some(used) = used
            && size > 0
            && i128::from(used) > size
        {
            return Some(StorageViolation {
                message: format!(
                    "Usage of EmptyDir volume {:?} exceeds the limit {:?}. ",
                    v.name, limit.0
                ),
                signal: "emptydirfs.limit",
            });
        }
    }
    if let Some(limit) = pod_amount(pod, true, "ephemeral-storage", pod_level_gate) {
        if let Some((_, why)) = unmeasured.first() {
            return Some(StorageViolation {
                message: format!(
                    "Pod ephemeral local storage usage could not be measured in full ({why}): it counts as over the total limit of containers {}. ",
                    binary_si(limit)
                ),
                signal: "ephemeralpodfs.limit",
            });
        }
        let used = stats
            .ephemeral_storage
            .as_ref()
            .and_then(|e| e.used_bytes)
            .map_or(0, i128::from);
        if used > limit {
            return Some(StorageViolation {
                message: format!(
                    "Pod ephemeral local storage usage exceeds the total limit of containers {}. ",
                    binary_si(limit)
                ),
                signal: "ephemeralpodfs.limit",
            });
        }
    }
    for cs in &stats.containers {
        let Some(c) = spec.containers.iter().find(|c| c.name == cs.name) else {
            continue;
        };
        let Some(limit_q) = c
            .resources
            .as_ref()
            .and_then(|r| r.limits.as_ref()?.get("ephemeral-storage"))
        else {
            continue;
        };
        let limit = plumbing::quantity::value(limit_q).unwrap_or(0);
        if limit == 0 {
            continue;
        }
        if let Some(why) = why_unmeasured(&Unfinished::Logs(cs.name.clone())) {
            return Some(StorageViolation {
                message: format!(
                    "Container {} local ephemeral storage usage could not be measured in full ({why}): it counts as over its limit {:?}. ",
                    cs.name, limit_q.0
                ),
                signal: "ephemeralcontainerfs.limit",
            });
        }
        let mut used = cs
            .logs
            .as_ref()
            .and_then(|f| f.used_bytes)
            .map_or(0, i128::from);
        if !dedicated_image_fs {
            used += cs
                .rootfs
                .as_ref()
                .and_then(|f| f.used_bytes)
                .map_or(0, i128::from);
        }
        if used > limit {
            return Some(StorageViolation {
                message: format!(
                    "Container {} exceeded its local ephemeral storage limit {:?}. ",
                    cs.name, limit_q.0
                ),
                signal: "ephemeralcontainerfs.limit",
            });
        }
    }
    None
}
