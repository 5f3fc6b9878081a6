//! The kubelet's servers: plain-HTTP healthz on 127.0.0.1:10248, the HTTPS API on :10250
//! (`/healthz`, `/pods`, `/runningpods/`, `/metrics`, `/metrics/probes`, `/configz`,
//! `/containerLogs/{ns}/{pod}/{container}` ([`logs`]), `/logs/` ([`node_logs`]),
//! `/stats/summary`, `/metrics/resource` and `/metrics/cadvisor` (`crate::stats`), `/exec`,
//! `/attach`, `/portForward` and `/run` ([`streaming`]: proxied to the runtime's streaming
//! server), `/statusz` and `/flagz` ([`zpages`]), `/debug/flags/v` and `/debug/pprof/`
//! ([`debug`])) and, when `readOnlyPort` is set, the unauthenticated read-only subset
//! ([`read_only_router`]). All three run on [`listener`] (connection cap, handshake and idle
//! timeouts, request metrics).
//!
//! Every :10250 request passes [`Auth`] first: authentication ([`authn`]: x509 client
//! certificates, TokenReview bearer tokens, anonymous when enabled; 401 otherwise), then
//! authorization ([`authz`]: SubjectAccessReview on `nodes/<subresource>`, or AlwaysAllow when
//! configured; 403 when denied, 500 when the apiserver gives no answer).

pub mod auth_review;
pub mod authn;
pub mod authz;
mod cache;
pub mod debug;
pub mod journal;
pub mod log_query;

pub use authz::{Auth, AuthError, AuthSettings, AuthzMode, Decision, RequestInfo};

pub mod listener;
pub mod logs;
pub mod node_logs;
mod read_only;
mod running_pods;
pub mod settings;
pub use settings::Settings;

pub use read_only::read_only_router;
pub mod streaming;
mod upgrade_proxy;
mod ws_spdy;
pub mod zpages;

use crate::atomic_file;
use crate::metrics::Metrics;
use crate::pleg::PlegHealth;
pub use auth_review::{ApiReview, AuthReview};
use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get, post};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// A server that could not be started.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("listening on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("TLS material {path}: {message}")]
    Tls { path: String, message: String },
    /// Upstream's BuildAuth errors (e.g. webhook modes without an apiserver client).
    #[error(transparent)]
    Auth(#[from] AuthError),
    #[error("{0}")]
    TlsPolicy(String),
}

/// The serving TLS versions and cipher suites (`tlsMinVersion`, `tlsCipherSuites`).
#[derive(Debug, Clone)]
pub struct TlsPolicy {
    pub versions: Vec<&'static rustls::SupportedProtocolVersion>,
    /// None: the provider's defaults.
    pub suites: Option<Vec<rustls::SupportedCipherSuite>>,
}

/// Upstream's Go cipher suite name → the rustls (ring) suite, where rustls has it.
fn cipher_suite(name: &str) -> Option<rustls::SupportedCipherSuite> {
    use rustls::crypto::ring::cipher_suite as cs;
    Some(match name {
        "TLS_AES_128_GCM_SHA256" => cs::TLS13_AES_128_GCM_SHA256,
        "TLS_AES_256_GCM_SHA384" => cs::TLS13_AES_256_GCM_SHA384,
        "TLS_CHACHA20_POLY1305_SHA256" => cs::TLS13_CHACHA20_POLY1305_SHA256,
        "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256" => cs::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,
        "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384" => cs::TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384,
        "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305"
        | "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256" => {
            cs::TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256
        }
        "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256" => cs::TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,
        "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384" => cs::TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384,
        "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305" | "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256" => {
            cs::TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256
        }
        _ => return None,
    })
}

/// Go names of suites upstream accepts that rustls does not implement (CBC, RSA key exchange,
/// 3DES, RC4).
const GO_ONLY_SUITES: &[&str] = &[
    "TLS_RSA_WITH_AES_128_CBC_SHA",
    "TLS_RSA_WITH_AES_256_CBC_SHA",
    "TLS_RSA_WITH_AES_128_GCM_SHA256",
    "TLS_RSA_WITH_AES_256_GCM_SHA384",
    "TLS_RSA_WITH_AES_128_CBC_SHA256",
    "TLS_RSA_WITH_3DES_EDE_CBC_SHA",
    "TLS_RSA_WITH_RC4_128_SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA256",
    "TLS_ECDHE_ECDSA_WITH_RC4_128_SHA",
    "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA",
    "TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA",
    "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA256",
    "TLS_ECDHE_RSA_WITH_3DES_EDE_CBC_SHA",
    "TLS_ECDHE_RSA_WITH_RC4_128_SHA",
];

