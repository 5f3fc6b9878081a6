use super::*;
use crate::runtime::fake::{FakeRuntime, StreamRequest};
use crate::runtime::{ExecResult, raw};
use k8s_openapi::api::core::v1::PodStatus;
use std::sync::Mutex;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

fn q(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

#[test]
fn stream_flags_follow_upstream() {
    let none = stream_flags(&q(&[("command", "ls")])).unwrap_err();
    assert_eq!(none.status, StatusCode::BAD_REQUEST);
    assert_eq!(
        none.body,
        "you must specify at least 1 of stdin, stdout, stderr"
    );
    // Only "1" turns a stream on (kubectl's "true" reaches the kubelet as "1").
    assert!(stream_flags(&q(&[("output", "true")])).is_err());
    let f = stream_flags(&q(&[("input", "1"), ("output", "1"), ("error", "1")])).unwrap();
    assert_eq!(
        f,
        StreamFlags {
            stdin: true,
            stdout: true,
            stderr: true,
            tty: false
        }
    );
    // A tty merges stderr into stdout: stderr is dropped.
    let t = stream_flags(&q(&[("output", "1"), ("error", "1"), ("tty", "1")])).unwrap();
    assert!(t.tty && t.stdout && !t.stderr);
}

#[test]
fn websocket_port_forwards_need_ports() {
    assert_eq!(forward_ports(&q(&[]), false).unwrap(), Vec::<i32>::new());
    let e = forward_ports(&q(&[]), true).unwrap_err();
    assert_eq!(
        (e.status, e.body.as_str()),
        (
            StatusCode::BAD_REQUEST,
            "query parameter \"port\" is required"
        )
    );
    assert_eq!(
        forward_ports(&q(&[("port", "80,8080"), ("port", "9")]), true).unwrap(),
        vec![80, 8080, 9]
    );
    assert!(forward_ports(&q(&[("port", "0")]), true).is_err());
    assert!(forward_ports(&q(&[("port", "70000")]), true).is_err());
    assert!(forward_ports(&q(&[("port", "")]), true).is_err());
}

#[test]
fn upgrade_detection() {
    let mut h = HeaderMap::new();
    assert!(!is_upgrade(&h));
    h.insert(
        header::CONNECTION,
        HeaderValue::from_static("keep-alive, Upgrade"),
    );
    h.insert(header::UPGRADE, HeaderValue::from_static("SPDY/3.1"));
    assert!(is_upgrade(&h) && !is_websocket(&h));
    h.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
    assert!(is_websocket(&h));
}

#[test]
fn backend_url_and_request_head() {
    let b = backend("http://127.0.0.1:38011/exec/AbC?x=1").unwrap();
    assert_eq!(b.authority, "127.0.0.1:38011");
    assert_eq!(b.target, "/exec/AbC?x=1");
    assert_eq!(backend("http://[::1]/pf/x").unwrap().authority, "[::1]:80");
    assert!(backend("https://127.0.0.1:1/exec/x").is_err());
    assert!(backend("not a url").is_err());

    let mut h = HeaderMap::new();
    h.insert(header::HOST, HeaderValue::from_static("node:10250"));
    h.insert(
        header::AUTHORIZATION,
        HeaderValue::from_static("Bearer secret"),
    );
    h.insert(header::CONNECTION, HeaderValue::from_static("Upgrade"));
    h.insert(header::UPGRADE, HeaderValue::from_static("SPDY/3.1"));
    h.insert(header::CONTENT_LENGTH, HeaderValue::from_static("0"));
    h.append(
        "x-stream-protocol-version",
        HeaderValue::from_static("v4.channel.k8s.io"),
    );
    h.append(
        "x-stream-protocol-version",
        HeaderValue::from_static("v3.channel.k8s.io"),
    );
    let head = String::from_utf8(request_head(&http::Method::POST, &h, &b)).unwrap();
    assert!(
        head.starts_with("POST /exec/AbC?x=1 HTTP/1.1\r\nHost: 127.0.0.1:38011\r\n"),
        "{head}"
    );
    assert!(head.contains("upgrade: SPDY/3.1\r\n"), "{head}");
    assert!(head.contains("x-stream-protocol-version: v4.channel.k8s.io\r\n"));
    assert!(head.contains("x-stream-protocol-version: v3.channel.k8s.io\r\n"));
    assert!(
        !head.contains("secret") && !head.contains("node:10250"),
        "{head}"
    );
    assert!(head.ends_with("\r\n\r\n"));
}

#[tokio::test]
async fn splice_copies_both_ways_and_stops_when_idle() {
    let (mut a, mut a_peer) = tokio::io::duplex(1024);
    let (mut b, mut b_peer) = tokio::io::duplex(1024);
    let cancel = CancellationToken::new();
    let task =
        tokio::spawn(
            async move { splice(&mut a, &mut b, Duration::from_millis(300), &cancel).await },
        );
    a_peer.write_all(b"ping").await.unwrap();
    let mut buf = [0u8; 4];
    b_peer.read_exact(&mut buf).await.unwrap();
    assert_eq!(&buf, b"ping");
    b_peer.write_all(b"pong").await.unwrap();
    a_peer.read_exact(&mut buf).await.unwrap();
    assert_eq!(&buf, b"pong");
    // Nothing more either way: the idle timeout ends it.
    let end = tokio::time::timeout(Duration::from_secs(5), task)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(end, SpliceEnd::Idle);
}

#[tokio::test]
async fn splice_ends_when_one_side_closes() {
    let (mut a, a_peer) = tokio::io::duplex(1024);
    let (mut b, _b_peer) = tokio::io::duplex(1024);
    let cancel = CancellationToken::new();
    drop(a_peer);
    let end = tokio::time::timeout(
        Duration::from_secs(5),
        splice(&mut a, &mut b, Duration::from_secs(60), &cancel),
    )
    .await
    .unwrap();
    assert_eq!(end, SpliceEnd::Closed);
}

/// A stand-in for the runtime's streaming server: records each request head, answers with
/// `answer`, then echoes bytes back (upper-cased, to tell them from the client's).
async fn fake_streaming_server(answer: &'static str) -> (String, Arc<Mutex<Vec<String>>>) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", l.local_addr().unwrap());
    let heads = Arc::new(Mutex::new(Vec::new()));
    let h2 = heads.clone();
    tokio::spawn(async move {
        while let Ok((mut c, _)) = l.accept().await {
            let heads = h2.clone();
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut b = [0u8; 1];
                while !buf.ends_with(b"\r\n\r\n") {
                    if c.read(&mut b).await.unwrap_or(0) == 0 {
                        return;
                    }
                    buf.push(b[0]);
                }
                heads
                    .lock()
                    .unwrap()
                    .push(String::from_utf8_lossy(&buf).into());
                c.write_all(answer.as_bytes()).await.unwrap();
                let mut chunk = [0u8; 1024];
                loop {
                    match c.read(&mut chunk).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => {
                            let up = chunk[..n].to_ascii_uppercase();
                            if c.write_all(&up).await.is_err() {
                                return;
                            }
                        }
                    }
                }
            });
        }
    });
    (base, heads)
}

