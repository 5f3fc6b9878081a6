//! Node resource settings, validated as upstream does at start: `kubeReserved`,
//! `systemReserved`, `reservedSystemCPUs`, `enforceNodeAllocatable` with its cgroups, and the
//! eviction thresholds (`evictionHard`, `evictionSoft`, `evictionSoftGracePeriod`,
//! `evictionMinimumReclaim`, `evictionPressureTransitionPeriod`, `evictionMaxPodGracePeriod`,
//! `mergeDefaultEvictionSettings`). Pure: the container manager and the eviction manager read
//! the result.

use crate::cm::resources::{
    Amount, DEFAULT_EVICTION_HARD, ENFORCE_KEYS, Eviction, NodeResources, Reserved, Signal,
    Threshold,
};
use crate::settings::Flags;
use crate::settings::resolve::invalid;
use crate::settings::{ConfigError, KubeletConfiguration};
use plumbing::duration;
use plumbing::quantity;
use std::collections::BTreeMap;
use std::time::Duration;

/// A config value that should be a map of strings (YAML numbers are taken as their text).
/// NodeResources' default is what upstream's defaults parse to.
impl Default for NodeResources {
    fn default() -> Self {
        parse(&Flags::default(), &KubeletConfiguration::default())
            .expect("upstream's defaults are valid")
    }
}

fn parse_signal(name: &str) -> Result<Signal, ConfigError> {
    Signal::ALL
        .into_iter()
        .find(|s| s.name() == name)
        .ok_or_else(|| invalid(format!("unsupported eviction signal {name}")))
}

fn string_map(
    name: &str,
    v: Option<&serde_json::Value>,
) -> Result<Option<BTreeMap<String, String>>, ConfigError> {
    let Some(v) = v.filter(|v| !v.is_null()) else {
        return Ok(None);
    };
    let obj = v
        .as_object()
        .ok_or_else(|| invalid(format!("{name}: {v} is not a map")))?;
    obj.iter()
        .map(|(k, v)| {
            let s = match v {
                serde_json::Value::String(s) => s.clone(),
                serde_json::Value::Number(n) => n.to_string(),
                other => return Err(invalid(format!("{name}.{k}: {other} is not a string"))),
            };
            Ok((k.clone(), s))
        })
        .collect::<Result<BTreeMap<_, _>, _>>()
        .map(Some)
}

fn string_value(name: &str, v: Option<&serde_json::Value>) -> Result<Option<String>, ConfigError> {
    match v {
        None | Some(serde_json::Value::Null) => Ok(None),
        Some(serde_json::Value::String(s)) if s.is_empty() => Ok(None),
        Some(serde_json::Value::String(s)) => Ok(Some(s.clone())),
        Some(other) => Err(invalid(format!("{name}: {other} is not a string"))),
    }
}

/// Upstream's ParseResourceList for reservations: cpu, memory, ephemeral-storage and pid only,
/// never negative.
fn reserved(name: &str, map: Option<&BTreeMap<String, String>>) -> Result<Reserved, ConfigError> {
    let mut r = Reserved::default();
    for (k, v) in map.into_iter().flatten() {
        let parse = |want_milli: bool| -> Result<i64, ConfigError> {
            let q = if want_milli {
                quantity::parse_milli(v)
            } else {
                quantity::parse_value(v)
            }
            .map_err(|e| {
                invalid(format!(
                    "{name}: failed to parse quantity {v:?} for {k:?} resource: {e}"
                ))
            })?;
            if q < 0 {
                return Err(invalid(format!(
                    "{name}: resource quantity for {k:?} cannot be negative: {v}"
                )));
            }
            i64::try_from(q).map_err(|_| invalid(format!("{name}: {k} {v} is too large")))
        };
        match k.as_str() {
            "cpu" => r.cpu_millis = parse(true)?,
            "memory" => r.memory_bytes = parse(false)?,
            "ephemeral-storage" => r.ephemeral_storage_bytes = parse(false)?,
            "pid" => r.pids = parse(false)?,
            _ => return Err(invalid(format!("{name}: cannot reserve {k:?} resource"))),
        }
    }
    Ok(r)
}

