//! Health and metrics HTTP servers, with upstream's semantics:
//!
//! - `/healthz` and `/livez` on the healthz address (default 0.0.0.0:10256): healthy while no
//!   queued change has waited longer than `healthTimeout` (2 × syncPeriod) for a sync of its
//!   IP family;
//!   `/healthz` is also 503 once the Node is being deleted or carries the autoscaler's
//!   ToBeDeleted taint.
//! - `/metrics` (plus `/proxyMode` and `/healthz` "ok") on the metrics address (default
//!   127.0.0.1:10249).
//! - One HTTP server per `healthCheckNodePort` of an externalTrafficPolicy=Local service,
//!   answering 200 when the node has ready local endpoints and the proxy is healthy.
//!
//! Every one of these servers runs on `plumbing::http_server` with one connection budget for
//! them all ([`HttpLimits`], ours: upstream's Go servers have no cap and no timeout): at most
//! [`MAX_CONNECTIONS`] open connections (fewer when the file limit is low: half of the soft
//! RLIMIT_NOFILE), [`MAX_CONNECTIONS_PER_SOURCE`] from one address (IPv6: one /64), the first
//! request head within [`HEADER_READ_TIMEOUT`], idle connections closed after
//! [`IDLE_TIMEOUT`]. So a pod opening thousands of idle connections to :10256 holds a few
//! dozen descriptors, and the syncs' `iptables-restore`/`nft` still start.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use plumbing::http_server::conn_limit::{Limiter, Refusal};
use plumbing::http_server::{self, Limits, Observer};
use prometheus::{IntCounterVec, Opts, Registry};
use thiserror::Error;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info};

use crate::model::{IpFamily, NamespacedName, ServiceState};

