//! The settings registry: every flag and config field a binary accepts, with what it does here.
//!
//! The rule: no setting is accepted and silently ignored. A setting either works as upstream's
//! ([`Status::Implemented`]), or it has no effect here and one warning names it at start when it
//! is set to a value other than upstream's default ([`Status::NotImplemented`]), or it is
//! security-relevant and not provided, so the agent refuses to start when it is set to such a
//! value ([`Status::Refused`]).
//!
//! This is the machinery ([`Setting`], [`check_file`], [`check_flags`], [`markdown_table`]),
//! shared by the kubelet and kube-proxy; each keeps its own registry (`kubelet::settings`,
//! `proxy::settings`). `docs/settings.md` is generated from both registries.

use serde_json::Value;

/// What the agent does with a setting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// Works as upstream's.
    Implemented,
    /// Accepted, has no effect: one warning at start when set to a value not in `ok`.
    NotImplemented,
    /// Security-relevant and not provided: the agent refuses to start when it is set to a value
    /// not in `ok`.
    Refused,
}

impl Status {
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Implemented => "Implemented",
            Status::NotImplemented => "NotImplemented",
            Status::Refused => "Refused",
        }
    }
}

/// One flag (`--name`) or config field (`name`, nested ones as `outer.inner`).
#[derive(Debug, Clone, Copy)]
pub struct Setting {
    pub name: &'static str,
    pub status: Status,
    /// Values (YAML scalars or `{}`/`[]`) that need no warning or refusal: upstream's default,
    /// the zero value upstream's defaulting replaces by it, and values whose behaviour the agent
    /// provides. An absent, `null`, `""`, `{}` or `[]` value is never "set".
    pub ok: &'static [&'static str],
    pub note: &'static str,
}

/// Shorthands for registry tables.
pub const fn implemented(name: &'static str, note: &'static str) -> Setting {
    Setting {
        name,
        status: Status::Implemented,
        ok: &[],
        note,
    }
}

pub const fn not_implemented(
    name: &'static str,
    ok: &'static [&'static str],
    note: &'static str,
) -> Setting {
    Setting {
        name,
        status: Status::NotImplemented,
        ok,
        note,
    }
}

pub const fn refused(
    name: &'static str,
    ok: &'static [&'static str],
    note: &'static str,
) -> Setting {
    Setting {
        name,
        status: Status::Refused,
        ok,
        note,
    }
}

/// What checking the settings found: warnings to log, and refusals that stop the start.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Findings {
    pub warnings: Vec<String>,
    pub refusals: Vec<String>,
}

impl Findings {
    pub fn extend(&mut self, other: Findings) {
        self.warnings.extend(other.warnings);
        self.refusals.extend(other.refusals);
    }
}

fn is_unset(v: &Value) -> bool {
    match v {
        Value::Null => true,
        Value::String(s) => s.is_empty(),
        Value::Object(m) => m.is_empty(),
        Value::Array(a) => a.is_empty(),
        _ => false,
    }
}

fn scalar_text(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.trim().to_string()),
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(b.to_string()),
        _ => None,
    }
}

/// Whether two scalars mean the same: as booleans (Go's spellings), numbers, Go durations, or
/// text.
fn same_scalar(a: &str, b: &str) -> bool {
    if a == b {
        return true;
    }
    if let (Some(x), Some(y)) = (crate::go::parse_bool(a), crate::go::parse_bool(b)) {
        return x == y;
    }
    if let (Ok(x), Ok(y)) = (a.parse::<f64>(), b.parse::<f64>()) {
        return x == y;
    }
    if let (Some(x), Some(y)) = (
        crate::duration::parse_go_duration(a),
        crate::duration::parse_go_duration(b),
    ) {
        return x == y;
    }
    false
}

fn parse_ok(text: &str) -> Value {
    serde_saphyr::from_str::<Value>(text).unwrap_or_else(|_| Value::String(text.to_string()))
}

/// Whether `v` needs no warning or refusal under `s`.
pub fn is_ok(s: &Setting, v: &Value) -> bool {
    if is_unset(v) {
        return true;
    }
    s.ok.iter().any(|o| {
        let o = parse_ok(o);
        if &o == v {
            return true;
        }
        match (scalar_text(&o), scalar_text(v)) {
            (Some(a), Some(b)) => same_scalar(&a, &b),
            _ => false,
        }
    })
}

