//! The settings of the kubelet's servers: `maxOpenFiles` (applied by `plumbing::fd_limit`) and
//! `nodeAgentServer` (ours, not upstream's: the connection limits of `plumbing::http_server::conn_limit`).
//!
//! ```yaml
//! nodeAgentServer:
//!   maxConnections: 4096                 # per server
//!   maxConnectionsPerSource: 256         # without an authorized request, per IP (IPv6: /64)
//!   authenticatedConnectionReserve: 1024 # :10250 slots kept for authenticated connections
//!   maxConnectionsPerIdentity: 1024      # :10250 authenticated connections of one user
//! ```

use std::time::Duration;

use super::listener::{Limits, ServerType};
use super::{AuthSettings, AuthzMode};
use serde::Serialize;

pub use crate::settings::file::{
    KubeletAnonymousAuthentication, KubeletAuthentication, KubeletAuthorization,
    KubeletWebhookAuthentication, KubeletWebhookAuthorization, KubeletX509Authentication,
    ServerFileSettings as FileSettings,
};

/// Open connections per server unless `maxConnections` says otherwise.
pub const DEFAULT_MAX_CONNECTIONS: usize = 4096;
/// Connections without an authorized request per source, unless configured.
pub const DEFAULT_MAX_CONNECTIONS_PER_SOURCE: usize = 256;


/// The servers' connection limits, validated.
#[derive(Debug, Clone, Copy, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Settings {
    pub max_connections: usize,
    pub max_connections_per_source: usize,
    pub authenticated_connection_reserve: usize,
    pub max_connections_per_identity: usize,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            max_connections: DEFAULT_MAX_CONNECTIONS,
            max_connections_per_source: DEFAULT_MAX_CONNECTIONS_PER_SOURCE,
            authenticated_connection_reserve: DEFAULT_MAX_CONNECTIONS / 4,
            max_connections_per_identity: DEFAULT_MAX_CONNECTIONS / 4,
        }
    }
}

