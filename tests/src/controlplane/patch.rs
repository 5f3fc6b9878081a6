//! The patch formats the apiserver accepts, applied to `serde_json::Value`s.
//!
//! - JSON merge patch (RFC 7386).
//! - A strategic merge patch good enough for node-agent traffic: lists named in
//!   [`merge_key`] merge by their key (conditions by `type`, container statuses by
//!   `name`, ...), `finalizers` merge as a set, every other list is replaced; the
//!   directives `$patch` (`delete`/`replace`/`merge`), `$retainKeys`,
//!   `$deleteFromPrimitiveList/<f>` are honoured and `$setElementOrder/<f>` reorders.
//! - JSON patch (RFC 6902).

use serde_json::{Map, Value};

use super::status::ApiError;

/// RFC 7386 merge of `patch` into `target`.
pub fn merge_patch(target: &mut Value, patch: &Value) {
    let Value::Object(p) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    let t = target.as_object_mut().expect("object");
    for (k, v) in p {
        if v.is_null() {
            t.remove(k);
        } else {
            merge_patch(t.entry(k.clone()).or_insert(Value::Null), v);
        }
    }
}

/// The strategic-merge key of the list stored under `field`, judged by the
/// list's items (`ports` of containers merge by `containerPort`, of services by `port`).
fn merge_key(field: &str, sample: Option<&Value>) -> Option<&'static str> {
    let has = |k: &str| sample.and_then(|s| s.get(k)).is_some();
    match field {
        "conditions" => Some("type"),
        "containerStatuses" | "initContainerStatuses" | "ephemeralContainerStatuses" => {
            Some("name")
        }
        "containers" | "initContainers" | "ephemeralContainers" => Some("name"),
        "env" | "volumes" | "imagePullSecrets" | "resourceClaimStatuses" | "volumesAttached" => {
            Some("name")
        }
        "volumeMounts" => Some("mountPath"),
        "volumeDevices" => Some("devicePath"),
        "podIPs" | "hostIPs" => Some("ip"),
        "ownerReferences" => Some("uid"),
        "taints" => Some("key"),
        "addresses" if sample.is_none_or(Value::is_object) => Some("type"),
        "ports" if has("containerPort") => Some("containerPort"),
        "ports" if sample.is_none_or(Value::is_object) => Some("port"),
        _ => None,
    }
}

fn is_primitive_set(field: &str) -> bool {
    field == "finalizers"
}

/// Strategic merge of `patch` into `target`.
pub fn strategic_merge(target: &mut Value, patch: &Value) -> Result<(), ApiError> {
    let Value::Object(p) = patch else {
        *target = patch.clone();
        return Ok(());
    };
    if p.get("$patch").and_then(Value::as_str) == Some("replace") {
        let mut clean = p.clone();
        clean.remove("$patch");
        *target = Value::Object(clean);
        strip_directives(target);
        return Ok(());
    }
    if p.get("$patch").and_then(Value::as_str) == Some("delete") {
        *target = Value::Null;
        return Ok(());
    }
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    let t = target.as_object_mut().expect("object");

    // Directives first.
    let mut orders: Vec<(String, Vec<Value>, Vec<Value>)> = Vec::new();
    for (k, v) in p {
        if let Some(field) = k.strip_prefix("$deleteFromPrimitiveList/") {
            let del = v.as_array().cloned().unwrap_or_default();
            if let Some(Value::Array(list)) = t.get_mut(field) {
                list.retain(|x| !del.contains(x));
            }
        } else if let Some(field) = k.strip_prefix("$setElementOrder/") {
            let live = t.get(field).and_then(Value::as_array).cloned();
            orders.push((
                field.to_string(),
                v.as_array().cloned().unwrap_or_default(),
                live.unwrap_or_default(),
            ));
        }
    }
    if let Some(Value::Array(keep)) = p.get("$retainKeys") {
        let keep: Vec<&str> = keep.iter().filter_map(Value::as_str).collect();
        t.retain(|k, _| keep.contains(&k.as_str()) || p.contains_key(k));
    }

    for (k, v) in p {
        if k.starts_with('$') {
            continue;
        }
        if v.is_null() {
            t.remove(k);
            continue;
        }
        match v {
            Value::Array(items) => {
                let existing = t.get(k).and_then(Value::as_array).cloned();
                let merged = merge_list(k, existing, items)?;
                t.insert(k.clone(), Value::Array(merged));
            }
            Value::Object(_) => {
                let slot = t.entry(k.clone()).or_insert(Value::Null);
                strategic_merge(slot, v)?;
                if slot.is_null() {
                    t.remove(k);
                }
            }
            _ => {
                t.insert(k.clone(), v.clone());
            }
        }
    }

    for (field, order, live) in orders {
        if let Some(Value::Array(list)) = t.get_mut(&field) {
            reorder(&field, list, &order, &live);
        }
    }
    Ok(())
}