fn show(v: &Value) -> String {
    match v {
        Value::String(s) => format!("{s:?}"),
        other => other.to_string(),
    }
}

fn judge(s: &Setting, v: &Value, what: &str, out: &mut Findings) {
    if is_ok(s, v) {
        return;
    }
    match s.status {
        Status::Implemented => {}
        Status::NotImplemented => out.warnings.push(format!(
            "{what} {} is set to {} but has no effect in this agent: {}",
            s.name,
            show(v),
            s.note
        )),
        Status::Refused => out.refusals.push(format!(
            "{what} {} is set to {}, which this agent does not provide: {}",
            s.name,
            show(v),
            s.note
        )),
    }
}

/// Checks a config file (already known to parse) against the registry `fields`: warnings for
/// NotImplemented fields set to non-default values and for fields the registry does not know
/// (upstream's lenient decoding drops those, with a message), refusals for Refused ones.
pub fn check_file(fields: &[Setting], kind: &str, text: &str) -> Findings {
    let mut out = Findings::default();
    let Ok(root) = serde_saphyr::from_str_with_options::<Value>(
        text,
        serde_saphyr::options! { legacy_octal_numbers: true },
    ) else {
        return out;
    };
    if let Value::Object(m) = &root {
        walk(fields, kind, "", m, &mut out);
    }
    out
}

fn walk(
    fields: &[Setting],
    kind: &str,
    prefix: &str,
    obj: &serde_json::Map<String, Value>,
    out: &mut Findings,
) {
    for (k, v) in obj {
        let path = if prefix.is_empty() {
            k.clone()
        } else {
            format!("{prefix}.{k}")
        };
        if let Some(s) = fields.iter().find(|s| s.name == path) {
            judge(s, v, "field", out);
            continue;
        }
        let child = format!("{path}.");
        if fields.iter().any(|s| s.name.starts_with(&child)) {
            if let Value::Object(m) = v {
                walk(fields, kind, &path, m, out);
            }
            continue;
        }
        out.warnings.push(format!(
            "unknown field {path:?}: not a {kind} field this agent knows; ignored"
        ));
    }
}

/// Checks the flags given on the command line (`(name without dashes, raw value)`).
pub fn check_flags(flags: &[Setting], given: &[(String, String)]) -> Findings {
    let mut out = Findings::default();
    for (name, raw) in given {
        let dashed = format!("--{name}");
        if let Some(s) = flags.iter().find(|s| s.name == dashed) {
            judge(s, &Value::String(raw.clone()), "flag", &mut out);
        }
    }
    out
}

/// The flags given explicitly on the command line, as `(long name, raw value)`.
pub fn given_flags(cmd: &clap::Command, m: &clap::ArgMatches) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for arg in cmd.get_arguments() {
        let id = arg.get_id().as_str();
        if m.value_source(id) != Some(clap::parser::ValueSource::CommandLine) {
            continue;
        }
        let Some(long) = arg.get_long() else {
            continue;
        };
        let raw = m
            .get_raw(id)
            .map(|vals| {
                vals.map(|v| v.to_string_lossy().into_owned())
                    .collect::<Vec<_>>()
                    .join(",")
            })
            .unwrap_or_default();
        out.push((long.to_string(), raw));
    }
    out
}

/// A markdown table of a registry.
pub fn markdown_table(settings: &[Setting]) -> String {
    let mut s = String::from("| Setting | Status | Note |\n|---|---|---|\n");
    for e in settings {
        let ok = if e.ok.is_empty() || e.status == Status::Implemented {
            String::new()
        } else {
            format!(
                " (no warning for: {})",
                e.ok.iter()
                    .map(|o| format!("`{o}`"))
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        };
        s.push_str(&format!(
            "| `{}` | {} | {}{} |\n",
            e.name,
            e.status.as_str(),
            e.note.replace('|', "\\|"),
            ok
        ));
    }
    s
}

/// A registry entry (short to write: the registries are long tables of these).
pub const fn s(
    name: &'static str,
    status: Status,
    ok: &'static [&'static str],
    note: &'static str,
) -> Setting {
    Setting {
        name,
        status,
        ok,
        note,
    }
}
