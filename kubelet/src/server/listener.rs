//! The kubelet's servers (:10250, the read-only port, :10248) on the shared accept loop
//! (`plumbing::http_server`: connection caps, per-source caps, the authenticated reserve,
//! handshake, header-read and idle timeouts, the header cap), reporting to the kubelet's
//! server metrics (`metrics::server`) under the server's `server_type`.

use crate::metrics::server as server_metrics;
use plumbing::http_server::{self, Observer, conn_limit::Refusal};
use std::sync::Arc;
use std::time::Instant;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

pub use plumbing::http_server::{AuthOutcome, Handler, Limits, PeerCerts};

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

impl Observer for ServerType {
    fn label(&self) -> &'static str {
        ServerType::label(*self)
    }

    fn max_connections(&self, max: usize) {
        server_metrics::server()
            .max_connections
            .with_label_values(&[self.label()])
            .set(max as f64);
    }

    fn open_connections(&self, delta: i64) {
        server_metrics::server()
            .open_connections
            .with_label_values(&[self.label()])
            .add(delta as f64);
    }

    fn rejected(&self, why: Refusal) {
        server_metrics::server()
            .rejected_connections
            .with_label_values(&[self.label(), why.label()])
            .inc();
    }

    fn evicted(&self) {
        server_metrics::server()
            .evicted_connections
            .with_label_values(&[self.label()])
            .inc();
    }

    fn tls_handshake_failed(&self, reason: &'static str) {
        server_metrics::server()
            .tls_handshake_errors
            .with_label_values(&[self.label(), reason])
            .inc();
    }

    fn idle_closed(&self) {
        server_metrics::server()
            .idle_closed
            .with_label_values(&[self.label()])
            .inc();
    }

    fn request(&self, method: &str, path: &str) -> Option<Box<dyn Send>> {
        let buckets = self.buckets()?;
        Some(Box::new(RequestRecord::start(method, path, *self, buckets)))
    }
}

/// Serves connections from `listener` until `cancel`: TLS first when `tls` is set.
pub async fn serve(
    listener: TcpListener,
    tls: Option<tokio_rustls::TlsAcceptor>,
    limits: Limits,
    kind: ServerType,
    handler: Handler,
    cancel: CancellationToken,
) {
    http_server::serve(listener, tls, limits, Arc::new(kind), handler, cancel).await
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
