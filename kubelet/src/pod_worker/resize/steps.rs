//! The order of an in-place resize's writes (upstream's doPodResizeAction and the KEP's
//! "Container resource limit update ordering"), pure. Memory, then CPU; for each, the pod
//! cgroup's value grows before the containers' and shrinks after them, and among the
//! containers the decreases go before the increases, so that no child is ever above its
//! parent (cgroup v1 refuses a CFS quota above the parent's, EINVAL).

use super::Amounts;
use crate::cm::{PodCgroupPart, PodCgroupValues};

/// A resource a container is updated for (UpdateContainerResources carries both; the other
/// one stays at what the container runs with).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(in crate::pod_worker) enum Resource {
    Memory,
    Cpu,
}

/// One write, in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(in crate::pod_worker) enum Step {
    /// Set this value of the pod cgroup to the allocated pod's.
    Pod(PodCgroupPart),
    /// Update container `index` (of the changes given) to its allocation for `Resource`.
    Container(usize, Resource),
}

/// A limit where `0` (none) or a negative value (unlimited) is larger than any set one.
fn limit(v: i128) -> i128 {
    if v <= 0 { i128::MAX } else { v }
}

/// The writes that take the pod from `now` (its cgroup's values; None: it has no cgroup of
/// its own) to `wanted`, with `changes` (allocated, running with) of the containers resized
/// in place. A value the pod does not set (None) is left as it is.
pub(in crate::pod_worker) fn steps(
    now: Option<PodCgroupValues>,
    wanted: PodCgroupValues,
    changes: &[(Amounts, Amounts)],
) -> Vec<Step> {
    let mut out = Vec::new();
    // (grows, shrinks) of one pod value.
    let compare = |now: Option<i128>, want: Option<i128>, as_limit: bool| match (now, want) {
        (Some(n), Some(w)) => {
            let (n, w) = if as_limit {
                (limit(n), limit(w))
            } else {
                (n, w)
            };
            (w > n, w < n)
        }
        _ => (false, false),
    };
    let now = now.unwrap_or_default();
    let memory = compare(
        now.memory.map(i128::from),
        wanted.memory.map(i128::from),
        true,
    );
    let containers = |out: &mut Vec<Step>, resource: Resource| {
        // (index, grows) of each container this resource changes.
        let mut changed: Vec<(usize, bool)> = Vec::new();
        for (i, (want, have)) in changes.iter().enumerate() {
            let (w, h) = match resource {
                Resource::Memory => (limit(want.memory_limit), limit(have.memory_limit)),
                Resource::Cpu if want.cpu_limit != have.cpu_limit => {
                    (limit(want.cpu_limit), limit(have.cpu_limit))
                }
                Resource::Cpu => (want.cpu_request, have.cpu_request),
            };
            if w != h {
                changed.push((i, w > h));
            }
        }
        // Decreases first (a stable sort keeps the spec order within each).
        changed.sort_by_key(|(_, grows)| *grows);
        out.extend(
            changed
                .into_iter()
                .map(|(i, _)| Step::Container(i, resource)),
        );
    };
    if memory.0 {
        out.push(Step::Pod(PodCgroupPart::MemoryLimit));
    }
    containers(&mut out, Resource::Memory);
    if memory.1 {
        out.push(Step::Pod(PodCgroupPart::MemoryLimit));
    }
    let quota = compare(
        now.cpu_quota.map(i128::from),
        wanted.cpu_quota.map(i128::from),
        true,
    );
    let shares = compare(
        now.cpu_shares.map(i128::from),
        wanted.cpu_shares.map(i128::from),
        false,
    );
    // Limits grow before requests and requests shrink before limits (requests ≤ limits).
    if quota.0 {
        out.push(Step::Pod(PodCgroupPart::CpuLimit));
    }
    if shares.0 {
        out.push(Step::Pod(PodCgroupPart::CpuRequest));
    }
    containers(&mut out, Resource::Cpu);
    if shares.1 {
        out.push(Step::Pod(PodCgroupPart::CpuRequest));
    }
    if quota.1 {
        out.push(Step::Pod(PodCgroupPart::CpuLimit));
    }
    out
}

#[cfg(test)]
mod tests;