/// The number of CPUs in a cpuset list (`0-3,6` → 5); duplicates count once.
pub fn cpuset_size(list: &str) -> Result<usize, String> {
    let mut cpus = std::collections::BTreeSet::new();
    for part in list.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (lo, hi) = match part.split_once('-') {
            Some((a, b)) => (a.trim(), b.trim()),
            None => (part, part),
        };
        let lo: u32 = lo.parse().map_err(|_| format!("invalid cpuset {list:?}"))?;
        let hi: u32 = hi.parse().map_err(|_| format!("invalid cpuset {list:?}"))?;
        if lo > hi || hi - lo > 65_535 {
            return Err(format!("invalid cpuset {list:?}: bad range {part}"));
        }
        cpus.extend(lo..=hi);
    }
    Ok(cpus.len())
}

/// Upstream's percentage rule: `0%` and `100%` mean "no threshold".
fn threshold_value(signal: Signal, v: &str) -> Result<Option<Amount>, ConfigError> {
    if let Some(p) = v.strip_suffix('%') {
        if v == "0%" || v == "100%" {
            return Ok(None);
        }
        let f: f64 = p
            .trim()
            .parse()
            .map_err(|_| invalid(format!("invalid eviction threshold {v:?}")))?;
        let f = (f / 100.0) as f32;
        if f < 0.0 {
            return Err(invalid(format!(
                "eviction percentage threshold {} must be >= 0%: {v}",
                signal.name()
            )));
        }
        if f > 1.0 {
            return Err(invalid(format!(
                "eviction percentage threshold {} must be <= 100%: {v}",
                signal.name()
            )));
        }
        return Ok(Some(Amount::Fraction(f)));
    }
    let q = quantity::parse_value(v).map_err(|e| invalid(e.to_string()))?;
    if q <= 0 {
        return Err(invalid(format!(
            "eviction threshold {} must be positive: {v}",
            signal.name()
        )));
    }
    Ok(Some(Amount::Quantity(q)))
}

fn statements(map: &BTreeMap<String, String>) -> Result<Vec<(Signal, Amount)>, ConfigError> {
    let mut out = Vec::new();
    for (k, v) in map {
        let signal = parse_signal(k)?;
        if let Some(a) = threshold_value(signal, v)? {
            out.push((signal, a));
        }
    }
    Ok(out)
}

fn min_reclaim(signal: Signal, v: &str) -> Result<Amount, ConfigError> {
    if let Some(p) = v.strip_suffix('%') {
        let f: f64 = p
            .trim()
            .parse()
            .map_err(|_| invalid(format!("invalid eviction minimum reclaim {v:?}")))?;
        if f <= 0.0 {
            return Err(invalid(format!(
                "eviction percentage minimum reclaim {} must be positive: {v}",
                signal.name()
            )));
        }
        return Ok(Amount::Fraction((f / 100.0) as f32));
    }
    let q = quantity::parse_value(v).map_err(|e| invalid(e.to_string()))?;
    if q < 0 {
        return Err(invalid(format!(
            "negative eviction minimum reclaim specified for {}",
            signal.name()
        )));
    }
    Ok(Amount::Quantity(q))
}

/// `evictionHard` after upstream's defaulting: unset → the defaults; set → as given, plus the
/// defaults for missing signals only with `mergeDefaultEvictionSettings: true`.
fn eviction_hard(
    given: Option<&BTreeMap<String, String>>,
    merge_defaults: bool,
) -> BTreeMap<String, String> {
    let defaults = || {
        DEFAULT_EVICTION_HARD
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
    };
    match given {
        None => defaults().collect(),
        Some(map) if merge_defaults => {
            let mut out: BTreeMap<String, String> = defaults().collect();
            out.extend(map.clone());
            out
        }
        Some(map) => map.clone(),
    }
}

fn bool_value(name: &str, v: Option<&serde_json::Value>) -> Result<Option<bool>, ConfigError> {
    match v {
        None | Some(serde_json::Value::Null) => Ok(None),
        Some(serde_json::Value::Bool(b)) => Ok(Some(*b)),
        Some(other) => Err(invalid(format!("{name}: {other} is not a boolean"))),
    }
}

