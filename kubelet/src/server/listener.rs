//! The accept loop of the kubelet's servers (:10250, the read-only port, :10248) and the limits
//! that keep a misbehaving client from starving the agent:
//! - a cap on open connections, a cap per source on connections that have not had a request
//!   authorized, and slots kept for authenticated clients ([`super::conn_limit`]): a refused
//!   connection is closed at once (counted), an evicted one is closed (counted);
//! - a request refused by authentication or authorization (401, 403) ends its connection
//!   (`Connection: close`; HTTP/2: GOAWAY), so a refused client does not keep its slot;
//! - a TLS handshake timeout: a client that never finishes its handshake (slowloris) is dropped;
//! - an idle timeout (upstream's `IdleTimeout`, 90 s): a connection with no request in flight
//!   for that long is closed, which also bounds how long a request head may take to arrive;
//! - a header size cap (upstream's `MaxHeaderBytes`, 1 MiB).
//!
//! Every connection is a task in one `JoinSet`, so cancelling the server ends them all. The
//! counters are in `metrics::server`. Upgraded connections (exec, attach, port-forward) leave
//! this loop once the upgrade is answered: their streams belong to the handler.

use super::conn_limit::{ConnLimits, Limiter, Slot, Source};
use crate::metrics::server as server_metrics;
use axum::response::Response;
use futures::future::BoxFuture;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use rustls::pki_types::CertificateDer;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// Connection limits of one server.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Open connections at most; more are closed at accept.
    pub max_connections: usize,
    /// Connections from one source (IPv4 address, IPv6 /64) with no authorized request yet.
    pub max_per_source: usize,
    /// Slots of `max_connections` only connections with an authorized request may hold.
    pub authenticated_reserve: usize,
    /// Time a TLS client has to finish its handshake.
    pub tls_handshake_timeout: Duration,
    /// Time a connection may stay open with no request in flight.
    pub idle_timeout: Duration,
    /// Largest request head (and HTTP/2 header list) accepted.
    pub max_header_bytes: usize,
}

impl Default for Limits {
    /// Upstream's `IdleTimeout` (90 s) and `MaxHeaderBytes` (1 MiB). Upstream's Go server has
    /// no connection cap and lets a handshake take its 4 h `ReadTimeout`; this agent caps
    /// connections at 4096 and handshakes at 10 s (Go's client-side TLS handshake timeout).
    /// No per-source cap and no reserve here: the servers set theirs from the configuration.
    /// Upstream's 4 h `ReadTimeout`/`WriteTimeout` are not applied: a request head is bounded
    /// by the idle timeout instead, and a followed log is not cut after 4 h.
    fn default() -> Self {
        Self {
            max_connections: 4096,
            max_per_source: usize::MAX,
            authenticated_reserve: 0,
            tls_handshake_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(90),
            max_header_bytes: 1 << 20,
        }
    }
}

/// Which server a connection belongs to: the `server_type` label, and which path buckets its
/// requests are counted under (`:10248` requests are not counted, as upstream's healthz mux).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ServerType {
    ReadWrite,
    ReadOnly,
    Healthz,
}

impl ServerType {
    pub fn label(self) -> &'static str {
        match self {
            ServerType::ReadWrite => "readwrite",
            ServerType::ReadOnly => "readonly",
            ServerType::Healthz => "healthz",
        }
    }

    fn buckets(self) -> Option<&'static [&'static str]> {
        match self {
            ServerType::ReadWrite => Some(server_metrics::READWRITE_BUCKETS),
            ServerType::ReadOnly => Some(server_metrics::READONLY_BUCKETS),
            ServerType::Healthz => None,
        }
    }
}

/// The client's certificate chain (TLS servers), as presented.
pub type PeerCerts = Option<Arc<[CertificateDer<'static>]>>;

/// What the authentication filter made of a request, set by the handler as a response
/// extension: an authorized request's connection leaves the pending budget; a refused one's
/// connection is closed after the response.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuthOutcome {
    Authorized,
    Refused,
}

/// Answers one request.
pub type Handler =
    Arc<dyn Fn(http::Request<Incoming>, PeerCerts) -> BoxFuture<'static, Response> + Send + Sync>;

