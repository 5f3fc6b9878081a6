use super::*;
use crate::metrics::server as m;
use crate::server::{AppState, logs, plain_handler, read_only_router};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

fn state() -> AppState {
    AppState {
        statuses: Arc::new(Vec::new()),
        pleg: Arc::new(crate::pleg::PlegHealth::default()),
        metrics: crate::metrics::Metrics::new("test-node"),
        configz: Arc::new(serde_json::json!({"secret": "x"})),
        logs: Arc::new(logs::Logs {
            pod_logs_dir: "/nonexistent/pods".into(),
            node_log_dir: None,
            containers: Arc::new(logs::RuntimeLookup::default()),
        }),
        stats: crate::stats::Handle::default(),
        runtime: Arc::new(logs::RuntimeLookup::default()),
        streaming: Arc::new(crate::server::streaming::Streaming::new(
            Duration::from_secs(60),
        )),
        debug: Default::default(),
    }
}

fn limits(max: usize, hs_ms: u64, idle_ms: u64) -> Limits {
    Limits {
        max_connections: max,
        max_per_source: usize::MAX,
        authenticated_reserve: 0,
        max_per_identity: usize::MAX,
        tls_handshake_timeout: Duration::from_millis(hs_ms),
        header_read_timeout: Duration::from_millis(idle_ms),
        idle_timeout: Duration::from_millis(idle_ms),
        max_header_bytes: 1 << 20,
    }
}

/// A read-only server on an ephemeral loopback port; cancelled on drop of the token.
async fn start(
    limits: Limits,
    tls: Option<tokio_rustls::TlsAcceptor>,
) -> (std::net::SocketAddr, CancellationToken) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let cancel = CancellationToken::new();
    tokio::spawn(serve(
        l,
        tls,
        limits,
        ServerType::ReadOnly,
        plain_handler(read_only_router(state())),
        cancel.clone(),
    ));
    (addr, cancel)
}

/// Sends `raw` and returns the status code of the answer (0: closed without one).
async fn status_of(s: &mut TcpStream, raw: &str) -> u16 {
    s.write_all(raw.as_bytes()).await.unwrap();
    let mut buf = vec![0u8; 4096];
    let n = tokio::time::timeout(Duration::from_secs(5), s.read(&mut buf))
        .await
        .expect("an answer in time")
        .unwrap_or(0);
    let text = String::from_utf8_lossy(&buf[..n]);
    text.split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0)
}

async fn get(addr: std::net::SocketAddr, path: &str) -> u16 {
    let mut s = TcpStream::connect(addr).await.unwrap();
    status_of(
        &mut s,
        &format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"),
    )
    .await
}

/// Waits until the peer closes `s` (true) or `within` passes (false).
async fn closed_within(s: &mut TcpStream, within: Duration) -> bool {
    let mut buf = [0u8; 64];
    matches!(
        tokio::time::timeout(within, s.read(&mut buf)).await,
        Ok(Ok(0)) | Ok(Err(_))
    )
}

fn rejected() -> f64 {
    m::server()
        .rejected_connections
        .with_label_values(&["readonly", "max_connections"])
        .get()
}

#[tokio::test]
async fn connections_beyond_the_cap_are_closed_and_counted() {
    let (addr, _cancel) = start(limits(3, 5_000, 60_000), None).await;
    let mut held = Vec::new();
    for _ in 0..3 {
        held.push(TcpStream::connect(addr).await.unwrap());
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    let before = rejected();
    let mut extra = TcpStream::connect(addr).await.unwrap();
    assert!(
        closed_within(&mut extra, Duration::from_secs(2)).await,
        "a connection beyond the cap is closed"
    );
    assert!(rejected() >= before + 1.0);
    // A freed slot serves again.
    drop(held.pop());
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(get(addr, "/healthz/ping").await, 200);
}

#[tokio::test]
async fn a_client_that_never_finishes_its_handshake_is_dropped() {
    let dir = tempfile::tempdir().unwrap();
    let policy = crate::server::tls_policy(None, &[]).unwrap();
    let cfg = crate::server::serving_tls(&policy, None, None, dir.path(), "localhost", &[], false)
        .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(cfg));
    let (addr, _cancel) = start(limits(100, 200, 60_000), Some(acceptor)).await;
    let timeouts = || {
        m::server()
            .tls_handshake_errors
            .with_label_values(&["readonly", "timeout"])
            .get()
    };
    let before = timeouts();
    // Slowloris: a few bytes of a ClientHello, then nothing.
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(&[0x16, 0x03, 0x01]).await.unwrap();
    assert!(
        closed_within(&mut s, Duration::from_secs(3)).await,
        "the half handshake is dropped after the handshake timeout"
    );
    assert!(timeouts() >= before + 1.0);
}