const SWITCH: &str = "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: SPDY/3.1\r\nX-Stream-Protocol-Version: v4.channel.k8s.io\r\n\r\nHELLO";

struct Setup {
    addr: std::net::SocketAddr,
    rt: Arc<FakeRuntime>,
    streaming: Arc<Streaming>,
    container: String,
    sandbox: String,
}

/// The :10250 routes on loopback (plain HTTP) with one pod `default/web` (uid `raw-t-0`)
/// running container `app` in the fake runtime.
async fn setup(stream_base: &str, idle: Duration) -> Setup {
    let rt = Arc::new(FakeRuntime::new());
    rt.set_stream_base(stream_base);
    let logs = tempfile::tempdir().unwrap();
    let sb = raw::sandbox(0, "t", logs.path(), "/kubepods");
    let sandbox = rt.run_sandbox(&sb).await.unwrap();
    let container = rt
        .create_container(&sandbox, &raw::container(&sb), &sb)
        .await
        .unwrap();
    rt.start_container(&container).await.unwrap();
    let mut pod = Pod::default();
    pod.metadata.name = Some("web".into());
    pod.metadata.namespace = Some("default".into());
    pod.metadata.uid = Some("raw-t-0".into());
    pod.status = Some(PodStatus::default());
    let statuses = Arc::new(vec![pod]);
    let streaming = Arc::new(Streaming::new(idle));
    streaming.set_runtime(rt.clone());
    let state = AppState {
        statuses,
        pleg: Arc::new(crate::pleg::PlegHealth::default()),
        metrics: crate::metrics::Metrics::new("n"),
        configz: Arc::new(serde_json::json!({})),
        logs: Arc::new(crate::server::logs::Logs {
            pod_logs_dir: logs.path().into(),
            node_log_dir: None,
            containers: Arc::new(crate::server::logs::RuntimeLookup::default()),
        }),
        stats: crate::stats::Handle::default(),
        runtime: Arc::new(crate::server::logs::RuntimeLookup::default()),
        streaming: streaming.clone(),
        debug: Default::default(),
    };
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        let _ = axum::serve(l, crate::server::api_router(state, true)).await;
    });
    Setup {
        addr,
        rt,
        streaming,
        container,
        sandbox,
    }
}

