use super::*;
use crate::certs::bootstrap::check_key_pair;
use crate::status::StatusManager;
use std::os::unix::fs::PermissionsExt;

fn mode(p: &Path) -> u32 {
    std::fs::metadata(p).unwrap().permissions().mode() & 0o777
}

fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

#[test]
fn tls_versions_and_suites() {
    use rustls::ProtocolVersion::{TLSv1_2, TLSv1_3};
    let v = |p: TlsPolicy| p.versions.iter().map(|v| v.version).collect::<Vec<_>>();
    assert_eq!(v(tls_policy(None, &[]).unwrap()), [TLSv1_3, TLSv1_2]);
    assert_eq!(
        v(tls_policy(Some("VersionTLS12"), &[]).unwrap()),
        [TLSv1_3, TLSv1_2]
    );
    assert_eq!(v(tls_policy(Some("VersionTLS13"), &[]).unwrap()), [TLSv1_3]);
    for old in ["VersionTLS10", "VersionTLS11"] {
        let e = tls_policy(Some(old), &[]).unwrap_err();
        assert!(e.contains(old) && e.contains("rustls"), "{e}");
    }
    assert!(
        tls_policy(Some("TLS1.2"), &[])
            .unwrap_err()
            .contains("unknown tls version")
    );
    let p = tls_policy(
        None,
        &[
            "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256".into(),
            "TLS_AES_128_GCM_SHA256".into(),
        ],
    )
    .unwrap();
    let suites = p.suites.unwrap();
    let tls12: Vec<_> = suites
        .iter()
        .filter(|s| !is_tls13(s))
        .map(|s| s.suite())
        .collect();
    assert_eq!(
        tls12,
        [rustls::CipherSuite::TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256]
    );
    assert_eq!(
        suites.iter().filter(|s| is_tls13(s)).count(),
        3,
        "TLS 1.3 suites stay"
    );
    let e = tls_policy(None, &["TLS_RSA_WITH_AES_128_CBC_SHA".into()]).unwrap_err();
    assert!(
        e.contains("TLS_RSA_WITH_AES_128_CBC_SHA") && e.contains("not supported"),
        "{e}"
    );
    let e = tls_policy(None, &["TLS_NOPE".into()]).unwrap_err();
    assert!(e.contains("unknown cipher suite"), "{e}");
    // A restricted policy still builds a server config.
    let dir = tempfile::tempdir().unwrap();
    let p = tls_policy(Some("VersionTLS13"), &["TLS_AES_256_GCM_SHA384".into()]).unwrap();
    serving_tls(&p, None, None, dir.path(), "n", &[], false).unwrap();
}

fn serve(dir: &Path) -> Result<rustls::ServerConfig, ServerError> {
    serving_tls(
        &tls_policy(None, &[]).unwrap(),
        None,
        None,
        dir,
        "worker-1",
        &["10.0.0.5".parse().unwrap()],
        true,
    )
}

#[test]
fn self_signed_pair_is_written_privately_and_kept() {
    let dir = tempfile::tempdir().unwrap();
    let pki = dir.path().join("pki");
    serve(&pki).unwrap();
    let (crt, key) = (pki.join("kubelet.crt"), pki.join("kubelet.key"));
    assert_eq!(mode(&key), 0o600);
    assert_eq!(mode(&crt), 0o644);
    assert_eq!(
        names(&pki),
        ["kubelet.crt", "kubelet.key"],
        "no temp file left"
    );
    let (c1, k1) = (std::fs::read(&crt).unwrap(), std::fs::read(&key).unwrap());
    check_key_pair(&c1, &k1).unwrap();
    // A usable pair is served again, not replaced.
    serve(&pki).unwrap();
    assert_eq!(std::fs::read(&crt).unwrap(), c1);
    assert_eq!(std::fs::read(&key).unwrap(), k1);
}