#[tokio::test]
async fn idle_and_slow_header_connections_are_closed_after_the_idle_timeout() {
    let (addr, _cancel) = start(limits(100, 5_000, 300), None).await;
    let idle = || {
        m::server()
            .idle_closed
            .with_label_values(&["readonly"])
            .get()
    };
    let before = idle();
    // Kept alive after one request, then silent.
    let mut s = TcpStream::connect(addr).await.unwrap();
    assert_eq!(
        status_of(&mut s, "GET /healthz/ping HTTP/1.1\r\nHost: x\r\n\r\n").await,
        200
    );
    // Half a request head, never finished.
    let mut slow = TcpStream::connect(addr).await.unwrap();
    slow.write_all(b"GET /pods HTTP/1.1\r\nHost: x\r\nX-A: ")
        .await
        .unwrap();
    assert!(closed_within(&mut s, Duration::from_secs(3)).await);
    assert!(closed_within(&mut slow, Duration::from_secs(3)).await);
    assert!(idle() >= before + 1.0, "{before} -> {}", idle());
}

#[tokio::test]
async fn many_idle_connections_do_not_stop_requests() {
    let (addr, _cancel) = start(limits(4096, 5_000, 60_000), None).await;
    let mut held = Vec::new();
    for _ in 0..300 {
        held.push(TcpStream::connect(addr).await.unwrap());
    }
    assert_eq!(get(addr, "/healthz/ping").await, 200);
    let open = m::server()
        .open_connections
        .with_label_values(&["readonly"])
        .get();
    assert!(open >= 300.0, "{open}");
}

#[tokio::test]
async fn read_only_port_serves_only_the_read_only_subset_and_counts_requests() {
    let (addr, _cancel) = start(limits(100, 5_000, 60_000), None).await;
    let count = |path: &str| {
        m::server()
            .requests
            .with_label_values(&["GET", path, "readonly", "false"])
            .get()
    };
    let before = count("metrics/probes");
    assert_eq!(get(addr, "/metrics/probes").await, 200);
    assert!(count("metrics/probes") >= before + 1.0);
    assert_eq!(get(addr, "/pods").await, 200);
    assert_eq!(get(addr, "/metrics").await, 200);
    // Never without credentials.
    assert_eq!(get(addr, "/configz").await, 404);
    for p in [
        "/exec/ns/pod/c?command=sh",
        "/containerLogs/ns/pod/c",
        "/runningpods/",
        "/logs/syslog",
        "/portForward/ns/pod",
    ] {
        assert_eq!(get(addr, p).await, 405, "{p}");
    }
    let mut s = TcpStream::connect(addr).await.unwrap();
    let malformed =
        "GET /exec/ns/pod/c HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: \r\n\r\n";
    let code = status_of(&mut s, malformed).await;
    assert!((400..500).contains(&code), "{code}");
}

#[tokio::test]
async fn oversized_request_heads_are_refused() {
    let (addr, _cancel) = start(limits(100, 5_000, 60_000), None).await;
    let mut s = TcpStream::connect(addr).await.unwrap();
    let big = "a".repeat(2 << 20);
    let req = format!("GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: {big}\r\n\r\n");
    let _ = s.write_all(req.as_bytes()).await;
    let mut buf = vec![0u8; 4096];
    let n = tokio::time::timeout(Duration::from_secs(5), s.read(&mut buf))
        .await
        .expect("an answer in time")
        .unwrap_or(0);
    let text = String::from_utf8_lossy(&buf[..n]);
    // hyper answers 431, or closes the connection: never a 200.
    assert!(n == 0 || text.contains(" 431 "), "{text}");
}

