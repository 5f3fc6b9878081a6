//! The part of upstream's node lifecycle controller a node agent's tests notice
//! (TaintNodesByCondition): a Node whose status reports MemoryPressure, DiskPressure or
//! PIDPressure True gets the matching `NoSchedule` taint, removed again when the condition goes
//! back. Applied when the Node's status is written (upstream's controller does it moments
//! later). Not-ready / unreachable taints and taint-based eviction are not done here.

use serde_json::{Value, json};

/// Condition type → the taint key it sets when True.
const PRESSURE_TAINTS: [(&str, &str); 3] = [
    ("MemoryPressure", "node.kubernetes.io/memory-pressure"),
    ("DiskPressure", "node.kubernetes.io/disk-pressure"),
    ("PIDPressure", "node.kubernetes.io/pid-pressure"),
];

/// Updates `node.spec.taints` from `node.status.conditions`.
pub(super) fn taint_by_condition(node: &mut Value) {
    let conditions = node
        .pointer("/status/conditions")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let is_true = |ty: &str| {
        conditions
            .iter()
            .any(|c| c["type"] == ty && c["status"] == "True")
    };
    let mut taints: Vec<Value> = node
        .pointer("/spec/taints")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let before = taints.clone();
    for (ty, key) in PRESSURE_TAINTS {
        let has = |t: &Value| t["key"] == key && t["effect"] == "NoSchedule";
        if is_true(ty) {
            if !taints.iter().any(has) {
                taints.push(json!({"key": key, "effect": "NoSchedule"}));
            }
        } else {
            taints.retain(|t| !has(t));
        }
    }
    if taints == before {
        return;
    }
    if !node.get("spec").is_some_and(Value::is_object) {
        node["spec"] = json!({});
    }
    if taints.is_empty() {
        if let Some(s) = node["spec"].as_object_mut() {
            s.remove("taints");
        }
    } else {
        node["spec"]["taints"] = Value::Array(taints);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pressure_conditions_taint_the_node_and_untaint_it() {
        let mut node = json!({
            "spec": {"taints": [{"key": "mine", "effect": "NoExecute"}]},
            "status": {"conditions": [
                {"type": "MemoryPressure", "status": "True"},
                {"type": "DiskPressure", "status": "False"}]}
        });
        taint_by_condition(&mut node);
        assert_eq!(
            node["spec"]["taints"],
            json!([{"key": "mine", "effect": "NoExecute"},
                   {"key": "node.kubernetes.io/memory-pressure", "effect": "NoSchedule"}])
        );
        node["status"]["conditions"][0]["status"] = json!("False");
        taint_by_condition(&mut node);
        assert_eq!(
            node["spec"]["taints"],
            json!([{"key": "mine", "effect": "NoExecute"}])
        );
    }
}