#[test]
fn half_present_or_mismatched_self_signed_pair_is_regenerated() {
    let dir = tempfile::tempdir().unwrap();
    let pki = dir.path();
    let (crt, key) = (pki.join("kubelet.crt"), pki.join("kubelet.key"));
    serve(pki).unwrap();
    let old_cert = std::fs::read(&crt).unwrap();

    // Only the certificate is left (say, a crash after the key was removed).
    std::fs::remove_file(&key).unwrap();
    serve(pki).unwrap();
    let (c, k) = (std::fs::read(&crt).unwrap(), std::fs::read(&key).unwrap());
    assert_ne!(c, old_cert);
    check_key_pair(&c, &k).unwrap();
    assert_eq!(mode(&key), 0o600);

    // The key belongs to another certificate: both are replaced, nothing fails.
    let other = rcgen::KeyPair::generate().unwrap();
    std::fs::write(&key, other.serialize_pem()).unwrap();
    assert!(check_key_pair(&c, &std::fs::read(&key).unwrap()).is_err());
    serve(pki).unwrap();
    let (c2, k2) = (std::fs::read(&crt).unwrap(), std::fs::read(&key).unwrap());
    assert_ne!(c2, c);
    check_key_pair(&c2, &k2).unwrap();
    assert_eq!(mode(&key), 0o600);
    assert_eq!(names(pki), ["kubelet.crt", "kubelet.key"]);
}

#[test]
fn configured_mismatched_pair_is_an_error_not_replaced() {
    let dir = tempfile::tempdir().unwrap();
    serve(dir.path()).unwrap();
    let crt = dir.path().join("kubelet.crt");
    let key = dir.path().join("other.key");
    std::fs::write(&key, rcgen::KeyPair::generate().unwrap().serialize_pem()).unwrap();
    let before = std::fs::read(&crt).unwrap();
    let r = serving_tls(
        &tls_policy(None, &[]).unwrap(),
        Some(&crt),
        Some(&key),
        &dir.path().join("unused"),
        "worker-1",
        &[],
        false,
    );
    assert!(matches!(r, Err(ServerError::Tls { .. })));
    assert_eq!(std::fs::read(&crt).unwrap(), before);
}

fn app_state() -> AppState {
    AppState {
        statuses: Arc::new(StatusManager::new()),
        pleg: Arc::new(PlegHealth::default()),
        metrics: Metrics::new("test-node"),
        configz: Arc::new(serde_json::json!({"x": 1})),
        logs: Arc::new(logs::Logs {
            pod_logs_dir: "/nonexistent/pods".into(),
            node_log_dir: Some("/nonexistent/var/log".into()),
            containers: Arc::new(logs::RuntimeLookup::default()),
        }),
        stats: crate::stats::Handle::default(),
        runtime: Arc::new(logs::RuntimeLookup::default()),
        streaming: Arc::new(streaming::Streaming::new(std::time::Duration::from_secs(
            60,
        ))),
        debug: Default::default(),
    }
}

/// (status, body) of one request to `router`.
async fn answer(router: &Router, method: &str, uri: &str) -> (u16, String) {
    use http_body_util::BodyExt;
    let req = http::Request::builder()
        .method(method)
        .uri(uri)
        .header("connection", "Upgrade")
        .header("upgrade", "SPDY/3.1")
        .body(axum::body::Body::empty())
        .unwrap();
    let resp = tower::ServiceExt::oneshot(router.clone(), req)
        .await
        .unwrap();
    let status = resp.status().as_u16();
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8_lossy(&body).into_owned())
}