#[derive(Debug, Error)]
pub enum Error {
    #[error("failed to listen on {addr}: {source}")]
    Listen {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("registering metrics: {0}")]
    Metrics(#[from] prometheus::Error),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Taint the cluster autoscaler sets before deleting a node.
pub const TO_BE_DELETED_TAINT: &str = "ToBeDeletedByClusterAutoscaler";

#[derive(Debug, Default)]
struct HealthInner {
    last_updated: BTreeMap<IpFamily, SystemTime>,
    oldest_pending_queued: BTreeMap<IpFamily, SystemTime>,
}

/// Upstream's proxy health server state, shared by the proxiers of both IP families:
/// `queued_update` on each change, `updated` after each successful sync, per family.
#[derive(Clone, Debug)]
pub struct ProxierHealth {
    inner: Arc<Mutex<HealthInner>>,
    node_eligible: Arc<AtomicBool>,
    timeout: Arc<Mutex<Duration>>,
}

impl Default for ProxierHealth {
    fn default() -> Self {
        Self::new(Duration::from_secs(60))
    }
}

/// What one health evaluation saw.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HealthReport {
    pub healthy: bool,
    pub last_updated: Option<SystemTime>,
    pub current_time: SystemTime,
}

impl ProxierHealth {
    pub fn new(health_timeout: Duration) -> Self {
        ProxierHealth {
            inner: Arc::default(),
            // Eligible while starting up, until a Node event says otherwise.
            node_eligible: Arc::new(AtomicBool::new(true)),
            timeout: Arc::new(Mutex::new(health_timeout)),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HealthInner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn set_timeout(&self, t: Duration) {
        *self.timeout.lock().unwrap_or_else(|e| e.into_inner()) = t;
    }

    /// A change for `family`'s proxier arrived that needs a sync (keeps the oldest such time).
    pub fn queued_update(&self, family: IpFamily) {
        self.queued_update_at(family, SystemTime::now());
    }

    pub fn queued_update_at(&self, family: IpFamily, now: SystemTime) {
        self.lock()
            .oldest_pending_queued
            .entry(family)
            .or_insert(now);
    }

    /// `family`'s rules now reflect the state.
    pub fn updated(&self, family: IpFamily) {
        self.updated_at(family, SystemTime::now());
    }

    pub fn updated_at(&self, family: IpFamily, now: SystemTime) {
        let mut g = self.lock();
        g.oldest_pending_queued.remove(&family);
        g.last_updated.insert(family, now);
    }

    /// Upstream's SyncNode: ineligible when deleted or tainted ToBeDeletedByClusterAutoscaler.
    pub fn sync_node(&self, deleting: bool, taint_keys: &[&str]) {
        let eligible = !deleting && !taint_keys.contains(&TO_BE_DELETED_TAINT);
        self.node_eligible.store(eligible, Ordering::SeqCst);
    }

    pub fn node_eligible(&self) -> bool {
        self.node_eligible.load(Ordering::SeqCst)
    }

    /// Upstream's rule: unhealthy when a family that has synced before has had a change
    /// pending for longer than the timeout (a proxier that never synced yet counts as
    /// starting up). `last_updated` is the newest sync of any family, or, when unhealthy,
    /// the last sync of the late family.
    pub fn report_at(&self, now: SystemTime) -> HealthReport {
        let g = self.lock();
        let timeout = *self.timeout.lock().unwrap_or_else(|e| e.into_inner());
        let mut report = HealthReport {
            healthy: true,
            last_updated: g.last_updated.values().max().copied(),
            current_time: now,
        };
        for (family, last) in &g.last_updated {
            if let Some(q) = g.oldest_pending_queued.get(family)
                && now.duration_since(*q).unwrap_or_default() >= timeout
            {
                report.healthy = false;
                report.last_updated = Some(*last);
                break;
            }
        }
        report
    }

    pub fn is_healthy(&self) -> bool {
        self.report_at(SystemTime::now()).healthy
    }
}

/// Formats like Go's `time.Time.String()` in UTC: `2006-01-02 15:04:05.999999999 +0000 UTC`
/// (the zero time for `None`).
pub fn go_time(t: Option<SystemTime>) -> String {
    let Some(t) = t else {
        return "0001-01-01 00:00:00 +0000 UTC".to_string();
    };
    let d = t.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = d.as_secs() as i64;
    let days = secs.div_euclid(86400);
    let sod = secs.rem_euclid(86400);
    // Civil-from-days (proleptic Gregorian).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    let mut s = format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02}",
        sod / 3600,
        (sod / 60) % 60,
        sod % 60
    );
    let nanos = d.subsec_nanos();
    if nanos != 0 {
        let frac = format!("{nanos:09}");
        s.push('.');
        s.push_str(frac.trim_end_matches('0'));
    }
    s.push_str(" +0000 UTC");
    s
}

#[derive(Clone)]
struct HealthzState {
    health: ProxierHealth,
    healthz_total: IntCounterVec,
    livez_total: IntCounterVec,
}

fn json_response(status: StatusCode, body: String) -> Response {
    let mut resp = (status, body).into_response();
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    h.insert(
        "X-Content-Type-Options",
        HeaderValue::from_static("nosniff"),
    );
    resp
}

/// Body and status of `/healthz` at `now` (pure, for tests).
pub fn healthz_body(health: &ProxierHealth, now: SystemTime) -> (StatusCode, String) {
    let eligible = health.node_eligible();
    let r = health.report_at(now);
    let healthy = r.healthy && eligible;
    // A healthy answer reports lastUpdated = now, as upstream does for compatibility.
    let last = if healthy {
        Some(r.current_time)
    } else {
        r.last_updated
    };
    let body = format!(
        "{{\"lastUpdated\": {:?},\"currentTime\": {:?}, \"nodeEligible\": {eligible}}}",
        go_time(last),
        go_time(Some(r.current_time))
    );
    let status = if healthy {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (status, body)
}

/// Body and status of `/livez` at `now` (node eligibility is not considered).
pub fn livez_body(health: &ProxierHealth, now: SystemTime) -> (StatusCode, String) {
    let r = health.report_at(now);
    let last = if r.healthy {
        Some(r.current_time)
    } else {
        r.last_updated
    };
    let body = format!(
        "{{\"lastUpdated\": {:?},\"currentTime\": {:?}}}",
        go_time(last),
        go_time(Some(r.current_time))
    );
    let status = if r.healthy {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (status, body)
}

async fn healthz(State(s): State<HealthzState>) -> Response {
    let (status, body) = healthz_body(&s.health, SystemTime::now());
    s.healthz_total.with_label_values(&[status.as_str()]).inc();
    json_response(status, body)
}

async fn livez(State(s): State<HealthzState>) -> Response {
    let (status, body) = livez_body(&s.health, SystemTime::now());
    s.livez_total.with_label_values(&[status.as_str()]).inc();
    json_response(status, body)
}

/// The router of the healthz server; registers `kubeproxy_proxy_healthz_total` and
/// `kubeproxy_proxy_livez_total` in `registry` (upstream's names).
pub fn healthz_router(health: ProxierHealth, registry: &Registry) -> Result<Router> {
    let healthz_total = IntCounterVec::new(
        Opts::new(
            "kubeproxy_proxy_healthz_total",
            "[ALPHA] Cumulative proxy healthz HTTP status",
        ),
        &["code"],
    )?;
    let livez_total = IntCounterVec::new(
        Opts::new(
            "kubeproxy_proxy_livez_total",
            "[ALPHA] Cumulative proxy livez HTTP status",
        ),
        &["code"],
    )?;
    registry.register(Box::new(healthz_total.clone()))?;
    registry.register(Box::new(livez_total.clone()))?;
    Ok(Router::new()
        .route("/healthz", get(healthz))
        .route("/livez", get(livez))
        .with_state(HealthzState {
            health,
            healthz_total,
            livez_total,
        }))
}

async fn metrics(State(registry): State<Registry>) -> Response {
    let encoder = prometheus::TextEncoder::new();
    match encoder.encode_to_string(&registry.gather()) {
        Ok(text) => {
            let mut resp = text.into_response();
            resp.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
            );
            resp
        }
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
    }
}

/// The router of the metrics server: `/metrics`, `/proxyMode`, `/healthz`.
pub fn metrics_router(registry: Registry, mode: &'static str) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/proxyMode", get(move || async move { mode }))
        .route("/healthz", get(|| async { "ok" }))
        .with_state(registry)
}

fn listen(addr: SocketAddr, only_v6: bool) -> std::io::Result<TcpListener> {
    use socket2::{Domain, Protocol, Socket, Type};
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    if addr.is_ipv6() {
        socket.set_only_v6(only_v6)?;
    }
    socket.set_reuse_address(true)?;
    socket.set_nonblocking(true)?;
    socket.bind(&addr.into())?;
    socket.listen(1024)?;
    TcpListener::from_std(socket.into())
}

/// A listener for one family's health-check server: an IPv6 one is IPv6-only, so that the
/// IPv6 proxier's `[::]:port` sits beside the IPv4 proxier's `0.0.0.0:port`.
fn bind_family(addr: SocketAddr) -> std::io::Result<TcpListener> {
    listen(addr, true)
}

/// A listener as Go's `net.Listen("tcp", addr)` makes it: a wildcard address (`0.0.0.0` or
/// `::`) gets one socket for both families where the host has IPv6.
fn bind_any(addr: SocketAddr) -> std::io::Result<TcpListener> {
    if addr.ip().is_unspecified() {
        let v6 = SocketAddr::new(std::net::Ipv6Addr::UNSPECIFIED.into(), addr.port());
        if let Ok(l) = listen(v6, false) {
            return Ok(l);
        }
    }
    listen(addr, true)
}

/// Open connections of all the proxy's HTTP servers together, at most.
pub const MAX_CONNECTIONS: usize = 1024;
/// Open connections from one source (IPv4 address, IPv6 /64), at most.
pub const MAX_CONNECTIONS_PER_SOURCE: usize = 64;
/// Time from accept to the first request head.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// Time a connection may stay open with no request in flight (the kubelet's, upstream's
/// `IdleTimeout` of its server).
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(90);

/// The connection budget shared by the proxy's HTTP servers (healthz, metrics and every
/// health-check node port): descriptors are the process's, so the cap is too.
#[derive(Clone)]
pub struct HttpLimits {
    limiter: Arc<Limiter>,
    limits: Limits,
}

impl std::fmt::Debug for HttpLimits {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpLimits")
            .field("limits", &self.limits)
            .finish_non_exhaustive()
    }
}

impl HttpLimits {
    /// The budget for a process whose soft file limit is `soft_nofile` (unknown: the full
    /// budget): [`MAX_CONNECTIONS`], or half the limit when that is lower (at least 16), so
    /// that the other half is left for child processes, the apiserver and netlink.
    pub fn for_file_limit(soft_nofile: Option<u64>) -> Self {
        let half = soft_nofile.map_or(usize::MAX, |n| usize::try_from(n / 2).unwrap_or(usize::MAX));
        let max = MAX_CONNECTIONS.min(half).max(16);
        Self::with(Limits {
            max_connections: max,
            max_per_source: MAX_CONNECTIONS_PER_SOURCE.min(max),
            authenticated_reserve: 0,
            header_read_timeout: HEADER_READ_TIMEOUT,
            idle_timeout: IDLE_TIMEOUT,
            ..Limits::default()
        })
    }

