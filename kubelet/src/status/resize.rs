//! The in-place resize parts of a pod's status (upstream's status manager and
//! convertToAPIContainerStatuses): `allocatedResources` (the allocated requests) and
//! `resources` (what a running container runs with) of each resizable container, and the
//! `PodResizePending` and `PodResizeInProgress` conditions. Pure.

use crate::allocation::{Pending, PodAllocation};
use k8s_openapi::api::core::v1::{PodCondition, PodStatus, ResourceRequirements};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use std::collections::BTreeMap;

pub const PENDING: &str = "PodResizePending";
pub const IN_PROGRESS: &str = "PodResizeInProgress";
/// Upstream's `PodReasonError`, the in-progress reason when actuating failed.
pub const REASON_ERROR: &str = "Error";

/// What the resize fields are computed from.
#[derive(Debug, Default)]
pub struct ResizeView<'a> {
    /// The pod's allocation (None: not admitted through the allocation, e.g. a static pod).
    pub allocated: Option<&'a PodAllocation>,
    /// Running container name → the resources it runs with.
    pub running_with: BTreeMap<String, ResourceRequirements>,
    pub pending: Option<&'a Pending>,
    /// Some while a resize is being actuated, with the error of the last attempt if it failed.
    pub in_progress: Option<Option<String>>,
    /// The pod's `metadata.generation`.
    pub generation: Option<i64>,
}

/// `requirements` without claims and empty lists (as the API shows them).
fn shown(r: &ResourceRequirements) -> ResourceRequirements {
    ResourceRequirements {
        limits: r.limits.clone().filter(|l| !l.is_empty()),
        requests: r.requests.clone().filter(|l| !l.is_empty()),
        claims: None,
    }
}

fn condition(
    type_: &str,
    reason: Option<&str>,
    message: Option<&str>,
    generation: Option<i64>,
    prev: Option<&PodStatus>,
) -> PodCondition {
    // A condition that stays True keeps its transition time.
    let since = prev
        .and_then(|p| p.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == type_ && c.status == "True"))
        .and_then(|c| c.last_transition_time.clone())
        .unwrap_or_else(|| Time(Timestamp::now()));
    PodCondition {
        type_: type_.into(),
        status: "True".into(),
        reason: reason.filter(|r| !r.is_empty()).map(str::to_string),
        message: message.filter(|m| !m.is_empty()).map(str::to_string),
        last_transition_time: Some(since),
        last_probe_time: None,
        observed_generation: generation,
    }
}

/// Sets the resize fields of `st` (computed without them) from `view`.
pub fn apply(st: &mut PodStatus, view: &ResizeView<'_>, prev: Option<&PodStatus>) {
    if let Some(alloc) = view.allocated {
        for cs in st
            .container_statuses
            .iter_mut()
            .flatten()
            .chain(st.init_container_statuses.iter_mut().flatten())
        {
            let Some(r) = alloc.get(&cs.name) else {
                continue;
            };
            cs.allocated_resources = r.requests.clone().filter(|l| !l.is_empty());
            let running = cs.state.as_ref().is_some_and(|s| s.running.is_some());
            cs.resources = if running {
                Some(shown(view.running_with.get(&cs.name).unwrap_or(r)))
            } else {
                None
            };
        }
    }
    let conds = st.conditions.get_or_insert_with(Vec::new);
    conds.retain(|c| c.type_ != PENDING && c.type_ != IN_PROGRESS);
    if let Some(p) = view.pending {
        conds.push(condition(
            PENDING,
            Some(&p.reason),
            Some(&p.message),
            p.generation,
            prev,
        ));
    }
    if let Some(error) = &view.in_progress {
        let reason = error.as_ref().map(|_| REASON_ERROR);
        conds.push(condition(
            IN_PROGRESS,
            reason,
            error.as_deref(),
            view.generation,
            prev,
        ));
    }
}

#[cfg(test)]
mod tests;