/// Issue 24: `enableDebuggingHandlers: false` holds on :10250, as upstream's NewServer:
/// exec, attach, port-forward, run, container and node logs, running pods and pprof answer 405
/// "Debug endpoints are disabled.", /configz is not served, the default handlers stay.
#[tokio::test]
async fn debugging_handlers_disabled_are_405_as_upstream() {
    let off = api_router(app_state(), false);
    let disabled = [
        ("POST", "/exec/default/web/app?command=id&output=1"),
        ("GET", "/exec/default/web/uid/app?command=id&output=1"),
        ("POST", "/attach/default/web/app?output=1"),
        ("POST", "/portForward/default/web"),
        ("GET", "/portForward/default/web/uid?port=80"),
        ("POST", "/run/default/web/app?cmd=id"),
        ("GET", "/containerLogs/default/web/app"),
        ("GET", "/logs/"),
        ("GET", "/logs/syslog"),
        ("GET", "/runningpods/"),
        ("GET", "/debug/pprof/"),
        ("GET", "/debug/pprof/profile"),
    ];
    for (m, p) in disabled {
        assert_eq!(
            answer(&off, m, p).await,
            (405, "Debug endpoints are disabled.\n".to_string()),
            "{m} {p}"
        );
    }
    assert_eq!(answer(&off, "GET", "/configz").await.0, 404);
    assert_eq!(answer(&off, "GET", "/healthz/ping").await.0, 200);
    assert_eq!(answer(&off, "GET", "/pods").await.0, 200);

    // Enabled (upstream's default): the handlers answer for themselves; pprof is a 404 that
    // says there is no profiler (see pprof_is_a_documented_404).
    let on = api_router(app_state(), true);
    let (code, body) = answer(&on, "POST", "/exec/default/web/app?command=id&output=1").await;
    assert_eq!((code, body.as_str()), (404, "pod does not exist"));
    assert_eq!(answer(&on, "GET", "/configz").await.0, 200);
    // No runtime connected in this test: served, and failing for that reason.
    assert_eq!(answer(&on, "GET", "/runningpods/").await.0, 500);
    assert_eq!(answer(&on, "GET", "/debug/pprof/").await.0, 404);
}

/// (status, body) of one request with a method, a body and optional Accept header.
async fn call(
    router: &Router,
    method: &str,
    uri: &str,
    body: &str,
    accept: Option<&str>,
) -> (u16, String) {
    use http_body_util::BodyExt;
    let mut req = http::Request::builder().method(method).uri(uri);
    if let Some(a) = accept {
        req = req.header("accept", a);
    }
    let resp = tower::ServiceExt::oneshot(
        router.clone(),
        req.body(axum::body::Body::from(body.to_string())).unwrap(),
    )
    .await
    .unwrap();
    let status = resp.status().as_u16();
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8_lossy(&body).into_owned())
}

fn with_debug(d: zpages::Debug) -> AppState {
    AppState {
        debug: Arc::new(d),
        ..app_state()
    }
}

/// Issue 30: PUT /debug/flags/v changes the verbosity as upstream's handler answers; other
/// methods are 406, a bad value 400 naming it, and enableDebugFlagsHandler: false is 405.
#[tokio::test]
async fn debug_flags_v_sets_the_verbosity() {
    let set = Arc::new(std::sync::Mutex::new(Vec::new()));
    let seen = set.clone();
    let router = api_router(
        with_debug(zpages::Debug {
            verbosity: Some(Arc::new(move |v| {
                seen.lock().unwrap().push(v);
                Ok(())
            })),
            ..Default::default()
        }),
        true,
    );
    assert_eq!(
        call(&router, "PUT", "/debug/flags/v", "5", None).await,
        (200, "successfully set klog.logging.verbosity to 5\n".into())
    );
    assert_eq!(*set.lock().unwrap(), vec![5]);
    assert_eq!(
        call(&router, "GET", "/debug/flags/v", "", None).await,
        (406, "unsupported http method\n".into())
    );
    let (code, body) = call(&router, "PUT", "/debug/flags/v", "5; rm -rf /", None).await;
    assert_eq!(code, 400);
    assert_eq!(
        body,
        "failed set klog.logging.verbosity 5; rm -rf /: strconv.ParseInt: parsing \"5; rm -rf /\": invalid syntax\n"
    );
    assert_eq!(*set.lock().unwrap(), vec![5], "a bad value changes nothing");

    let off = api_router(
        with_debug(zpages::Debug {
            flags_handler: false,
            ..Default::default()
        }),
        true,
    );
    assert_eq!(
        call(&off, "PUT", "/debug/flags/v", "5", None).await,
        (405, "flags endpoint is disabled.\n".into())
    );
    // Without the debugging handlers upstream registers no flags handler at all.
    assert_eq!(
        call(
            &api_router(app_state(), false),
            "PUT",
            "/debug/flags/v",
            "5",
            None
        )
        .await
        .0,
        404
    );
}

