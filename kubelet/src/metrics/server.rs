//! Metrics of the kubelet's HTTP servers (:10250, the read-only port and :10248).
//!
//! Upstream's request families, with its labels (`method`, `path`, `server_type`,
//! `long_running`) and buckets:
//! - `kubelet_http_requests_total` (counter), `kubelet_http_requests_duration_seconds`
//!   (histogram, default buckets), `kubelet_http_inflight_requests` (gauge).
//!
//! This agent's connection limits (upstream's Go server has none of these, so the names are
//! ours; listed in `docs/metrics.md`), each labelled `server_type` (`readwrite`, `readonly`,
//! `healthz`):
//! - `kubelet_server_open_connections` (gauge): accepted connections still open;
//! - `kubelet_server_max_connections` (gauge): the cap on open connections;
//! - `kubelet_server_rejected_connections_total{server_type, reason}` (counter): connections
//!   closed at accept, `reason` `max_connections` (every slot held) or `per_source` (the
//!   source holds its cap of connections without an authorized request);
//! - `kubelet_server_evicted_connections_total` (counter): connections without an authorized
//!   request closed to make room for a new one (the slots beyond are kept for authenticated
//!   connections);
//! - `kubelet_server_tls_handshake_errors_total{server_type, reason}` (counter): handshakes
//!   that did not finish, `reason` `timeout` (the handshake timeout passed, e.g. a slowloris
//!   client) or `error` (a TLS or I/O error);
//! - `kubelet_server_idle_closed_connections_total` (counter): connections closed after the
//!   idle timeout with no request in flight.
//!
//! The process's file limit is `process_max_fds` (process collector), raised at start from
//! `maxOpenFiles`.

use std::sync::LazyLock;

use prometheus::core::Collector;
use prometheus::{CounterVec, GaugeVec, HistogramVec};

use super::{DEF_BUCKETS, counter_vec, gauge_vec, histogram_vec};

/// The server families of the process.
pub struct ServerMetrics {
    pub requests: CounterVec,
    pub duration: HistogramVec,
    pub inflight: GaugeVec,
    pub open_connections: GaugeVec,
    pub max_connections: GaugeVec,
    pub rejected_connections: CounterVec,
    pub evicted_connections: CounterVec,
    pub tls_handshake_errors: CounterVec,
    pub idle_closed: CounterVec,
}

const REQUEST_LABELS: &[&str] = &["method", "path", "server_type", "long_running"];

static SERVER: LazyLock<ServerMetrics> = LazyLock::new(|| ServerMetrics {
    requests: counter_vec(
        "kubelet_http_requests_total",
        "Number of the http requests received since the server started",
        REQUEST_LABELS,
    ),
    duration: histogram_vec(
        "kubelet_http_requests_duration_seconds",
        "Duration in seconds to serve http requests",
        DEF_BUCKETS.to_vec(),
        REQUEST_LABELS,
    ),
    inflight: gauge_vec(
        "kubelet_http_inflight_requests",
        "Number of the inflight http requests",
        REQUEST_LABELS,
    ),
    open_connections: gauge_vec(
        "kubelet_server_open_connections",
        "Number of open connections to the kubelet's servers",
        &["server_type"],
    ),
    max_connections: gauge_vec(
        "kubelet_server_max_connections",
        "The cap on open connections per kubelet server",
        &["server_type"],
    ),
    rejected_connections: counter_vec(
        "kubelet_server_rejected_connections_total",
        "Connections closed at accept, by reason (max_connections, per_source)",
        &["server_type", "reason"],
    ),
    evicted_connections: counter_vec(
        "kubelet_server_evicted_connections_total",
        "Connections without an authorized request closed to make room for a new connection",
        &["server_type"],
    ),
    tls_handshake_errors: counter_vec(
        "kubelet_server_tls_handshake_errors_total",
        "TLS handshakes that did not finish, by reason (timeout, error)",
        &["server_type", "reason"],
    ),
    idle_closed: counter_vec(
        "kubelet_server_idle_closed_connections_total",
        "Connections closed by the kubelet after the idle timeout",
        &["server_type"],
    ),
});

/// The process's server metrics.
pub fn server() -> &'static ServerMetrics {
    &SERVER
}