/// A :10250-like server on loopback (the authenticating handler over plain TCP): the token
/// `good` is user `admin`, allowed `get` on `nodes/pods`; anything else is a 401.
async fn start_authenticating(limits: Limits) -> (std::net::SocketAddr, CancellationToken) {
    use crate::server::auth_review::fake::FakeReview;
    let review = Arc::new(FakeReview::default());
    review.token("good", "admin", &[]);
    review.grant("admin", "get", "pods");
    review.token("api", "kube-apiserver-kubelet-client", &[]);
    review.grant("kube-apiserver-kubelet-client", "get", "pods");
    let auth = crate::server::Auth::new(
        crate::server::AuthSettings::secure_defaults(),
        "node-a",
        Some(review as Arc<dyn crate::server::auth_review::AuthReview>),
    )
    .unwrap();
    let l = TcpListener::bind("0.0.0.0:0").await.unwrap();
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], l.local_addr().unwrap().port()));
    let cancel = CancellationToken::new();
    tokio::spawn(serve(
        l,
        None,
        limits,
        ServerType::ReadWrite,
        crate::server::https_handler(Arc::new(auth), crate::server::api_router(state(), true)),
        cancel.clone(),
    ));
    (addr, cancel)
}

/// A connection to `to` from the loopback address `from` (each 127.0.0.x is its own source).
async fn connect_from(from: [u8; 4], to: std::net::SocketAddr) -> TcpStream {
    let sock = tokio::net::TcpSocket::new_v4().unwrap();
    sock.bind(std::net::SocketAddr::from((from, 0))).unwrap();
    sock.connect(to).await.unwrap()
}

const GOOD: &str = "GET /pods HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer good\r\n\r\n";
const BAD: &str = "GET /pods HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer nope\r\n\r\n";

fn counter(c: &prometheus::CounterVec, labels: &[&str]) -> f64 {
    c.with_label_values(labels).get()
}

/// Issue 24: one source without credentials cannot hold the slots of :10250: beyond its
/// per-source cap its connections are closed at accept, and an authenticated client from
/// elsewhere still gets in and keeps its connection.
#[tokio::test]
async fn one_source_cannot_exhaust_the_slots_and_an_authenticated_client_gets_in() {
    let mut l = limits(20, 5_000, 60_000);
    l.max_per_source = 5;
    l.authenticated_reserve = 5;
    let (addr, _cancel) = start_authenticating(l).await;
    let per_source = || {
        counter(
            &m::server().rejected_connections,
            &["readwrite", "per_source"],
        )
    };
    let before = per_source();
    // One host opens 20 connections (the whole cap) and sends nothing.
    let mut flood = Vec::new();
    for _ in 0..20 {
        flood.push(connect_from([127, 0, 0, 2], addr).await);
    }
    let mut closed = 0;
    for c in flood.iter_mut() {
        if closed_within(c, Duration::from_millis(300)).await {
            closed += 1;
        }
    }
    assert_eq!(closed, 15, "all but its cap of 5 are closed at accept");
    assert!(per_source() >= before + 15.0);
    // An authenticated client from another address is served, and its connection is kept.
    let mut good = connect_from([127, 0, 0, 3], addr).await;
    assert_eq!(status_of(&mut good, GOOD).await, 200);
    assert_eq!(status_of(&mut good, GOOD).await, 200, "kept alive");
}

