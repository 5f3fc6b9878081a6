//! The read-only port (`readOnlyPort` / `--read-only-port`, 0 = off, upstream's 10255 when
//! set): plain HTTP, no authentication, only upstream's "auth not required" handlers
//! (`/healthz*`, `/pods`, `/stats/summary`, `/metrics`, `/metrics/resource`,
//! `/metrics/probes`, `/metrics/cadvisor`). The debugging paths answer 405 "Debug endpoints are disabled." as
//! upstream's `InstallDebuggingDisabledHandlers`; anything else is 404 (so `/configz`,
//! `/runningpods/`'s data and the logs are never readable without credentials).

use super::{AppState, default_routes};
use axum::Router;
use axum::http::StatusCode;
use axum::routing::any;

async fn debugging_disabled_answer() -> (StatusCode, &'static str) {
    (
        StatusCode::METHOD_NOT_ALLOWED,
        "Debug endpoints are disabled.\n",
    )
}

/// Routes of the read-only server.
pub fn read_only_router(state: AppState) -> Router {
    debugging_disabled(default_routes()).with_state(state)
}

/// Upstream's InstallDebuggingDisabledHandlers: the debugging paths (`/run/`, `/exec/`,
/// `/attach/`, `/portForward/`, `/containerLogs/`, `/runningpods/`, `/debug/pprof/`, `/logs/`
/// and everything below them) answer 405 "Debug endpoints are disabled.", whatever the method.
/// The read-only port always, :10250 with `enableDebuggingHandlers: false`.
pub(super) fn debugging_disabled(mut r: Router<AppState>) -> Router<AppState> {
    for prefix in [
        "/run",
        "/exec",
        "/attach",
        "/portForward",
        "/containerLogs",
        "/runningpods",
        "/debug/pprof",
        "/logs",
    ] {
        r = r
            .route(&format!("{prefix}/"), any(debugging_disabled_answer))
            .route(
                &format!("{prefix}/{{*rest}}"),
                any(debugging_disabled_answer),
            );
    }
    r
}
