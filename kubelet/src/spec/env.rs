//! Container environment: `env` values (literal, fieldRef, resourceFieldRef, ConfigMap and
//! Secret keys) and `$(VAR)` expansion as upstream does it, with a cap on the expanded size.

use super::ConfigError;
use crate::objects::{Kind, ObjectData, ObjectKey};
use crate::podspec::downward::{field_ref, resource_field_value};
use k8s_openapi::api::core::v1::{Container, Pod};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use std::collections::BTreeMap;
use std::sync::Arc;

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

/// The container a resourceFieldRef names, with the defaults its `limits.*` read: the
/// current container when `container_name` is empty; else a regular container with the
/// same defaults, or an init container without any (upstream defaults only the pod's
/// regular containers and the current one).
fn named_container<'a>(
    pod: &'a Pod,
    current: &'a Container,
    container_name: Option<&str>,
) -> Result<(&'a Container, bool), ConfigError> {
    let Some(name) = container_name.filter(|n| !n.is_empty()) else {
        return Ok((current, true));
    };
    let spec = pod.spec.as_ref();
    if let Some(c) = spec.and_then(|s| s.containers.iter().find(|c| c.name == name)) {
        return Ok((c, true));
    }
    spec.and_then(|s| s.init_containers.iter().flatten().find(|c| c.name == name))
        .map(|c| (c, false))
        .ok_or_else(|| ConfigError(format!("container {name} not found")))
}

/// The ConfigMaps and Secrets fetched for a container's env; `None`: not found.
pub type EnvObjects = BTreeMap<ObjectKey, Option<Arc<ObjectData>>>;

/// A container's environment, and the warnings upstream records as Events.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ContainerEnv {
    /// In declaration order: envFrom sources, then env (a later name replaces an earlier
    /// one in place), then service variables no other source set.
    pub vars: Vec<(String, String)>,
    /// `InvalidEnvironmentVariableNames` messages.
    pub invalid_names: Vec<String>,
}

impl ContainerEnv {
    /// Name → value, for `$(VAR)` in command and args.
    pub fn map(&self) -> BTreeMap<String, String> {
        self.vars.iter().cloned().collect()
    }
}

/// Upstream's (relaxed, GA since v1.34) environment variable name check: printable ASCII
/// other than `=`, not empty.
pub fn is_env_var_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .bytes()
            .all(|b| (b' '..=b'~').contains(&b) && b != b'=')
}

struct Ordered {
    vars: Vec<(String, String)>,
    index: BTreeMap<String, usize>,
}

impl Ordered {
    fn set(&mut self, k: String, v: String) {
        match self.index.get(&k) {
            Some(&i) => self.vars[i].1 = v,
            None => {
                self.index.insert(k.clone(), self.vars.len());
                self.vars.push((k, v));
            }
        }
    }
}

