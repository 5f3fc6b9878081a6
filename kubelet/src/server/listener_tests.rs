use super::*;
use crate::metrics::server as m;
use crate::server::{AppState, logs, plain_handler, read_only_router};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

fn state() -> AppState {
    AppState {
        statuses: Arc::new(crate::status_manager::StatusManager::new()),
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
    }
}

fn limits(max: usize, hs_ms: u64, idle_ms: u64) -> Limits {
    Limits {
        max_connections: max,
        tls_handshake_timeout: Duration::from_millis(hs_ms),
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
        .with_label_values(&["readonly"])
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