/// Sends a raw request; the connection and the response head read so far.
async fn send(addr: std::net::SocketAddr, head: &str) -> (TcpStream, BackendHead) {
    let mut c = TcpStream::connect(addr).await.unwrap();
    c.write_all(head.as_bytes()).await.unwrap();
    let h = tokio::time::timeout(Duration::from_secs(10), read_head(&mut c))
        .await
        .unwrap()
        .unwrap();
    (c, h)
}

async fn body_of(mut c: TcpStream, h: BackendHead) -> String {
    let len: usize = h
        .headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse().ok())
        .unwrap_or(0);
    let mut body = h.rest;
    let mut chunk = [0u8; 1024];
    while body.len() < len {
        let n = c.read(&mut chunk).await.unwrap();
        if n == 0 {
            break;
        }
        body.extend_from_slice(&chunk[..n]);
    }
    String::from_utf8_lossy(&body).into()
}

const UPGRADE: &str = "Connection: Upgrade\r\nUpgrade: SPDY/3.1\r\nX-Stream-Protocol-Version: v4.channel.k8s.io\r\nAuthorization: Bearer t0ken\r\n";

#[tokio::test]
async fn exec_upgrade_is_proxied_to_the_runtime_url() {
    let (base, heads) = fake_streaming_server(SWITCH).await;
    let s = setup(&base, Duration::from_secs(60)).await;
    let (mut c, h) = send(
        s.addr,
        &format!(
            "POST /exec/default/web/app?command=sh&command=-c&command=echo%20hi&output=1&error=1 HTTP/1.1\r\nHost: node\r\n{UPGRADE}Content-Length: 0\r\n\r\n"
        ),
    )
    .await;
    assert_eq!(h.status, StatusCode::SWITCHING_PROTOCOLS);
    assert_eq!(h.headers["x-stream-protocol-version"], "v4.channel.k8s.io");
    assert_eq!(h.headers["upgrade"], "SPDY/3.1");
    // The runtime got the CRI request the query asked for...
    assert_eq!(
        s.rt.stream_requests(),
        vec![StreamRequest::Exec {
            id: s.container.clone(),
            cmd: vec!["sh".into(), "-c".into(), "echo hi".into()],
            flags: StreamFlags {
                stdin: false,
                stdout: true,
                stderr: true,
                tty: false
            },
        }]
    );
    // ...and the upgrade on its URL, with the client's protocol headers but not its token.
    let head = heads.lock().unwrap()[0].clone();
    assert!(head.starts_with("POST /exec/1 HTTP/1.1\r\n"), "{head}");
    assert!(
        head.to_ascii_lowercase()
            .contains("x-stream-protocol-version: v4.channel.k8s.io")
    );
    assert!(!head.contains("t0ken"), "{head}");
    // Bytes the runtime wrote right after its 101 arrive, then the splice works both ways.
    let mut got = h.rest.clone();
    let mut buf = [0u8; 64];
    while got.len() < 5 {
        let n = c.read(&mut buf).await.unwrap();
        got.extend_from_slice(&buf[..n]);
    }
    assert_eq!(&got, b"HELLO");
    assert_eq!(s.streaming.open(), 1);
    c.write_all(b"stdin bytes").await.unwrap();
    let mut echo = [0u8; 11];
    c.read_exact(&mut echo).await.unwrap();
    assert_eq!(&echo, b"STDIN BYTES");
    drop(c);
    tokio::time::timeout(Duration::from_secs(5), async {
        while s.streaming.open() > 0 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the splice ends when the client goes away");
}

#[tokio::test]
async fn idle_streams_are_closed() {
    let (base, _) = fake_streaming_server(SWITCH).await;
    let s = setup(&base, Duration::from_millis(300)).await;
    let (mut c, h) = send(
        s.addr,
        &format!(
            "GET /attach/default/web/raw-t-0/app?output=1 HTTP/1.1\r\nHost: n\r\n{UPGRADE}\r\n"
        ),
    )
    .await;
    assert_eq!(h.status, StatusCode::SWITCHING_PROTOCOLS);
    assert!(matches!(
        s.rt.stream_requests()[0],
        StreamRequest::Attach { .. }
    ));
    let before = IDLE_CLOSED.get();
    // Read everything until the kubelet closes the idle connection.
    let mut buf = [0u8; 64];
    let closed = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            if c.read(&mut buf).await.unwrap_or(0) == 0 {
                break;
            }
        }
    })
    .await;
    assert!(closed.is_ok(), "an idle stream must be closed");
    assert!(IDLE_CLOSED.get() > before);
}