fn is_tls13(s: &rustls::SupportedCipherSuite) -> bool {
    s.version().version == rustls::ProtocolVersion::TLSv1_3
}

/// Resolves `tlsMinVersion` and `tlsCipherSuites`. As in Go, the listed suites restrict TLS 1.2;
/// TLS 1.3's suites are not configurable there, so all of them stay enabled.
pub fn tls_policy(min_version: Option<&str>, suites: &[String]) -> Result<TlsPolicy, String> {
    use rustls::version::{TLS12, TLS13};
    let versions = match min_version.unwrap_or("") {
        "" | "VersionTLS12" => vec![&TLS13, &TLS12],
        "VersionTLS13" => vec![&TLS13],
        v @ ("VersionTLS10" | "VersionTLS11") => {
            return Err(format!(
                "tlsMinVersion: {v} is not supported: this agent's TLS library (rustls) serves only TLS 1.2 and 1.3; use VersionTLS12 or VersionTLS13"
            ));
        }
        other => {
            return Err(format!(
                "tlsMinVersion: unknown tls version {other:?} (VersionTLS12, VersionTLS13)"
            ));
        }
    };
    if suites.is_empty() {
        return Ok(TlsPolicy {
            versions,
            suites: None,
        });
    }
    let mut out: Vec<rustls::SupportedCipherSuite> = rustls::crypto::ring::DEFAULT_CIPHER_SUITES
        .iter()
        .copied()
        .filter(is_tls13)
        .collect();
    for name in suites.iter().map(|s| s.trim()).filter(|s| !s.is_empty()) {
        match cipher_suite(name) {
            Some(cs) if is_tls13(&cs) => {}
            Some(cs) => {
                if !out.contains(&cs) {
                    out.push(cs)
                }
            }
            None if GO_ONLY_SUITES.contains(&name) => {
                return Err(format!(
                    "tlsCipherSuites: {name} is not supported by this agent's TLS library (rustls provides only AEAD ECDHE suites)"
                ));
            }
            None => return Err(format!("tlsCipherSuites: unknown cipher suite {name:?}")),
        }
    }
    Ok(TlsPolicy {
        versions,
        suites: Some(out),
    })
}

/// The pods this node runs with their latest status, as `/pods`, the log and streaming
/// handlers read them (the status manager implements it).
pub trait PodLister: Send + Sync {
    fn pods(&self) -> Vec<k8s_openapi::api::core::v1::Pod>;
}

/// A fixed list (tests).
#[cfg(test)]
impl PodLister for Vec<k8s_openapi::api::core::v1::Pod> {
    fn pods(&self) -> Vec<k8s_openapi::api::core::v1::Pod> {
        self.clone()
    }
}

/// What the handlers read.
#[derive(Clone)]
pub struct AppState {
    pub statuses: Arc<dyn PodLister>,
    pub pleg: Arc<PlegHealth>,
    pub metrics: Metrics,
    pub configz: Arc<serde_json::Value>,
    /// Container and node log locations (`/containerLogs`, `/logs/`).
    pub logs: Arc<logs::Logs>,
    /// `/stats/summary` and `/metrics/resource`.
    pub stats: crate::stats::Handle,
    /// The runtime, once connected (`/runningpods/`).
    pub runtime: Arc<logs::RuntimeLookup>,
    /// `/exec`, `/attach`, `/portForward`, `/run`.
    pub streaming: Arc<streaming::Streaming>,
    /// `/statusz`, `/flagz`, `/debug/flags/v`, `/debug/pprof/`.
    pub debug: Arc<zpages::Debug>,
}

async fn healthz(State(s): State<AppState>) -> Response {
    // "syncloop" and "pleg" are upstream's checks: both fail when the runtime relist stalls.
    if s.pleg.healthy(crate::clock::unix_now()) {
        (StatusCode::OK, "ok").into_response()
    } else {
        (
            StatusCode::INTERNAL_SERVER_ERROR,
            "[+]ping ok\n[+]log ok\n[-]syncloop failed: reason withheld\nhealthz check failed\n",
        )
            .into_response()
    }
}

async fn ok() -> &'static str {
    "ok"
}

async fn pods(State(s): State<AppState>) -> Response {
    let list = serde_json::json!({
        "kind": "PodList",
        "apiVersion": "v1",
        "metadata": {},
        "items": s.statuses.pods(),
    });
    (
        [(header::CONTENT_TYPE, "application/json")],
        list.to_string(),
    )
        .into_response()
}