/// Flags over the file, validated as upstream's ParseThresholdConfig and
/// ValidateKubeletConfiguration do for these fields.
pub fn parse(flags: &Flags, file: &KubeletConfiguration) -> Result<NodeResources, ConfigError> {
    let kube_map = match &flags.kube_reserved {
        Some(m) => Some(m.clone()),
        None => string_map("kubeReserved", file.kube_reserved.as_ref())?,
    };
    let system_map = match &flags.system_reserved {
        Some(m) => Some(m.clone()),
        None => string_map("systemReserved", file.system_reserved.as_ref())?,
    };
    let kube_reserved = reserved("kubeReserved", kube_map.as_ref())?;
    let mut system_reserved = reserved("systemReserved", system_map.as_ref())?;
    let reserved_system_cpus = match &flags.reserved_cpus {
        Some(s) if !s.is_empty() => Some(s.clone()),
        Some(_) => None,
        None => string_value("reservedSystemCPUs", file.reserved_system_cpus.as_ref())?,
    };
    let kube_reserved_cgroup = match &flags.kube_reserved_cgroup {
        Some(s) => Some(s.clone()).filter(|s| !s.is_empty()),
        None => string_value("kubeReservedCgroup", file.kube_reserved_cgroup.as_ref())?,
    };
    let system_reserved_cgroup = match &flags.system_reserved_cgroup {
        Some(s) => Some(s.clone()).filter(|s| !s.is_empty()),
        None => string_value("systemReservedCgroup", file.system_reserved_cgroup.as_ref())?,
    };
    if let Some(list) = &reserved_system_cpus {
        let n = cpuset_size(list).map_err(|e| invalid(format!("reservedSystemCPUs: {e}")))?;
        if kube_reserved_cgroup.is_some() || system_reserved_cgroup.is_some() {
            return Err(invalid(
                "can't use reservedSystemCPUs (--reserved-cpus) with systemReservedCgroup \
                 (--system-reserved-cgroup) or kubeReservedCgroup (--kube-reserved-cgroup)",
            ));
        }
        system_reserved.cpu_millis = n as i64 * 1000;
    }

    let enforce: Vec<String> = match &flags.enforce_node_allocatable {
        Some(s) => s
            .split(',')
            .map(|k| k.trim().to_string())
            .filter(|k| !k.is_empty())
            .collect(),
        None => match file.enforce_node_allocatable.as_ref() {
            None | Some(serde_json::Value::Null) => vec!["pods".to_string()],
            Some(serde_json::Value::Array(a)) => a
                .iter()
                .map(|v| {
                    v.as_str().map(str::to_string).ok_or_else(|| {
                        invalid(format!("enforceNodeAllocatable: {v} is not a string"))
                    })
                })
                .collect::<Result<_, _>>()?,
            Some(other) => {
                return Err(invalid(format!(
                    "enforceNodeAllocatable: {other} is not a list"
                )));
            }
        },
    };
    for k in &enforce {
        if !ENFORCE_KEYS.contains(&k.as_str()) {
            return Err(invalid(format!(
                "invalid option {k:?} specified for enforceNodeAllocatable (--enforce-node-allocatable) setting. Valid options are \"pods\", \"system-reserved\", \"system-reserved-compressible\", \"kube-reserved\", \"kube-reserved-compressible\" or \"none\""
            )));
        }
    }
    if enforce.iter().any(|k| k == "none") && enforce.len() > 1 {
        return Err(invalid(
            "enforceNodeAllocatable (--enforce-node-allocatable) may not contain additional enforcements when \"none\" is specified",
        ));
    }
    let enforce: Vec<String> = enforce.into_iter().filter(|k| k != "none").collect();
    let names = |k: &str| enforce.iter().any(|e| e == k);
    if (names("system-reserved") || names("system-reserved-compressible"))
        && system_reserved_cgroup.is_none()
    {
        return Err(invalid(
            "systemReservedCgroup (--system-reserved-cgroup) must be specified when \"system-reserved\" or \"system-reserved-compressible\" included in enforceNodeAllocatable (--enforce-node-allocatable)",
        ));
    }
    if (names("kube-reserved") || names("kube-reserved-compressible"))
        && kube_reserved_cgroup.is_none()
    {
        return Err(invalid(
            "kubeReservedCgroup (--kube-reserved-cgroup) must be specified when \"kube-reserved\" or \"kube-reserved-compressible\" included in enforceNodeAllocatable (--enforce-node-allocatable)",
        ));
    }
    if names("system-reserved") && names("system-reserved-compressible") {
        return Err(invalid(
            "\"system-reserved\" and \"system-reserved-compressible\" cannot be specified together in enforceNodeAllocatable (--enforce-node-allocatable)",
        ));
    }
    if names("kube-reserved") && names("kube-reserved-compressible") {
        return Err(invalid(
            "\"kube-reserved\" and \"kube-reserved-compressible\" cannot be specified together in enforceNodeAllocatable (--enforce-node-allocatable)",
        ));
    }

    let eviction = eviction(flags, file, &enforce)?;
    Ok(NodeResources {
        kube_reserved,
        system_reserved,
        reserved_system_cpus,
        enforce_node_allocatable: enforce,
        kube_reserved_cgroup,
        system_reserved_cgroup,
        eviction,
    })
}

