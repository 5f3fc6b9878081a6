//! The `logging` section of KubeletConfiguration and KubeProxyConfiguration
//! (component-base's LoggingConfiguration) with the logging flags over it.

use super::filter::VModule;
use serde_json::Value;

/// The line format (`--logging-format`, `logging.format`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Format {
    #[default]
    Text,
    Json,
}

/// A logging setting upstream's validation refuses.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum LogError {
    #[error("logging.format: Invalid value: {0:?}: Unsupported log format")]
    Format(String),
    #[error("logging.vmodule: Invalid value: {0:?}: {1}")]
    VModule(String, &'static str),
    #[error("logging.verbosity: Invalid value: {0}: must be a non-negative integer")]
    Verbosity(String),
    #[error("logging.{0}: Invalid value: {1}: must be a boolean")]
    Bool(&'static str, String),
}

/// The logging flags as given (absent when not on the command line).
#[derive(Clone, Debug, Default)]
pub struct Flags<'a> {
    pub format: Option<&'a str>,
    pub verbosity: Option<i32>,
    pub vmodule: Option<&'a str>,
    pub text_split_stream: Option<bool>,
    pub json_split_stream: Option<bool>,
}

/// What the logger does.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Options {
    pub format: Format,
    pub verbosity: i32,
    pub vmodule: Vec<VModule>,
    /// Errors to stderr, the rest to stdout (the chosen format's `splitStream`).
    pub split_stream: bool,
}

fn parse_format(s: &str) -> Result<Format, LogError> {
    match s {
        "" | "text" => Ok(Format::Text),
        "json" => Ok(Format::Json),
        other => Err(LogError::Format(other.to_string())),
    }
}

/// `pattern=N,pattern=N` as klog's `-vmodule`.
pub fn parse_vmodule(s: &str) -> Result<Vec<VModule>, LogError> {
    let mut out = Vec::new();
    for part in s.split(',').filter(|p| !p.is_empty()) {
        let bad = |why| LogError::VModule(s.to_string(), why);
        let (pattern, v) = part
            .split_once('=')
            .ok_or_else(|| bad("expect comma-separated list of filename=N"))?;
        let verbosity = v
            .parse::<u32>()
            .map_err(|_| bad("expect comma-separated list of filename=N"))?;
        if pattern.is_empty() {
            return Err(bad("expect comma-separated list of filename=N"));
        }
        out.push(VModule {
            pattern: pattern.to_string(),
            verbosity: verbosity.min(i32::MAX as u32) as i32,
        });
    }
    Ok(out)
}

fn file_vmodule(v: &Value) -> Result<Vec<VModule>, LogError> {
    let Some(items) = v.as_array() else {
        return Err(LogError::VModule(v.to_string(), "must be a list"));
    };
    items
        .iter()
        .map(|item| {
            let pattern = item
                .get("filePattern")
                .and_then(Value::as_str)
                .unwrap_or("");
            let v = item.get("verbosity").and_then(Value::as_u64).unwrap_or(0);
            if pattern.is_empty() {
                return Err(LogError::VModule(
                    item.to_string(),
                    "filePattern is required",
                ));
            }
            Ok(VModule {
                pattern: pattern.to_string(),
                verbosity: v.min(i32::MAX as u64) as i32,
            })
        })
        .collect()
}

fn file_bool(file: Option<&Value>, path: &'static str) -> Result<Option<bool>, LogError> {
    let pointer = format!("/{}", path.replace('.', "/"));
    match file.and_then(|f| f.pointer(&pointer)) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(other) => Err(LogError::Bool(path, other.to_string())),
    }
}

impl Options {
    /// The file's `logging` section (`file`) with the flags given over it, as upstream's.
    pub fn resolve(flags: &Flags<'_>, file: Option<&Value>) -> Result<Options, LogError> {
        let get = |k: &str| file.and_then(|f| f.get(k)).filter(|v| !v.is_null());
        let format = match (flags.format, get("format")) {
            (Some(f), _) => parse_format(f)?,
            (None, Some(Value::String(f))) => parse_format(f)?,
            (None, Some(other)) => return Err(LogError::Format(other.to_string())),
            (None, None) => Format::Text,
        };
        let verbosity = match (flags.verbosity, get("verbosity")) {
            (Some(v), _) => v,
            (None, Some(v)) => v
                .as_u64()
                .map(|n| n.min(i32::MAX as u64) as i32)
                .ok_or_else(|| LogError::Verbosity(v.to_string()))?,
            (None, None) => 0,
        };
        let vmodule = match (flags.vmodule, get("vmodule")) {
            (Some(s), _) => parse_vmodule(s)?,
            (None, Some(v)) => file_vmodule(v)?,
            (None, None) => Vec::new(),
        };
        let split_stream = match format {
            Format::Text => flags
                .text_split_stream
                .or(file_bool(file, "options.text.splitStream")?),
            Format::Json => flags
                .json_split_stream
                .or(file_bool(file, "options.json.splitStream")?),
        }
        .unwrap_or(false);
        Ok(Options {
            format,
            verbosity,
            vmodule,
            split_stream,
        })
    }
}
