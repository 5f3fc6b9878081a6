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

use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

use crate::settings::resolve::{dur, gate_or, invalid, ip, port};
use crate::settings::{ConfigError, Flags, KubeletConfiguration};
use plumbing::duration;

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
pub struct ConnectionLimits {
    pub max_connections: usize,
    pub max_connections_per_source: usize,
    pub authenticated_connection_reserve: usize,
    pub max_connections_per_identity: usize,
}

impl Default for ConnectionLimits {
    fn default() -> Self {
        ConnectionLimits {
            max_connections: DEFAULT_MAX_CONNECTIONS,
            max_connections_per_source: DEFAULT_MAX_CONNECTIONS_PER_SOURCE,
            authenticated_connection_reserve: DEFAULT_MAX_CONNECTIONS / 4,
            max_connections_per_identity: DEFAULT_MAX_CONNECTIONS / 4,
        }
    }
}

impl ConnectionLimits {
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
pub fn merge(file: Option<&FileSettings>) -> Result<ConnectionLimits, String> {
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
    Ok(ConnectionLimits {
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

// ---------------------------------------------------------------------------------------
// Everything the servers are configured with.

/// The servers' settings, validated: :10250 (`enableServer`, `address`, `port`, TLS,
/// `authentication` / `authorization`, the handlers), the read-only port and :10248.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Settings {
    /// `enableServer` (default true): serve the :10250 API.
    pub enable_server: bool,
    pub address: IpAddr,
    pub port: u16,
    pub read_only_port: u16,
    pub healthz_port: u16,
    pub healthz_bind_address: IpAddr,
    pub tls_cert_file: Option<PathBuf>,
    pub tls_private_key_file: Option<PathBuf>,
    /// The `ReloadKubeletServerCertificateFile` gate (beta, on by default as upstream): a
    /// configured serving pair is reloaded when its files change.
    #[serde(skip)]
    pub reload_tls_cert_files: bool,
    /// `tlsMinVersion` (validated).
    pub tls_min_version: Option<String>,
    /// `tlsCipherSuites` (validated).
    pub tls_cipher_suites: Vec<String>,
    /// `serverTLSBootstrap`: the serving certificate comes from a `kubernetes.io/kubelet-serving`
    /// CSR (cluster mode only) and is rotated before expiry.
    pub server_tls_bootstrap: bool,
    /// `authentication` / `authorization`, flags over file, upstream's defaults.
    pub auth: AuthSettings,
    /// `enableSystemLogHandler` (default true): `/logs/` is served.
    pub enable_system_log_handler: bool,
    /// `enableDebuggingHandlers` (default true): exec, attach, port-forward, run, logs.
    pub enable_debugging_handlers: bool,
    /// `enableDebugFlagsHandler`, `enableProfilingHandler` and the z-page gates.
    #[serde(flatten)]
    pub debug: DebugSettings,
    /// `streamingConnectionIdleTimeout` (default 4h): an exec/attach/port-forward connection
    /// with no traffic for this long is closed.
    #[serde(with = "duration::serde_opt_plain")]
    pub streaming_connection_idle_timeout: Duration,
    /// `maxOpenFiles`: RLIMIT_NOFILE set at start.
    pub max_open_files: u64,
    /// `nodeAgentServer` (ours): the servers' connection limits.
    #[serde(rename = "server")]
    pub connections: ConnectionLimits,
}

/// Flags over the file over upstream's defaults.
pub fn resolve(flags: &Flags, file: &KubeletConfiguration) -> Result<Settings, ConfigError> {
    let (tls_min_version, tls_cipher_suites) = tls(flags, file)?;
    let system_log_handler = file
        .enable_system_log_handler
        .as_ref()
        .and_then(|v| v.as_bool());
    Ok(Settings {
        enable_server: file.enable_server.unwrap_or(true),
        address: ip(
            "address",
            (flags.address.as_deref())
                .or(file.address.as_deref())
                .unwrap_or("0.0.0.0"),
        )?,
        port: port("port", flags.port.or(file.port).unwrap_or(10250), false)?,
        read_only_port: port(
            "readOnlyPort",
            flags.read_only_port.or(file.read_only_port).unwrap_or(0),
            true,
        )?,
        healthz_port: port(
            "healthzPort",
            flags.healthz_port.or(file.healthz_port).unwrap_or(10248),
            true,
        )?,
        healthz_bind_address: ip(
            "healthzBindAddress",
            (flags.healthz_bind_address.as_deref())
                .or(file.healthz_bind_address.as_deref())
                .unwrap_or("127.0.0.1"),
        )?,
        tls_cert_file: (flags.tls_cert_file.clone())
            .or(file.tls_cert_file.clone())
            .map(PathBuf::from),
        tls_private_key_file: (flags.tls_private_key_file.clone())
            .or(file.tls_private_key_file.clone())
            .map(PathBuf::from),
        reload_tls_cert_files: gate_or(flags, file, crate::certs::serving_files::RELOAD_GATE, true),
        tls_min_version,
        tls_cipher_suites,
        server_tls_bootstrap: file.server_tls_bootstrap.unwrap_or(false),
        auth: auth(flags, file)?,
        enable_system_log_handler: system_log_handler.unwrap_or(true),
        enable_debugging_handlers: file.enable_debugging_handlers.unwrap_or(true),
        debug: debug_settings(
            file.enable_debug_flags_handler.as_ref(),
            file.enable_profiling_handler.as_ref(),
            file.enable_system_log_query.as_ref(),
            system_log_handler != Some(false),
            |name, default| gate_or(flags, file, name, default),
        )
        .map_err(invalid)?,
        streaming_connection_idle_timeout: dur(
            "streamingConnectionIdleTimeout",
            &flags.streaming_connection_idle_timeout,
            file.streaming_connection_idle_timeout,
            Duration::from_secs(4 * 3600),
        )?,
        max_open_files: max_open_files(flags.max_open_files, file.max_open_files.as_ref())
            .map_err(invalid)?,
        connections: merge(file.node_agent_server.as_ref()).map_err(invalid)?,
    })
}

/// `tlsMinVersion` and `tlsCipherSuites`, checked against what the TLS stack offers.
fn tls(
    flags: &Flags,
    file: &KubeletConfiguration,
) -> Result<(Option<String>, Vec<String>), ConfigError> {
    let min_version = (flags.tls_min_version.clone())
        .or(file.tls_min_version.clone())
        .filter(|s| !s.is_empty());
    let suites: Vec<String> = match &flags.tls_cipher_suites {
        Some(list) => list.split(',').map(|s| s.trim().to_string()).collect(),
        None => file.tls_cipher_suites.clone().unwrap_or_default(),
    }
    .into_iter()
    .filter(|s| !s.is_empty())
    .collect();
    super::tls_policy(min_version.as_deref(), &suites).map_err(invalid)?;
    Ok((min_version, suites))
}

/// `authentication` / `authorization` with the auth flags over them.
fn auth(flags: &Flags, file: &KubeletConfiguration) -> Result<AuthSettings, ConfigError> {
    auth_settings(
        AuthFlags {
            anonymous_auth: flags.anonymous_auth,
            authentication_token_webhook: flags.authentication_token_webhook,
            authentication_token_webhook_cache_ttl: flags
                .authentication_token_webhook_cache_ttl
                .as_deref(),
            authorization_mode: flags.authorization_mode.as_deref(),
            authorization_webhook_cache_authorized_ttl: flags
                .authorization_webhook_cache_authorized_ttl
                .as_deref(),
            authorization_webhook_cache_unauthorized_ttl: flags
                .authorization_webhook_cache_unauthorized_ttl
                .as_deref(),
            client_ca_file: flags.client_ca_file.as_deref(),
        },
        flags.config.is_some(),
        file.authentication.as_ref(),
        file.authorization.as_ref(),
    )
    .map_err(invalid)
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