/// Serves connections from `listener` until `cancel`: TLS first when `tls` is set.
pub async fn serve(
    listener: TcpListener,
    tls: Option<tokio_rustls::TlsAcceptor>,
    limits: Limits,
    kind: ServerType,
    handler: Handler,
    cancel: CancellationToken,
) {
    let m = server_metrics::server();
    let label = kind.label();
    m.max_connections
        .with_label_values(&[label])
        .set(limits.max_connections as f64);
    let limiter = Limiter::new(ConnLimits {
        max_connections: limits.max_connections,
        max_per_source: limits.max_per_source,
        authenticated_reserve: limits.authenticated_reserve,
    });
    let limits = Arc::new(limits);
    let mut conns = tokio::task::JoinSet::new();
    loop {
        let (tcp, peer) = tokio::select! {
            _ = cancel.cancelled() => break,
            r = listener.accept() => match r {
                Ok(x) => x,
                Err(e) => {
                    // EMFILE and the like: back off instead of spinning on the error.
                    tracing::warn!(error = %e, server = label, "accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
            Some(_) = conns.join_next(), if !conns.is_empty() => continue,
        };
        let slot = match limiter.admit(Source::of(peer.ip())) {
            Ok(a) => {
                if a.evicted_another {
                    m.evicted_connections.with_label_values(&[label]).inc();
                }
                Arc::new(a.slot)
            }
            Err(why) => {
                m.rejected_connections
                    .with_label_values(&[label, why.label()])
                    .inc();
                tracing::debug!(server = label, %peer, reason = why.label(), "connection refused at accept");
                drop(tcp);
                continue;
            }
        };
        let _ = tcp.set_nodelay(true);
        let open = m.open_connections.with_label_values(&[label]);
        open.inc();
        let tls = tls.clone();
        let handler = handler.clone();
        let limits = limits.clone();
        let cancel = cancel.clone();
        conns.spawn(async move {
            let _open = scopeguard(move || open.dec());
            match tls {
                None => serve_conn(tcp, None, &handler, kind, &limits, &slot, &cancel).await,
                Some(acceptor) => {
                    let hs =
                        tokio::time::timeout(limits.tls_handshake_timeout, acceptor.accept(tcp));
                    let hs = tokio::select! {
                        r = hs => r,
                        _ = slot.evicted().cancelled() => return,
                    };
                    let stream = match hs {
                        Ok(Ok(s)) => s,
                        Ok(Err(e)) => {
                            m.tls_handshake_errors
                                .with_label_values(&[label, "error"])
                                .inc();
                            tracing::debug!(error = %e, server = label, "TLS handshake failed");
                            return;
                        }
                        Err(_) => {
                            m.tls_handshake_errors
                                .with_label_values(&[label, "timeout"])
                                .inc();
                            tracing::debug!(server = label, "TLS handshake timed out");
                            return;
                        }
                    };
                    let peer: PeerCerts = stream
                        .get_ref()
                        .1
                        .peer_certificates()
                        .map(|c| c.iter().map(|c| c.clone().into_owned()).collect());
                    serve_conn(stream, peer, &handler, kind, &limits, &slot, &cancel).await
                }
            }
        });
    }
    conns.abort_all();
}

/// Runs `f` when dropped.
struct Guard<F: FnOnce()>(Option<F>);

impl<F: FnOnce()> Drop for Guard<F> {
    fn drop(&mut self) {
        if let Some(f) = self.0.take() {
            f()
        }
    }
}

fn scopeguard<F: FnOnce()>(f: F) -> Guard<F> {
    Guard(Some(f))
}

/// Requests in flight on one connection and when the last one ended.
struct Activity {
    start: Instant,
    inflight: AtomicUsize,
    /// Milliseconds since `start` of the last request start or end.
    last_ms: AtomicU64,
}

impl Activity {
    fn touch(&self) {
        self.last_ms
            .store(self.start.elapsed().as_millis() as u64, Ordering::Relaxed);
    }

    fn idle_for(&self) -> Option<Duration> {
        if self.inflight.load(Ordering::Relaxed) > 0 {
            return None;
        }
        let last = Duration::from_millis(self.last_ms.load(Ordering::Relaxed));
        Some(self.start.elapsed().saturating_sub(last))
    }
}

async fn serve_conn<I>(
    io: I,
    peer: PeerCerts,
    handler: &Handler,
    kind: ServerType,
    limits: &Limits,
    slot: &Arc<Slot>,
    cancel: &CancellationToken,
) where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let activity = Arc::new(Activity {
        start: Instant::now(),
        inflight: AtomicUsize::new(0),
        last_ms: AtomicU64::new(0),
    });
    let act = activity.clone();
    let handler = handler.clone();
    // Set when a refused request asks for the connection to end.
    let close = Arc::new(tokio::sync::Notify::new());
    let (conn_slot, conn_close) = (slot.clone(), close.clone());
    let svc = hyper::service::service_fn(move |req: http::Request<Incoming>| {
        let act = act.clone();
        let handler = handler.clone();
        let peer = peer.clone();
        let slot = conn_slot.clone();
        let close = conn_close.clone();
        async move {
            act.inflight.fetch_add(1, Ordering::Relaxed);
            act.touch();
            // The request ends when its response body does (a followed log, a long scrape).
            let record = kind
                .buckets()
                .map(|b| RequestRecord::start(req.method().as_str(), req.uri().path(), kind, b));
            let done = scopeguard(move || {
                drop(record);
                act.inflight.fetch_sub(1, Ordering::Relaxed);
                act.touch();
            });
            let http1 = req.version() < http::Version::HTTP_2;
            let mut resp = handler(req, peer).await;
            match resp.extensions().get::<AuthOutcome>() {
                Some(AuthOutcome::Authorized) => slot.authenticated(),
                Some(AuthOutcome::Refused) => {
                    if http1 {
                        resp.headers_mut().insert(
                            http::header::CONNECTION,
                            http::HeaderValue::from_static("close"),
                        );
                    }
                    close.notify_one();
                }
                None => {}
            }
            let resp = resp.map(|body| {
                axum::body::Body::new(body.map_frame(move |f| {
                    let _ = &done;
                    f
                }))
            });
            Ok::<_, std::convert::Infallible>(resp)
        }
    });
    let tick_every =
        (limits.idle_timeout / 4).clamp(Duration::from_millis(10), Duration::from_secs(5));
    let mut builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
    // hyper's own header timeout is only a backstop: the idle check below closes (and
    // counts) a connection whose request head has not arrived first.
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.idle_timeout + 2 * tick_every)
        .max_buf_size(limits.max_header_bytes.max(8192));
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_header_list_size(limits.max_header_bytes.min(u32::MAX as usize) as u32);
    let conn = builder.serve_connection_with_upgrades(TokioIo::new(io), svc);
    tokio::pin!(conn);
    let mut tick = tokio::time::interval(tick_every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut draining = false;
    loop {
        tokio::select! {
            _ = conn.as_mut() => return,
            _ = cancel.cancelled(), if !draining => {
                draining = true;
                conn.as_mut().graceful_shutdown();
            }
            // After the refused request's response: no further request on this connection.
            _ = close.notified(), if !draining => {
                draining = true;
                conn.as_mut().graceful_shutdown();
            }
            _ = slot.evicted().cancelled() => return,
            _ = tick.tick() => {
                if activity.idle_for().is_some_and(|d| d >= limits.idle_timeout) {
                    server_metrics::server()
                        .idle_closed
                        .with_label_values(&[kind.label()])
                        .inc();
                    return;
                }
            }
        }
    }
}

/// Upstream's per-request metrics: counted at the start, in flight until dropped, then timed.
struct RequestRecord {
    labels: [&'static str; 4],
    started: Instant,
}

impl RequestRecord {
    fn start(method: &str, path: &str, kind: ServerType, buckets: &[&'static str]) -> Self {
        let bucket = server_metrics::path_bucket(path, buckets);
        let labels = [
            server_metrics::method_bucket(method),
            bucket,
            kind.label(),
            server_metrics::long_running(bucket),
        ];
        let m = server_metrics::server();
        m.requests.with_label_values(&labels).inc();
        m.inflight.with_label_values(&labels).inc();
        Self {
            labels,
            started: Instant::now(),
        }
    }
}

impl Drop for RequestRecord {
    fn drop(&mut self) {
        let m = server_metrics::server();
        m.inflight.with_label_values(&self.labels).dec();
        m.duration
            .with_label_values(&self.labels)
            .observe(self.started.elapsed().as_secs_f64());
    }
}

#[cfg(test)]
mod tests;