    /// A budget with these limits (tests use small ones).
    pub fn with(limits: Limits) -> Self {
        HttpLimits {
            limiter: Limiter::new(limits.conn_limits()),
            limits,
        }
    }

    /// The limits in force.
    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// (open, pending) connections now, over every server.
    pub fn counts(&self) -> (usize, usize) {
        self.limiter.counts()
    }

    fn spawn(
        &self,
        listener: TcpListener,
        router: Router,
        server: &'static str,
        stop: CancellationToken,
    ) {
        let handler: http_server::Handler = Arc::new(move |req, _peer| {
            let router = router.clone();
            Box::pin(async move {
                tower::ServiceExt::oneshot(router, req)
                    .await
                    .into_response()
            })
        });
        tokio::spawn(http_server::serve_shared(
            listener,
            None,
            self.limiter.clone(),
            self.limits.clone(),
            Arc::new(ServerLog(server)),
            handler,
            stop,
        ));
    }
}

impl Default for HttpLimits {
    /// The budget for this process's soft file limit now.
    fn default() -> Self {
        Self::for_file_limit(plumbing::fd_limit::current().map(|(soft, _)| soft))
    }
}

/// Logs what the connection limits did to one server's connections.
struct ServerLog(&'static str);

impl Observer for ServerLog {
    fn label(&self) -> &'static str {
        self.0
    }

    fn rejected(&self, why: Refusal) {
        debug!(
            server = self.0,
            reason = why.label(),
            "connection refused at accept"
        );
    }

    fn idle_closed(&self) {
        debug!(
            server = self.0,
            "connection closed after the header-read or idle timeout"
        );
    }
}

/// Binds `addr` (as `bind_any` does) and serves `router` within `limits` until `shutdown`;
/// `server` names it in logs.
pub async fn serve(
    addr: SocketAddr,
    router: Router,
    server: &'static str,
    limits: &HttpLimits,
    shutdown: CancellationToken,
) -> Result<()> {
    let listener = bind_any(addr).map_err(|source| Error::Listen { addr, source })?;
    info!(address = %addr, server, "serving HTTP");
    limits.spawn(listener, router, server, shutdown);
    Ok(())
}

struct HcInstance {
    port: u16,
    endpoints: usize,
    stop: CancellationToken,
}

type HcMap = Arc<Mutex<BTreeMap<NamespacedName, HcInstance>>>;

/// One HTTP server per health-check node port (upstream's ServiceHealthServer).
#[derive(Clone)]
pub struct ServiceHealthServer {
    bind_ips: Vec<IpAddr>,
    health: ProxierHealth,
    services: HcMap,
    http: HttpLimits,
}

impl std::fmt::Debug for ServiceHealthServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServiceHealthServer")
            .field("bind_ips", &self.bind_ips)
            .finish_non_exhaustive()
    }
}

