//! Whether the node takes a pod's resize (upstream's allocation manager's
//! handlePodResourcesResize with the resize admit handlers): a static pod cannot resize; a pod
//! asking for more cpu or memory than the node's allocatable is `Infeasible`; one that does
//! not fit beside the other pods' allocations waits, `Deferred`, and is tried again with every
//! pod update (a pod leaving frees room). Pure.

use crate::allocation::{self, Pending, REASON_DEFERRED, REASON_INFEASIBLE};
use crate::podspec;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use std::collections::BTreeMap;

/// What becomes of a pod's resize.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// The spec asks for what is allocated: nothing to decide.
    Unchanged,
    /// The node takes it: the spec's resources become the allocation.
    Allocate,
    /// Not now (`Deferred`) or never at this size (`Infeasible`).
    Pending(Pending),
    /// Nothing to weigh it against yet (the node's allocatable is unknown).
    Undecided,
}

/// Upstream's message for a static pod's resize.
pub const STATIC_POD_MESSAGE: &str = "In-place resize of static-pods is not supported";

/// Decides `desired`'s resize against its `allocated` form, with `used` the requests of every
/// other admitted pod (at their allocations).
pub fn decide(
    desired: &Pod,
    allocated: &Pod,
    used: &BTreeMap<String, i128>,
    allocatable: Option<&BTreeMap<String, Quantity>>,
    pod_level_gate: bool,
) -> Decision {
    let want = allocation::from_spec(desired);
    let have = allocation::from_spec(allocated);
    let same = want.len() == have.len()
        && want.iter().all(|(name, r)| {
            have.get(name)
                .is_some_and(|h| allocation::same_requirements(r, h))
        });
    if same {
        return Decision::Unchanged;
    }
    let pending = |reason: &str, message: String| {
        Decision::Pending(Pending {
            reason: reason.into(),
            message,
            generation: desired.metadata.generation,
        })
    };
    let source = desired
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(crate::podspec::ANN_CONFIG_SOURCE));
    if source.is_some_and(|s| s != "api") {
        return pending(REASON_INFEASIBLE, STATIC_POD_MESSAGE.into());
    }
    let Some(allocatable) = allocatable else {
        // The node's allocatable is not known yet (before the Node object has it): decided
        // on a later pass.
        return Decision::Undecided;
    };
    let requests = super::fit::requests(desired, pod_level_gate);
    let capacity = |name: &str| {
        allocatable
            .get(name)
            .and_then(|q| podspec::resources::amount(name, q))
            .unwrap_or(0)
    };
    // Memory first, then cpu, as upstream.
    for name in ["memory", "cpu"] {
        let req = requests.get(name).copied().unwrap_or(0);
        let cap = capacity(name);
        if req > cap {
            return pending(
                REASON_INFEASIBLE,
                format!(
                    "Node didn't have enough capacity: {name}, requested: {req}, capacity: {cap}"
                ),
            );
        }
    }
    match super::fit::check(desired, used, allocatable, pod_level_gate) {
        Some((_, message)) => pending(REASON_DEFERRED, message),
        None => Decision::Allocate,
    }
}

/// True when the resize asks for more cpu or memory than is allocated (those go after the
/// ones that do not, as upstream orders pending resizes).
pub fn increases(desired: &Pod, allocated: &Pod, pod_level_gate: bool) -> bool {
    let want = super::fit::requests(desired, pod_level_gate);
    let have = super::fit::requests(allocated, pod_level_gate);
    ["cpu", "memory"]
        .iter()
        .any(|n| want.get(*n).copied().unwrap_or(0) > have.get(*n).copied().unwrap_or(0))
}