async fn metrics(State(s): State<AppState>) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        s.metrics.render(),
    )
        .into_response()
}

async fn probe_metrics(State(s): State<AppState>) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        s.metrics.render_probes(),
    )
        .into_response()
}

async fn configz(State(s): State<AppState>) -> Response {
    let body = serde_json::json!({ "kubeletconfig": s.configz.as_ref() });
    (
        [(header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response()
}

/// Upstream's InstallDefaultHandlers: what both :10250 and the read-only port serve.
fn default_routes() -> Router<AppState> {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/healthz/ping", get(ok))
        .route("/healthz/log", get(ok))
        .route("/healthz/syncloop", get(healthz))
        .route("/pods", get(pods))
        .route("/pods/", get(pods))
        .route("/metrics", get(metrics))
        .route("/metrics/probes", get(probe_metrics))
        .route(
            "/stats/summary",
            get(|State(s): State<AppState>| async move { s.stats.summary().await }),
        )
        .route(
            "/metrics/resource",
            get(|State(s): State<AppState>| async move { s.stats.resource_metrics().await }),
        )
        .route(
            "/metrics/cadvisor",
            get(|State(s): State<AppState>| async move { s.stats.cadvisor_metrics().await }),
        )
}

/// Routes of the :10250 server: the default handlers plus, with `debugging_handlers`
/// (`enableDebuggingHandlers`, upstream's default true), upstream's auth-required handlers.
/// Without them, as upstream's NewServer: the debugging paths answer 405 "Debug endpoints are
/// disabled." and `/configz` is not served.
pub fn api_router(state: AppState, debugging_handlers: bool) -> Router {
    let zpages = zpage_routes(&state, debugging_handlers);
    if !debugging_handlers {
        return read_only::debugging_disabled(default_routes().merge(zpages)).with_state(state);
    }
    default_routes()
        .merge(zpages)
        .route("/debug/flags/v", any(debug::flags_v))
        .route("/debug/pprof/", any(debug::pprof))
        .route("/debug/pprof/{*rest}", any(debug::pprof))
        .route("/configz", get(configz))
        .route("/runningpods", get(running_pods::running_pods))
        .route("/runningpods/", get(running_pods::running_pods))
        .route(
            "/containerLogs/{ns}/{pod}/{container}",
            get(logs::container_logs),
        )
        .route(
            "/exec/{ns}/{pod}/{container}",
            get(streaming::exec).post(streaming::exec),
        )
        .route(
            "/exec/{ns}/{pod}/{uid}/{container}",
            get(streaming::exec).post(streaming::exec),
        )
        .route(
            "/attach/{ns}/{pod}/{container}",
            get(streaming::attach).post(streaming::attach),
        )
        .route(
            "/attach/{ns}/{pod}/{uid}/{container}",
            get(streaming::attach).post(streaming::attach),
        )
        .route(
            "/portForward/{ns}/{pod}",
            get(streaming::port_forward).post(streaming::port_forward),
        )
        .route(
            "/portForward/{ns}/{pod}/{uid}",
            get(streaming::port_forward).post(streaming::port_forward),
        )
        .route("/run/{ns}/{pod}/{container}", post(streaming::run))
        .route("/run/{ns}/{pod}/{uid}/{container}", post(streaming::run))
        .route("/logs/", get(node_logs::node_logs))
        .route("/logs/{*path}", get(node_logs::node_logs))
        .with_state(state)
}

/// `/statusz` and `/flagz` on :10250, each with its feature gate (upstream's zpages).
fn zpage_routes(state: &AppState, debugging_handlers: bool) -> Router<AppState> {
    let mut r = Router::new();
    if state.debug.statusz {
        r = r.route(
            "/statusz",
            get(move |State(s): State<AppState>, h: axum::http::HeaderMap| {
                zpages::statusz(s, h, debugging_handlers)
            }),
        );
    }
    if state.debug.flagz {
        r = r.route("/flagz", get(zpages::flagz));
    }
    r
}

/// Routes of the :10248 server.
pub fn healthz_router(state: AppState) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/healthz/ping", get(ok))
        .route("/healthz/syncloop", get(healthz))
        .with_state(state)
}

/// Binds a TCP listener with a clear error.
pub async fn bind(addr: SocketAddr) -> Result<TcpListener, ServerError> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| ServerError::Bind { addr, source })
}

/// Serves plain HTTP until cancelled (:10248 or the read-only port, by `kind`).
pub async fn serve_http(
    listener: TcpListener,
    router: Router,
    kind: listener::ServerType,
    limits: listener::Limits,
    cancel: CancellationToken,
) {
    listener::serve(listener, None, limits, kind, plain_handler(router), cancel).await
}