impl Drop for HcInstance {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// Body of a health-check answer (upstream's layout: tab-indented JSON).
pub fn service_health_body(nn: &NamespacedName, endpoints: usize, proxy_healthy: bool) -> String {
    format!(
        "{{\n\t\"service\": {{\n\t\t\"namespace\": {:?},\n\t\t\"name\": {:?}\n\t}},\n\t\"localEndpoints\": {endpoints},\n\t\"serviceProxyHealthy\": {proxy_healthy}\n}}",
        nn.namespace, nn.name
    )
}

impl ServiceHealthServer {
    /// `bind_ips`: the node addresses to listen on (`0.0.0.0` when nodePortAddresses is unset).
    pub fn new(bind_ips: Vec<IpAddr>, health: ProxierHealth) -> Self {
        ServiceHealthServer {
            bind_ips,
            health,
            services: Arc::default(),
            http: HttpLimits::default(),
        }
    }

    /// Serves the health-check ports within `http` (the budget the proxy's other servers use).
    pub fn with_http_limits(mut self, http: HttpLimits) -> Self {
        self.http = http;
        self
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<NamespacedName, HcInstance>> {
        self.services.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Services (and ports) currently served.
    pub fn ports(&self) -> BTreeMap<NamespacedName, u16> {
        self.lock()
            .iter()
            .map(|(k, v)| (k.clone(), v.port))
            .collect()
    }

    /// Opens servers for new services, closes those gone or whose port changed. A port that
    /// cannot be bound is logged and retried at the next sync.
    pub async fn sync_services(&self, wanted: &BTreeMap<NamespacedName, u16>) {
        {
            let mut g = self.lock();
            g.retain(|nn, inst| {
                let keep = wanted.get(nn) == Some(&inst.port);
                if !keep {
                    info!(service = %nn, port = inst.port, "closing healthcheck");
                }
                keep
            });
        }
        for (nn, port) in wanted {
            if self.lock().contains_key(nn) {
                continue;
            }
            let stop = CancellationToken::new();
            let mut bound = Vec::new();
            let mut failed = None;
            for ip in &self.bind_ips {
                let addr = SocketAddr::new(*ip, *port);
                match bind_family(addr) {
                    Ok(l) => bound.push(l),
                    Err(e) => {
                        failed = Some((addr, e));
                        break;
                    }
                }
            }
            if let Some((addr, e)) = failed {
                error!(service = %nn, %addr, error = %e, "failed to start healthcheck");
                continue;
            }
            info!(service = %nn, port, "opening healthcheck");
            for listener in bound {
                self.http.spawn(
                    listener,
                    self.router(nn.clone()),
                    "healthcheck",
                    stop.clone(),
                );
            }
            self.lock().insert(
                nn.clone(),
                HcInstance {
                    port: *port,
                    endpoints: 0,
                    stop,
                },
            );
        }
    }

    /// Sets the local ready endpoint counts; services not listed get 0.
    pub fn sync_endpoints(&self, counts: &BTreeMap<NamespacedName, usize>) {
        for (nn, inst) in self.lock().iter_mut() {
            inst.endpoints = counts.get(nn).copied().unwrap_or(0);
        }
    }

    fn router(&self, nn: NamespacedName) -> Router {
        let services = self.services.clone();
        let health = self.health.clone();
        Router::new().fallback(move || {
            let services = services.clone();
            let health = health.clone();
            let nn = nn.clone();
            async move {
                let count = {
                    let g = services.lock().unwrap_or_else(|e| e.into_inner());
                    match g.get(&nn) {
                        Some(i) => i.endpoints,
                        None => return StatusCode::SERVICE_UNAVAILABLE.into_response(),
                    }
                };
                let healthy = health.is_healthy();
                let status = if count > 0 && healthy {
                    StatusCode::OK
                } else {
                    StatusCode::SERVICE_UNAVAILABLE
                };
                let mut resp = json_response(status, service_health_body(&nn, count, healthy));
                if let Ok(v) = HeaderValue::from_str(&count.to_string()) {
                    resp.headers_mut()
                        .insert("X-Load-Balancing-Endpoint-Weight", v);
                }
                resp
            }
        })
    }
}

/// Health-check node ports by service, and each service's number of distinct ready local
/// endpoint IPs (upstream's HealthCheckNodePorts and LocalReadyEndpoints).
pub(crate) type HealthCheckState = (
    BTreeMap<NamespacedName, u16>,
    BTreeMap<NamespacedName, usize>,
);

pub(crate) fn health_check_state(state: &ServiceState) -> HealthCheckState {
    let mut ports = BTreeMap::new();
    for (name, info) in state.service_port_map() {
        if info.health_check_node_port != 0 {
            ports.insert(name.service.clone(), info.health_check_node_port);
        }
    }
    let mut ips: BTreeMap<NamespacedName, std::collections::BTreeSet<IpAddr>> = BTreeMap::new();
    for (name, eps) in state.endpoints_map() {
        for e in eps.iter().filter(|e| e.ready && e.is_local) {
            ips.entry(name.service.clone()).or_default().insert(e.ip);
        }
    }
    let counts = ips.into_iter().map(|(k, v)| (k, v.len())).collect();
    (ports, counts)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_time_format() {
        let t = UNIX_EPOCH + Duration::new(1_700_000_000, 123_400_000);
        assert_eq!(go_time(Some(t)), "2023-11-14 22:13:20.1234 +0000 UTC");
        assert_eq!(
            go_time(Some(UNIX_EPOCH + Duration::from_secs(951_782_400))),
            "2000-02-29 00:00:00 +0000 UTC"
        );
        assert_eq!(go_time(None), "0001-01-01 00:00:00 +0000 UTC");
    }

    #[test]
    fn healthz_follows_queued_updates() {
        let h = ProxierHealth::new(Duration::from_secs(60));
        let t0 = UNIX_EPOCH + Duration::from_secs(1_000_000);
        let v4 = IpFamily::V4;
        // Starting up: healthy, even with a change queued before the first sync.
        assert_eq!(healthz_body(&h, t0).0, StatusCode::OK);
        h.queued_update_at(v4, t0);
        assert_eq!(
            healthz_body(&h, t0 + Duration::from_secs(100)).0,
            StatusCode::OK
        );
        h.updated_at(v4, t0);
        h.queued_update_at(v4, t0 + Duration::from_secs(1));
        h.queued_update_at(v4, t0 + Duration::from_secs(50)); // keeps the oldest
        assert_eq!(
            healthz_body(&h, t0 + Duration::from_secs(60)).0,
            StatusCode::OK
        );
        let (status, body) = healthz_body(&h, t0 + Duration::from_secs(61));
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(
            body,
            "{\"lastUpdated\": \"1970-01-12 13:46:40 +0000 UTC\",\"currentTime\": \"1970-01-12 13:47:41 +0000 UTC\", \"nodeEligible\": true}"
        );
        assert_eq!(
            livez_body(&h, t0 + Duration::from_secs(61)).0,
            StatusCode::SERVICE_UNAVAILABLE
        );
        h.updated_at(v4, t0 + Duration::from_secs(62));
        let (status, body) = healthz_body(&h, t0 + Duration::from_secs(63));
        assert_eq!(status, StatusCode::OK);
        assert!(body.starts_with("{\"lastUpdated\": \"1970-01-12 13:47:43 +0000 UTC\""));
        // Node being removed: healthz fails, livez does not.
        h.sync_node(false, &[TO_BE_DELETED_TAINT]);
        let (status, body) = healthz_body(&h, t0 + Duration::from_secs(63));
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        assert!(body.ends_with("\"nodeEligible\": false}"));
        assert_eq!(
            livez_body(&h, t0 + Duration::from_secs(63)).0,
            StatusCode::OK
        );
    }

    #[test]
    fn dual_stack_health_needs_both_families() {
        let h = ProxierHealth::new(Duration::from_secs(60));
        let t0 = UNIX_EPOCH + Duration::from_secs(1_000_000);
        h.updated_at(IpFamily::V4, t0);
        h.updated_at(IpFamily::V6, t0 + Duration::from_secs(5));
        // The IPv6 proxier falls behind while the IPv4 one keeps syncing.
        h.queued_update_at(IpFamily::V6, t0 + Duration::from_secs(10));
        h.updated_at(IpFamily::V4, t0 + Duration::from_secs(70));
        let r = h.report_at(t0 + Duration::from_secs(71));
        assert!(!r.healthy);
        assert_eq!(r.last_updated, Some(t0 + Duration::from_secs(5)));
        h.updated_at(IpFamily::V6, t0 + Duration::from_secs(72));
        let r = h.report_at(t0 + Duration::from_secs(73));
        assert!(r.healthy);
        assert_eq!(r.last_updated, Some(t0 + Duration::from_secs(72)));
    }

    #[test]
    fn the_connection_budget_follows_the_file_limit() {
        let max = |soft| HttpLimits::for_file_limit(soft).limits().max_connections;
        assert_eq!(max(None), MAX_CONNECTIONS);
        assert_eq!(max(Some(1_048_576)), MAX_CONNECTIONS);
        // systemd's default soft limit: half is left for children, sockets and files.
        assert_eq!(max(Some(1024)), 512);
        assert_eq!(max(Some(20)), 16);
        let l = HttpLimits::for_file_limit(Some(1024));
        assert_eq!(l.limits().max_per_source, MAX_CONNECTIONS_PER_SOURCE);
        assert_eq!(l.limits().header_read_timeout, HEADER_READ_TIMEOUT);
        assert_eq!(l.limits().idle_timeout, IDLE_TIMEOUT);
    }

    #[test]
    fn service_health_body_layout() {
        assert_eq!(
            service_health_body(&NamespacedName::new("ns", "web"), 2, true),
            "{\n\t\"service\": {\n\t\t\"namespace\": \"ns\",\n\t\t\"name\": \"web\"\n\t},\n\t\"localEndpoints\": 2,\n\t\"serviceProxyHealthy\": true\n}"
        );
    }
}
