//! Whether a pod's requests fit the node at admission (upstream's lifecycle predicate
//! admit handler running the scheduler's noderesources fit): every requested resource must
//! fit in allocatable minus what the pods already admitted request. Requests are upstream's
//! PodRequests: containers, sidecars, init containers, overhead, and pod-level `spec.resources`
//! in place of the containers' when set (and the `PodLevelResources` gate is on). Pure.

use crate::podspec::resources;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use std::collections::BTreeMap;

/// A pod's effective requests in upstream's units (cpu in millicores, the rest in values).
/// `pod_level_gate`: the `PodLevelResources` gate.
pub fn requests(pod: &Pod, pod_level_gate: bool) -> BTreeMap<String, i128> {
    crate::cm::pod_amounts(pod, false, pod_level_gate)
}

/// Adds `pod`'s requests to `used`.
pub fn add_requests(used: &mut BTreeMap<String, i128>, pod: &Pod, pod_level_gate: bool) {
    for (k, v) in requests(pod, pod_level_gate) {
        *used.entry(k).or_insert(0) += v;
    }
}

/// Upstream's IsExtendedResourceName, loosely: a qualified name outside `kubernetes.io/`.
/// Such a name the node does not list is dropped before the fit (removeMissingExtendedResources).
fn is_extended(name: &str) -> bool {
    name.contains('/') && !name.starts_with("kubernetes.io/") && !name.starts_with("requests.")
}

/// The first resource that does not fit, as upstream's rejection: reason `OutOf<resource>`,
/// message "Node didn't have enough resource: <resource>, requested: R, used: U, capacity: C".
/// cpu, memory and ephemeral-storage are checked first, then the others by name.
pub fn check(
    pod: &Pod,
    used: &BTreeMap<String, i128>,
    allocatable: &BTreeMap<String, Quantity>,
    pod_level_gate: bool,
) -> Option<(String, String)> {
    let want = requests(pod, pod_level_gate);
    let first = ["cpu", "memory", "ephemeral-storage"];
    let order = first.iter().map(|s| s.to_string()).chain(
        want.keys()
            .filter(|k| !first.contains(&k.as_str()))
            .cloned(),
    );
    for name in order {
        let Some(&req) = want.get(&name) else {
            continue;
        };
        if req <= 0 || name == "pods" {
            continue;
        }
        let cap = match allocatable.get(&name) {
            Some(q) => resources::amount(&name, q).unwrap_or(0),
            None if is_extended(&name) => continue,
            None => 0,
        };
        let in_use = used.get(&name).copied().unwrap_or(0);
        if req > cap - in_use {
            return Some((
                format!("OutOf{name}"),
                format!(
                    "Node didn't have enough resource: {name}, requested: {req}, used: {in_use}, capacity: {cap}"
                ),
            ));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(spec: serde_json::Value) -> Pod {
        serde_json::from_value(serde_json::json!({"metadata": {"name": "p"}, "spec": spec}))
            .unwrap()
    }

    fn alloc(pairs: &[(&str, &str)]) -> BTreeMap<String, Quantity> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), Quantity(v.to_string())))
            .collect()
    }

    /// Pod-level requests replace the containers' at admission: 1500m of pod-level cpu does
    /// not fit beside 3 CPUs used on a 4-CPU node, though the containers ask for 100m.
    #[test]
    fn pod_level_requests_decide_the_fit() {
        let p = pod(serde_json::json!({
            "resources": {"requests": {"cpu": "1500m", "memory": "64Mi"}},
            "containers": [{"name": "c", "resources": {"requests": {"cpu": "100m"}}}]
        }));
        assert_eq!(requests(&p, true)["cpu"], 1500);
        let a = alloc(&[("cpu", "4"), ("memory", "1Gi"), ("pods", "110")]);
        let used: BTreeMap<String, i128> = [("cpu".to_string(), 3000)].into();
        assert_eq!(
            check(&p, &used, &a, true),
            Some((
                "OutOfcpu".into(),
                "Node didn't have enough resource: cpu, requested: 1500, used: 3000, capacity: 4000"
                    .into()
            ))
        );
        assert_eq!(check(&p, &BTreeMap::new(), &a, true), None);
        // Pod-level limits alone default the requests (the apiserver's defaulting).
        let p = pod(serde_json::json!({
            "resources": {"limits": {"memory": "2Gi"}},
            "containers": [{"name": "c"}]
        }));
        assert_eq!(
            check(&p, &BTreeMap::new(), &a, true).unwrap().1,
            "Node didn't have enough resource: memory, requested: 2147483648, used: 0, capacity: 1073741824"
        );
    }

    #[test]
    fn unknown_extended_resources_are_dropped_but_missing_hugepages_are_not() {
        let a = alloc(&[("cpu", "4"), ("memory", "1Gi")]);
        let p = pod(serde_json::json!({"containers": [{"name": "c",
            "resources": {"requests": {"example.com/dongle": "1"}, "limits": {"example.com/dongle": "1"}}}]}));
        assert_eq!(check(&p, &BTreeMap::new(), &a, true), None);
        let p = pod(serde_json::json!({"containers": [{"name": "c",
            "resources": {"requests": {"hugepages-2Mi": "2Mi", "memory": "1Mi"}, "limits": {"hugepages-2Mi": "2Mi", "memory": "1Mi"}}}]}));
        assert_eq!(
            check(&p, &BTreeMap::new(), &a, true).unwrap().0,
            "OutOfhugepages-2Mi"
        );
    }
}
