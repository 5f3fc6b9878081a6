//! An event's or span's fields, collected once for either format.

use tracing::field::{Field, Visit};

/// One value as the formats tell them apart: numbers and booleans bare, the rest as strings.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    Str(String),
    I64(i64),
    U64(u64),
    F64(f64),
    Bool(bool),
}

/// The message, the error (the `error` or `err` field, written as upstream's `err`) and the
/// other key/values in order.
#[derive(Debug, Default)]
pub struct Collected {
    pub msg: Option<String>,
    pub err: Option<String>,
    pub kvs: Vec<(&'static str, Value)>,
}

impl Collected {
    fn put(&mut self, field: &Field, value: Value) {
        match (field.name(), value) {
            // A `message` field beside the format string: the format string (visited
            // first) is the message, the field a key/value.
            ("message", Value::Str(s)) if self.msg.is_none() => self.msg = Some(s),
            ("error" | "err", Value::Str(s)) if self.err.is_none() => self.err = Some(s),
            (name, v) => self.kvs.push((name.strip_prefix("r#").unwrap_or(name), v)),
        }
    }
}

impl Visit for Collected {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.put(field, Value::Str(format!("{value:?}")));
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.put(field, Value::Str(value.to_string()));
    }
    fn record_i64(&mut self, field: &Field, value: i64) {
        self.put(field, Value::I64(value));
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        self.put(field, Value::U64(value));
    }
    fn record_f64(&mut self, field: &Field, value: f64) {
        self.put(field, Value::F64(value));
    }
    fn record_bool(&mut self, field: &Field, value: bool) {
        self.put(field, Value::Bool(value));
    }
    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        self.put(field, Value::Str(value.to_string()));
    }
}

/// Go's `%q` of a string: quoted, with `"`, `\` and control characters escaped.
pub fn quote(s: &str, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 || c == '\u{7f}' => {
                out.push_str(&format!("\\x{:02x}", c as u32));
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// ` key=value` pairs as klog writes them: strings quoted, numbers and booleans bare.
pub fn klog_kvs(kvs: &[(&str, Value)], out: &mut String) {
    for (k, v) in kvs {
        out.push(' ');
        out.push_str(k);
        out.push('=');
        match v {
            Value::Str(s) => quote(s, out),
            Value::I64(n) => out.push_str(&n.to_string()),
            Value::U64(n) => out.push_str(&n.to_string()),
            Value::F64(n) => out.push_str(&n.to_string()),
            Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        }
    }
}

/// `,"key":value` pairs (each with its leading comma).
pub fn json_kvs(kvs: &[(&str, Value)], out: &mut String) {
    for (k, v) in kvs {
        out.push(',');
        out.push_str(&serde_json::Value::from(*k).to_string());
        out.push(':');
        let v = match v {
            Value::Str(s) => serde_json::Value::from(s.as_str()),
            Value::I64(n) => serde_json::Value::from(*n),
            Value::U64(n) => serde_json::Value::from(*n),
            Value::F64(n) => serde_json::Value::from(*n),
            Value::Bool(b) => serde_json::Value::from(*b),
        };
        out.push_str(&v.to_string());
    }
}