#[tokio::test]
async fn port_forward_goes_to_the_pods_sandbox() {
    let (base, heads) = fake_streaming_server(SWITCH).await;
    let s = setup(&base, Duration::from_secs(60)).await;
    let ws = "Connection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Protocol: v4.channel.k8s.io\r\n";
    // websocket without ports: 400 before anything else.
    let (c, h) = send(
        s.addr,
        &format!("GET /portForward/default/web HTTP/1.1\r\nHost: n\r\n{ws}\r\n"),
    )
    .await;
    assert_eq!(h.status, StatusCode::BAD_REQUEST);
    assert_eq!(body_of(c, h).await, "query parameter \"port\" is required");
    // A UID that is not the pod's: 404.
    let (_, h) = send(
        s.addr,
        &format!("GET /portForward/default/web/other-uid?port=80 HTTP/1.1\r\nHost: n\r\n{ws}\r\n"),
    )
    .await;
    assert_eq!(h.status, StatusCode::NOT_FOUND);
    let (_, h) = send(
        s.addr,
        &format!("GET /portForward/default/web?port=80 HTTP/1.1\r\nHost: n\r\n{ws}\r\n"),
    )
    .await;
    assert_eq!(h.status, StatusCode::SWITCHING_PROTOCOLS);
    assert_eq!(
        s.rt.stream_requests(),
        vec![StreamRequest::PortForward {
            sandbox_id: s.sandbox.clone(),
            ports: vec![80]
        }]
    );
    let head = heads.lock().unwrap()[0].clone();
    assert!(
        head.starts_with("GET /portforward/1 HTTP/1.1\r\n"),
        "{head}"
    );
    assert!(
        head.contains("sec-websocket-key: dGhlIHNhbXBsZSBub25jZQ=="),
        "{head}"
    );
}

#[tokio::test]
async fn refusals_use_upstreams_status_codes() {
    let (base, _) = fake_streaming_server(SWITCH).await;
    let s = setup(&base, Duration::from_secs(60)).await;
    let cases = [
        // No stream selected.
        (
            format!("POST /exec/default/web/app?command=ls HTTP/1.1\r\nHost: n\r\n{UPGRADE}\r\n"),
            400,
            "you must specify at least 1 of stdin, stdout, stderr",
        ),
        // Unknown pod.
        (
            format!("POST /exec/default/nope/app?output=1 HTTP/1.1\r\nHost: n\r\n{UPGRADE}\r\n"),
            404,
            "pod does not exist",
        ),
        // Unknown container (upstream's findContainer error, a 500).
        (
            format!("POST /exec/default/web/db?output=1 HTTP/1.1\r\nHost: n\r\n{UPGRADE}\r\n"),
            500,
            "container not found (\"db\")",
        ),
        // A UID that is not the pod's.
        (
            format!(
                "POST /exec/default/web/x-uid/app?output=1 HTTP/1.1\r\nHost: n\r\n{UPGRADE}\r\n"
            ),
            404,
            "pod not found",
        ),
        // Not an upgrade.
        (
            "POST /exec/default/web/app?output=1 HTTP/1.1\r\nHost: n\r\nContent-Length: 0\r\n\r\n"
                .to_string(),
            500,
            "Upgrade request required\n",
        ),
    ];
    for (req, status, body) in cases {
        let (c, h) = send(s.addr, &req).await;
        assert_eq!(h.status.as_u16(), status, "{req}");
        assert_eq!(body_of(c, h).await, body, "{req}");
    }
    assert!(s.rt.stream_requests().is_empty(), "no session was prepared");
    let (_, h) = send(
        s.addr,
        "DELETE /exec/default/web/app?output=1 HTTP/1.1\r\nHost: n\r\n\r\n",
    )
    .await;
    assert_eq!(h.status, StatusCode::METHOD_NOT_ALLOWED);
}