fn merge_list(
    field: &str,
    existing: Option<Vec<Value>>,
    patch: &[Value],
) -> Result<Vec<Value>, ApiError> {
    // A list-level `$patch: replace` item replaces the whole list.
    if patch
        .iter()
        .any(|i| i.get("$patch").and_then(Value::as_str) == Some("replace"))
    {
        return Ok(patch
            .iter()
            .filter(|i| i.get("$patch").is_none())
            .cloned()
            .map(|mut v| {
                strip_directives(&mut v);
                v
            })
            .collect());
    }
    let Some(mut out) = existing else {
        return Ok(patch
            .iter()
            .filter(|i| i.get("$patch").and_then(Value::as_str) != Some("delete"))
            .cloned()
            .map(|mut v| {
                strip_directives(&mut v);
                v
            })
            .collect());
    };
    if is_primitive_set(field) {
        for item in patch {
            if !out.contains(item) {
                out.push(item.clone());
            }
        }
        return Ok(out);
    }
    let Some(key) = merge_key(field, patch.first().or(out.first())) else {
        let mut v = patch.to_vec();
        v.iter_mut().for_each(strip_directives);
        return Ok(v);
    };
    for item in patch {
        let Some(kv) = item.get(key) else {
            return Err(ApiError::bad_request(format!(
                "map: {item} does not contain declared merge key: {key}"
            )));
        };
        let pos = out.iter().position(|e| e.get(key) == Some(kv));
        let delete = item.get("$patch").and_then(Value::as_str) == Some("delete");
        match (pos, delete) {
            (Some(i), true) => {
                out.remove(i);
            }
            (None, true) => {}
            (Some(i), false) => strategic_merge(&mut out[i], item)?,
            (None, false) => {
                let mut v = item.clone();
                strip_directives(&mut v);
                out.push(v);
            }
        }
    }
    Ok(out)
}

/// Upstream's `normalizeElementOrder`: the items named in `$setElementOrder` take its
/// order; the others (only on the server) keep theirs and stay in front of the named items
/// that came after them in the live list (`live`, the list before the patch).
fn reorder(field: &str, list: &mut Vec<Value>, order: &[Value], live: &[Value]) {
    let key = merge_key(field, list.first());
    let ident = |v: &Value| -> Value {
        match key {
            Some(k) => v.get(k).cloned().unwrap_or(Value::Null),
            None => v.clone(),
        }
    };
    let rank_in = |v: &Value, set: &[Value]| {
        let id = ident(v);
        set.iter().position(|o| match key {
            Some(k) => o.get(k) == Some(&id),
            None => *o == id,
        })
    };
    let (mut named, server_only): (Vec<Value>, Vec<Value>) =
        list.drain(..).partition(|v| rank_in(v, order).is_some());
    named.sort_by_key(|v| rank_in(v, order));
    let live_rank = |v: &Value| live.iter().position(|l| ident(l) == ident(v));
    let (mut i, mut j) = (0, 0);
    while i < server_only.len() || j < named.len() {
        let left_first = match (server_only.get(i), named.get(j)) {
            (Some(_), None) => true,
            (None, _) => false,
            (Some(l), Some(r)) => {
                matches!((live_rank(l), live_rank(r)), (Some(a), Some(b)) if a < b)
            }
        };
        if left_first {
            list.push(server_only[i].clone());
            i += 1;
        } else {
            list.push(named[j].clone());
            j += 1;
        }
    }
}

fn strip_directives(v: &mut Value) {
    match v {
        Value::Object(m) => {
            m.retain(|k, _| !k.starts_with('$'));
            m.values_mut().for_each(strip_directives);
        }
        Value::Array(a) => a.iter_mut().for_each(strip_directives),
        _ => {}
    }
}

fn unescape_token(t: &str) -> String {
    t.replace("~1", "/").replace("~0", "~")
}

fn pointer_parent<'a>(doc: &'a mut Value, path: &str) -> Result<(&'a mut Value, String), ApiError> {
    if path.is_empty() {
        return Err(ApiError::bad_request(
            "json patch: the root cannot be the target here",
        ));
    }
    let (parent, last) = path
        .rsplit_once('/')
        .ok_or_else(|| ApiError::bad_request(format!("json patch: invalid path {path:?}")))?;
    let parent_v = doc
        .pointer_mut(parent)
        .ok_or_else(|| ApiError::invalid_patch(format!("doc is missing path: \"{path}\"")))?;
    Ok((parent_v, unescape_token(last)))
}