/// Everything a container's env reads, as upstream's makeEnvironmentVariables: `envFrom`
/// first (invalid names skipped with a warning; a missing optional source skipped), then
/// `env` in order (`$(VAR)` expanded against what is set so far and the service variables;
/// a missing optional key leaves the variable unset), then the service variables.
/// `limit_defaults` ([`crate::podspec::downward::limit_defaults`]) is what a resourceFieldRef's unset `limits.*` reads.
#[allow(clippy::too_many_arguments)]
pub fn container_env(
    pod: &Pod,
    c: &Container,
    pod_ips: &[String],
    host_ips: &[String],
    objects: &EnvObjects,
    service_env: &BTreeMap<String, String>,
    limit_defaults: &BTreeMap<String, Quantity>,
    budget: &mut ExpandBudget,
) -> Result<ContainerEnv, ConfigError> {
    let ns = pod.metadata.namespace.as_deref().unwrap_or("default");
    let lookup = |kind: Kind, name: &str| {
        objects
            .get(&ObjectKey {
                kind,
                namespace: ns.to_string(),
                name: name.to_string(),
            })
            .cloned()
            .flatten()
    };
    let not_found =
        |kind: Kind, name: &str| ConfigError(format!("{} \"{name}\" not found", kind.lower()));
    let mut out = Ordered {
        vars: Vec::new(),
        index: BTreeMap::new(),
    };
    let mut invalid_names = Vec::new();
    for f in c.env_from.iter().flatten() {
        let prefix = f.prefix.clone().unwrap_or_default();
        let (kind, name, optional) = if let Some(r) = &f.config_map_ref {
            (
                Kind::ConfigMap,
                r.name.as_str(),
                r.optional.unwrap_or(false),
            )
        } else if let Some(r) = &f.secret_ref {
            (Kind::Secret, r.name.as_str(), r.optional.unwrap_or(false))
        } else {
            continue;
        };
        let Some(data) = lookup(kind, name) else {
            if optional {
                continue;
            }
            return Err(not_found(kind, name));
        };
        let entries: Vec<(String, String)> = match kind {
            // envFrom reads a ConfigMap's `data` only, as upstream.
            Kind::ConfigMap => data
                .text
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
            Kind::Secret => data
                .binary
                .iter()
                .map(|(k, v)| (k.clone(), String::from_utf8_lossy(v).into_owned()))
                .collect(),
        };
        let mut invalid = Vec::new();
        for (k, v) in entries {
            let k = format!("{prefix}{k}");
            if is_env_var_name(&k) {
                out.set(k, v);
            } else {
                invalid.push(k);
            }
        }
        if !invalid.is_empty() {
            invalid.sort();
            invalid_names.push(format!(
                "Keys [{}] from the EnvFrom {} {ns}/{name} were skipped since they are considered invalid environment variable names.",
                invalid.join(", "),
                match kind {
                    Kind::ConfigMap => "configMap",
                    Kind::Secret => "secret",
                }
            ));
        }
    }
    let mut vars: BTreeMap<String, String> = service_env.clone();
    vars.extend(out.vars.iter().cloned());
    for e in c.env.iter().flatten() {
        let value = match (&e.value, &e.value_from) {
            (Some(v), _) if !v.is_empty() => expand(v, &vars, budget)?,
            (_, Some(from)) => {
                if let Some(f) = &from.field_ref {
                    field_ref(pod, &f.field_path, pod_ips, host_ips)?
                } else if let Some(r) = &from.resource_field_ref {
                    let (target, defaulted) = named_container(pod, c, r.container_name.as_deref())?;
                    let none = BTreeMap::new();
                    let defaults = if defaulted { limit_defaults } else { &none };
                    resource_field_value(target, &r.resource, r.divisor.as_ref(), defaults)?
                } else if let Some(r) = &from.config_map_key_ref {
                    let optional = r.optional.unwrap_or(false);
                    let Some(data) = lookup(Kind::ConfigMap, &r.name) else {
                        if optional {
                            continue;
                        }
                        return Err(not_found(Kind::ConfigMap, &r.name));
                    };
                    match data.text.get(&r.key) {
                        Some(v) => v.clone(),
                        None if optional => continue,
                        None => {
                            return Err(ConfigError(format!(
                                "couldn't find key {} in ConfigMap {ns}/{}",
                                r.key, r.name
                            )));
                        }
                    }
                } else if let Some(r) = &from.secret_key_ref {
                    let optional = r.optional.unwrap_or(false);
                    let Some(data) = lookup(Kind::Secret, &r.name) else {
                        if optional {
                            continue;
                        }
                        return Err(not_found(Kind::Secret, &r.name));
                    };
                    match data.binary.get(&r.key) {
                        Some(v) => String::from_utf8_lossy(v).into_owned(),
                        None if optional => continue,
                        None => {
                            return Err(ConfigError(format!(
                                "couldn't find key {} in Secret {ns}/{}",
                                r.key, r.name
                            )));
                        }
                    }
                } else {
                    String::new()
                }
            }
            _ => String::new(),
        };
        vars.insert(e.name.clone(), value.clone());
        out.set(e.name.clone(), value);
    }
    for (k, v) in service_env {
        if !out.index.contains_key(k) {
            out.set(k.clone(), v.clone());
        }
    }
    Ok(ContainerEnv {
        vars: out.vars,
        invalid_names,
    })
}
