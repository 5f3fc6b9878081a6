use super::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

struct Quiet;

impl Observer for Quiet {
    fn label(&self) -> &'static str {
        "test"
    }
}

fn ok_handler() -> Handler {
    Arc::new(|_req, _peer| Box::pin(async { axum::response::IntoResponse::into_response("ok") }))
}

fn limits(max: usize, per_source: usize, header_ms: u64, idle_ms: u64) -> Limits {
    Limits {
        max_connections: max,
        max_per_source: per_source,
        authenticated_reserve: 0,
        max_per_identity: usize::MAX,
        tls_handshake_timeout: Duration::from_secs(5),
        header_read_timeout: Duration::from_millis(header_ms),
        idle_timeout: Duration::from_millis(idle_ms),
        max_header_bytes: 1 << 16,
    }
}

async fn start_shared(limiter: Arc<Limiter>, limits: Limits) -> std::net::SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(serve_shared(
        l,
        None,
        limiter,
        limits,
        Arc::new(Quiet),
        ok_handler(),
        CancellationToken::new(),
    ));
    addr
}

/// True when the peer closed `s` within `within`.
async fn closed_within(s: &mut TcpStream, within: Duration) -> bool {
    let mut buf = [0u8; 256];
    loop {
        match tokio::time::timeout(within, s.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return true,
            Ok(Ok(_)) => continue,
            Err(_) => return false,
        }
    }
}

async fn get_ok(addr: std::net::SocketAddr) -> bool {
    let Ok(mut s) = TcpStream::connect(addr).await else {
        return false;
    };
    let _ = s
        .write_all(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await;
    let mut out = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut out)).await;
    out.starts_with(b"HTTP/1.1 200")
}

#[tokio::test]
async fn a_silent_connection_is_closed_at_the_header_read_timeout_before_the_idle_one() {
    let limiter = Limiter::new(limits(10, 10, 0, 0).conn_limits());
    let addr = start_shared(limiter, limits(10, 10, 200, 60_000)).await;
    let mut silent = TcpStream::connect(addr).await.unwrap();
    assert!(
        closed_within(&mut silent, Duration::from_secs(3)).await,
        "no request head within the header-read timeout: closed, long before the idle timeout"
    );
    // A connection with a request answered stays open until the idle timeout.
    let mut active = TcpStream::connect(addr).await.unwrap();
    active
        .write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let mut buf = [0u8; 256];
    let n = active.read(&mut buf).await.unwrap();
    assert!(buf[..n].starts_with(b"HTTP/1.1 200"));
    assert!(!closed_within(&mut active, Duration::from_millis(600)).await);
}

#[tokio::test]
async fn servers_sharing_a_limiter_share_its_caps() {
    // Two servers, one budget of 4 connections, 3 per source.
    let limiter = Limiter::new(limits(4, 3, 0, 0).conn_limits());
    let a = start_shared(limiter.clone(), limits(4, 3, 30_000, 30_000)).await;
    let b = start_shared(limiter.clone(), limits(4, 3, 30_000, 30_000)).await;
    let mut held = Vec::new();
    for _ in 0..3 {
        held.push(TcpStream::connect(a).await.unwrap());
    }
    // The source holds its 3 on server a: server b refuses it too.
    let mut refused = TcpStream::connect(b).await.unwrap();
    assert!(closed_within(&mut refused, Duration::from_secs(3)).await);
    assert!(!get_ok(b).await, "the per-source cap is shared");
    drop(held);
    // Slots are given back when the connections end.
    let deadline = Instant::now() + Duration::from_secs(5);
    while limiter.counts().0 != 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(get_ok(b).await && get_ok(a).await);
}