/// Issue 30: /debug/pprof/ is a documented 404 (no profiler), 405 when switched off.
#[tokio::test]
async fn pprof_is_a_documented_404() {
    let on = api_router(app_state(), true);
    for p in [
        "/debug/pprof/",
        "/debug/pprof/profile",
        "/debug/pprof/heap?debug=1",
    ] {
        assert_eq!(
            call(&on, "GET", p, "", None).await,
            (404, format!("{}\n", debug::NO_PROFILER)),
            "{p}"
        );
    }
    let off = api_router(
        with_debug(zpages::Debug {
            profiling_handler: false,
            ..Default::default()
        }),
        true,
    );
    assert_eq!(
        call(&off, "GET", "/debug/pprof/profile", "", None).await,
        (405, "profiling endpoint is disabled.\n".into())
    );
}

/// Issue 30: /statusz and /flagz with their gates; JSON only for the full versioned type.
#[tokio::test]
async fn statusz_and_flagz_are_served_with_their_gates() {
    let on = api_router(app_state(), true);
    let (code, body) = call(&on, "GET", "/statusz", "", Some("application/json, */*")).await;
    assert_eq!(code, 200);
    assert!(body.starts_with("\nkubelet statusz\n"), "{body}");
    let (code, body) = call(
        &on,
        "GET",
        "/statusz",
        "",
        Some("application/json;v=v1alpha1;g=config.k8s.io;as=Statusz"),
    )
    .await;
    assert_eq!(code, 200);
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&body).unwrap()["kind"],
        "Statusz"
    );
    assert_eq!(
        call(&on, "GET", "/flagz", "", Some("application/json")).await,
        (406, format!("{}\n", zpages::UNSUPPORTED_MEDIA_TYPE))
    );
    assert!(
        call(&on, "GET", "/flagz", "", None)
            .await
            .1
            .starts_with("\nkubelet flags\n")
    );
    // Served without the debugging handlers too (they are not debugging handlers upstream).
    assert_eq!(
        call(&api_router(app_state(), false), "GET", "/statusz", "", None)
            .await
            .0,
        200
    );
    let gated = api_router(
        with_debug(zpages::Debug {
            statusz: false,
            flagz: false,
            ..Default::default()
        }),
        true,
    );
    assert_eq!(call(&gated, "GET", "/statusz", "", None).await.0, 404);
    assert_eq!(call(&gated, "GET", "/flagz", "", None).await.0, 404);
}

/// The authorization each debugging path gets, as upstream's GetRequestAttributes.
#[test]
fn debugging_paths_authorize_as_upstream() {
    assert_eq!(authz::subresources("/debug/flags/v"), vec!["proxy"]);
    assert_eq!(authz::subresources("/debug/pprof/heap"), vec!["proxy"]);
    assert_eq!(authz::subresources("/flagz"), vec!["proxy"]);
    assert_eq!(authz::subresources("/statusz"), vec!["statusz", "proxy"]);
    let h = http::HeaderMap::new();
    assert_eq!(
        authz::api_verb(&http::Method::PUT, "/debug/flags/v", &h),
        "update"
    );
}

fn log_query_state(dir: &std::path::Path, journal: journal::fake::FakeJournal) -> AppState {
    AppState {
        logs: Arc::new(logs::Logs {
            pod_logs_dir: "/nonexistent/pods".into(),
            node_log_dir: Some(dir.into()),
            containers: Arc::new(logs::RuntimeLookup::default()),
        }),
        debug: Arc::new(zpages::Debug {
            log_query: Some(Arc::new(journal)),
            ..Default::default()
        }),
        ..app_state()
    }
}

