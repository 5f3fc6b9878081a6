//! `--config-dir`: KubeletConfiguration drop-ins, as upstream merges them. Every `*.conf`
//! file under the directory (walked in lexical order, subdirectories included, as Go's
//! `filepath.WalkDir`) is a KubeletConfiguration of its own (`kind` and `apiVersion`
//! required) and is applied over the configuration so far as a JSON merge patch (RFC 7386:
//! objects merge key by key, lists and scalars replace, `null` removes). A drop-in that does
//! not parse, or names a field upstream's KubeletConfiguration does not have, stops the start
//! with an error naming the file (upstream decodes drop-ins strictly).

use std::path::{Path, PathBuf};

use serde_json::Value;

use super::{ConfigError, KubeletConfiguration, parse_file};

const EXTENSION: &str = "conf";

/// The `*.conf` files under `dir` in the order upstream applies them: each directory's
/// entries by name, a subdirectory's files where the subdirectory sorts (WalkDir's order).
/// Blocking.
pub fn files(dir: &Path) -> Result<Vec<PathBuf>, ConfigError> {
    let mut entries: Vec<(PathBuf, bool)> = std::fs::read_dir(dir)
        .map_err(|source| ConfigError::Read {
            path: format!(
                "failed to walk through kubelet dropin directory {:?}",
                dir.display().to_string()
            ),
            source,
        })?
        .filter_map(Result::ok)
        .map(|e| (e.path(), e.file_type().is_ok_and(|t| t.is_dir())))
        .collect();
    entries.sort();
    let mut out = Vec::new();
    for (path, is_dir) in entries {
        if is_dir {
            out.extend(files(&path)?);
        } else if path.extension().is_some_and(|x| x == EXTENSION) {
            out.push(path);
        }
    }
    Ok(out)
}

/// RFC 7386 JSON merge patch of `patch` onto `target`.
pub fn merge_patch(target: &mut Value, patch: &Value) {
    let Value::Object(fields) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = Value::Object(Default::default());
    }
    let Value::Object(t) = target else {
        return;
    };
    for (k, v) in fields {
        if v.is_null() {
            t.remove(k);
        } else {
            merge_patch(t.entry(k.clone()).or_insert(Value::Null), v);
        }
    }
}

fn yaml_value(path: &str, text: &str) -> Result<Value, ConfigError> {
    let opts = serde_saphyr::options! { legacy_octal_numbers: true };
    let v: Option<Value> =
        serde_saphyr::from_str_with_options(text, opts).map_err(|e| ConfigError::Parse {
            path: path.to_string(),
            message: e.to_string(),
        })?;
    Ok(v.unwrap_or(Value::Object(Default::default())))
}

/// One drop-in, decoded strictly: its own KubeletConfiguration with `kind` and
/// `apiVersion`, no field upstream does not have.
pub fn decode(path: &Path, text: &str) -> Result<Value, ConfigError> {
    let shown = path.display().to_string();
    let fail = |message: String| ConfigError::Parse {
        path: format!("failed to load kubelet dropin file, path: {shown}"),
        message,
    };
    let typed: KubeletConfiguration = parse_file(&shown, text).map_err(|e| match e {
        ConfigError::Parse { message, .. } => fail(message),
        other => other,
    })?;
    if typed.kind.is_none() {
        return Err(fail("Object 'Kind' is missing".into()));
    }
    if typed.api_version.is_none() {
        return Err(fail("Object 'apiVersion' is missing".into()));
    }
    if let Some(field) = typed.extra.keys().next() {
        return Err(fail(format!(
            "strict decoding error: unknown field {field:?}"
        )));
    }
    yaml_value(&shown, text)
}

/// The main file's text (if any) with every drop-in of `dir` applied, as one JSON document
/// for [`parse_file`]. Blocking.
pub fn merge(main: Option<(&str, &str)>, dir: &Path) -> Result<String, ConfigError> {
    let mut merged = match main {
        Some((path, text)) => yaml_value(path, text)?,
        None => Value::Object(Default::default()),
    };
    for file in files(dir)? {
        let text = std::fs::read_to_string(&file).map_err(|source| ConfigError::Read {
            path: file.display().to_string(),
            source,
        })?;
        let patch = decode(&file, &text)?;
        tracing::info!(file = %file.display(), "applying kubelet config drop-in");
        merge_patch(&mut merged, &patch);
    }
    Ok(merged.to_string())
}

#[cfg(test)]
mod tests;