impl Settings {
    /// One server's limits: :10250 gets all four; the read-only port (no authentication)
    /// the cap and the per-source cap; :10248 (loopback by default) only the cap.
    pub fn limits(&self, kind: ServerType) -> Limits {
        let (per_source, reserve, per_identity) = match kind {
            ServerType::ReadWrite => (
                self.max_connections_per_source,
                self.authenticated_connection_reserve,
                self.max_connections_per_identity,
            ),
            ServerType::ReadOnly => (self.max_connections_per_source, 0, usize::MAX),
            ServerType::Healthz => (usize::MAX, 0, usize::MAX),
        };
        Limits {
            max_connections: self.max_connections,
            max_per_source: per_source,
            authenticated_reserve: reserve,
            max_per_identity: per_identity,
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
    let per_identity = field(
        "maxConnectionsPerIdentity",
        f.max_connections_per_identity,
        1,
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
        max_connections_per_identity: per_identity.max(1),
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

// ---------------------------------------------------------------------------------------
// :10250 authentication and authorization.

/// The auth flags, which win over the file (`--anonymous-auth`, `--authentication-token-webhook`,
/// its cache TTL, `--authorization-mode`, the authorization webhook's cache TTLs,
/// `--client-ca-file`).
#[derive(Debug, Default, Clone, Copy)]
pub struct AuthFlags<'a> {
    pub anonymous_auth: Option<bool>,
    pub authentication_token_webhook: Option<bool>,
    pub authentication_token_webhook_cache_ttl: Option<&'a str>,
    pub authorization_mode: Option<&'a str>,
    pub authorization_webhook_cache_authorized_ttl: Option<&'a str>,
    pub authorization_webhook_cache_unauthorized_ttl: Option<&'a str>,
    pub client_ca_file: Option<&'a str>,
}

/// `authentication` / `authorization`: flags over the file. Upstream's defaults differ with and
/// without a config file (`has_file`): v1beta1's (anonymous off, webhook on, mode Webhook)
/// apply to a file, the legacy flag defaults (anonymous on, webhook off, AlwaysAllow) when
/// there is none.
pub fn auth_settings(
    flags: AuthFlags<'_>,
    has_file: bool,
    authn: Option<&KubeletAuthentication>,
    authz: Option<&KubeletAuthorization>,
) -> Result<AuthSettings, String> {
    let authn = authn.cloned().unwrap_or_default();
    let authz = authz.cloned().unwrap_or_default();
    let anonymous = flags
        .anonymous_auth
        .or(authn.anonymous.and_then(|a| a.enabled))
        .unwrap_or(!has_file);
    let webhook = flags
        .authentication_token_webhook
        .or(authn.webhook.as_ref().and_then(|w| w.enabled))
        .unwrap_or(has_file);
    // v1beta1 defaulting: an absent or zero TTL (kubeadm writes `0s`) is the default.
    let ttl = |name: &str, v: Option<&serde_json::Value>, default: u64| {
        let d = match v {
            None | Some(serde_json::Value::Null) => Duration::ZERO,
            Some(serde_json::Value::String(s)) => {
                plumbing::duration::parse(s).map_err(|e| format!("{name}: {e}"))?
            }
            Some(other) => {
                return Err(format!("{name}: want a duration string, got {other}"));
            }
        };
        Ok(if d.is_zero() {
            Duration::from_secs(default)
        } else {
            d
        })
    };
    // A flag applies after defaulting, as upstream's: `0s` there turns the cache off.
    let flag_ttl = |name: &str, v: Option<&str>| {
        v.map(|s| plumbing::duration::parse(s).map_err(|e| format!("--{name}: {e}")))
            .transpose()
    };
    let cache_ttl = match flag_ttl(
        "authentication-token-webhook-cache-ttl",
        flags.authentication_token_webhook_cache_ttl,
    )? {
        Some(d) => d,
        None => ttl(
            "authentication.webhook.cacheTTL",
            authn.webhook.as_ref().and_then(|w| w.cache_ttl.as_ref()),
            120,
        )?,
    };
    let authz_webhook = authz.webhook.clone().unwrap_or_default();
    let cache_authorized_ttl = match flag_ttl(
        "authorization-webhook-cache-authorized-ttl",
        flags.authorization_webhook_cache_authorized_ttl,
    )? {
        Some(d) => d,
        None => ttl(
            "authorization.webhook.cacheAuthorizedTTL",
            authz_webhook.cache_authorized_ttl.as_ref(),
            300,
        )?,
    };
    let cache_unauthorized_ttl = match flag_ttl(
        "authorization-webhook-cache-unauthorized-ttl",
        flags.authorization_webhook_cache_unauthorized_ttl,
    )? {
        Some(d) => d,
        None => ttl(
            "authorization.webhook.cacheUnauthorizedTTL",
            authz_webhook.cache_unauthorized_ttl.as_ref(),
            30,
        )?,
    };
    let client_ca_file = flags
        .client_ca_file
        .map(str::to_string)
        .or(authn.x509.and_then(|x| x.client_ca_file))
        .filter(|s| !s.is_empty());
    let mode = flags
        .authorization_mode
        .map(str::to_string)
        .or(authz.mode)
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| if has_file { "Webhook" } else { "AlwaysAllow" }.into());
    let mode = AuthzMode::parse(&mode).map_err(|e| format!("authorization.mode: {e}"))?;
    Ok(AuthSettings {
        anonymous,
        webhook,
        client_ca_file,
        mode,
        cache_ttl,
        cache_authorized_ttl,
        cache_unauthorized_ttl,
    })
}

#[cfg(test)]
mod tests;

// ---------------------------------------------------------------------------------------
// The debugging endpoints.

/// `enableDebugFlagsHandler`, `enableProfilingHandler` (both default true, as upstream) and
/// the z-page gates `ComponentStatusz` (beta, on in v1.36) and `ComponentFlagz`.
#[derive(Debug, Clone, Copy, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct DebugSettings {
    pub enable_debug_flags_handler: bool,
    pub enable_profiling_handler: bool,
    /// `enableSystemLogQuery` (default false): `/logs/?query=` (NodeLogQuery).
    pub enable_system_log_query: bool,
    #[serde(skip)]
    pub statusz: bool,
    #[serde(skip)]
    pub flagz: bool,
}

/// The z-page gates and their upstream v1.36 defaults.
pub const ZPAGE_GATES: [(&str, bool); 2] = [("ComponentStatusz", true), ("ComponentFlagz", true)];

/// The NodeLogQuery gate (beta, off by default upstream).
pub const NODE_LOG_QUERY_GATE: &str = "NodeLogQuery";

/// Resolves [`DebugSettings`] from the file's fields and `gate(name, default)`; a field
/// that is not a boolean is an error naming it, and `enableSystemLogQuery` needs the
/// `NodeLogQuery` gate and `enableSystemLogHandler` (upstream's validation messages).
pub fn debug_settings(
    flags_handler: Option<&serde_json::Value>,
    profiling_handler: Option<&serde_json::Value>,
    system_log_query: Option<&serde_json::Value>,
    system_log_handler: bool,
    gate: impl Fn(&str, bool) -> bool,
) -> Result<DebugSettings, String> {
    let flag = |name: &str, v: Option<&serde_json::Value>, default: bool| match v {
        None | Some(serde_json::Value::Null) => Ok(default),
        Some(serde_json::Value::Bool(b)) => Ok(*b),
        Some(other) => Err(format!("{name}: {other} is not a boolean")),
    };
    let query = flag("enableSystemLogQuery", system_log_query, false)?;
    if query && !gate(NODE_LOG_QUERY_GATE, false) {
        return Err(
            "invalid configuration: NodeLogQuery feature gate is required for enableSystemLogHandler"
                .into(),
        );
    }
    if query && !system_log_handler {
        return Err(
            "invalid configuration: enableSystemLogHandler is required for enableSystemLogQuery"
                .into(),
        );
    }
    Ok(DebugSettings {
        enable_debug_flags_handler: flag("enableDebugFlagsHandler", flags_handler, true)?,
        enable_profiling_handler: flag("enableProfilingHandler", profiling_handler, true)?,
        enable_system_log_query: query,
        statusz: gate(ZPAGE_GATES[0].0, ZPAGE_GATES[0].1),
        flagz: gate(ZPAGE_GATES[1].0, ZPAGE_GATES[1].1),
    })
}