/// Issue 24: connections without an authorized request cannot take the slots kept for
/// authenticated ones: when they hold the rest, the longest-waiting one is closed to admit a
/// newcomer, and an authenticated connection is never the one closed.
#[tokio::test]
async fn unauthenticated_connections_leave_the_reserve_to_authenticated_ones() {
    let mut l = limits(12, 5_000, 60_000);
    l.max_per_source = 3;
    l.authenticated_reserve = 4;
    let (addr, _cancel) = start_authenticating(l).await;
    let evicted = || counter(&m::server().evicted_connections, &["readwrite"]);
    // An authenticated client first.
    let mut admin = connect_from([127, 0, 0, 10], addr).await;
    assert_eq!(status_of(&mut admin, GOOD).await, 200);
    // Sources 11..=13 hold the 8 slots kept for pending connections (3 + 3 + 2).
    let mut idle = Vec::new();
    for (host, n) in [(11u8, 3), (12, 3), (13, 2)] {
        for _ in 0..n {
            idle.push(connect_from([127, 0, 0, host], addr).await);
        }
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    let before = evicted();
    // More from new sources: each evicts the longest-waiting pending connection.
    let mut late = Vec::new();
    for host in 14u8..18 {
        late.push(connect_from([127, 0, 0, host], addr).await);
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(evicted() >= before + 4.0, "{before} -> {}", evicted());
    for c in idle.iter_mut().take(4) {
        assert!(
            closed_within(c, Duration::from_secs(2)).await,
            "the oldest pending connections make room"
        );
    }
    // The authenticated connection was kept, and a newcomer that authenticates is served.
    assert_eq!(status_of(&mut admin, GOOD).await, 200);
    let mut fresh = connect_from([127, 0, 0, 20], addr).await;
    assert_eq!(status_of(&mut fresh, GOOD).await, 200);
    assert_eq!(status_of(&mut admin, GOOD).await, 200);
}

/// Issue 37.4: a client with a valid credential cannot fill every slot with authenticated
/// connections: beyond its identity's cap its connections count as unauthenticated (they are
/// still served), so they are evicted for the apiserver's.
#[tokio::test]
async fn one_identity_cannot_fill_the_slots_and_the_apiserver_gets_in() {
    let mut l = limits(12, 5_000, 60_000);
    l.max_per_source = 100;
    l.authenticated_reserve = 4;
    l.max_per_identity = 3;
    let (addr, _cancel) = start_authenticating(l).await;
    // `admin` opens the whole cap, each connection with an authorized request, kept alive.
    let mut admin = Vec::new();
    for _ in 0..12 {
        let mut c = connect_from([127, 0, 0, 40], addr).await;
        assert_eq!(status_of(&mut c, GOOD).await, 200, "served all the same");
        admin.push(c);
    }
    // The apiserver's identity still gets connections, one after another.
    const API: &str = "GET /pods HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer api\r\n\r\n";
    let mut api = Vec::new();
    for i in 0..4 {
        let mut c = connect_from([127, 0, 0, 41], addr).await;
        assert_eq!(
            status_of(&mut c, API).await,
            200,
            "apiserver connection {i}"
        );
        api.push(c);
    }
    // admin's first three (counted as authenticated) were not the ones closed.
    for c in admin.iter_mut().take(3) {
        assert_eq!(status_of(c, GOOD).await, 200);
    }
}

/// Issue 24: a 401 (or 403) ends its connection: a refused client does not keep its slot
/// with keep-alive.
#[tokio::test]
async fn a_refused_request_closes_its_connection() {
    let (addr, _cancel) = start_authenticating(limits(100, 5_000, 60_000)).await;
    let mut c = connect_from([127, 0, 0, 30], addr).await;
    c.write_all(BAD.as_bytes()).await.unwrap();
    let mut got = Vec::new();
    let end = tokio::time::timeout(Duration::from_secs(5), c.read_to_end(&mut got)).await;
    assert!(end.is_ok(), "the connection is closed after the 401");
    let text = String::from_utf8_lossy(&got);
    assert!(text.starts_with("HTTP/1.1 401 "), "{text}");
    assert!(
        text.to_ascii_lowercase().contains("connection: close"),
        "{text}"
    );
    // 403: an authenticated user without the right.
    let mut c = connect_from([127, 0, 0, 30], addr).await;
    c.write_all(b"GET /configz HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer good\r\n\r\n")
        .await
        .unwrap();
    let mut got = Vec::new();
    let end = tokio::time::timeout(Duration::from_secs(5), c.read_to_end(&mut got)).await;
    assert!(end.is_ok(), "the connection is closed after the 403");
    assert!(String::from_utf8_lossy(&got).starts_with("HTTP/1.1 403 "));
    // An authorized request keeps its connection.
    let mut ok = connect_from([127, 0, 0, 30], addr).await;
    assert_eq!(status_of(&mut ok, GOOD).await, 200);
    assert!(!closed_within(&mut ok, Duration::from_millis(300)).await);
}
