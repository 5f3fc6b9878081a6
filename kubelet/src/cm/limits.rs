//! What the container manager writes, as pure functions of the pod and the node: upstream's
//! ResourceConfigForPod (pod cgroups, pod-level `spec.resources` included), the QoS tiers' shares (qos_container_manager) and the
//! `kubepods` limits (node_container_manager).

use super::cgroups::CgroupLimits;
use crate::cm::resources::Reserved;
use crate::cm::settings::PodLimits;
use crate::podspec::{self, Qos};
use k8s_openapi::api::core::v1::{Container, Pod, ResourceRequirements};
use plumbing::quantity;
use std::collections::BTreeMap;

/// Upstream's cm constants (helpers_linux.go).
pub const MIN_SHARES: u64 = 2;
pub const MAX_SHARES: u64 = 262_144;
pub const SHARES_PER_CPU: i128 = 1024;
pub const MIN_QUOTA_PERIOD: i64 = 1000;
/// `1 << 62`, upstream's "unbounded" hugetlb limit for the QoS tiers.
pub const HUGETLB_UNBOUNDED: i64 = 1 << 62;

/// Upstream's MilliCPUToShares: 0 → MinShares, else millicores × 1024 / 1000 in [2, 262144].
pub fn milli_cpu_to_shares(milli: i128) -> u64 {
    if milli <= 0 {
        return MIN_SHARES;
    }
    (milli * SHARES_PER_CPU / 1000).clamp(MIN_SHARES as i128, MAX_SHARES as i128) as u64
}

/// Upstream's MilliCPUToQuota: 0 → no quota; else millicores × period / 1000, at least 1000.
pub fn milli_cpu_to_quota(milli: i128, period_us: u64) -> i64 {
    if milli <= 0 {
        return 0;
    }
    let q = milli * i128::from(period_us) / 1000;
    q.clamp(i128::from(MIN_QUOTA_PERIOD), i128::from(i64::MAX)) as i64
}

/// The page size in bytes of a `hugepages-<size>` resource name.
pub fn hugepage_size(resource: &str) -> Option<u64> {
    let size = resource.strip_prefix("hugepages-")?;
    u64::try_from(quantity::parse_value(size).ok()?)
        .ok()
        .filter(|s| *s > 0)
}

/// One container's amounts in upstream's units (millicores, bytes), by resource name; a
/// missing request defaults to its limit (as the apiserver's defaulting does).
fn amounts(r: &Option<ResourceRequirements>, limits: bool) -> BTreeMap<String, i128> {
    let r = r.clone().unwrap_or_default();
    let lim = r.limits.unwrap_or_default();
    let map = if limits {
        lim.clone()
    } else {
        let mut req = r.requests.unwrap_or_default();
        for (k, v) in &lim {
            req.entry(k.clone()).or_insert_with(|| v.clone());
        }
        req
    };
    map.into_iter()
        .filter_map(|(k, q)| {
            let v = if k == "cpu" {
                quantity::milli(&q).ok()?
            } else {
                quantity::value(&q).ok()?
            };
            Some((k, v))
        })
        .collect()
}

fn add(into: &mut BTreeMap<String, i128>, from: &BTreeMap<String, i128>) {
    for (k, v) in from {
        *into.entry(k.clone()).or_insert(0) += v;
    }
}

fn max_into(into: &mut BTreeMap<String, i128>, from: &BTreeMap<String, i128>) {
    for (k, v) in from {
        let e = into.entry(k.clone()).or_insert(0);
        *e = (*e).max(*v);
    }
}

fn is_sidecar(c: &Container) -> bool {
    c.restart_policy.as_deref() == Some("Always")
}

