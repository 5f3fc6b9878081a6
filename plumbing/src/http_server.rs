//! The accept loop of the node agent's HTTP servers (the kubelet's :10250, read-only port and
//! :10248; kube-proxy's healthz, metrics and health-check node ports) and the limits that keep
//! a misbehaving client from starving the process of connections and file descriptors:
//! - a cap on open connections, a cap per source on connections that have not had a request
//!   authorized, and slots kept for authenticated clients ([`conn_limit`]): a refused
//!   connection is closed at once (counted), an evicted one is closed (counted);
//! - a request refused by authentication or authorization (401, 403) ends its connection
//!   (`Connection: close`; HTTP/2: GOAWAY), so a refused client does not keep its slot;
//! - a TLS handshake timeout: a client that never finishes its handshake (slowloris) is dropped;
//! - a header-read timeout: a connection whose first request head has not arrived in time is
//!   closed;
//! - an idle timeout: a connection with no request in flight for that long is closed, which
//!   also bounds how long a later request head may take to arrive;
//! - a header size cap.
//!
//! Every connection is a task in one `JoinSet`, so cancelling the server ends them all. What
//! happens is reported to the server's [`Observer`] (its metrics). Upgraded connections
//! (exec, attach, port-forward) leave this loop once the upgrade is answered: their streams
//! belong to the handler.

pub mod conn_limit;

use axum::response::Response;
use conn_limit::{ConnLimits, Limiter, Refusal, Slot, Source};
use futures::future::BoxFuture;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use rustls::pki_types::CertificateDer;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
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
    /// Connections with an authorized request per identity (user name) at most.
    pub max_per_identity: usize,
    /// Time a TLS client has to finish its handshake.
    pub tls_handshake_timeout: Duration,
    /// Time from accept (after the TLS handshake) to the first request head.
    pub header_read_timeout: Duration,
    /// Time a connection may stay open with no request in flight.
    pub idle_timeout: Duration,
    /// Largest request head (and HTTP/2 header list) accepted.
    pub max_header_bytes: usize,
}

impl Default for Limits {
    /// The kubelet's: upstream's `IdleTimeout` (90 s) and `MaxHeaderBytes` (1 MiB). Upstream's Go server has
    /// no connection cap and lets a handshake take its 4 h `ReadTimeout`; this agent caps
    /// connections at 4096 and handshakes at 10 s (Go's client-side TLS handshake timeout).
    /// No per-source cap and no reserve here: the servers set theirs from the configuration.
    /// Upstream's 4 h `ReadTimeout`/`WriteTimeout` are not applied: a request head is bounded
    /// by the idle timeout instead (the first one by the header-read timeout, here also 90 s),
    /// and a followed log is not cut after 4 h.
    fn default() -> Self {
        Self {
            max_connections: 4096,
            max_per_source: usize::MAX,
            authenticated_reserve: 0,
            max_per_identity: usize::MAX,
            tls_handshake_timeout: Duration::from_secs(10),
            header_read_timeout: Duration::from_secs(90),
            idle_timeout: Duration::from_secs(90),
            max_header_bytes: 1 << 20,
        }
    }
}

/// What a server reports (its metrics); every method does nothing by default.
pub trait Observer: Send + Sync + 'static {
    /// The server's label in logs.
    fn label(&self) -> &'static str;
    /// The cap on open connections, once at start.
    fn max_connections(&self, _max: usize) {}
    /// A connection was admitted (`+1`) or ended (`-1`).
    fn open_connections(&self, _delta: i64) {}
    /// A connection was closed at accept.
    fn rejected(&self, _why: Refusal) {}
    /// A pending connection was closed to make room for a new one.
    fn evicted(&self) {}
    /// A TLS handshake did not finish: `timeout` or `error`.
    fn tls_handshake_failed(&self, _reason: &'static str) {}
    /// A connection was closed by the idle or header-read timeout.
    fn idle_closed(&self) {}
    /// A request started; what this returns is dropped when its response body has ended.
    fn request(&self, _method: &str, _path: &str) -> Option<Box<dyn Send>> {
        None
    }
}

/// The client's certificate chain (TLS servers), as presented.
pub type PeerCerts = Option<Arc<[CertificateDer<'static>]>>;

/// What the authentication filter made of a request, set by the handler as a response
/// extension: an authorized request's connection leaves the pending budget; a refused one's
/// connection is closed after the response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AuthOutcome {
    /// Authorized as this identity (the user name), counted against `max_per_identity`.
    Authorized(Arc<str>),
    Refused,
}

/// Answers one request.
pub type Handler =
    Arc<dyn Fn(http::Request<Incoming>, PeerCerts) -> BoxFuture<'static, Response> + Send + Sync>;

impl Limits {
    /// The admission part of these limits.
    pub fn conn_limits(&self) -> ConnLimits {
        ConnLimits {
            max_connections: self.max_connections,
            max_per_source: self.max_per_source,
            authenticated_reserve: self.authenticated_reserve,
            max_per_identity: self.max_per_identity,
        }
    }
}

