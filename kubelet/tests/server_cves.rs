//! Regression tests for upstream kubelet CVEs of the HTTP servers (:10248 healthz, the
//! read-only port, :10250), driving the routers and the listener as the kubelet runs them.
//! Named `cve_<year>_<number>_...`; the table is in docs/security.md.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{Method, Request, StatusCode};
use kubelet::metrics::server::{self as server_metrics, READONLY_BUCKETS};
use kubelet::server::listener::{Limits, ServerType, serve};
use kubelet::server::{
    AppState, api_router, healthz_router, logs, plain_handler, read_only_router, streaming,
};
use prometheus::core::Collector;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;

fn state() -> AppState {
    AppState {
        statuses: Arc::new(kubelet::status::manager::StatusManager::new()),
        pleg: Arc::new(kubelet::pleg::PlegHealth::default()),
        metrics: kubelet::metrics::Metrics::new("test-node"),
        configz: Arc::new(serde_json::json!({})),
        logs: Arc::new(logs::Logs {
            pod_logs_dir: "/nonexistent/pods".into(),
            node_log_dir: None,
            containers: Arc::new(logs::RuntimeLookup::default()),
        }),
        stats: kubelet::stats::Handle::default(),
        runtime: Arc::new(logs::RuntimeLookup::default()),
        streaming: Arc::new(streaming::Streaming::new(Duration::from_secs(60))),
        debug: Default::default(),
    }
}

async fn status(router: axum::Router, method: Method, path: &str) -> StatusCode {
    let req = Request::builder()
        .method(method)
        .uri(path)
        .body(Body::empty())
        .unwrap();
    router.oneshot(req).await.unwrap().status()
}

const PPROF: &[&str] = &[
    "/debug/pprof/",
    "/debug/pprof/heap",
    "/debug/pprof/profile?seconds=30",
    "/debug/pprof/goroutine?debug=2",
    "/debug/pprof/cmdline",
    "/debug/flags/v",
];

/// CVE-2019-11248: upstream served `/debug/pprof` on the unauthenticated healthz port
/// (:10248). No server of this agent has profiling handlers: the healthz port and (behind
/// authentication) :10250 answer 404 (:10250's `/debug/flags/v` is upstream's PUT handler); the read-only port, and :10250 without
/// `enableDebuggingHandlers`, answer upstream's 405 "Debug endpoints are disabled.".
#[tokio::test]
async fn cve_2019_11248_no_profiling_handlers_on_any_port() {
    for path in PPROF {
        assert_eq!(
            status(healthz_router(state()), Method::GET, path).await,
            StatusCode::NOT_FOUND,
            "healthz {path}"
        );
        // Behind authentication: pprof is a documented 404 (no profiler); /debug/flags/v is
        // upstream's handler, which answers a GET 406 (only PUT sets the verbosity).
        let want = if *path == "/debug/flags/v" {
            StatusCode::NOT_ACCEPTABLE
        } else {
            StatusCode::NOT_FOUND
        };
        assert_eq!(
            status(api_router(state(), true), Method::GET, path).await,
            want,
            ":10250 {path}"
        );
    }
    for path in &PPROF[..5] {
        assert_eq!(
            status(read_only_router(state()), Method::GET, path).await,
            StatusCode::METHOD_NOT_ALLOWED,
            "read-only {path}"
        );
        assert_eq!(
            status(api_router(state(), false), Method::GET, path).await,
            StatusCode::METHOD_NOT_ALLOWED,
            ":10250 without debugging handlers {path}"
        );
    }
    // What the healthz port does serve.
    assert_eq!(
        status(healthz_router(state()), Method::GET, "/healthz/ping").await,
        StatusCode::OK
    );
}

/// CVE-2025-0426: container checkpoint requests on the unauthenticated read-only port filled
/// the node's disk. The read-only port has no `/checkpoint`; nor has :10250 (this agent
/// implements no checkpointing, and that port authenticates first anyway).
#[tokio::test]
async fn cve_2025_0426_no_checkpoint_on_the_read_only_port() {
    for path in [
        "/checkpoint/default/web/app",
        "/checkpoint/default/web/app?timeout=60",
    ] {
        assert_eq!(
            status(read_only_router(state()), Method::POST, path).await,
            StatusCode::NOT_FOUND,
            "read-only {path}"
        );
        for debugging in [true, false] {
            assert_eq!(
                status(api_router(state(), debugging), Method::POST, path).await,
                StatusCode::NOT_FOUND,
                ":10250 (debugging handlers {debugging}) {path}"
            );
        }
    }
}

/// The `path` label values of `kubelet_http_requests_total{server_type="readonly"}`.
fn readonly_path_labels() -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for family in server_metrics::server().requests.collect() {
        for m in family.get_metric() {
            let labels = m.get_label();
            let get = |n: &str| {
                labels
                    .iter()
                    .find(|l| l.name() == n)
                    .map(|l| l.value().to_string())
            };
            if get("server_type").as_deref() == Some("readonly")
                && let Some(p) = get("path")
            {
                out.insert(p);
            }
        }
    }
    out
}

/// CVE-2020-8551: upstream's request metrics were labelled with the request's path, so a
/// client (unauthenticated, on the read-only port) sending ever new paths grew the kubelet's
/// memory without bound. Here 400 requests to distinct paths leave the label set within the
/// server's fixed buckets (plus `other`).
#[tokio::test]
async fn cve_2020_8551_request_metrics_stay_bounded_under_random_paths() {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let cancel = CancellationToken::new();
    tokio::spawn(serve(
        l,
        None,
        Limits {
            max_connections: 100,
            tls_handshake_timeout: Duration::from_secs(5),
            idle_timeout: Duration::from_secs(30),
            ..Limits::default()
        },
        ServerType::ReadOnly,
        plain_handler(read_only_router(state())),
        cancel.clone(),
    ));
    for i in 0..400 {
        let path = match i % 4 {
            0 => format!("/random-{i}/x"),
            1 => format!("/metrics/random-{i}"),
            2 => format!("/pods/{i}"),
            _ => format!("/stats/summary/{i}?q={i}"),
        };
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        s.write_all(
            format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes(),
        )
        .await
        .unwrap();
        let mut buf = Vec::new();
        tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut buf))
            .await
            .expect("an answer in time")
            .unwrap();
        assert!(buf.starts_with(b"HTTP/1.1 "), "{path}");
    }
    cancel.cancel();
    let labels = readonly_path_labels();
    let allowed: BTreeSet<String> = READONLY_BUCKETS
        .iter()
        .map(|s| s.to_string())
        .chain(["other".to_string()])
        .collect();
    assert!(
        labels.is_subset(&allowed),
        "path labels outside the fixed buckets: {:?}",
        labels.difference(&allowed).collect::<Vec<_>>()
    );
    assert!(labels.contains("other"), "the random paths were counted");
}