/// Upstream's PodRequests / PodLimits: the containers' sum plus restartable init containers
/// (sidecars), or the largest init container with the sidecars started before it, whichever
/// is larger; then, with the `PodLevelResources` gate on and pod-level resources set, each
/// supported pod-level amount (cpu, memory, hugepages) replaces the containers'; plus the pod
/// overhead (for limits only where a non-zero limit exists).
pub fn pod_amounts(pod: &Pod, limits: bool, pod_level_gate: bool) -> BTreeMap<String, i128> {
    let mut sum = pod_amounts_without_overhead(pod, limits, pod_level_gate);
    let spec = pod.spec.clone().unwrap_or_default();
    for (k, q) in spec.overhead.unwrap_or_default() {
        if limits && sum.get(&k).is_none_or(|v| *v == 0) {
            continue;
        }
        let v = if k == "cpu" {
            quantity::milli(&q).ok()
        } else {
            quantity::value(&q).ok()
        };
        *sum.entry(k).or_insert(0) += v.unwrap_or(0);
    }
    sum
}

/// [`pod_amounts`] without the pod overhead (upstream's `ExcludeOverhead`).
pub fn pod_amounts_without_overhead(
    pod: &Pod,
    limits: bool,
    pod_level_gate: bool,
) -> BTreeMap<String, i128> {
    let spec = pod.spec.clone().unwrap_or_default();
    let mut sum = BTreeMap::new();
    for c in &spec.containers {
        add(&mut sum, &amounts(&c.resources, limits));
    }
    let mut sidecars = BTreeMap::new();
    let mut init_max = BTreeMap::new();
    for c in spec.init_containers.iter().flatten() {
        let own = amounts(&c.resources, limits);
        if is_sidecar(c) {
            add(&mut sidecars, &own);
            max_into(&mut init_max, &sidecars);
        } else {
            let mut with = sidecars.clone();
            add(&mut with, &own);
            max_into(&mut init_max, &with);
        }
    }
    add(&mut sum, &sidecars);
    max_into(&mut sum, &init_max);
    if let Some(r) = podspec::resources::pod_level(&spec, pod_level_gate) {
        // PodRequests applies pod-level requests only when some are set (after the
        // apiserver's defaulting from pod-level limits); PodLimits whenever any are.
        let level = if limits {
            podspec::resources::limits(r)
        } else {
            podspec::resources::requests(r)
        };
        for (k, q) in &level {
            if let Some(v) = podspec::resources::amount(k, q) {
                sum.insert(k.clone(), v);
            }
        }
    }
    sum
}

/// Upstream's ResourceConfigForPod plus `podPidsLimit` and the hugetlb sizes the pod does not
/// ask for (limited to 0, as the cgroup manager does). `host_sizes` are the node's page sizes.
pub fn pod_limits(pod: &Pod, s: &PodLimits, host_sizes: &[u64]) -> CgroupLimits {
    let spec = pod.spec.clone().unwrap_or_default();
    let gate = s.pod_level_resources;
    let qos = podspec::qos_class_with(&spec, gate);
    let reqs = pod_amounts(pod, false, gate);
    let lims = pod_amounts(pod, true, gate);
    let all = spec
        .containers
        .iter()
        .chain(spec.init_containers.iter().flatten());
    let (mut cpu_declared, mut mem_declared) = (true, true);
    for c in all {
        let l = amounts(&c.resources, true);
        cpu_declared &= l.get("cpu").is_some_and(|v| *v > 0);
        mem_declared &= l.get("memory").is_some_and(|v| *v > 0);
    }
    // A pod-level limit declares the limit for the whole pod.
    cpu_declared |= podspec::resources::pod_limit(&spec, gate, "cpu").is_some();
    mem_declared |= podspec::resources::pod_limit(&spec, gate, "memory").is_some();
    let period = s.cpu_cfs_period_us;
    let shares = milli_cpu_to_shares(reqs.get("cpu").copied().unwrap_or(0));
    let quota = if s.cpu_cfs_quota {
        milli_cpu_to_quota(lims.get("cpu").copied().unwrap_or(0), period)
    } else {
        -1
    };
    let memory = lims
        .get("memory")
        .map(|m| (*m).clamp(0, i128::from(i64::MAX)) as i64);
    let mut out = CgroupLimits::default();
    match qos {
        Qos::Guaranteed => {
            out.cpu_shares = Some(shares);
            out.cpu_quota = Some(quota);
            out.cpu_period = Some(period);
            out.memory = Some(memory.unwrap_or(0));
        }
        Qos::Burstable => {
            out.cpu_shares = Some(shares);
            if cpu_declared {
                out.cpu_quota = Some(quota);
                out.cpu_period = Some(period);
            }
            if mem_declared {
                out.memory = memory;
            }
        }
        Qos::BestEffort => out.cpu_shares = Some(MIN_SHARES),
    }
    if s.pod_pids_limit > 0 {
        out.pids = Some(s.pod_pids_limit);
    }
    out.hugetlb = hugetlb_limits(&reqs, host_sizes, 0);
    out
}