fn jp_add(doc: &mut Value, path: &str, value: Value) -> Result<(), ApiError> {
    if path.is_empty() {
        *doc = value;
        return Ok(());
    }
    let (parent, last) = pointer_parent(doc, path)?;
    match parent {
        Value::Object(m) => {
            m.insert(last, value);
            Ok(())
        }
        Value::Array(a) => {
            if last == "-" {
                a.push(value);
                return Ok(());
            }
            let i: usize = last
                .parse()
                .map_err(|_| ApiError::invalid_patch(format!("invalid array index {last:?}")))?;
            if i > a.len() {
                return Err(ApiError::invalid_patch(format!(
                    "add operation does not apply: index {i} out of bounds"
                )));
            }
            a.insert(i, value);
            Ok(())
        }
        _ => Err(ApiError::invalid_patch(format!(
            "doc is missing path: \"{path}\""
        ))),
    }
}

fn jp_remove(doc: &mut Value, path: &str) -> Result<Value, ApiError> {
    let (parent, last) = pointer_parent(doc, path)?;
    let missing = || {
        ApiError::invalid_patch(format!(
            "remove operation does not apply: doc is missing path: \"{path}\""
        ))
    };
    match parent {
        Value::Object(m) => m.remove(&last).ok_or_else(missing),
        Value::Array(a) => {
            let i: usize = last.parse().map_err(|_| missing())?;
            if i < a.len() {
                Ok(a.remove(i))
            } else {
                Err(missing())
            }
        }
        _ => Err(missing()),
    }
}

/// RFC 6902 JSON patch.
pub fn json_patch(doc: &mut Value, ops: &Value) -> Result<(), ApiError> {
    let ops = ops
        .as_array()
        .ok_or_else(|| ApiError::bad_request("json patch: the patch must be a JSON array"))?;
    for op in ops {
        let kind = op.get("op").and_then(Value::as_str).unwrap_or("");
        let path = op.get("path").and_then(Value::as_str).unwrap_or("");
        let value = || {
            op.get("value")
                .cloned()
                .ok_or_else(|| ApiError::bad_request(format!("json patch: {kind} needs a value")))
        };
        let from = || {
            op.get("from")
                .and_then(Value::as_str)
                .map(str::to_string)
                .ok_or_else(|| ApiError::bad_request(format!("json patch: {kind} needs from")))
        };
        match kind {
            "add" => jp_add(doc, path, value()?)?,
            "remove" => {
                jp_remove(doc, path)?;
            }
            "replace" => {
                let v = value()?;
                let slot = doc.pointer_mut(path).ok_or_else(|| {
                    ApiError::invalid_patch(format!(
                        "replace operation does not apply: doc is missing key: {path}"
                    ))
                })?;
                *slot = v;
            }
            "move" => {
                let v = jp_remove(doc, &from()?)?;
                jp_add(doc, path, v)?;
            }
            "copy" => {
                let f = from()?;
                let v = doc.pointer(&f).cloned().ok_or_else(|| {
                    ApiError::invalid_patch(format!(
                        "copy operation does not apply: doc is missing from path: {f}"
                    ))
                })?;
                jp_add(doc, path, v)?;
            }
            "test" => {
                let want = value()?;
                if doc.pointer(path) != Some(&want) {
                    return Err(ApiError::invalid_patch(format!(
                        "testing value {path} failed: test failed"
                    )));
                }
            }
            other => {
                return Err(ApiError::bad_request(format!(
                    "json patch: unexpected kind of operation {other:?}"
                )));
            }
        }
    }
    Ok(())
}