fn eviction(
    flags: &Flags,
    file: &KubeletConfiguration,
    enforce: &[String],
) -> Result<Eviction, ConfigError> {
    let merge_defaults = match flags.merge_default_eviction_settings {
        Some(b) => b,
        None => bool_value(
            "mergeDefaultEvictionSettings",
            file.merge_default_eviction_settings.as_ref(),
        )?
        .unwrap_or(false),
    };
    let hard_given = flags.eviction_hard.clone().or(file.eviction_hard.clone());
    let hard = eviction_hard(hard_given.as_ref(), merge_defaults);
    let soft = match &flags.eviction_soft {
        Some(m) => m.clone(),
        None => string_map("evictionSoft", file.eviction_soft.as_ref())?.unwrap_or_default(),
    };
    let graces = match &flags.eviction_soft_grace_period {
        Some(m) => m.clone(),
        None => string_map(
            "evictionSoftGracePeriod",
            file.eviction_soft_grace_period.as_ref(),
        )?
        .unwrap_or_default(),
    };
    let reclaims = match &flags.eviction_minimum_reclaim {
        Some(m) => m.clone(),
        None => string_map(
            "evictionMinimumReclaim",
            file.eviction_minimum_reclaim.as_ref(),
        )?
        .unwrap_or_default(),
    };

    let mut grace_by_signal = BTreeMap::new();
    for (k, v) in &graces {
        let signal = parse_signal(k)?;
        let d = duration::parse(v).map_err(|e| invalid(format!("evictionSoftGracePeriod: {e}")))?;
        grace_by_signal.insert(signal, d);
    }
    let mut reclaim_by_signal = BTreeMap::new();
    for (k, v) in &reclaims {
        let signal = parse_signal(k)?;
        reclaim_by_signal.insert(signal, min_reclaim(signal, v)?);
    }

    let mut thresholds: Vec<Threshold> = statements(&hard)?
        .into_iter()
        .map(|(signal, value)| Threshold {
            signal,
            value,
            grace_period: Duration::ZERO,
            min_reclaim: None,
        })
        .collect();
    for (signal, value) in statements(&soft)? {
        let grace_period = *grace_by_signal.get(&signal).ok_or_else(|| {
            invalid(format!(
                "grace period must be specified for the soft eviction threshold {}",
                signal.name()
            ))
        })?;
        thresholds.push(Threshold {
            signal,
            value,
            grace_period,
            min_reclaim: None,
        });
    }
    for t in &mut thresholds {
        t.min_reclaim = reclaim_by_signal.get(&t.signal).copied();
    }
    if enforce.iter().any(|k| k == "pods") {
        let copies: Vec<Threshold> = thresholds
            .iter()
            .filter(|t| t.signal == Signal::MemoryAvailable && t.is_hard())
            .map(|t| Threshold {
                signal: Signal::AllocatableMemoryAvailable,
                ..t.clone()
            })
            .collect();
        thresholds.extend(copies);
    }

    let pressure_transition_period = match &flags.eviction_pressure_transition_period {
        Some(s) => duration::parse(s)
            .map_err(|e| invalid(format!("evictionPressureTransitionPeriod: {e}")))?,
        None => match file.eviction_pressure_transition_period.as_ref() {
            None | Some(serde_json::Value::Null) => Duration::from_secs(300),
            Some(serde_json::Value::String(s)) => {
                let d = duration::parse(s)
                    .map_err(|e| invalid(format!("evictionPressureTransitionPeriod: {e}")))?;
                if d.is_zero() {
                    Duration::from_secs(300)
                } else {
                    d
                }
            }
            Some(other) => {
                return Err(invalid(format!(
                    "evictionPressureTransitionPeriod: {other} is not a duration"
                )));
            }
        },
    };
    let max_pod_grace_period = match flags.eviction_max_pod_grace_period {
        Some(n) => i64::from(n),
        None => match file.eviction_max_pod_grace_period.as_ref() {
            None | Some(serde_json::Value::Null) => 0,
            Some(v) => v.as_i64().ok_or_else(|| {
                invalid(format!("evictionMaxPodGracePeriod: {v} is not an integer"))
            })?,
        },
    };
    Ok(Eviction {
        thresholds,
        pressure_transition_period,
        max_pod_grace_period,
    })
}

#[cfg(test)]
mod tests;