/// Hugetlb limits from `hugepages-<size>` amounts; the node's other sizes get `others`.
fn hugetlb_limits(
    amounts: &BTreeMap<String, i128>,
    host_sizes: &[u64],
    others: i64,
) -> BTreeMap<u64, i64> {
    let mut out: BTreeMap<u64, i64> = host_sizes.iter().map(|s| (*s, others)).collect();
    for (k, v) in amounts {
        if let Some(size) = hugepage_size(k) {
            out.insert(size, (*v).clamp(0, i128::from(i64::MAX)) as i64);
        }
    }
    out
}

/// A QoS tier's limits (upstream's setCPUCgroupConfig + setHugePagesUnbounded): BestEffort 2
/// shares; Burstable the shares of the Burstable pods' summed CPU requests (`burstable_milli`).
pub fn tier_limits(qos: Qos, burstable_milli: i128, host_sizes: &[u64]) -> CgroupLimits {
    let shares = match qos {
        Qos::BestEffort => MIN_SHARES,
        _ => milli_cpu_to_shares(burstable_milli),
    };
    CgroupLimits {
        cpu_shares: Some(shares),
        hugetlb: host_sizes.iter().map(|s| (*s, HUGETLB_UNBOUNDED)).collect(),
        ..Default::default()
    }
}

/// The node's resources as the container manager sees them (upstream's internal capacity).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeCapacity {
    pub cpu_millis: i64,
    pub memory_bytes: i64,
    /// The process limit: min(kernel.pid_max, kernel.threads-max).
    pub pids: Option<i64>,
    /// Page size → bytes of pre-allocated huge pages.
    pub hugepages: BTreeMap<u64, i64>,
}

/// Upstream's getCgroupConfig over a resource list: shares from CPU, and unless only
/// compressible resources are enforced, memory and pids.
pub fn reserved_limits(r: &Reserved, compressible_only: bool) -> CgroupLimits {
    CgroupLimits {
        cpu_shares: Some(milli_cpu_to_shares(i128::from(r.cpu_millis))),
        memory: (!compressible_only && r.memory_bytes > 0).then_some(r.memory_bytes),
        pids: (!compressible_only && r.pids > 0).then_some(r.pids),
        ..Default::default()
    }
}

/// The `kubepods` limits (upstream's enforceNodeAllocatableCgroups): capacity, or with
/// `enforceNodeAllocatable: [pods]` capacity − kubeReserved − systemReserved (no eviction
/// thresholds), floored at 0.
pub fn kubepods_limits(
    cap: &NodeCapacity,
    kube: &Reserved,
    system: &Reserved,
    enforce_pods: bool,
) -> CgroupLimits {
    let (k, s) = if enforce_pods {
        (*kube, *system)
    } else {
        (Reserved::default(), Reserved::default())
    };
    let cpu = (cap.cpu_millis - k.cpu_millis - s.cpu_millis).max(0);
    let memory = (cap.memory_bytes - k.memory_bytes - s.memory_bytes).max(0);
    CgroupLimits {
        cpu_shares: Some(milli_cpu_to_shares(i128::from(cpu))),
        memory: Some(memory),
        pids: cap.pids.map(|p| (p - k.pids - s.pids).max(0)),
        hugetlb: cap.hugepages.clone(),
        ..Default::default()
    }
}
