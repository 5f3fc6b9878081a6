//! Upstream's feature-gate set, as both daemons check `--feature-gates` and `featureGates`:
//! an unknown gate refuses the start ("unrecognized feature gate: X"), as does a gate locked
//! to its default set to the other value ("cannot set feature gate X to V, feature is locked
//! to D"); every known gate is accepted (those the agent does not act on are warned about by
//! the daemon that reads them). The table (`feature_gates.tsv`) holds upstream v1.36's gates
//! with their defaults and locks.

use std::collections::BTreeMap;

const TABLE: &str = include_str!("feature_gates.tsv");

/// One known gate: its upstream default and whether it is locked to it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Gate {
    pub name: &'static str,
    pub default: bool,
    pub locked: bool,
}

/// Every known gate, in the table's order (by name).
pub fn known() -> impl Iterator<Item = Gate> {
    TABLE
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .filter_map(|l| {
            let mut cols = l.split('\t');
            let (name, default, locked) = (cols.next()?, cols.next()?, cols.next()?);
            Some(Gate {
                name,
                default: default == "true",
                locked: locked == "locked",
            })
        })
}

/// The known gate `name` (case-sensitive, as upstream).
pub fn lookup(name: &str) -> Option<Gate> {
    known().find(|g| g.name == name)
}

/// Why a gate setting refuses the start; the text is upstream's.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GateError {
    #[error("unrecognized feature gate: {0}")]
    Unknown(String),
    #[error("cannot set feature gate {name} to {value}, feature is locked to {locked_to}")]
    Locked {
        name: String,
        value: bool,
        locked_to: bool,
    },
    /// A `featureGates` value in a config file that is not a boolean.
    #[error("featureGates: {name}: {value} is not a boolean")]
    NotBool { name: String, value: String },
}

/// Checks `gates` (name → value) as upstream's SetFromMap: the first unknown gate is the error;
/// else the first locked gate set against its lock.
pub fn check(gates: &BTreeMap<String, bool>) -> Result<(), GateError> {
    let mut locked = None;
    for (name, &value) in gates {
        let Some(g) = lookup(name) else {
            return Err(GateError::Unknown(name.clone()));
        };
        if g.locked && g.default != value && locked.is_none() {
            locked = Some(GateError::Locked {
                name: name.clone(),
                value,
                locked_to: g.default,
            });
        }
    }
    locked.map_or(Ok(()), Err)
}

/// A config file's `featureGates` map as name → bool (a JSON/YAML boolean per gate).
pub fn from_json(v: Option<&serde_json::Value>) -> Result<BTreeMap<String, bool>, GateError> {
    let Some(m) = v.and_then(|v| v.as_object()) else {
        return Ok(BTreeMap::new());
    };
    m.iter()
        .map(|(k, v)| match v.as_bool() {
            Some(b) => Ok((k.clone(), b)),
            None => Err(GateError::NotBool {
                name: k.clone(),
                value: v.to_string(),
            }),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gates(pairs: &[(&str, bool)]) -> BTreeMap<String, bool> {
        pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect()
    }

    #[test]
    fn the_table_holds_upstreams_gates_with_defaults_and_locks() {
        let all: Vec<Gate> = known().collect();
        assert!(all.len() > 200, "{}", all.len());
        let names: std::collections::BTreeSet<_> = all.iter().map(|g| g.name).collect();
        assert_eq!(names.len(), all.len(), "no gate twice");
        // Kubelet, component-base logging, client-go, generic apiserver and the specials.
        let sample = [
            ("KubeletCrashLoopBackOffMax", true, false),
            ("EventedPLEG", false, false),
            ("InPlacePodVerticalScaling", true, true),
            ("ContextualLogging", true, false),
            ("LoggingAlphaOptions", false, false),
            ("WatchListClient", true, false),
            ("APIServerTracing", true, true),
            ("CustomCPUCFSQuotaPeriod", false, false),
            ("AllAlpha", false, false),
            ("AllBeta", false, false),
        ];
        for (name, default, locked) in sample {
            assert_eq!(
                lookup(name),
                Some(Gate {
                    name,
                    default,
                    locked
                }),
                "{name}"
            );
        }
    }

    #[test]
    fn unknown_gates_are_refused_with_upstreams_message() {
        let e = check(&gates(&[("EventedPLEG", true), ("NoSuchGate", true)])).unwrap_err();
        assert_eq!(e.to_string(), "unrecognized feature gate: NoSuchGate");
        // Case matters, as upstream's map lookup.
        let e = check(&gates(&[("eventedpleg", true)])).unwrap_err();
        assert_eq!(e.to_string(), "unrecognized feature gate: eventedpleg");
    }

    #[test]
    fn locked_gates_take_only_their_value() {
        let e = check(&gates(&[("InPlacePodVerticalScaling", false)])).unwrap_err();
        assert_eq!(
            e.to_string(),
            "cannot set feature gate InPlacePodVerticalScaling to false, feature is locked to true"
        );
        assert_eq!(
            check(&gates(&[("InPlacePodVerticalScaling", true)])),
            Ok(())
        );
        // Known, unlocked gates take either value.
        assert_eq!(
            check(&gates(&[
                ("EventedPLEG", true),
                ("KubeletPSI", false),
                ("AllAlpha", true)
            ])),
            Ok(())
        );
    }

    #[test]
    fn file_values_must_be_booleans() {
        let v: serde_json::Value = serde_json::json!({"EventedPLEG": true, "KubeletPSI": false});
        assert_eq!(
            from_json(Some(&v)).unwrap(),
            gates(&[("EventedPLEG", true), ("KubeletPSI", false)])
        );
        let v: serde_json::Value = serde_json::json!({"EventedPLEG": "yes"});
        assert_eq!(
            from_json(Some(&v)).unwrap_err().to_string(),
            "featureGates: EventedPLEG: \"yes\" is not a boolean"
        );
        assert!(from_json(None).unwrap().is_empty());
    }
}
