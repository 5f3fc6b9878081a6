//! The settings of the kubelet's servers: `maxOpenFiles` (applied by `server::fd_limit`) and
//! `nodeAgentServer` (ours, not upstream's: the connection limits of `server::conn_limit`).
//!
//! ```yaml
//! nodeAgentServer:
//!   maxConnections: 4096                 # per server
//!   maxConnectionsPerSource: 256         # without an authorized request, per IP (IPv6: /64)
//!   authenticatedConnectionReserve: 1024 # :10250 slots kept for authenticated connections
//! ```

use super::listener::{Limits, ServerType};
use serde::{Deserialize, Serialize};

/// Open connections per server unless `maxConnections` says otherwise.
pub const DEFAULT_MAX_CONNECTIONS: usize = 4096;
/// Connections without an authorized request per source, unless configured.
pub const DEFAULT_MAX_CONNECTIONS_PER_SOURCE: usize = 256;

/// `nodeAgentServer` as written in the config file.
#[derive(Debug, Default, Clone, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase", default)]
pub struct FileSettings {
    pub max_connections: Option<i64>,
    pub max_connections_per_source: Option<i64>,
    pub authenticated_connection_reserve: Option<i64>,
}

/// The servers' connection limits, validated.
#[derive(Debug, Clone, Copy, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Settings {
    pub max_connections: usize,
    pub max_connections_per_source: usize,
    pub authenticated_connection_reserve: usize,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            max_connections: DEFAULT_MAX_CONNECTIONS,
            max_connections_per_source: DEFAULT_MAX_CONNECTIONS_PER_SOURCE,
            authenticated_connection_reserve: DEFAULT_MAX_CONNECTIONS / 4,
        }
    }
}

impl Settings {
    /// One server's limits: :10250 gets all three; the read-only port (no authentication)
    /// the cap and the per-source cap; :10248 (loopback by default) only the cap.
    pub fn limits(&self, kind: ServerType) -> Limits {
        let (per_source, reserve) = match kind {
            ServerType::ReadWrite => (
                self.max_connections_per_source,
                self.authenticated_connection_reserve,
            ),
            ServerType::ReadOnly => (self.max_connections_per_source, 0),
            ServerType::Healthz => (usize::MAX, 0),
        };
        Limits {
            max_connections: self.max_connections,
            max_per_source: per_source,
            authenticated_reserve: reserve,
            ..Limits::default()
        }
    }
}

/// `nodeAgentServer` with defaults applied (an absent field: its default; the reserve's is a
/// quarter of `maxConnections`) and checked.
pub fn merge(file: Option<&FileSettings>) -> Result<Settings, String> {
    let f = file.cloned().unwrap_or_default();
    let field = |name: &str, v: Option<i64>, min: i64, default: usize| match v {
        None => Ok(default),
        Some(n) if n >= min => usize::try_from(n).map_err(|e| e.to_string()),
        Some(n) => Err(format!(
            "nodeAgentServer.{name}: {n} must be at least {min}"
        )),
    };
    let max = field(
        "maxConnections",
        f.max_connections,
        1,
        DEFAULT_MAX_CONNECTIONS,
    )?;
    let per_source = field(
        "maxConnectionsPerSource",
        f.max_connections_per_source,
        1,
        DEFAULT_MAX_CONNECTIONS_PER_SOURCE,
    )?;
    let reserve = field(
        "authenticatedConnectionReserve",
        f.authenticated_connection_reserve,
        0,
        max / 4,
    )?;
    if reserve >= max {
        return Err(format!(
            "nodeAgentServer.authenticatedConnectionReserve: {reserve} must be less than maxConnections ({max})"
        ));
    }
    Ok(Settings {
        max_connections: max,
        max_connections_per_source: per_source,
        authenticated_connection_reserve: reserve,
    })
}

/// `maxOpenFiles` (flag first; 0 or unset: 1000000, v1beta1's default); negative is invalid,
/// as upstream's validation says.
pub fn max_open_files(flag: Option<i64>, file: Option<&serde_json::Value>) -> Result<u64, String> {
    let v = match (flag, file) {
        (Some(v), _) => v,
        (None, None) | (None, Some(serde_json::Value::Null)) => 0,
        (None, Some(v)) => v
            .as_i64()
            .ok_or_else(|| format!("maxOpenFiles: {v} is not an integer"))?,
    };
    match u64::try_from(v) {
        Ok(0) => Ok(1_000_000),
        Ok(n) => Ok(n),
        Err(_) => Err(format!(
            "maxOpenFiles (--max-open-files) {v} must not be a negative number"
        )),
    }
}

#[cfg(test)]
mod tests;
