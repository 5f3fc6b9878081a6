//! The kubelet's servers: plain-HTTP healthz on 127.0.0.1:10248 and the HTTPS API on :10250
//! (`/healthz`, `/pods`, `/metrics`, `/configz`). Authentication and authorization of :10250
//! follow when the agent joins a cluster; standalone it behaves like upstream's defaults
//! (anonymous allowed, AlwaysAllow).

use crate::atomic_file;
use crate::metrics::Metrics;
use crate::pleg::PlegHealth;
use crate::status_manager::StatusManager;
use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use hyper_util::rt::{TokioExecutor, TokioIo};
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
}

/// What the handlers read.
#[derive(Clone)]
pub struct AppState {
    pub statuses: Arc<StatusManager>,
    pub pleg: Arc<PlegHealth>,
    pub metrics: Metrics,
    pub configz: Arc<serde_json::Value>,
}

fn unix_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

async fn healthz(State(s): State<AppState>) -> Response {
    // "syncloop" and "pleg" are upstream's checks: both fail when the runtime relist stalls.
    if s.pleg.healthy(unix_now()) {
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
    let running = s
        .statuses
        .pods()
        .iter()
        .filter(|p| {
            p.status
                .as_ref()
                .and_then(|st| st.conditions.as_ref())
                .is_some_and(|cs| {
                    cs.iter()
                        .any(|c| c.type_ == "PodReadyToStartContainers" && c.status == "True")
                })
        })
        .count();
    s.metrics.running_pods.set(running as f64);
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        s.metrics.render(),
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

/// Routes of the :10250 server.
pub fn api_router(state: AppState) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/healthz/ping", get(ok))
        .route("/healthz/log", get(ok))
        .route("/healthz/syncloop", get(healthz))
        .route("/pods", get(pods))
        .route("/pods/", get(pods))
        .route("/metrics", get(metrics))
        .route("/configz", get(configz))
        .with_state(state)
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

/// Serves plain HTTP until cancelled.
pub async fn serve_http(listener: TcpListener, router: Router, cancel: CancellationToken) {
    let _ = axum::serve(listener, router)
        .with_graceful_shutdown(async move { cancel.cancelled().await })
        .await;
}

/// Loads the serving certificate, or creates and stores a self-signed one in `cert_dir`
/// (`kubelet.crt` / `kubelet.key`, as upstream does when no tlsCertFile is configured). A
/// half-present or mismatched self-signed pair is replaced by a new one; a configured pair is
/// used as is (and a broken one is an error).
pub fn serving_tls(
    cert: Option<&Path>,
    key: Option<&Path>,
    cert_dir: &Path,
    hostname: &str,
    ips: &[std::net::IpAddr],
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
    let key = rustls_pemfile::private_key(&mut std::io::BufReader::new(
        std::fs::File::open(&key_path).map_err(|e| tls_err(&key_path, e.to_string()))?,
    ))
    .map_err(|e| tls_err(&key_path, e.to_string()))?
    .ok_or_else(|| tls_err(&key_path, "no private key found".into()))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut cfg = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| tls_err(&cert_path, e.to_string()))?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(|e| tls_err(&cert_path, e.to_string()))?;
    cfg.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(cfg)
}

/// Why the self-signed pair in the cert dir cannot be served (`None`: it can): a file is
/// missing or unreadable, or the key does not belong to the certificate (say, a crash between
/// writing the two). Either way both are generated anew.
fn self_signed_problem(cert: &Path, key: &Path) -> Option<String> {
    let read = |p: &Path| std::fs::read(p).map_err(|e| format!("{}: {e}", p.display()));
    match (read(cert), read(key)) {
        (Ok(c), Ok(k)) => crate::cluster::bootstrap::check_key_pair(&c, &k)
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
        format!("{hostname}@{}", unix_now()),
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

/// Serves HTTPS until cancelled; each connection runs in its own task.
pub async fn serve_https(
    listener: TcpListener,
    tls: rustls::ServerConfig,
    router: Router,
    cancel: CancellationToken,
) {
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(tls));
    let mut conns = tokio::task::JoinSet::new();
    loop {
        let (tcp, _) = tokio::select! {
            _ = cancel.cancelled() => break,
            r = listener.accept() => match r {
                Ok(c) => c,
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    continue;
                }
            },
            Some(_) = conns.join_next(), if !conns.is_empty() => continue,
        };
        let acceptor = acceptor.clone();
        let router = router.clone();
        conns.spawn(async move {
            let Ok(tls) = acceptor.accept(tcp).await else {
                return;
            };
            let svc = hyper::service::service_fn(move |req| {
                let router = router.clone();
                async move {
                    Ok::<_, std::convert::Infallible>(
                        tower::ServiceExt::oneshot(router, req)
                            .await
                            .into_response(),
                    )
                }
            });
            let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                .serve_connection_with_upgrades(TokioIo::new(tls), svc)
                .await;
        });
    }
    conns.abort_all();
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::bootstrap::check_key_pair;
    use std::os::unix::fs::PermissionsExt;

    fn mode(p: &Path) -> u32 {
        std::fs::metadata(p).unwrap().permissions().mode() & 0o777
    }

    fn names(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }

    fn serve(dir: &Path) -> Result<rustls::ServerConfig, ServerError> {
        serving_tls(None, None, dir, "worker-1", &["10.0.0.5".parse().unwrap()])
    }

    #[test]
    fn self_signed_pair_is_written_privately_and_kept() {
        let dir = tempfile::tempdir().unwrap();
        let pki = dir.path().join("pki");
        serve(&pki).unwrap();
        let (crt, key) = (pki.join("kubelet.crt"), pki.join("kubelet.key"));
        assert_eq!(mode(&key), 0o600);
        assert_eq!(mode(&crt), 0o644);
        assert_eq!(
            names(&pki),
            ["kubelet.crt", "kubelet.key"],
            "no temp file left"
        );
        let (c1, k1) = (std::fs::read(&crt).unwrap(), std::fs::read(&key).unwrap());
        check_key_pair(&c1, &k1).unwrap();
        // A usable pair is served again, not replaced.
        serve(&pki).unwrap();
        assert_eq!(std::fs::read(&crt).unwrap(), c1);
        assert_eq!(std::fs::read(&key).unwrap(), k1);
    }

    #[test]
    fn half_present_or_mismatched_self_signed_pair_is_regenerated() {
        let dir = tempfile::tempdir().unwrap();
        let pki = dir.path();
        let (crt, key) = (pki.join("kubelet.crt"), pki.join("kubelet.key"));
        serve(pki).unwrap();
        let old_cert = std::fs::read(&crt).unwrap();

        // Only the certificate is left (say, a crash after the key was removed).
        std::fs::remove_file(&key).unwrap();
        serve(pki).unwrap();
        let (c, k) = (std::fs::read(&crt).unwrap(), std::fs::read(&key).unwrap());
        assert_ne!(c, old_cert);
        check_key_pair(&c, &k).unwrap();
        assert_eq!(mode(&key), 0o600);

        // The key belongs to another certificate: both are replaced, nothing fails.
        let other = rcgen::KeyPair::generate().unwrap();
        std::fs::write(&key, other.serialize_pem()).unwrap();
        assert!(check_key_pair(&c, &std::fs::read(&key).unwrap()).is_err());
        serve(pki).unwrap();
        let (c2, k2) = (std::fs::read(&crt).unwrap(), std::fs::read(&key).unwrap());
        assert_ne!(c2, c);
        check_key_pair(&c2, &k2).unwrap();
        assert_eq!(mode(&key), 0o600);
        assert_eq!(names(pki), ["kubelet.crt", "kubelet.key"]);
    }

    #[test]
    fn configured_mismatched_pair_is_an_error_not_replaced() {
        let dir = tempfile::tempdir().unwrap();
        serve(dir.path()).unwrap();
        let crt = dir.path().join("kubelet.crt");
        let key = dir.path().join("other.key");
        std::fs::write(&key, rcgen::KeyPair::generate().unwrap().serialize_pem()).unwrap();
        let before = std::fs::read(&crt).unwrap();
        let r = serving_tls(
            Some(&crt),
            Some(&key),
            &dir.path().join("unused"),
            "worker-1",
            &[],
        );
        assert!(matches!(r, Err(ServerError::Tls { .. })));
        assert_eq!(std::fs::read(&crt).unwrap(), before);
    }
}
