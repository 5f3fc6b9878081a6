//! CVE-2019-11250 and CVE-2020-8565: client-go wrote bearer tokens (the kubelet's own, and
//! the ones it reviews) to the log at high verbosity. Here every crate logs at TRACE (what
//! `-v=5` and above select) into a buffer while the kubelet's apiserver client, built from a
//! kubeconfig holding a token, reviews callers' bearer tokens through the :10250
//! authenticator against a local stand-in apiserver; no token appears in the log.
//!
//! Its own test binary: the subscriber is process-wide.

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Json;
use axum::http::HeaderMap;
use axum::routing::post;
use kubelet::objects::client::{ClientHandle, RateLimitLayer, build};
use kubelet::server::auth_review::ApiReview;
use kubelet::server::authn::Authenticator;

const CLIENT_TOKEN: &str = "client-token-4f1d2c9e7b";
const GOOD_TOKEN: &str = "caller-token-a8e3b61f55";
const BAD_TOKEN: &str = "caller-token-0c7d93ea21";

#[derive(Clone, Default)]
struct Buffer(Arc<Mutex<Vec<u8>>>);

impl Write for Buffer {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The stand-in apiserver's TokenReview: GOOD_TOKEN is `reader`, anything else is refused.
/// It records the Authorization header it was sent.
async fn token_review(
    seen: Arc<Mutex<Vec<String>>>,
    headers: HeaderMap,
    Json(body): Json<serde_json::Value>,
) -> Json<serde_json::Value> {
    if let Some(h) = headers.get("authorization") {
        seen.lock()
            .unwrap()
            .push(h.to_str().unwrap_or("").to_string());
    }
    let token = body["spec"]["token"].as_str().unwrap_or("");
    let status = if token == GOOD_TOKEN {
        serde_json::json!({"authenticated": true, "user": {"username": "reader", "groups": ["g"]}})
    } else {
        serde_json::json!({"authenticated": false, "error": "invalid bearer token"})
    };
    Json(serde_json::json!({
        "apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
        "metadata": {}, "spec": body["spec"], "status": status
    }))
}

#[tokio::test]
async fn cve_2019_11250_tokens_never_reach_the_log_at_any_verbosity() {
    let buf = Buffer::default();
    let writer = buf.clone();
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new("trace"))
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .init();

    let seen = Arc::new(Mutex::new(Vec::new()));
    let s2 = seen.clone();
    let app = axum::Router::new().route(
        "/apis/authentication.k8s.io/v1/tokenreviews",
        post(move |h: HeaderMap, b: Json<serde_json::Value>| token_review(s2.clone(), h, b)),
    );
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(l, app).await });

    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: http://{addr}\ncontexts:\n- name: x\n  context:\n    cluster: c\n    user: u\ncurrent-context: x\nusers:\n- name: u\n  user:\n    token: {CLIENT_TOKEN}\n"
        ),
    )
    .unwrap();
    let client = build(&kubeconfig, &RateLimitLayer::new(100.0, 100))
        .await
        .unwrap();
    let (handle, _publisher) = ClientHandle::new(client);
    let authn = Authenticator::new(
        false,
        None,
        Some(Arc::new(ApiReview::new(handle))),
        Duration::from_secs(120),
    );
    let bearer = |t: &str| {
        let mut h = http::HeaderMap::new();
        h.insert(
            http::header::AUTHORIZATION,
            format!("Bearer {t}").parse().unwrap(),
        );
        h
    };
    let user = authn.authenticate(&bearer(GOOD_TOKEN), None).await.unwrap();
    assert_eq!(user.name, "reader");
    let refused = authn.authenticate(&bearer(BAD_TOKEN), None).await;
    assert!(refused.is_err());
    // Both went to the stand-in apiserver with the kubelet's own token.
    assert_eq!(
        *seen.lock().unwrap(),
        vec![format!("Bearer {CLIENT_TOKEN}"); 2]
    );

    let log = String::from_utf8_lossy(&buf.0.lock().unwrap()).into_owned();
    assert!(
        log.contains("tokenreviews"),
        "TRACE logging was on during the requests (the client's spans name the URL):\n{log}"
    );
    for token in [CLIENT_TOKEN, GOOD_TOKEN, BAD_TOKEN] {
        assert!(
            !log.contains(token),
            "{token} is in the log:\n{}",
            log.lines()
                .filter(|l| l.contains(token))
                .collect::<Vec<_>>()
                .join("\n")
        );
    }
}