/// Issue 30: NodeLogQuery through /logs/?query=: services from the journal (upstream's
/// journalctl arguments), files, the file fallback without journald, and upstream's 400/406
/// answers; a hostile service name never reaches journalctl.
#[tokio::test]
async fn node_log_query_as_upstream() {
    let d = tempfile::tempdir().unwrap();
    std::fs::write(d.path().join("syslog"), "sys line\n").unwrap();
    std::fs::write(d.path().join("crio.log"), "crio line\n").unwrap();
    let fake = journal::fake::FakeJournal {
        units: Some("containerd.service\nkubelet.service\n".into()),
        output: "journal line\n".into(),
        ..Default::default()
    };
    let runs = fake.runs.clone();
    let r = api_router(log_query_state(d.path(), fake), true);
    assert_eq!(
        call(&r, "GET", "/logs/?query=kubelet&tailLines=5", "", None).await,
        (200, "journal line\n".into())
    );
    let last = runs.lock().unwrap().last().cloned().unwrap();
    assert!(
        last.contains(&"--unit=kubelet".into()) && last.contains(&"--lines=5".into()),
        "{last:?}"
    );
    assert_eq!(
        call(&r, "GET", "/logs/?query=%2Fsyslog", "", None).await,
        (200, "sys line\n".into())
    );
    // crio is not in the journal: its file under /var/log is the answer.
    assert_eq!(
        call(&r, "GET", "/logs/?query=crio", "", None).await,
        (200, "crio line\n".into())
    );
    assert_eq!(
        call(&r, "GET", "/logs/?query=nothing", "", None).await,
        (200, "\nlog not found for nothing\n".into())
    );
    let (code, body) = call(&r, "GET", "/logs/?query=crio&tailLines=2", "", None).await;
    assert_eq!(code, 200);
    assert!(
        body.contains("options present and query resolved to log files for [crio]"),
        "{body}"
    );
    assert_eq!(
        call(&r, "GET", "/logs/syslog?query=kubelet", "", None).await,
        (406, "path not allowed in query mode\n".into())
    );
    assert_eq!(call(&r, "GET", "/logs/?tailLines=x", "", None).await.0, 400);
    assert_eq!(
        call(&r, "GET", "/logs/?query=a&query=b%2Fc", "", None)
            .await
            .0,
        406
    );
    let before = runs.lock().unwrap().len();
    for hostile in [
        "kubelet%3Bid",
        "%24(id)",
        "kubelet%0A--unit%3Dssh",
        "a%20b",
        "..%2F..%2Fetc%2Fshadow",
    ] {
        let (code, _) = call(&r, "GET", &format!("/logs/?query={hostile}"), "", None).await;
        assert_eq!(code, 406, "{hostile}");
    }
    assert_eq!(
        runs.lock().unwrap().len(),
        before,
        "journalctl never ran for a refused query"
    );
    // Plain file requests are unchanged.
    assert_eq!(
        call(&r, "GET", "/logs/syslog", "", None).await,
        (200, "sys line\n".into())
    );

    // Without journald every service is looked for as a file.
    let no_journal = journal::fake::FakeJournal::default();
    let none_runs = no_journal.runs.clone();
    let r = api_router(log_query_state(d.path(), no_journal), true);
    assert_eq!(
        call(&r, "GET", "/logs/?query=kubelet", "", None).await,
        (200, "\nlog not found for kubelet\n".into())
    );
    assert!(none_runs.lock().unwrap().is_empty());
}

/// With NodeLogQuery off (the default) the query is ignored: /logs/ stays a file server.
#[tokio::test]
async fn node_log_query_off_serves_files_only() {
    let d = tempfile::tempdir().unwrap();
    std::fs::write(d.path().join("syslog"), "sys line\n").unwrap();
    let mut state = log_query_state(d.path(), Default::default());
    state.debug = Arc::new(zpages::Debug::default());
    let r = api_router(state, true);
    let (code, body) = call(&r, "GET", "/logs/?query=kubelet", "", None).await;
    assert_eq!(code, 200);
    assert!(body.contains("<a href=\"./syslog\">syslog</a>"), "{body}");
}