impl ServerMetrics {
    pub(super) fn collectors(&self) -> Vec<Box<dyn Collector>> {
        vec![
            Box::new(self.requests.clone()),
            Box::new(self.duration.clone()),
            Box::new(self.inflight.clone()),
            Box::new(self.open_connections.clone()),
            Box::new(self.max_connections.clone()),
            Box::new(self.rejected_connections.clone()),
            Box::new(self.evicted_connections.clone()),
            Box::new(self.tls_handshake_errors.clone()),
            Box::new(self.idle_closed.clone()),
        ]
    }

    pub(super) fn may_be_empty(&self) -> Vec<(Box<dyn Collector>, &'static str)> {
        vec![
            (Box::new(self.requests.clone()), "counter"),
            (Box::new(self.duration.clone()), "histogram"),
            (Box::new(self.inflight.clone()), "gauge"),
            (Box::new(self.open_connections.clone()), "gauge"),
            (Box::new(self.max_connections.clone()), "gauge"),
            (Box::new(self.rejected_connections.clone()), "counter"),
            (Box::new(self.evicted_connections.clone()), "counter"),
            (Box::new(self.tls_handshake_errors.clone()), "counter"),
            (Box::new(self.idle_closed.clone()), "counter"),
        ]
    }
}

/// Upstream's method buckets; anything else is `other`.
pub fn method_bucket(method: &str) -> &'static str {
    match method {
        "OPTIONS" => "OPTIONS",
        "GET" => "GET",
        "HEAD" => "HEAD",
        "POST" => "POST",
        "PUT" => "PUT",
        "DELETE" => "DELETE",
        "TRACE" => "TRACE",
        "CONNECT" => "CONNECT",
        _ => "other",
    }
}

/// Upstream's path buckets: the first path segment (`metrics/<x>` for `/metrics/<x>`) when a
/// handler is registered under it on that server, else `other`.
pub fn path_bucket(path: &str, known: &[&'static str]) -> &'static str {
    let mut parts = path.trim_start_matches('/').splitn(3, '/');
    let first = parts.next().unwrap_or("");
    let root = match (first, parts.next()) {
        ("metrics", Some(second)) => format!("metrics/{second}"),
        _ => first.to_string(),
    };
    known
        .iter()
        .find(|k| **k == root)
        .copied()
        .unwrap_or("other")
}

/// Upstream's long-running buckets. Its table spells `portforward` in lower case while the
/// bucket is `portForward`, so port-forward requests are labelled `false` there; kept as is.
pub fn long_running(bucket: &str) -> &'static str {
    match bucket {
        "exec" | "attach" | "portforward" | "debug" => "true",
        _ => "false",
    }
}

/// Path buckets of the :10250 server (upstream's `addMetricsBucketMatcher` calls).
pub const READWRITE_BUCKETS: &[&str] = &[
    "healthz",
    "pods",
    "stats",
    "metrics",
    "metrics/cadvisor",
    "metrics/probes",
    "metrics/resource",
    "run",
    "exec",
    "attach",
    "portForward",
    "containerLogs",
    "configz",
    "runningpods",
    "checkpoint",
    "logs",
    "debug",
];

/// Path buckets of the read-only server (its handlers plus the disabled debugging paths).
pub const READONLY_BUCKETS: &[&str] = &[
    "healthz",
    "pods",
    "stats",
    "metrics",
    "metrics/cadvisor",
    "metrics/probes",
    "metrics/resource",
    "run",
    "exec",
    "attach",
    "portForward",
    "containerLogs",
    "runningpods",
    "pprof",
    "logs",
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_follow_upstream() {
        assert_eq!(
            path_bucket("/metrics/probes", READWRITE_BUCKETS),
            "metrics/probes"
        );
        assert_eq!(path_bucket("/metrics", READWRITE_BUCKETS), "metrics");
        assert_eq!(path_bucket("/metrics/nope", READWRITE_BUCKETS), "other");
        assert_eq!(path_bucket("/exec/ns/p/c", READWRITE_BUCKETS), "exec");
        assert_eq!(path_bucket("/configz", READONLY_BUCKETS), "other");
        assert_eq!(path_bucket("/", READWRITE_BUCKETS), "other");
        assert_eq!(long_running("exec"), "true");
        assert_eq!(long_running("portForward"), "false");
        assert_eq!(method_bucket("PROPFIND"), "other");
    }
}