/// Loads the serving certificate, or creates and stores a self-signed one in `cert_dir`
/// (`kubelet.crt` / `kubelet.key`, as upstream does when no tlsCertFile is configured). A
/// half-present or mismatched self-signed pair is replaced by a new one; a configured pair is
/// used as is (and a broken one is an error). `request_client_cert`: ask clients for a
/// certificate (verified by [`authn`] when a client CA is configured).
pub fn serving_tls(
    policy: &TlsPolicy,
    cert: Option<&Path>,
    key: Option<&Path>,
    cert_dir: &Path,
    hostname: &str,
    ips: &[std::net::IpAddr],
    request_client_cert: bool,
) -> Result<rustls::ServerConfig, ServerError> {
    let tls_err = |path: &Path, message: String| ServerError::Tls {
        path: path.display().to_string(),
        message,
    };
    let (cert_path, key_path): (PathBuf, PathBuf) = match (cert, key) {
        (Some(c), Some(k)) => (c.into(), k.into()),
        _ => {
            let c = cert_dir.join("kubelet.crt");
            let k = cert_dir.join("kubelet.key");
            if let Some(why) = self_signed_problem(&c, &k) {
                if c.exists() || k.exists() {
                    tracing::warn!(cert = %c.display(), key = %k.display(), reason = %why, "the self-signed serving certificate is unusable; generating a new pair");
                }
                generate_self_signed(&c, &k, cert_dir, hostname, ips)?;
            }
            (c, k)
        }
    };
    let certs = rustls_pemfile::certs(&mut std::io::BufReader::new(
        std::fs::File::open(&cert_path).map_err(|e| tls_err(&cert_path, e.to_string()))?,
    ))
    .collect::<Result<Vec<_>, _>>()
    .map_err(|e| tls_err(&cert_path, e.to_string()))?;
    // kubelet_certificate_manager_server_ttl_seconds counts down to the leaf's notAfter.
    let not_after = certs.first().and_then(|c| {
        x509_parser::parse_x509_certificate(c.as_ref())
            .ok()
            .map(|(_, x)| x.validity().not_after.timestamp())
    });
    crate::metrics::certificates().set_server_expiry(not_after);
    let key = rustls_pemfile::private_key(&mut std::io::BufReader::new(
        std::fs::File::open(&key_path).map_err(|e| tls_err(&key_path, e.to_string()))?,
    ))
    .map_err(|e| tls_err(&key_path, e.to_string()))?
    .ok_or_else(|| tls_err(&key_path, "no private key found".into()))?;
    let mut provider = rustls::crypto::ring::default_provider();
    if let Some(suites) = &policy.suites {
        provider.cipher_suites = suites.clone();
    }
    let builder = rustls::ServerConfig::builder_with_provider(Arc::new(provider))
        .with_protocol_versions(&policy.versions)
        .map_err(|e| tls_err(&cert_path, e.to_string()))?;
    let builder = if request_client_cert {
        builder.with_client_cert_verifier(authn::RequestClientCert::verifier())
    } else {
        builder.with_no_client_auth()
    };
    let mut cfg = builder
        .with_single_cert(certs, key)
        .map_err(|e| tls_err(&cert_path, e.to_string()))?;
    cfg.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(cfg)
}

/// The serving TLS config for a certificate that can change at runtime (`serverTLSBootstrap`:
/// `certs::ServingCertResolver` answers every handshake with the current pair, none until one
/// is issued).
pub fn serving_tls_resolver(
    policy: &TlsPolicy,
    resolver: Arc<dyn rustls::server::ResolvesServerCert>,
    request_client_cert: bool,
) -> Result<rustls::ServerConfig, ServerError> {
    let mut provider = rustls::crypto::ring::default_provider();
    if let Some(suites) = &policy.suites {
        provider.cipher_suites = suites.clone();
    }
    let builder = rustls::ServerConfig::builder_with_provider(Arc::new(provider))
        .with_protocol_versions(&policy.versions)
        .map_err(|e| ServerError::TlsPolicy(e.to_string()))?;
    let builder = if request_client_cert {
        builder.with_client_cert_verifier(authn::RequestClientCert::verifier())
    } else {
        builder.with_no_client_auth()
    };
    let mut cfg = builder.with_cert_resolver(resolver);
    cfg.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(cfg)
}