impl ApiError {
    /// A patch that cannot be applied to the object (upstream: 422 without details).
    pub fn invalid_patch(msg: String) -> Self {
        Self::new(422, "Invalid", msg)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn merge_patch_rfc7386() {
        let mut t = json!({"a": "b", "c": {"d": "e", "f": "g"}});
        merge_patch(&mut t, &json!({"a": "z", "c": {"f": null}}));
        assert_eq!(t, json!({"a": "z", "c": {"d": "e"}}));
    }

    #[test]
    fn strategic_conditions_merge_by_type() {
        let mut t = json!({"status": {"conditions": [
            {"type": "PodScheduled", "status": "True"},
            {"type": "Ready", "status": "False"}
        ], "containerStatuses": [{"name": "a", "ready": false}, {"name": "b", "ready": false}]},
        "metadata": {"finalizers": ["x"]}});
        let p = json!({"status": {
            "$setElementOrder/conditions": [{"type": "Ready"}, {"type": "PodScheduled"}],
            "conditions": [{"type": "Ready", "status": "True"}],
            "containerStatuses": [{"name": "b", "ready": true}]},
            "metadata": {"finalizers": ["y"]}});
        strategic_merge(&mut t, &p).unwrap();
        assert_eq!(
            t["status"]["conditions"],
            json!([{"type": "Ready", "status": "True"}, {"type": "PodScheduled", "status": "True"}])
        );
        assert_eq!(t["status"]["containerStatuses"][0]["ready"], json!(false));
        assert_eq!(t["status"]["containerStatuses"][1]["ready"], json!(true));
        assert_eq!(t["metadata"]["finalizers"], json!(["x", "y"]));

        let p = json!({"status": {"conditions": [{"type": "Ready", "$patch": "delete"}]}});
        strategic_merge(&mut t, &p).unwrap();
        assert_eq!(t["status"]["conditions"].as_array().unwrap().len(), 1);
    }

    /// What the kubelet's node status patch sends (upstream's PatchNodeStatus): conditions
    /// by type in `$setElementOrder` order, others' conditions and resources untouched, a
    /// `null` resource key removed, addresses replaced whole (two of one type survive).
    #[test]
    fn strategic_node_status_patch_as_the_kubelet_sends_it() {
        let mut t = json!({"status": {
            "conditions": [
                {"type": "NetworkUnavailable", "status": "False"},
                {"type": "Ready", "status": "False", "reason": "KubeletNotReady"},
                {"type": "KernelDeadlock", "status": "True"},
                {"type": "Gone", "status": "True"}],
            "capacity": {"cpu": "2", "example.com/dongle": "4"},
            "allocatable": {"cpu": "2", "example.com/old": "1"},
            "addresses": [{"type": "InternalIP", "address": "10.0.0.1"}]}});
        let p = json!({"status": {
            "$setElementOrder/conditions": [{"type": "NetworkUnavailable"}, {"type": "Ready"},
                                            {"type": "KernelDeadlock"}],
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"},
                           {"type": "Gone", "$patch": "delete"}],
            "allocatable": {"example.com/dongle": "4", "example.com/old": null},
            "addresses": [{"type": "InternalIP", "address": "10.0.0.5"},
                          {"type": "InternalIP", "address": "fd00::5"},
                          {"$patch": "replace"}]}});
        strategic_merge(&mut t, &p).unwrap();
        assert_eq!(
            t["status"]["conditions"],
            json!([{"type": "NetworkUnavailable", "status": "False"},
                   {"type": "Ready", "status": "True", "reason": "KubeletReady"},
                   {"type": "KernelDeadlock", "status": "True"}])
        );
        assert_eq!(
            t["status"]["capacity"],
            json!({"cpu": "2", "example.com/dongle": "4"})
        );
        assert_eq!(
            t["status"]["allocatable"],
            json!({"cpu": "2", "example.com/dongle": "4"})
        );
        assert_eq!(
            t["status"]["addresses"],
            json!([{"type": "InternalIP", "address": "10.0.0.5"},
                   {"type": "InternalIP", "address": "fd00::5"}])
        );
    }

    /// An item only on the server keeps its place relative to the live list (upstream's
    /// mergeSortedSlice), not pushed to the end.
    #[test]
    fn set_element_order_keeps_server_only_items_in_place() {
        let mut t = json!({"conditions": [{"type": "A"}, {"type": "NPD"}, {"type": "B"}]});
        let p = json!({"$setElementOrder/conditions": [{"type": "A"}, {"type": "B"}, {"type": "C"}],
                       "conditions": [{"type": "C"}]});
        strategic_merge(&mut t, &p).unwrap();
        assert_eq!(
            t["conditions"],
            json!([{"type": "A"}, {"type": "NPD"}, {"type": "B"}, {"type": "C"}])
        );
    }

    #[test]
    fn json_patch_ops() {
        let mut t = json!({"metadata": {"labels": {"a": "1"}}, "l": [1, 2]});
        json_patch(
            &mut t,
            &json!([
                {"op": "test", "path": "/metadata/labels/a", "value": "1"},
                {"op": "add", "path": "/metadata/labels/b~1c", "value": "2"},
                {"op": "remove", "path": "/metadata/labels/a"},
                {"op": "add", "path": "/l/-", "value": 3},
                {"op": "replace", "path": "/l/0", "value": 0},
                {"op": "copy", "from": "/l/0", "path": "/z"},
            ]),
        )
        .unwrap();
        assert_eq!(
            t,
            json!({"metadata": {"labels": {"b/c": "2"}}, "l": [0, 2, 3], "z": 0})
        );
        let err =
            json_patch(&mut t, &json!([{"op": "test", "path": "/z", "value": 9}])).unwrap_err();
        assert_eq!(err.code, 422);
    }
}
