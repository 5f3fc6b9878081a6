//! Upstream's z-pages on :10250: `/statusz` (the `ComponentStatusz` gate, beta and on in
//! v1.36) and `/flagz` (the `ComponentFlagz` gate). Plain text by default, with upstream's
//! header, its randomly chosen `key<delimiter>value` separator (so nobody scrapes it) and its
//! `Up: H hr MM min SS sec` form; versioned JSON (`kind` Statusz/Flagz, `apiVersion`
//! `config.k8s.io/v1alpha1` or `v1beta1`) when the `Accept` header asks for it with all of
//! `g`, `v` and `as`. Any other `Accept` is 406.
//!
//! What differs from upstream, on purpose: this agent is not a Go program, so `/statusz` has no
//! `Go version` line (and no `goVersion` field), and the kubelet has no emulation version.
//! `/flagz` lists the agent's command-line flags (given values, else their defaults).

use super::AppState;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use std::collections::BTreeMap;
use std::sync::{Arc, OnceLock};
use std::time::SystemTime;

/// The component name upstream's kubelet registers its z-pages with.
pub const COMPONENT: &str = "kubelet";

const WARNING: &str = "Warning: This endpoint is not meant to be machine parseable, has no formatting compatibility guarantees and is for debugging purposes only.";

/// Upstream's answer when no acceptable media type is asked for.
pub const UNSUPPORTED_MEDIA_TYPE: &str = "media type not acceptable, must be: text/plain";

/// The separators upstream picks from at random for each answer.
const DELIMITERS: [&str; 4] = [":", ": ", "=", " "];

/// Sets the log verbosity (`/debug/flags/v`); the binary installs the real one.
pub type VerbositySetter = plumbing::logging::SetVerbosity;

/// What the debugging endpoints read: process facts, the settings that switch them, and the
/// verbosity control.
#[derive(Clone)]
pub struct Debug {
    /// When the process started (`/statusz`).
    pub start: SystemTime,
    /// The command line (`/flagz`): flag name (without dashes) → value.
    pub flags: BTreeMap<String, String>,
    /// `enableDebugFlagsHandler` (default true).
    pub flags_handler: bool,
    /// `enableProfilingHandler` (default true).
    pub profiling_handler: bool,
    /// The `ComponentStatusz` gate.
    pub statusz: bool,
    /// The `ComponentFlagz` gate.
    pub flagz: bool,
    /// None: the verbosity cannot be changed in this process (tests, or no subscriber).
    pub verbosity: Option<VerbositySetter>,
    /// NodeLogQuery (`enableSystemLogQuery` and the `NodeLogQuery` gate): the journal
    /// `/logs/?query=` reads. None: `/logs/` serves files only.
    pub log_query: Option<Arc<dyn super::journal::Journal>>,
}

impl Default for Debug {
    fn default() -> Self {
        Debug {
            start: SystemTime::now(),
            flags: BTreeMap::new(),
            flags_handler: true,
            profiling_handler: true,
            statusz: true,
            flagz: true,
            verbosity: None,
            log_query: None,
        }
    }
}

/// What `main` records about the process before the agent starts.
#[derive(Clone)]
pub struct Process {
    pub start: SystemTime,
    pub flags: BTreeMap<String, String>,
    pub verbosity: Option<VerbositySetter>,
}

static PROCESS: OnceLock<Process> = OnceLock::new();

/// Records the process facts (once; later calls are ignored).
pub fn record_process(p: Process) {
    let _ = PROCESS.set(p);
}

/// The recorded process facts, if `main` recorded them.
pub fn recorded_process() -> Option<Process> {
    PROCESS.get().cloned()
}

/// What an `Accept` header asks a z-page for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Text,
    /// Versioned JSON at this version of `config.k8s.io`.
    Json(&'static str),
}

/// Upstream's negotiation: no header → text; the first acceptable entry (highest `q` first)
/// wins: `text/plain`, `text/*` or `*/*` (no parameter but `charset=utf-8`) is text;
/// `application/json;g=config.k8s.io;v=<v1alpha1|v1beta1>;as=<kind>` is JSON. None → 406.
pub fn negotiate(accept: Option<&str>, kind: &str) -> Option<Format> {
    let Some(accept) = accept.filter(|a| !a.trim().is_empty()) else {
        return Some(Format::Text);
    };
    let mut entries: Vec<(f32, Option<Format>)> = Vec::new();
    for entry in accept.split(',') {
        let mut parts = entry.split(';');
        let media = parts.next().unwrap_or("").trim().to_ascii_lowercase();
        let mut q = 1.0f32;
        let mut params: BTreeMap<String, String> = BTreeMap::new();
        for p in parts {
            let Some((k, v)) = p.split_once('=') else {
                continue;
            };
            let k = k.trim().to_ascii_lowercase();
            let v = v.trim().trim_matches('"').to_string();
            if k == "q" {
                q = v.parse().unwrap_or(0.0);
            } else {
                params.insert(k, v);
            }
        }
        if q <= 0.0 {
            continue;
        }
        let format = match media.as_str() {
            "text/plain" | "text/*" | "*/*" => {
                let plain = params.is_empty()
                    || (params.len() == 1
                        && params
                            .get("charset")
                            .is_some_and(|c| c.eq_ignore_ascii_case("utf-8")));
                plain.then_some(Format::Text)
            }
            "application/json" => {
                let version = match params.get("v").map(String::as_str) {
                    Some("v1alpha1") => Some("v1alpha1"),
                    Some("v1beta1") => Some("v1beta1"),
                    _ => None,
                };
                let ok = params.get("g").map(String::as_str) == Some("config.k8s.io")
                    && params.get("as").map(String::as_str) == Some(kind);
                version.filter(|_| ok).map(Format::Json)
            }
            _ => None,
        };
        entries.push((q, format));
    }
    // Stable: equal weights keep the client's order.
    entries.sort_by(|a, b| b.0.partial_cmp(&a.0).unwrap_or(std::cmp::Ordering::Equal));
    entries.into_iter().find_map(|(_, f)| f)
}

