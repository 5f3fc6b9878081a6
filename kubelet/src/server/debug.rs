//! `/debug/flags/v` and `/debug/pprof/` on :10250, as upstream's InstallDebugFlagsHandler and
//! InstallProfilingHandler (both only with `enableDebuggingHandlers`).
//!
//! `/debug/flags/v`: PUT with the new verbosity as the body (a base-10 32-bit integer, taken
//! as is, like klog's `Level.Set`) changes the log level at once: 0–1 info, 2–4 debug, 5 and
//! up trace (the same mapping as `--v`); any other method is 406 "unsupported http method".
//! `enableDebugFlagsHandler: false`: 405 "flags endpoint is disabled.".
//!
//! `/debug/pprof/`: this agent is not a Go program and carries no profiler, so with
//! `enableProfilingHandler` (default true) every path below it is a 404 saying so;
//! `enableProfilingHandler: false` answers upstream's 405 "profiling endpoint is disabled.".

use super::AppState;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{Method, StatusCode, header};
use axum::response::{IntoResponse, Response};

/// The 404 body of `/debug/pprof/` when profiling is enabled.
pub const NO_PROFILER: &str = "404 page not found: this agent has no Go runtime to profile, so /debug/pprof/ serves no profiles (enableProfilingHandler, see docs/settings.md)";

/// Upstream's writePlainText: the message and a newline, `text/plain`, nosniff.
fn plain(status: StatusCode, msg: &str) -> Response {
    (
        status,
        [
            (header::CONTENT_TYPE, "text/plain"),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        ],
        format!("{msg}\n"),
    )
        .into_response()
}

/// Go's http.Error: the message and a newline, `text/plain; charset=utf-8`.
fn http_error(status: StatusCode, msg: &str) -> Response {
    (
        status,
        [
            (header::CONTENT_TYPE, "text/plain; charset=utf-8"),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        ],
        format!("{msg}\n"),
    )
        .into_response()
}

/// Parses a verbosity as klog's `Level.Set` does (Go's `strconv.ParseInt(v, 10, 32)`), with
/// Go's error text.
pub fn parse_level(v: &str) -> Result<i32, LevelError> {
    let digits = v.strip_prefix(['+', '-']).unwrap_or(v);
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(LevelError::Syntax(v.to_string()));
    }
    v.parse::<i32>()
        .map_err(|_| LevelError::Range(v.to_string()))
}

/// Go's `strconv.ParseInt` errors for a verbosity.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LevelError {
    #[error("strconv.ParseInt: parsing {0:?}: invalid syntax")]
    Syntax(String),
    #[error("strconv.ParseInt: parsing {0:?}: value out of range")]
    Range(String),
}

/// The tracing level a klog verbosity stands for (as `--v` at start).
pub fn level_for(v: i32) -> &'static str {
    match v {
        i32::MIN..=1 => "info",
        2..=4 => "debug",
        _ => "trace",
    }
}

/// `/debug/flags/v`, any method.
pub async fn flags_v(State(s): State<AppState>, method: Method, body: Bytes) -> Response {
    if !s.debug.flags_handler {
        return http_error(
            StatusCode::METHOD_NOT_ALLOWED,
            "flags endpoint is disabled.",
        );
    }
    if method != Method::PUT {
        return plain(StatusCode::NOT_ACCEPTABLE, "unsupported http method");
    }
    let val = String::from_utf8_lossy(&body).into_owned();
    let level = match parse_level(&val) {
        Ok(l) => l,
        Err(e) => {
            return plain(
                StatusCode::BAD_REQUEST,
                &format!("failed set klog.logging.verbosity {val}: {e}"),
            );
        }
    };
    let Some(set) = &s.debug.verbosity else {
        return plain(
            StatusCode::INTERNAL_SERVER_ERROR,
            "the log verbosity cannot be changed in this process",
        );
    };
    match set(level) {
        Ok(()) => {
            tracing::info!(
                verbosity = level,
                level = level_for(level),
                "log verbosity changed through /debug/flags/v"
            );
            plain(
                StatusCode::OK,
                &format!("successfully set klog.logging.verbosity to {val}"),
            )
        }
        Err(e) => plain(
            StatusCode::BAD_REQUEST,
            &format!("failed set klog.logging.verbosity {val}: {e}"),
        ),
    }
}

/// `/debug/pprof/` and everything below it, any method.
pub async fn pprof(State(s): State<AppState>) -> Response {
    if !s.debug.profiling_handler {
        return http_error(
            StatusCode::METHOD_NOT_ALLOWED,
            "profiling endpoint is disabled.",
        );
    }
    http_error(StatusCode::NOT_FOUND, NO_PROFILER)
}

#[cfg(test)]
mod tests;
