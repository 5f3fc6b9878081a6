//! The resources the test control plane serves, and the selectors it applies.

use serde_json::Value;

use super::status::ApiError;

/// One served resource (group/version/plural) with the behaviours that vary by type.
#[derive(Debug)]
pub struct ResourceDef {
    pub group: &'static str,
    pub version: &'static str,
    pub plural: &'static str,
    pub singular: &'static str,
    pub kind: &'static str,
    pub namespaced: bool,
    /// Serves `/status` (PUT/PATCH touch only `.status`).
    pub status: bool,
    /// Serves `/approval` (CSRs).
    pub approval: bool,
    /// PUT on a missing object creates it (upstream `AllowCreateOnUpdate`).
    pub create_on_update: bool,
    /// Field selector labels beyond `metadata.name` / `metadata.namespace`.
    pub fields: &'static [&'static str],
    pub short: &'static [&'static str],
}

impl ResourceDef {
    /// `pods`, `leases.coordination.k8s.io`: how upstream names a resource in messages.
    pub fn qualified(&self) -> String {
        if self.group.is_empty() {
            self.plural.to_string()
        } else {
            format!("{}.{}", self.plural, self.group)
        }
    }

    /// `v1`, `coordination.k8s.io/v1`.
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.to_string()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    /// Collection path without namespace, e.g. `/api/v1/pods`.
    pub fn base_path(&self) -> String {
        if self.group.is_empty() {
            format!("/api/{}", self.version)
        } else {
            format!("/apis/{}/{}", self.group, self.version)
        }
    }

    /// The URL of one object or collection.
    pub fn path(&self, namespace: Option<&str>, name: Option<&str>) -> String {
        let mut p = self.base_path();
        if let (true, Some(ns)) = (self.namespaced, namespace) {
            p.push_str(&format!("/namespaces/{ns}"));
        }
        p.push('/');
        p.push_str(self.plural);
        if let Some(n) = name {
            p.push('/');
            p.push_str(n);
        }
        p
    }

    /// Supported field selector labels.
    pub fn supports_field(&self, field: &str) -> bool {
        field == "metadata.name"
            || (self.namespaced && field == "metadata.namespace")
            || self.fields.contains(&field)
    }
}

const POD_FIELDS: &[&str] = &[
    "spec.nodeName",
    "spec.restartPolicy",
    "spec.schedulerName",
    "spec.serviceAccountName",
    "spec.hostNetwork",
    "status.phase",
    "status.podIP",
    "status.nominatedNodeName",
];
const EVENT_FIELDS: &[&str] = &[
    "involvedObject.kind",
    "involvedObject.namespace",
    "involvedObject.name",
    "involvedObject.uid",
    "involvedObject.apiVersion",
    "involvedObject.resourceVersion",
    "involvedObject.fieldPath",
    "reason",
    "reportingComponent",
    "source",
    "type",
];
const EVENTS_V1_FIELDS: &[&str] = &[
    "regarding.kind",
    "regarding.namespace",
    "regarding.name",
    "regarding.uid",
    "regarding.apiVersion",
    "regarding.resourceVersion",
    "regarding.fieldPath",
    "reason",
    "reportingController",
    "type",
];

const fn def(
    group: &'static str,
    plural: &'static str,
    singular: &'static str,
    kind: &'static str,
    namespaced: bool,
) -> ResourceDef {
    ResourceDef {
        group,
        version: "v1",
        plural,
        singular,
        kind,
        namespaced,
        status: false,
        approval: false,
        create_on_update: false,
        fields: &[],
        short: &[],
    }
}

/// Every served resource.
pub static RESOURCES: &[ResourceDef] = &[
    ResourceDef {
        status: true,
        fields: POD_FIELDS,
        short: &["po"],
        ..def("", "pods", "pod", "Pod", true)
    },
    ResourceDef {
        status: true,
        fields: &["spec.unschedulable"],
        short: &["no"],
        ..def("", "nodes", "node", "Node", false)
    },
    ResourceDef {
        create_on_update: true,
        fields: EVENT_FIELDS,
        short: &["ev"],
        ..def("", "events", "event", "Event", true)
    },
    ResourceDef {
        short: &["cm"],
        ..def("", "configmaps", "configmap", "ConfigMap", true)
    },
    ResourceDef {
        fields: &["type"],
        ..def("", "secrets", "secret", "Secret", true)
    },
    ResourceDef {
        status: true,
        short: &["svc"],
        ..def("", "services", "service", "Service", true)
    },
    ResourceDef {
        short: &["ep"],
        ..def("", "endpoints", "endpoints", "Endpoints", true)
    },
    ResourceDef {
        short: &["sa"],
        ..def(
            "",
            "serviceaccounts",
            "serviceaccount",
            "ServiceAccount",
            true,
        )
    },
    ResourceDef {
        status: true,
        fields: &["status.phase"],
        short: &["ns"],
        ..def("", "namespaces", "namespace", "Namespace", false)
    },
    ResourceDef {
        create_on_update: true,
        ..def("coordination.k8s.io", "leases", "lease", "Lease", true)
    },
    ResourceDef {
        status: true,
        approval: true,
        fields: &["spec.signerName"],
        short: &["csr"],
        ..def(
            "certificates.k8s.io",
            "certificatesigningrequests",
            "certificatesigningrequest",
            "CertificateSigningRequest",
            false,
        )
    },
    ResourceDef {
        fields: &["addressType"],
        ..def(
            "discovery.k8s.io",
            "endpointslices",
            "endpointslice",
            "EndpointSlice",
            true,
        )
    },
    ResourceDef {
        create_on_update: true,
        fields: EVENTS_V1_FIELDS,
        short: &["ev"],
        ..def("events.k8s.io", "events", "event", "Event", true)
    },
];