/// `H hr MM min SS sec`, as upstream prints uptime.
pub fn uptime_text(secs: u64) -> String {
    format!(
        "{} hr {:02} min {:02} sec",
        secs / 3600,
        (secs / 60) % 60,
        secs % 60
    )
}

/// Go's `time.UnixDate` layout (`Mon Jan _2 15:04:05 MST 2006`), in UTC.
pub fn unix_date(t: SystemTime) -> String {
    jiff::Timestamp::try_from(t)
        .map(|ts| ts.strftime("%a %b %e %H:%M:%S UTC %Y").to_string())
        .unwrap_or_default()
}

fn rfc3339(t: SystemTime) -> String {
    jiff::Timestamp::try_from(t)
        .map(|ts| ts.strftime("%Y-%m-%dT%H:%M:%SZ").to_string())
        .unwrap_or_default()
}

fn delimiter() -> &'static str {
    DELIMITERS[fastrand::usize(..DELIMITERS.len())]
}

/// The paths `/statusz` lists: the handlers this :10250 server has.
pub fn listed_paths(d: &Debug, debugging_handlers: bool) -> Vec<&'static str> {
    let mut p = vec![
        "/healthz",
        "/metrics",
        "/metrics/cadvisor",
        "/metrics/probes",
        "/metrics/resource",
        "/pods",
        "/stats",
    ];
    if debugging_handlers {
        p.extend([
            "/attach",
            "/configz",
            "/containerLogs",
            "/exec",
            "/logs",
            "/portForward",
            "/run",
            "/runningpods",
        ]);
        if d.flags_handler {
            p.push("/debug/flags/v");
        }
    }
    if d.statusz {
        p.push("/statusz");
    }
    if d.flagz {
        p.push("/flagz");
    }
    p.sort_unstable();
    p
}

fn not_acceptable() -> Response {
    (
        StatusCode::NOT_ACCEPTABLE,
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        format!("{UNSUPPORTED_MEDIA_TYPE}\n"),
    )
        .into_response()
}

fn accept(headers: &HeaderMap) -> Option<&str> {
    headers.get(header::ACCEPT).and_then(|v| v.to_str().ok())
}

/// The `/statusz` body for `format`, `now` being the time of the request.
pub fn statusz_body(d: &Debug, paths: &[&str], format: Format, now: SystemTime) -> String {
    let up = now.duration_since(d.start).unwrap_or_default().as_secs();
    match format {
        Format::Text => {
            let delim = delimiter();
            format!(
                "\n{COMPONENT} statusz\n{WARNING}\n\nStarted{delim} {}\nUp{delim} {}\nBinary version{delim} {}\nPaths{delim} {}\n",
                unix_date(d.start),
                uptime_text(up),
                crate::KUBERNETES_VERSION.trim_start_matches('v'),
                paths.join(" "),
            )
        }
        Format::Json(v) => serde_json::json!({
            "kind": "Statusz",
            "apiVersion": format!("config.k8s.io/{v}"),
            "metadata": {"name": COMPONENT},
            "startTime": rfc3339(d.start),
            "uptimeSeconds": up,
            "binaryVersion": crate::KUBERNETES_VERSION.trim_start_matches('v'),
            "paths": paths,
        })
        .to_string(),
    }
}

/// The `/flagz` body for `format`.
pub fn flagz_body(d: &Debug, format: Format) -> String {
    match format {
        Format::Text => {
            let delim = delimiter();
            let mut s = format!("\n{COMPONENT} flags\n{WARNING}\n\n");
            for (k, v) in &d.flags {
                s.push_str(&format!("{k}{delim}{v}\n"));
            }
            s
        }
        Format::Json(v) => serde_json::json!({
            "kind": "Flagz",
            "apiVersion": format!("config.k8s.io/{v}"),
            "metadata": {"name": COMPONENT},
            "flags": d.flags,
        })
        .to_string(),
    }
}

fn answer(format: Format, body: String) -> Response {
    let ct = match format {
        Format::Text => "text/plain; charset=utf-8",
        Format::Json(_) => "application/json",
    };
    ([(header::CONTENT_TYPE, ct)], body).into_response()
}

/// GET `/statusz` (routed only with the `ComponentStatusz` gate on); `debugging_handlers`:
/// whether this server has them (for the listed paths).
pub async fn statusz(s: AppState, headers: HeaderMap, debugging_handlers: bool) -> Response {
    let Some(format) = negotiate(accept(&headers), "Statusz") else {
        return not_acceptable();
    };
    let paths = listed_paths(&s.debug, debugging_handlers);
    answer(
        format,
        statusz_body(&s.debug, &paths, format, SystemTime::now()),
    )
}

/// GET `/flagz` (routed only with the `ComponentFlagz` gate on).
pub async fn flagz(State(s): State<AppState>, headers: HeaderMap) -> Response {
    let Some(format) = negotiate(accept(&headers), "Flagz") else {
        return not_acceptable();
    };
    answer(format, flagz_body(&s.debug, format))
}

#[cfg(test)]
mod tests;
