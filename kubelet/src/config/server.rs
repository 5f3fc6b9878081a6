//! The settings of the kubelet's servers: `maxOpenFiles` (applied by `server::fd_limit`).

use super::{ConfigError, invalid};

/// `maxOpenFiles` (flag first; 0 or unset: 1000000, v1beta1's default); negative is invalid,
/// as upstream's validation says.
pub fn max_open_files(
    flag: Option<i64>,
    file: Option<&serde_json::Value>,
) -> Result<u64, ConfigError> {
    let v = match (flag, file) {
        (Some(v), _) => v,
        (None, None) | (None, Some(serde_json::Value::Null)) => 0,
        (None, Some(v)) => v
            .as_i64()
            .ok_or_else(|| invalid(format!("maxOpenFiles: {v} is not an integer")))?,
    };
    match u64::try_from(v) {
        Ok(0) => Ok(1_000_000),
        Ok(n) => Ok(n),
        Err(_) => Err(invalid(format!(
            "maxOpenFiles (--max-open-files) {v} must not be a negative number"
        ))),
    }
}
