//! `labelSelector` and `fieldSelector`: parsing (with the apiserver's 400s) and matching.

use serde_json::Value;

use super::resources::ResourceDef;
use super::status::ApiError;

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

    /// Every exact (`=`/`==`) term as (field, value): what authorization looks at.
    pub fn exact_terms(&self) -> Vec<(String, String)> {
        self.0
            .iter()
            .filter(|(_, eq, _)| *eq)
            .map(|(k, _, v)| (k.clone(), v.clone()))
            .collect()
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
    use crate::controlplane::resources::find;
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
