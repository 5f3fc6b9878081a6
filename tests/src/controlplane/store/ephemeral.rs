//! The `pods/ephemeralcontainers` subresource as upstream's podEphemeralContainersStrategy
//! defines it: an update changes only `spec.ephemeralContainers` (everything else is kept from
//! the stored pod; the spec change bumps the generation), existing ephemeral containers may
//! be neither removed nor changed, names are unique across all of the pod's containers, an
//! ephemeral container has no ports, probes, lifecycle, resources or restart policy, its
//! target must be one of the pod's containers, and static (mirror) pods take none.

use serde_json::{Value, json};

use crate::controlplane::status::ApiError;

/// Fields of a container an ephemeral container may not set (upstream's allow list, in the
/// order of the API type).
const FORBIDDEN: [&str; 9] = [
    "ports",
    "resources",
    "resizePolicy",
    "restartPolicy",
    "restartPolicyRules",
    "livenessProbe",
    "readinessProbe",
    "startupProbe",
    "lifecycle",
];

fn list<'a>(obj: &'a Value, field: &str) -> &'a [Value] {
    obj.pointer(&format!("/spec/{field}"))
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default()
}

fn name_of(c: &Value) -> &str {
    c.get("name").and_then(Value::as_str).unwrap_or("")
}

fn set(v: Option<&Value>) -> bool {
    match v {
        None | Some(Value::Null) => false,
        Some(Value::Array(a)) => !a.is_empty(),
        Some(Value::Object(o)) => !o.is_empty(),
        Some(Value::String(s)) => !s.is_empty(),
        Some(_) => true,
    }
}

/// The stored pod `existing` with the ephemeral containers of `new`, or upstream's error.
pub fn update(existing: &Value, new: &Value) -> Result<Value, ApiError> {
    let name = existing
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or("");
    let invalid = |field: &str, reason: &str, detail: String| {
        Err(ApiError::invalid("Pod", name, field, reason, &detail))
    };
    if existing
        .pointer("/metadata/annotations/kubernetes.io~1config.mirror")
        .is_some()
    {
        return invalid(
            "",
            "FieldValueForbidden",
            "Forbidden: static pods do not support ephemeral containers".into(),
        );
    }
    let wanted = list(new, "ephemeralContainers");
    let path = "spec.ephemeralContainers";
    for old in list(existing, "ephemeralContainers") {
        match wanted.iter().find(|c| name_of(c) == name_of(old)) {
            None => {
                return invalid(
                    path,
                    "FieldValueForbidden",
                    format!(
                        "Forbidden: existing ephemeral containers {:?} may not be removed\n",
                        name_of(old)
                    ),
                );
            }
            Some(c) if c != old => {
                return invalid(
                    path,
                    "FieldValueForbidden",
                    format!(
                        "Forbidden: existing ephemeral containers {:?} may not be changed\n",
                        name_of(old)
                    ),
                );
            }
            Some(_) => {}
        }
    }
    let regular: Vec<&str> = list(existing, "containers")
        .iter()
        .chain(list(existing, "initContainers"))
        .map(name_of)
        .collect();
    let mut seen = regular.clone();
    for (i, c) in wanted.iter().enumerate() {
        let at = format!("{path}[{i}]");
        let n = name_of(c);
        if n.is_empty() {
            return invalid(
                &format!("{at}.name"),
                "FieldValueRequired",
                "Required value".into(),
            );
        }
        if seen.contains(&n) {
            return invalid(
                &format!("{at}.name"),
                "FieldValueDuplicate",
                format!("Duplicate value: {n:?}"),
            );
        }
        seen.push(n);
        if !set(c.get("image")) {
            return invalid(
                &format!("{at}.image"),
                "FieldValueRequired",
                "Required value".into(),
            );
        }
        if let Some(f) = FORBIDDEN.iter().find(|f| set(c.get(**f))) {
            return invalid(
                &format!("{at}.{f}"),
                "FieldValueForbidden",
                "Forbidden: cannot be set for an Ephemeral Container".into(),
            );
        }
        let mounts = c.get("volumeMounts").and_then(Value::as_array);
        for (j, m) in mounts.into_iter().flatten().enumerate() {
            if set(m.get("subPath")) {
                return invalid(
                    &format!("{at}.volumeMounts[{j}].subPath"),
                    "FieldValueForbidden",
                    "Forbidden: cannot be set for an Ephemeral Container".into(),
                );
            }
        }
        let target = c
            .get("targetContainerName")
            .and_then(Value::as_str)
            .unwrap_or("");
        if !target.is_empty() && !regular.contains(&target) {
            return invalid(
                &format!("{at}.targetContainerName"),
                "FieldValueNotFound",
                format!("Not found: {target:?}"),
            );
        }
    }
    let mut out = existing.clone();
    out["spec"]["ephemeralContainers"] = json!(wanted);
    if wanted.is_empty()
        && let Some(spec) = out.get_mut("spec").and_then(Value::as_object_mut)
    {
        spec.remove("ephemeralContainers");
    }
    Ok(out)
}

#[cfg(test)]
mod tests;