/// Why the self-signed pair in the cert dir cannot be served (`None`: it can): a file is
/// missing or unreadable, or the key does not belong to the certificate (say, a crash between
/// writing the two). Either way both are generated anew.
fn self_signed_problem(cert: &Path, key: &Path) -> Option<String> {
    let read = |p: &Path| std::fs::read(p).map_err(|e| format!("{}: {e}", p.display()));
    match (read(cert), read(key)) {
        (Ok(c), Ok(k)) => crate::certs::check_key_pair(&c, &k)
            .err()
            .map(|e| format!("{} and {}: {e}", cert.display(), key.display())),
        (Err(e), _) | (_, Err(e)) => Some(e),
    }
}

/// Creates a self-signed serving pair for `hostname` and `ips` (each file written atomically,
/// the key 0600).
fn generate_self_signed(
    c: &Path,
    k: &Path,
    cert_dir: &Path,
    hostname: &str,
    ips: &[std::net::IpAddr],
) -> Result<(), ServerError> {
    let tls_err = |path: &Path, message: String| ServerError::Tls {
        path: path.display().to_string(),
        message,
    };
    std::fs::create_dir_all(cert_dir).map_err(|e| tls_err(cert_dir, e.to_string()))?;
    let mut names = vec![hostname.to_string(), "localhost".to_string()];
    names.extend(ips.iter().map(|i| i.to_string()));
    names.push("127.0.0.1".into());
    let mut params = rcgen::CertificateParams::new(names).map_err(|e| tls_err(c, e.to_string()))?;
    params.distinguished_name.push(
        rcgen::DnType::CommonName,
        format!("{hostname}@{}", crate::clock::unix_now()),
    );
    let key_pair = rcgen::KeyPair::generate().map_err(|e| tls_err(k, e.to_string()))?;
    let cert = params
        .self_signed(&key_pair)
        .map_err(|e| tls_err(c, e.to_string()))?;
    // Key first: a crash in between leaves a mismatched pair, which the next start replaces.
    atomic_file::write_private_atomic(k, key_pair.serialize_pem().as_bytes())
        .map_err(|e| tls_err(k, e.to_string()))?;
    atomic_file::write_public_atomic(c, cert.pem().as_bytes())
        .map_err(|e| tls_err(c, e.to_string()))?;
    tracing::info!(cert = %c.display(), "generated a self-signed serving certificate");
    Ok(())
}

/// Serves HTTPS until cancelled.
pub async fn serve_https(
    listener: TcpListener,
    tls: rustls::ServerConfig,
    auth: Arc<Auth>,
    router: Router,
    limits: listener::Limits,
    cancel: CancellationToken,
) {
    listener::serve(
        listener,
        Some(tokio_rustls::TlsAcceptor::from(Arc::new(tls))),
        limits,
        listener::ServerType::ReadWrite,
        https_handler(auth, router),
        cancel,
    )
    .await
}

/// The :10250 request path: [`Auth`] decides, then `router` answers. The response carries the
/// [`listener::AuthOutcome`] (authorized, or refused with 401/403) for the connection limits.
pub fn https_handler(auth: Arc<Auth>, router: Router) -> listener::Handler {
    Arc::new(
        move |req: http::Request<hyper::body::Incoming>, peer_certs: listener::PeerCerts| {
            let router = router.clone();
            let auth = auth.clone();
            Box::pin(async move {
                let decision = auth
                    .decide(RequestInfo {
                        method: req.method(),
                        path: req.uri().path(),
                        headers: req.headers(),
                        peer_certs: peer_certs.as_deref(),
                    })
                    .await;
                match decision {
                    Decision::Allow { user } => {
                        let mut resp = tower::ServiceExt::oneshot(router, req)
                            .await
                            .into_response();
                        resp.extensions_mut()
                            .insert(listener::AuthOutcome::Authorized(user.into()));
                        resp
                    }
                    Decision::Deny { status, body } => {
                        tracing::debug!(%status, path = %req.uri().path(), "kubelet API request refused");
                        let mut resp = (
                            status,
                            [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
                            body,
                        )
                            .into_response();
                        if matches!(status, StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN) {
                            resp.extensions_mut().insert(listener::AuthOutcome::Refused);
                        }
                        resp
                    }
                }
            })
        },
    )
}

/// A handler that answers with `router` alone (no authentication: :10248 and the read-only
/// port).
pub fn plain_handler(router: Router) -> listener::Handler {
    Arc::new(
        move |req: http::Request<hyper::body::Incoming>, _: listener::PeerCerts| {
            let router = router.clone();
            Box::pin(async move {
                tower::ServiceExt::oneshot(router, req)
                    .await
                    .into_response()
            })
        },
    )
}

#[cfg(test)]
mod tests;
