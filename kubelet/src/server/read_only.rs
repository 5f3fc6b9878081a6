//! The read-only port (`readOnlyPort` / `--read-only-port`, 0 = off, upstream's 10255 when
//! set): plain HTTP, no authentication, only upstream's "auth not required" handlers
//! (`/healthz*`, `/pods`, `/stats/summary`, `/metrics`, `/metrics/resource`,
//! `/metrics/probes`, `/metrics/cadvisor`). The debugging paths answer 405 "Debug endpoints are disabled." as
//! upstream's `InstallDebuggingDisabledHandlers`; anything else is 404 (so `/configz`,
//! `/runningpods/`'s data and the logs are never readable without credentials).

use super::{AppState, healthz, metrics, ok, pods, probe_metrics};
use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::{any, get};

async fn debugging_disabled() -> (StatusCode, &'static str) {
    (
        StatusCode::METHOD_NOT_ALLOWED,
        "Debug endpoints are disabled.\n",
    )
}

/// Routes of the read-only server.
pub fn read_only_router(state: AppState) -> Router {
    let mut r = Router::new()
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
        );
    for prefix in [
        "/run",
        "/exec",
        "/attach",
        "/portForward",
        "/containerLogs",
        "/debug/pprof",
        "/logs",
    ] {
        r = r
            .route(&format!("{prefix}/"), any(debugging_disabled))
            .route(&format!("{prefix}/{{*rest}}"), any(debugging_disabled));
    }
    r.route("/runningpods/", any(debugging_disabled))
        .with_state(state)
}