/// Serves connections from `listener` until `cancel`: TLS first when `tls` is set. The
/// connection caps of `limits` apply to this server alone.
pub async fn serve(
    listener: TcpListener,
    tls: Option<tokio_rustls::TlsAcceptor>,
    limits: Limits,
    observer: Arc<dyn Observer>,
    handler: Handler,
    cancel: CancellationToken,
) {
    let limiter = Limiter::new(limits.conn_limits());
    serve_shared(listener, tls, limiter, limits, observer, handler, cancel).await
}

/// [`serve`] with the connection caps of `limiter`, which several servers may share (one
/// budget of descriptors for all of a process's ports); `limits`' timeouts and header cap
/// apply, its caps are `limiter`'s.
pub async fn serve_shared(
    listener: TcpListener,
    tls: Option<tokio_rustls::TlsAcceptor>,
    limiter: Arc<Limiter>,
    limits: Limits,
    observer: Arc<dyn Observer>,
    handler: Handler,
    cancel: CancellationToken,
) {
    let label = observer.label();
    observer.max_connections(limiter.limits().max_connections);
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
                    observer.evicted();
                }
                Arc::new(a.slot)
            }
            Err(why) => {
                observer.rejected(why);
                tracing::debug!(server = label, %peer, reason = why.label(), "connection refused at accept");
                drop(tcp);
                continue;
            }
        };
        let _ = tcp.set_nodelay(true);
        observer.open_connections(1);
        let open = observer.clone();
        let tls = tls.clone();
        let handler = handler.clone();
        let limits = limits.clone();
        let cancel = cancel.clone();
        let observer = observer.clone();
        conns.spawn(async move {
            let _open = scopeguard(move || open.open_connections(-1));
            match tls {
                None => serve_conn(tcp, None, &handler, &observer, &limits, &slot, &cancel).await,
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
                            observer.tls_handshake_failed("error");
                            tracing::debug!(error = %e, server = label, "TLS handshake failed");
                            return;
                        }
                        Err(_) => {
                            observer.tls_handshake_failed("timeout");
                            tracing::debug!(server = label, "TLS handshake timed out");
                            return;
                        }
                    };
                    let peer: PeerCerts = stream
                        .get_ref()
                        .1
                        .peer_certificates()
                        .map(|c| c.iter().map(|c| c.clone().into_owned()).collect());
                    serve_conn(stream, peer, &handler, &observer, &limits, &slot, &cancel).await
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
    /// A request has started on this connection.
    started: AtomicBool,
    /// Milliseconds since `start` of the last request start or end.
    last_ms: AtomicU64,
}

impl Activity {
    fn touch(&self) {
        self.started.store(true, Ordering::Relaxed);
        self.last_ms
            .store(self.start.elapsed().as_millis() as u64, Ordering::Relaxed);
    }

    /// Whether a connection that has been open this long with no request yet is past
    /// `header_read`, or one with no request in flight has been idle past `idle`.
    fn expired(&self, header_read: Duration, idle: Duration) -> bool {
        if !self.started.load(Ordering::Relaxed) {
            return self.start.elapsed() >= header_read;
        }
        self.idle_for().is_some_and(|d| d >= idle)
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
    observer: &Arc<dyn Observer>,
    limits: &Limits,
    slot: &Arc<Slot>,
    cancel: &CancellationToken,
) where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let activity = Arc::new(Activity {
        start: Instant::now(),
        inflight: AtomicUsize::new(0),
        started: AtomicBool::new(false),
        last_ms: AtomicU64::new(0),
    });
    let act = activity.clone();
    let handler = handler.clone();
    let obs = observer.clone();
    // Set when a refused request asks for the connection to end.
    let close = Arc::new(tokio::sync::Notify::new());
    let (conn_slot, conn_close) = (slot.clone(), close.clone());
    let svc = hyper::service::service_fn(move |req: http::Request<Incoming>| {
        let act = act.clone();
        let handler = handler.clone();
        let peer = peer.clone();
        let slot = conn_slot.clone();
        let close = conn_close.clone();
        let obs = obs.clone();
        async move {
            act.inflight.fetch_add(1, Ordering::Relaxed);
            act.touch();
            // The request ends when its response body does (a followed log, a long scrape).
            let record = obs.request(req.method().as_str(), req.uri().path());
            let done = scopeguard(move || {
                drop(record);
                act.inflight.fetch_sub(1, Ordering::Relaxed);
                act.touch();
            });
            let http1 = req.version() < http::Version::HTTP_2;
            let mut resp = handler(req, peer).await;
            match resp.extensions().get::<AuthOutcome>().cloned() {
                Some(AuthOutcome::Authorized(who)) => {
                    slot.authenticated(&who);
                }
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
    let shortest = limits.idle_timeout.min(limits.header_read_timeout);
    let tick_every = (shortest / 4).clamp(Duration::from_millis(10), Duration::from_secs(5));
    let mut builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
    // hyper's own header timeout is only a backstop: the checks below close (and count) a
    // connection whose request head has not arrived first.
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.idle_timeout.max(limits.header_read_timeout) + 2 * tick_every)
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
                if activity.expired(limits.header_read_timeout, limits.idle_timeout) {
                    observer.idle_closed();
                    return;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests;