/// Look a resource up by API group and plural.
pub fn find(group: &str, version: &str, plural: &str) -> Option<&'static ResourceDef> {
    RESOURCES
        .iter()
        .find(|r| r.group == group && r.version == version && r.plural == plural)
}

/// Look a resource up by `plural` (core) or `plural.group`, e.g. `leases.coordination.k8s.io`.
pub fn by_name(name: &str) -> Option<&'static ResourceDef> {
    RESOURCES.iter().find(|r| r.qualified() == name)
}

/// The distinct API groups (other than core) in serving order.
pub fn groups() -> Vec<&'static str> {
    let mut out: Vec<&'static str> = Vec::new();
    for r in RESOURCES {
        if !r.group.is_empty() && !out.contains(&r.group) {
            out.push(r.group);
        }
    }
    out
}

// ---------------------------------------------------------------------------
// Selectors

#[derive(Debug, Clone, PartialEq)]
enum LabelReq {
    Eq(String, String),
    NotEq(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    NotExists(String),
    Gt(String, i64),
    Lt(String, i64),
}

/// A parsed `labelSelector` (the string form: `a=b,c!=d,e in (x,y),!f`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LabelSelector(Vec<LabelReq>);

fn split_top_level(s: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut depth = 0usize;
    let mut cur = String::new();
    for c in s.chars() {
        match c {
            '(' => {
                depth += 1;
                cur.push(c);
            }
            ')' => {
                depth = depth.saturating_sub(1);
                cur.push(c);
            }
            ',' if depth == 0 => out.push(std::mem::take(&mut cur)),
            _ => cur.push(c),
        }
    }
    out.push(cur);
    out.into_iter()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .collect()
}

fn parse_set(s: &str) -> Result<Vec<String>, ApiError> {
    let s = s.trim();
    let inner = s
        .strip_prefix('(')
        .and_then(|s| s.strip_suffix(')'))
        .ok_or_else(|| {
            ApiError::bad_request(format!(
                "unable to parse requirement: found '{s}', expected: '('"
            ))
        })?;
    Ok(inner
        .split(',')
        .map(|v| v.trim().to_string())
        .filter(|v| !v.is_empty())
        .collect())
}

impl LabelSelector {
    pub fn parse(s: &str) -> Result<Self, ApiError> {
        let mut reqs = Vec::new();
        for term in split_top_level(s) {
            let bad = || ApiError::bad_request(format!("unable to parse requirement: {term}"));
            if let Some(k) = term.strip_prefix('!') {
                reqs.push(LabelReq::NotExists(k.trim().to_string()));
            } else if let Some(i) = term.find(" notin ") {
                reqs.push(LabelReq::NotIn(
                    term[..i].trim().to_string(),
                    parse_set(&term[i + 7..])?,
                ));
            } else if let Some(i) = term.find(" in ") {
                reqs.push(LabelReq::In(
                    term[..i].trim().to_string(),
                    parse_set(&term[i + 4..])?,
                ));
            } else if let Some(i) = term.find("!=") {
                reqs.push(LabelReq::NotEq(
                    term[..i].trim().to_string(),
                    term[i + 2..].trim().to_string(),
                ));
            } else if let Some(i) = term.find("==") {
                reqs.push(LabelReq::Eq(
                    term[..i].trim().to_string(),
                    term[i + 2..].trim().to_string(),
                ));
            } else if let Some(i) = term.find('=') {
                reqs.push(LabelReq::Eq(
                    term[..i].trim().to_string(),
                    term[i + 1..].trim().to_string(),
                ));
            } else if let Some(i) = term.find('>') {
                let v = term[i + 1..].trim().parse().map_err(|_| bad())?;
                reqs.push(LabelReq::Gt(term[..i].trim().to_string(), v));
            } else if let Some(i) = term.find('<') {
                let v = term[i + 1..].trim().parse().map_err(|_| bad())?;
                reqs.push(LabelReq::Lt(term[..i].trim().to_string(), v));
            } else if term.contains(char::is_whitespace) {
                return Err(bad());
            } else {
                reqs.push(LabelReq::Exists(term.clone()));
            }
        }
        Ok(Self(reqs))
    }

