//! The downward API's field references, shared by a container's env (`spec`) and
//! downwardAPI volumes (`volume`): `fieldRef` paths and `resourceFieldRef` values, with the
//! defaults an unset `limits.*` reads.

use super::resources;
use k8s_openapi::api::core::v1::{Container, Pod};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use plumbing::quantity;
use std::collections::BTreeMap;

/// A field reference the downward API does not know (reported as the container's or the
/// volume's config error).
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
#[error("{0}")]
pub struct FieldRefError(pub String);

pub fn field_ref(
    pod: &Pod,
    path: &str,
    pod_ips: &[String],
    host_ips: &[String],
) -> Result<String, FieldRefError> {
    let m = &pod.metadata;
    let spec = pod.spec.clone().unwrap_or_default();
    let keyed = |prefix: &str, map: &Option<BTreeMap<String, String>>| {
        path.strip_prefix(prefix)
            .and_then(|r| r.strip_suffix("']"))
            .map(|k| {
                map.as_ref()
                    .and_then(|m| m.get(k))
                    .cloned()
                    .unwrap_or_default()
            })
    };
    if let Some(v) = keyed("metadata.labels['", &m.labels) {
        return Ok(v);
    }
    if let Some(v) = keyed("metadata.annotations['", &m.annotations) {
        return Ok(v);
    }
    Ok(match path {
        "metadata.name" => m.name.clone().unwrap_or_default(),
        "metadata.namespace" => m.namespace.clone().unwrap_or_default(),
        "metadata.uid" => m.uid.clone().unwrap_or_default(),
        "spec.nodeName" => spec.node_name.unwrap_or_default(),
        "spec.serviceAccountName" => spec.service_account_name.unwrap_or_default(),
        "status.podIP" => pod_ips.first().cloned().unwrap_or_default(),
        "status.podIPs" => pod_ips.join(","),
        "status.hostIP" => host_ips.first().cloned().unwrap_or_default(),
        "status.hostIPs" => host_ips.join(","),
        other => {
            return Err(FieldRefError(format!(
                "unsupported fieldRef path {other:?}"
            )));
        }
    })
}

/// The downward API's `limits.*` resources that fall back to a default when a container
/// has no (or a zero) limit of its own (upstream's MergeContainerResourceLimits; huge pages
/// never do: they are never overcommitted).
const DEFAULTED_LIMITS: [&str; 3] = ["cpu", "memory", "ephemeral-storage"];

/// What a container's env reads for `limits.cpu`, `limits.memory` and
/// `limits.ephemeral-storage` when it has no such limit, as upstream's
/// defaultPodLimitsForDownwardAPI: the node's allocatable, except that with the
/// `PodLevelResources` gate on and pod-level limits set, a non-zero pod-level limit of a
/// resource the pod level supports (cpu, memory) replaces the allocatable one (only where
/// the allocatable lists that resource).
pub fn limit_defaults(
    pod: &Pod,
    allocatable: &BTreeMap<String, Quantity>,
    pod_level_gate: bool,
) -> BTreeMap<String, Quantity> {
    let mut out = allocatable.clone();
    let spec = pod.spec.clone().unwrap_or_default();
    let pod_limits = spec
        .resources
        .as_ref()
        .filter(|_| pod_level_gate)
        .and_then(|r| r.limits.as_ref())
        .filter(|l| l.keys().any(|k| resources::is_supported(k)));
    for (name, q) in pod_limits.into_iter().flatten() {
        let applies = DEFAULTED_LIMITS.contains(&name.as_str())
            && resources::is_supported(name)
            && resources::amount(name, q).is_some_and(|v| v != 0);
        if applies && let Some(slot) = out.get_mut(name) {
            *slot = q.clone();
        }
    }
    out
}

/// A container's `limits.<name>` / `requests.<name>` in units of `divisor` (default 1),
/// rounded up, as a resourceFieldRef reads it: cpu in millicores over the divisor's,
/// anything else in whole units (bytes). A `limits.cpu`, `limits.memory` or
/// `limits.ephemeral-storage` the container does not set (or sets to 0) reads `defaults`
/// (see [`limit_defaults`]; an empty map keeps 0).
pub fn resource_field_value(
    c: &Container,
    resource: &str,
    divisor: Option<&Quantity>,
    defaults: &BTreeMap<String, Quantity>,
) -> Result<String, FieldRefError> {
    let res = c.resources.clone().unwrap_or_default();
    let (is_limit, key) = match resource.split_once('.') {
        Some(("limits", k)) => (true, k),
        Some(("requests", k)) => (false, k),
        _ => {
            return Err(FieldRefError(format!(
                "unsupported resourceFieldRef {resource:?}"
            )));
        }
    };
    let map = if is_limit { res.limits } else { res.requests }.unwrap_or_default();
    let amount = |q: &Quantity| {
        if key == "cpu" {
            quantity::milli(q).ok()
        } else {
            quantity::value(q).ok()
        }
    };
    let mut v = map.get(key).and_then(amount).unwrap_or(0);
    if is_limit && v == 0 && DEFAULTED_LIMITS.contains(&key) {
        v = defaults.get(key).and_then(amount).unwrap_or(0);
    }
    let divisor = divisor
        .and_then(amount)
        .filter(|d| *d > 0)
        .unwrap_or(if key == "cpu" { 1000 } else { 1 });
    Ok(v.div_euclid(divisor)
        .saturating_add(i128::from(v.rem_euclid(divisor) != 0))
        .to_string())
}