#[tokio::test]
async fn a_runtime_refusal_is_relayed() {
    let (base, _) = fake_streaming_server(
        "HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain\r\nContent-Length: 21\r\n\r\nunsupported protocol!",
    )
    .await;
    let s = setup(&base, Duration::from_secs(60)).await;
    let (c, h) = send(
        s.addr,
        &format!("POST /exec/default/web/app?output=1 HTTP/1.1\r\nHost: n\r\n{UPGRADE}\r\n"),
    )
    .await;
    assert_eq!(h.status, StatusCode::BAD_REQUEST);
    assert_eq!(body_of(c, h).await, "unsupported protocol!");

    // A runtime streaming server that is gone: 500 with the dial error.
    let gone = {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        format!("http://{}", l.local_addr().unwrap())
    };
    s.rt.set_stream_base(&gone);
    let (c, h) = send(
        s.addr,
        &format!("POST /exec/default/web/app?output=1 HTTP/1.1\r\nHost: n\r\n{UPGRADE}\r\n"),
    )
    .await;
    assert_eq!(h.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert!(body_of(c, h).await.contains("dialing the runtime"));
}

#[tokio::test]
async fn run_returns_the_commands_output() {
    let s = setup("http://127.0.0.1:1", Duration::from_secs(60)).await;
    s.rt.push_exec_result(ExecResult {
        exit_code: 0,
        stdout: b"web\n".to_vec(),
        stderr: b"warn\n".to_vec(),
    });
    let (c, h) = send(
        s.addr,
        "POST /run/default/web/app?cmd=sh%20-c%20hostname HTTP/1.1\r\nHost: n\r\nContent-Length: 0\r\n\r\n",
    )
    .await;
    assert_eq!(h.status, StatusCode::OK);
    assert_eq!(body_of(c, h).await, "web\nwarn\n");
    s.rt.push_exec_result(ExecResult {
        exit_code: 3,
        stdout: vec![],
        stderr: b"boom".to_vec(),
    });
    let (c, h) = send(
        s.addr,
        "POST /run/default/web/app?cmd=false HTTP/1.1\r\nHost: n\r\nContent-Length: 0\r\n\r\n",
    )
    .await;
    assert_eq!(h.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(body_of(c, h).await, "command 'false' exited with 3: boom");
    let (_, h) = send(
        s.addr,
        "POST /run/default/nope/app?cmd=ls HTTP/1.1\r\nHost: n\r\nContent-Length: 0\r\n\r\n",
    )
    .await;
    assert_eq!(h.status, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn shutdown_closes_open_streams() {
    let (base, _) = fake_streaming_server(SWITCH).await;
    let s = setup(&base, Duration::from_secs(3600)).await;
    let (mut c, h) = send(
        s.addr,
        &format!("POST /exec/default/web/app?output=1 HTTP/1.1\r\nHost: n\r\n{UPGRADE}\r\n"),
    )
    .await;
    assert_eq!(h.status, StatusCode::SWITCHING_PROTOCOLS);
    tokio::time::timeout(Duration::from_secs(5), async {
        while s.streaming.open() == 0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .unwrap();
    s.streaming.shutdown(Duration::from_secs(5)).await;
    assert_eq!(s.streaming.open(), 0);
    // The client sees the connection end.
    let mut buf = [0u8; 64];
    let ended = tokio::time::timeout(Duration::from_secs(5), async {
        while c.read(&mut buf).await.unwrap_or(0) > 0 {}
    })
    .await;
    assert!(ended.is_ok());
}

#[tokio::test]
async fn v5_websocket_exec_is_answered_here_and_spoken_as_spdy_to_the_runtime() {
    let (base, heads) = fake_streaming_server(SWITCH).await;
    let s = setup(&base, Duration::from_secs(60)).await;
    let ws = "Connection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Protocol: v5.channel.k8s.io, v4.channel.k8s.io\r\n";
    let (_c, h) = send(
        s.addr,
        &format!(
            "GET /exec/default/web/app?command=cat&input=1&output=1 HTTP/1.1\r\nHost: n\r\n{ws}\r\n"
        ),
    )
    .await;
    assert_eq!(h.status, StatusCode::SWITCHING_PROTOCOLS);
    assert_eq!(h.headers["sec-websocket-protocol"], "v5.channel.k8s.io");
    assert_eq!(
        h.headers["sec-websocket-accept"],
        "s3pPLMBiTxaQ9kYGzzhZRbK+xOo="
    );
    let head = heads.lock().unwrap()[0].clone();
    assert!(head.starts_with("POST /exec/1 HTTP/1.1\r\n"), "{head}");
    assert!(head.contains("Upgrade: SPDY/3.1\r\n"), "{head}");
    assert!(
        head.contains("X-Stream-Protocol-Version: v4.channel.k8s.io\r\n"),
        "{head}"
    );
    assert!(!head.to_ascii_lowercase().contains("websocket"), "{head}");
}

/// Issue 24: a `{uid}` segment that is not the named pod's UID is a 404 for exec, attach and
/// run (as for port-forward), never a session in the pod that UID belongs to.
#[tokio::test]
async fn a_uid_of_another_pod_is_a_404_not_that_pods_container() {
    let (base, heads) = fake_streaming_server(SWITCH).await;
    let s = setup(&base, Duration::from_secs(60)).await;
    // Another pod (`raw-t-1`) runs a container `app` too.
    let logs = tempfile::tempdir().unwrap();
    let other = raw::sandbox(1, "t", logs.path(), "/kubepods");
    let other_sb = s.rt.run_sandbox(&other).await.unwrap();
    let other_c =
        s.rt.create_container(&other_sb, &raw::container(&other), &other)
            .await
            .unwrap();
    s.rt.start_container(&other_c).await.unwrap();
    s.rt.push_exec_result(ExecResult {
        exit_code: 0,
        stdout: b"secret of raw-t-1\n".to_vec(),
        stderr: vec![],
    });
    for req in [
        format!(
            "POST /exec/default/web/raw-t-1/app?command=id&output=1 HTTP/1.1\r\nHost: n\r\n{UPGRADE}\r\n"
        ),
        format!(
            "POST /attach/default/web/raw-t-1/app?output=1 HTTP/1.1\r\nHost: n\r\n{UPGRADE}\r\n"
        ),
        "POST /run/default/web/raw-t-1/app?cmd=id HTTP/1.1\r\nHost: n\r\nContent-Length: 0\r\n\r\n"
            .to_string(),
    ] {
        let (c, h) = send(s.addr, &req).await;
        assert_eq!(h.status, StatusCode::NOT_FOUND, "{req}");
        assert_eq!(body_of(c, h).await, "pod not found", "{req}");
    }
    assert!(s.rt.stream_requests().is_empty(), "no session was prepared");
    assert!(
        heads.lock().unwrap().is_empty(),
        "nothing reached the runtime"
    );
    // The pod's own UID still works.
    let (_, h) = send(
        s.addr,
        &format!("POST /exec/default/web/raw-t-0/app?command=id&output=1 HTTP/1.1\r\nHost: n\r\n{UPGRADE}\r\n"),
    )
    .await;
    assert_eq!(h.status, StatusCode::SWITCHING_PROTOCOLS);
    assert_eq!(
        s.rt.stream_requests(),
        vec![StreamRequest::Exec {
            id: s.container.clone(),
            cmd: vec!["id".into()],
            flags: StreamFlags {
                stdin: false,
                stdout: true,
                stderr: false,
                tty: false
            },
        }]
    );
}

/// A loopback listener that counts the connections it accepts (and answers none).
async fn counting_listener() -> (String, Arc<std::sync::atomic::AtomicUsize>) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let n = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let n2 = n.clone();
    tokio::spawn(async move {
        while let Ok((c, _)) = l.accept().await {
            n2.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            drop(c);
        }
    });
    (format!("http://{addr}"), n)
}

/// CVE-2020-8559: a redirect from the runtime's streaming server is neither followed nor
/// passed back to the client (whose credentials a client following it would carry to the
/// redirect's target); the client gets upstream's 500 "invalid upgrade response".
#[tokio::test]
async fn a_redirect_from_the_runtime_is_not_followed_nor_relayed() {
    let (elsewhere, contacted) = counting_listener().await;
    let answer: &'static str = Box::leak(
        format!(
            "HTTP/1.1 302 Found\r\nLocation: {elsewhere}/exec/stolen\r\nContent-Length: 0\r\n\r\n"
        )
        .into_boxed_str(),
    );
    let (base, heads) = fake_streaming_server(answer).await;
    let s = setup(&base, Duration::from_secs(60)).await;
    let ws5 = "Connection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Protocol: v5.channel.k8s.io\r\n";
    let ws4 = "Connection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Protocol: v4.channel.k8s.io\r\n";
    for req in [
        format!(
            "POST /exec/default/web/app?command=id&output=1 HTTP/1.1\r\nHost: n\r\n{UPGRADE}\r\n"
        ),
        format!("GET /attach/default/web/app?output=1 HTTP/1.1\r\nHost: n\r\n{ws4}\r\n"),
        format!("GET /exec/default/web/app?command=id&output=1 HTTP/1.1\r\nHost: n\r\n{ws5}\r\n"),
        format!("POST /portForward/default/web HTTP/1.1\r\nHost: n\r\n{UPGRADE}\r\n"),
    ] {
        let (c, h) = send(s.addr, &req).await;
        assert_eq!(h.status, StatusCode::INTERNAL_SERVER_ERROR, "{req}");
        assert!(
            h.headers.get(header::LOCATION).is_none(),
            "{req}: {:?}",
            h.headers
        );
        assert_eq!(
            body_of(c, h).await,
            "invalid upgrade response: status code 302\n",
            "{req}"
        );
    }
    assert_eq!(
        heads.lock().unwrap().len(),
        4,
        "each asked the runtime once"
    );
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        contacted.load(std::sync::atomic::Ordering::SeqCst),
        0,
        "the redirect's target was never contacted"
    );
}

/// The kubelet's TLS side of an in-memory connection whose client end completes the handshake
/// and then never reads: `(kubelet side, client end)`; the client end must be kept alive.
async fn tls_pair_with_a_client_that_stops_reading(
    buffer: usize,
) -> (
    tokio_rustls::server::TlsStream<tokio::io::DuplexStream>,
    tokio_rustls::client::TlsStream<tokio::io::DuplexStream>,
) {
    let dir = tempfile::tempdir().unwrap();
    let policy = crate::server::tls_policy(None, &[]).unwrap();
    let cfg = crate::server::serving_tls(&policy, None, None, dir.path(), "localhost", &[], false)
        .unwrap();
    let pem = std::fs::read(dir.path().join("kubelet.crt")).unwrap();
    let mut roots = rustls::RootCertStore::empty();
    for c in rustls_pemfile::certs(&mut &pem[..]) {
        roots.add(c.unwrap()).unwrap();
    }
    let ccfg = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    let (c_io, s_io) = tokio::io::duplex(buffer);
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(cfg));
    let connector = tokio_rustls::TlsConnector::from(Arc::new(ccfg));
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    let (c, s) = tokio::join!(connector.connect(name, c_io), acceptor.accept(s_io));
    (s.unwrap(), c.unwrap())
}

/// Issue 24: after the idle timeout a client that stopped reading cannot hold the session (and
/// with it the runtime connection and the exec'd process): the TLS shutdown (close_notify)
/// towards it is bounded like Go's, and the runtime side is closed.
#[tokio::test(start_paused = true)]
async fn a_client_that_stops_reading_does_not_hold_a_spliced_session() {
    let (kubelet_side, client) = tls_pair_with_a_client_that_stops_reading(4096).await;
    let (mut runtime, runtime_side) = tokio::io::duplex(1 << 20);
    let cancel = CancellationToken::new();
    let task = tokio::spawn(async move {
        relay_upgraded(
            kubelet_side,
            runtime_side,
            b"HELLO".to_vec(),
            Duration::from_secs(30),
            &cancel,
        )
        .await
    });
    // The runtime writes far more than the client's buffers hold.
    runtime.write_all(&vec![b'x'; 256 * 1024]).await.unwrap();
    let end = tokio::time::timeout(Duration::from_secs(3600), task).await;
    let end = end.expect("the session ends within the idle timeout plus the close bound");
    assert_eq!(end.unwrap(), SpliceEnd::Idle);
    // The runtime's side is closed: the exec'd process gets its EOF.
    let mut buf = vec![0u8; 4096];
    let eof = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            match runtime.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    })
    .await;
    assert!(eof.is_ok(), "the runtime connection is closed");
    drop(client);
}