    pub fn matches(&self, obj: &Value) -> bool {
        let labels = obj.pointer("/metadata/labels").and_then(Value::as_object);
        let get = |k: &str| labels.and_then(|l| l.get(k)).and_then(Value::as_str);
        self.0.iter().all(|r| match r {
            LabelReq::Eq(k, v) => get(k) == Some(v.as_str()),
            LabelReq::NotEq(k, v) => get(k) != Some(v.as_str()),
            LabelReq::In(k, vs) => get(k).is_some_and(|x| vs.iter().any(|v| v == x)),
            LabelReq::NotIn(k, vs) => get(k).is_none_or(|x| !vs.iter().any(|v| v == x)),
            LabelReq::Exists(k) => get(k).is_some(),
            LabelReq::NotExists(k) => get(k).is_none(),
            LabelReq::Gt(k, n) => get(k)
                .and_then(|x| x.parse::<i64>().ok())
                .is_some_and(|x| x > *n),
            LabelReq::Lt(k, n) => get(k)
                .and_then(|x| x.parse::<i64>().ok())
                .is_some_and(|x| x < *n),
        })
    }
}

/// A parsed `fieldSelector` (`k=v`, `k==v`, `k!=v`, comma separated; `\` escapes).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FieldSelector(Vec<(String, bool, String)>);

fn split_escaped(s: &str, sep: char) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut esc = false;
    for c in s.chars() {
        if esc {
            cur.push('\\');
            cur.push(c);
            esc = false;
        } else if c == '\\' {
            esc = true;
        } else if c == sep {
            out.push(std::mem::take(&mut cur));
        } else {
            cur.push(c);
        }
    }
    out.push(cur);
    out
}

fn unescape(s: &str) -> String {
    let mut out = String::new();
    let mut esc = false;
    for c in s.chars() {
        if esc {
            out.push(c);
            esc = false;
        } else if c == '\\' {
            esc = true;
        } else {
            out.push(c);
        }
    }
    out
}

impl FieldSelector {
    pub fn parse(s: &str, res: &ResourceDef) -> Result<Self, ApiError> {
        let mut reqs = Vec::new();
        for term in split_escaped(s, ',') {
            if term.trim().is_empty() {
                continue;
            }
            let (k, eq, v) = if let Some(i) = term.find("!=") {
                (&term[..i], false, &term[i + 2..])
            } else if let Some(i) = term.find("==") {
                (&term[..i], true, &term[i + 2..])
            } else if let Some(i) = term.find('=') {
                (&term[..i], true, &term[i + 1..])
            } else {
                return Err(ApiError::bad_request(format!(
                    "invalid selector: '{s}'; can't understand '{term}'"
                )));
            };
            let k = k.trim();
            if !res.supports_field(k) {
                return Err(ApiError::bad_request(format!(
                    "field label not supported: {k}"
                )));
            }
            reqs.push((k.to_string(), eq, unescape(v.trim())));
        }
        Ok(Self(reqs))
    }

    pub fn matches(&self, obj: &Value) -> bool {
        self.0
            .iter()
            .all(|(k, eq, v)| (field_value(obj, k) == *v) == *eq)
    }

    /// The value an exact `field=value` term requires, if any.
    pub fn exact(&self, field: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(k, eq, _)| k == field && *eq)
            .map(|(_, _, v)| v.as_str())
    }
}

/// The string a field selector compares for `path` (missing → "").
pub fn field_value(obj: &Value, path: &str) -> String {
    let path = if path == "source" {
        "source.component"
    } else {
        path
    };
    let mut cur = obj;
    for seg in path.split('.') {
        match cur.get(seg) {
            Some(v) => cur = v,
            None => return String::new(),
        }
    }
    match cur {
        Value::String(s) => s.clone(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => n.to_string(),
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn label_selectors() {
        let o = json!({"metadata": {"labels": {"app": "web", "tier": "fe", "n": "5"}}});
        for (sel, want) in [
            ("app=web", true),
            ("app==web,tier=fe", true),
            ("app!=web", false),
            ("app in (db, web)", true),
            ("app notin (web)", false),
            ("missing", false),
            ("!missing", true),
            ("app,tier", true),
            ("n>4", true),
            ("n<5", false),
            ("", true),
        ] {
            assert_eq!(
                LabelSelector::parse(sel).unwrap().matches(&o),
                want,
                "{sel}"
            );
        }
    }

    #[test]
    fn field_selectors() {
        let pods = find("", "v1", "pods").unwrap();
        let o = json!({"metadata": {"name": "a", "namespace": "d"}, "spec": {"nodeName": "n1", "hostNetwork": true}});
        assert!(
            FieldSelector::parse("spec.nodeName=n1", pods)
                .unwrap()
                .matches(&o)
        );
        assert!(
            FieldSelector::parse("spec.nodeName==n1,metadata.name=a", pods)
                .unwrap()
                .matches(&o)
        );
        assert!(
            !FieldSelector::parse("spec.nodeName!=n1", pods)
                .unwrap()
                .matches(&o)
        );
        assert!(
            FieldSelector::parse("spec.hostNetwork=true", pods)
                .unwrap()
                .matches(&o)
        );
        assert!(
            FieldSelector::parse("status.phase=", pods)
                .unwrap()
                .matches(&o)
        );
        assert_eq!(
            FieldSelector::parse("spec.bogus=1", pods).unwrap_err().code,
            400
        );
    }
}
