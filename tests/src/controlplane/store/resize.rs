//! `pods/resize` as upstream's podResizeStrategy defines it: the stored pod with only its
//! containers' (and init containers') `resources` and `resizePolicy` taken from the request;
//! a change to any resource other than cpu and memory is refused. The spec changes, so the
//! generation moves (the common update path bumps it).

use serde_json::Value;

use crate::controlplane::status::ApiError;

/// The stored pod `existing` after the resize request `new`.
pub fn resized(existing: &Value, new: &Value, name: &str) -> Result<Value, ApiError> {
    let mut out = existing.clone();
    for list in ["containers", "initContainers"] {
        let Some(stored) = out
            .get_mut("spec")
            .and_then(|s| s.get_mut(list))
            .and_then(Value::as_array_mut)
        else {
            continue;
        };
        let asked = new
            .pointer(&format!("/spec/{list}"))
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        for c in stored.iter_mut() {
            let cname = c.get("name").cloned();
            let Some(req) = asked.iter().find(|a| a.get("name") == cname.as_ref()) else {
                continue;
            };
            let before = c.get("resources").cloned().unwrap_or(Value::Null);
            let after = req.get("resources").cloned().unwrap_or(Value::Null);
            if only_cpu_memory_changed(&before, &after).is_err() {
                return Err(ApiError::invalid(
                    "Pod",
                    name,
                    "spec",
                    "FieldValueForbidden",
                    "Forbidden: only cpu and memory resources are mutable",
                ));
            }
            for field in ["resources", "resizePolicy"] {
                match req.get(field) {
                    Some(v) => c[field] = v.clone(),
                    None => {
                        if let Some(m) = c.as_object_mut() {
                            m.remove(field);
                        }
                    }
                }
            }
        }
    }
    Ok(out)
}

/// Err when a resource other than cpu and memory differs between `a` and `b`.
fn only_cpu_memory_changed(a: &Value, b: &Value) -> Result<(), ()> {
    for list in ["requests", "limits"] {
        let names = |v: &Value| -> Vec<(String, Value)> {
            v.get(list)
                .and_then(Value::as_object)
                .map(|m| {
                    m.iter()
                        .filter(|(k, _)| *k != "cpu" && *k != "memory")
                        .map(|(k, v)| (k.clone(), v.clone()))
                        .collect()
                })
                .unwrap_or_default()
        };
        if names(a) != names(b) {
            return Err(());
        }
    }
    if a.get("claims") != b.get("claims") {
        return Err(());
    }
    Ok(())
}
