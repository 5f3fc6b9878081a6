//! The node status write as upstream's `nodeutil.PatchNodeStatus`: the Node is read, the
//! kubelet's setters change only what it owns, and the difference goes out as a strategic
//! two-way merge patch. Conditions merge by `type` (with `$setElementOrder/conditions`),
//! resource maps by key (a removed key is `null`), so the conditions, capacity and
//! allocatable that other components write survive. Addresses are the exception upstream
//! makes: their `type` merge key is not unique (two `InternalIP`s), so a changed list is
//! sent whole with a `$patch: replace` item.

use k8s_openapi::api::core::v1::NodeStatus;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use serde_json::{Map, Value, json};
use std::collections::BTreeMap;

/// `{"status": …}` turning `old` into `new`; None when they are equal.
pub fn status_patch(old: &NodeStatus, new: &NodeStatus) -> Option<Value> {
    let old_v = to_object(old);
    let new_v = to_object(new);
    let old_addresses = old_v.get("addresses").filter(|a| is_non_empty_array(a));
    let replace_addresses =
        old_addresses.is_some() && old_v.get("addresses") != new_v.get("addresses");
    let mut diff_new = new_v.clone();
    if let Some(a) = old_addresses.filter(|_| replace_addresses) {
        diff_new.insert("addresses".into(), a.clone());
    }
    let mut patch = diff_object(&old_v, &diff_new, true);
    if replace_addresses {
        let mut list = new_v
            .get("addresses")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        list.push(json!({"$patch": "replace"}));
        patch.insert("addresses".into(), Value::Array(list));
    }
    (!patch.is_empty()).then(|| json!({ "status": patch }))
}

fn is_non_empty_array(v: &Value) -> bool {
    v.as_array().is_some_and(|a| !a.is_empty())
}

fn to_object(s: &NodeStatus) -> Map<String, Value> {
    match serde_json::to_value(s) {
        Ok(Value::Object(m)) => m,
        _ => Map::new(),
    }
}

/// Keys of `new` that differ from `old` (objects recursively), `null` for keys gone.
/// At the status level `conditions` merge by `type`; every other list is atomic.
fn diff_object(
    old: &Map<String, Value>,
    new: &Map<String, Value>,
    top: bool,
) -> Map<String, Value> {
    let mut out = Map::new();
    for (k, nv) in new {
        let Some(ov) = old.get(k) else {
            out.insert(k.clone(), nv.clone());
            continue;
        };
        if ov == nv {
            continue;
        }
        match (ov, nv) {
            (Value::Object(o), Value::Object(n)) => {
                let d = diff_object(o, n, false);
                if !d.is_empty() {
                    out.insert(k.clone(), Value::Object(d));
                }
            }
            (Value::Array(o), Value::Array(n)) if top && k == "conditions" => {
                diff_keyed_list(k, "type", o, n, &mut out);
            }
            _ => {
                out.insert(k.clone(), nv.clone());
            }
        }
    }
    for k in old.keys() {
        if !new.contains_key(k) {
            out.insert(k.clone(), Value::Null);
        }
    }
    out
}

/// A list merged by `key`: changed items with their key and changed fields, new items whole,
/// removed ones as `$patch: delete`, and the new order as `$setElementOrder/<field>`.
fn diff_keyed_list(
    field: &str,
    key: &str,
    old: &[Value],
    new: &[Value],
    out: &mut Map<String, Value>,
) {
    let id = |v: &Value| v.get(key).cloned().unwrap_or(Value::Null);
    let mut items = Vec::new();
    for n in new {
        match (old.iter().find(|o| id(o) == id(n)), n) {
            (Some(o), _) if o == n => {}
            (Some(Value::Object(o)), Value::Object(nm)) => {
                let mut d = diff_object(o, nm, false);
                d.insert(key.into(), id(n));
                items.push(Value::Object(d));
            }
            _ => items.push(n.clone()),
        }
    }
    for o in old {
        if !new.iter().any(|n| id(n) == id(o)) {
            items.push(json!({"$patch": "delete", key: id(o)}));
        }
    }
    if !items.is_empty() {
        out.insert(field.into(), Value::Array(items));
    }
    let order = new.iter().map(|n| json!({ key: id(n) })).collect();
    out.insert(format!("$setElementOrder/{field}"), Value::Array(order));
}

/// The status as JSON with the conditions' heartbeat times removed: two statuses that
/// compare equal need no write before `nodeStatusReportFrequency` is due.
pub fn comparable(s: &NodeStatus) -> Value {
    let mut v = serde_json::to_value(s).unwrap_or_default();
    if let Some(cs) = v.get_mut("conditions").and_then(|c| c.as_array_mut()) {
        for c in cs {
            if let Some(o) = c.as_object_mut() {
                o.remove("lastHeartbeatTime");
            }
        }
    }
    v
}

/// Upstream's `IsExtendedResourceName`: a domain-qualified name outside `kubernetes.io`,
/// not a `requests.` quota name.
pub fn is_extended_resource(name: &str) -> bool {
    name.contains('/') && !name.contains("kubernetes.io/") && !name.starts_with("requests.")
}

/// Upstream's MachineInfo setter on the Node as read: the kubelet's own resources are set
/// in capacity, whatever else is there (an operator's extended resources) stays; extended
/// resources no longer in capacity leave allocatable; every other capacity entry is
/// allocatable as it is, and the kubelet's own allocatable (capacity − reservations) is set
/// over that.
pub fn merge_resources(
    prev: Option<&NodeStatus>,
    own_capacity: BTreeMap<String, Quantity>,
    own_allocatable: BTreeMap<String, Quantity>,
) -> (BTreeMap<String, Quantity>, BTreeMap<String, Quantity>) {
    let mut capacity = prev.and_then(|s| s.capacity.clone()).unwrap_or_default();
    capacity.extend(own_capacity);
    let mut allocatable = prev.and_then(|s| s.allocatable.clone()).unwrap_or_default();
    allocatable.retain(|k, _| capacity.contains_key(k) || !is_extended_resource(k));
    for (k, v) in &capacity {
        allocatable.insert(k.clone(), v.clone());
    }
    allocatable.extend(own_allocatable);
    (capacity, allocatable)
}

#[cfg(test)]
mod tests;
