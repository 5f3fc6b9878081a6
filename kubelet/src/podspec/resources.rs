//! Pod-level resources (`spec.resources`, upstream's `PodLevelResources` feature gate: alpha
//! in v1.32, beta and on by default since v1.34): which pod-level amounts count and what the
//! apiserver's defaulting would have filled in. Pure.
//!
//! Upstream's component-helpers only honour `cpu`, `memory` and `hugepages-<size>` at the pod
//! level; any other name the apiserver let through is ignored here as there.

use crate::quantity;
use k8s_openapi::api::core::v1::{PodSpec, ResourceRequirements};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use std::collections::BTreeMap;

/// The feature gate's name in `featureGates` / `--feature-gates`.
pub const GATE: &str = "PodLevelResources";

/// Upstream's IsSupportedPodLevelResource.
pub fn is_supported(name: &str) -> bool {
    name == "cpu" || name == "memory" || name.starts_with("hugepages-")
}

fn names_supported(m: &Option<BTreeMap<String, Quantity>>) -> bool {
    m.as_ref()
        .is_some_and(|m| m.keys().any(|k| is_supported(k)))
}

/// The pod-level requirements when the gate is on and they name a supported resource
/// (upstream's IsPodLevelResourcesSet), else None.
pub fn pod_level(spec: &PodSpec, enabled: bool) -> Option<&ResourceRequirements> {
    let r = spec.resources.as_ref().filter(|_| enabled)?;
    (names_supported(&r.requests) || names_supported(&r.limits)).then_some(r)
}

/// The pod-level requests after the apiserver's defaulting (a supported resource with a
/// pod-level limit and no pod-level request is requested at its limit), supported names only.
pub fn requests(r: &ResourceRequirements) -> BTreeMap<String, Quantity> {
    let mut out: BTreeMap<String, Quantity> = r
        .requests
        .iter()
        .flatten()
        .filter(|(k, _)| is_supported(k))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    for (k, v) in r.limits.iter().flatten() {
        if is_supported(k) {
            out.entry(k.clone()).or_insert_with(|| v.clone());
        }
    }
    out
}

/// The pod-level limits, supported names only.
pub fn limits(r: &ResourceRequirements) -> BTreeMap<String, Quantity> {
    r.limits
        .iter()
        .flatten()
        .filter(|(k, _)| is_supported(k))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

/// A resource's amount in upstream's units: millicores for `cpu`, else the value (bytes).
pub fn amount(name: &str, q: &Quantity) -> Option<i128> {
    if name == "cpu" {
        quantity::milli(q).ok()
    } else {
        quantity::value(q).ok()
    }
}

/// The pod-level limit of `name` when the gate is on and pod-level resources are set, and
/// the limit is not zero (upstream's getCPULimit/getMemoryLimit fallback for a container
/// without its own limit).
pub fn pod_limit(spec: &PodSpec, enabled: bool, name: &str) -> Option<i128> {
    let r = pod_level(spec, enabled)?;
    let q = r.limits.as_ref()?.get(name)?;
    amount(name, q).filter(|v| *v != 0)
}
