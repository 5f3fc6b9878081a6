//! Container environment: `env` values (literal, fieldRef, resourceFieldRef, ConfigMap and
//! Secret keys) and `$(VAR)` expansion as upstream does it, with a cap on the expanded size.

use super::ConfigError;
use crate::quantity;
use k8s_openapi::api::core::v1::{Container, EnvVar, Pod};
use std::collections::BTreeMap;

/// How many bytes `$(VAR)` references may add to one container's env, command and args:
/// ARG_MAX with the default 8 MiB stack, past which execve would refuse the container anyway.
/// It stops a manifest whose variables reference each other from growing without bound.
pub const MAX_EXPANSION_BYTES: usize = 2 << 20;

/// What is left of a container's [`MAX_EXPANSION_BYTES`].
#[derive(Debug)]
pub struct ExpandBudget {
    left: usize,
}

impl Default for ExpandBudget {
    fn default() -> Self {
        ExpandBudget {
            left: MAX_EXPANSION_BYTES,
        }
    }
}

/// Expands `$(VAR)` references like upstream (`$$` escapes; unknown references stay as written).
/// Substituted bytes count against `budget`; past it, an error names the variable.
pub fn expand(
    input: &str,
    vars: &BTreeMap<String, String>,
    budget: &mut ExpandBudget,
) -> Result<String, ConfigError> {
    let mut out = String::with_capacity(input.len());
    let b = input.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'$' && i + 1 < b.len() {
            match b[i + 1] {
                b'$' => {
                    out.push('$');
                    i += 2;
                    continue;
                }
                b'(' => {
                    if let Some(end) = input[i + 2..].find(')') {
                        let name = &input[i + 2..i + 2 + end];
                        match vars.get(name) {
                            Some(v) => {
                                budget.left = budget.left.checked_sub(v.len()).ok_or_else(|| {
                                    ConfigError(format!(
                                        "expanding $({name}): variable references expand to more than {MAX_EXPANSION_BYTES} bytes"
                                    ))
                                })?;
                                out.push_str(v);
                            }
                            None => out.push_str(&input[i..i + 3 + end]),
                        }
                        i += 3 + end;
                        continue;
                    }
                }
                _ => {}
            }
        }
        let ch = input[i..].chars().next().unwrap_or('\0');
        out.push(ch);
        i += ch.len_utf8();
    }
    Ok(out)
}

pub fn field_ref(
    pod: &Pod,
    path: &str,
    pod_ips: &[String],
    host_ips: &[String],
) -> Result<String, ConfigError> {
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
        other => return Err(ConfigError(format!("unsupported fieldRef path {other:?}"))),
    })
}

/// A container's `limits.<name>` / `requests.<name>` in units of `divisor` (default 1),
/// rounded up, as a resourceFieldRef reads it.
pub fn resource_field_value(
    c: &Container,
    resource: &str,
    divisor: Option<&k8s_openapi::apimachinery::pkg::api::resource::Quantity>,
) -> Result<String, ConfigError> {
    let res = c.resources.clone().unwrap_or_default();
    let (map, key) = match resource.split_once('.') {
        Some(("limits", k)) => (res.limits.unwrap_or_default(), k.to_string()),
        Some(("requests", k)) => (res.requests.unwrap_or_default(), k.to_string()),
        _ => {
            return Err(ConfigError(format!(
                "unsupported resourceFieldRef {resource:?}"
            )));
        }
    };
    let divisor = divisor
        .and_then(|d| quantity::milli(d).ok())
        .filter(|d| *d > 0)
        .unwrap_or(1000);
    let v = map
        .get(&key)
        .and_then(|q| quantity::milli(q).ok())
        .unwrap_or(0);
    Ok(((v + divisor - 1) / divisor).to_string())
}

pub(crate) fn env_value(
    pod: &Pod,
    c: &Container,
    e: &EnvVar,
    pod_ips: &[String],
    host_ips: &[String],
    vars: &BTreeMap<String, String>,
    budget: &mut ExpandBudget,
) -> Result<String, ConfigError> {
    if let Some(v) = &e.value {
        return expand(v, vars, budget);
    }
    let Some(from) = &e.value_from else {
        return Ok(String::new());
    };
    if let Some(f) = &from.field_ref {
        return field_ref(pod, &f.field_path, pod_ips, host_ips);
    }
    if let Some(r) = &from.resource_field_ref {
        return resource_field_value(c, &r.resource, r.divisor.as_ref());
    }
    if let Some(s) = &from.secret_key_ref {
        return Err(ConfigError(format!("secret \"{}\" not found", s.name)));
    }
    if let Some(cm) = &from.config_map_key_ref {
        return Err(ConfigError(format!("configmap \"{}\" not found", cm.name)));
    }
    Ok(String::new())
}
