//! httpGet runner against local hyper servers on 127.0.0.1.

use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use probes::http::{HttpGetRequest, HttpProber, Scheme};
use probes::{ProbeOutcome, ProbeResult};
use tokio::net::TcpListener;

type Seen = Arc<Mutex<Vec<(String, HeaderMap)>>>;

/// Routes of the test server; `port` is its own port (for absolute redirects).
async fn handle(
    req: Request<Incoming>,
    port: u16,
    seen: Seen,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let path = req
        .uri()
        .path_and_query()
        .map(|p| p.as_str().to_string())
        .unwrap_or_default();
    seen.lock()
        .unwrap()
        .push((path.clone(), req.headers().clone()));
    let resp = |status: u16, location: Option<String>, body: Vec<u8>| {
        let mut b = Response::builder().status(StatusCode::from_u16(status).unwrap());
        if let Some(l) = location {
            b = b.header(http::header::LOCATION, l);
        }
        Ok(b.body(Full::new(Bytes::from(body))).unwrap())
    };
    match path.as_str() {
        "/ok" | "/ok?x=1" => resp(200, None, b"all good".to_vec()),
        "/redirect" => resp(302, Some("/ok".into()), vec![]),
        "/redirect-abs" => resp(301, Some(format!("http://127.0.0.1:{port}/ok")), vec![]),
        "/offhost" => resp(
            302,
            Some(format!("http://localhost:{port}/ok")),
            b"moved".to_vec(),
        ),
        "/loop" => resp(302, Some("/loop".into()), vec![]),
        "/error" => resp(500, None, b"broken".to_vec()),
        "/big" => resp(200, None, vec![b'x'; 20 * 1024]),
        "/slow" => {
            tokio::time::sleep(Duration::from_secs(30)).await;
            resp(200, None, vec![])
        }
        _ => resp(404, None, vec![]),
    }
}

async fn serve_conn<S>(io: S, port: u16, seen: Seen)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let svc = service_fn(move |req| handle(req, port, seen.clone()));
    let _ = hyper::server::conn::http1::Builder::new()
        .serve_connection(TokioIo::new(io), svc)
        .await;
}

/// Starts a plain HTTP server; returns its port and the requests it saw.
async fn http_server() -> (u16, Seen) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let seen: Seen = Arc::default();
    let s = seen.clone();
    tokio::spawn(async move {
        loop {
            let (stream, _) = listener.accept().await.unwrap();
            tokio::spawn(serve_conn(stream, port, s.clone()));
        }
    });
    (port, seen)
}

/// Starts an HTTPS server with a fresh self-signed certificate.
async fn https_server() -> (u16, Seen) {
    let ck = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
    let cert = ck.cert.der().clone();
    let key = rustls::pki_types::PrivateKeyDer::try_from(ck.signing_key.serialize_der()).unwrap();
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(vec![cert], key)
    .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let seen: Seen = Arc::default();
    let s = seen.clone();
    tokio::spawn(async move {
        loop {
            let (stream, _) = listener.accept().await.unwrap();
            let acceptor = acceptor.clone();
            let s = s.clone();
            tokio::spawn(async move {
                if let Ok(tls) = acceptor.accept(stream).await {
                    serve_conn(tls, port, s).await;
                }
            });
        }
    });
    (port, seen)
}

fn get(port: u16, path: &str) -> HttpGetRequest {
    HttpGetRequest {
        scheme: Scheme::Http,
        host: "127.0.0.1".into(),
        port,
        path: path.into(),
        headers: vec![],
    }
}

const T: Duration = Duration::from_secs(5);

#[tokio::test]
async fn ok_is_success_with_body_and_default_headers() {
    let (port, seen) = http_server().await;
    let o = HttpProber::new().probe(&get(port, "/ok?x=1"), T).await;
    assert_eq!(o, ProbeOutcome::success("all good"));
    let seen = seen.lock().unwrap();
    let (path, h) = &seen[0];
    assert_eq!(path, "/ok?x=1");
    assert_eq!(h["user-agent"], "kube-probe/1.36");
    assert_eq!(h["accept"], "*/*");
    assert_eq!(h["host"], format!("127.0.0.1:{port}").as_str());
    assert_eq!(h["connection"], "close");
}

#[tokio::test]
async fn same_host_redirects_are_followed() {
    let (port, seen) = http_server().await;
    let prober = HttpProber::new();
    assert_eq!(
        prober.probe(&get(port, "/redirect"), T).await,
        ProbeOutcome::success("all good")
    );
    assert_eq!(
        prober.probe(&get(port, "/redirect-abs"), T).await,
        ProbeOutcome::success("all good")
    );
    let paths: Vec<String> = seen
        .lock()
        .unwrap()
        .iter()
        .map(|(p, _)| p.clone())
        .collect();
    assert_eq!(paths, ["/redirect", "/ok", "/redirect-abs", "/ok"]);
}

#[tokio::test]
async fn redirect_to_other_host_is_a_warning_and_not_followed() {
    let (port, seen) = http_server().await;
    let o = HttpProber::new().probe(&get(port, "/offhost"), T).await;
    assert_eq!(
        o,
        ProbeOutcome::warning("Probe terminated redirects, Response body: moved")
    );
    assert_eq!(seen.lock().unwrap().len(), 1);
}

#[tokio::test]
async fn redirect_loop_stops_after_ten_requests() {
    let (port, seen) = http_server().await;
    let o = HttpProber::new().probe(&get(port, "/loop"), T).await;
    assert_eq!(o.result, ProbeResult::Failure);
    assert_eq!(
        o.output,
        format!("Get \"http://127.0.0.1:{port}/loop\": stopped after 10 redirects")
    );
    assert_eq!(seen.lock().unwrap().len(), 10);
}

#[tokio::test]
async fn server_error_is_failure() {
    let (port, _) = http_server().await;
    let o = HttpProber::new().probe(&get(port, "/error"), T).await;
    assert_eq!(
        o,
        ProbeOutcome::failure("HTTP probe failed with statuscode: 500")
    );
    let o = HttpProber::new().probe(&get(port, "/missing"), T).await;
    assert_eq!(
        o,
        ProbeOutcome::failure("HTTP probe failed with statuscode: 404")
    );
}

#[tokio::test]
async fn body_is_capped_at_10k() {
    let (port, _) = http_server().await;
    let o = HttpProber::new().probe(&get(port, "/big"), T).await;
    assert_eq!(o.result, ProbeResult::Success);
    assert_eq!(o.output.len(), 10 * 1024);
}

#[tokio::test]
async fn slow_response_times_out_as_failure() {
    let (port, _) = http_server().await;
    let o = HttpProber::new()
        .probe(&get(port, "/slow"), Duration::from_millis(300))
        .await;
    assert_eq!(o.result, ProbeResult::Failure);
    assert_eq!(
        o.output,
        format!(
            "Get \"http://127.0.0.1:{port}/slow\": context deadline exceeded (Client.Timeout exceeded while awaiting headers)"
        )
    );
}

#[tokio::test]
async fn connection_refused_is_failure() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let o = HttpProber::new().probe(&get(port, "/ok"), T).await;
    assert_eq!(o.result, ProbeResult::Failure);
    assert!(o.output.contains("connection refused"), "{}", o.output);
}

#[tokio::test]
async fn custom_headers_reach_the_server_and_host_overrides() {
    let (port, seen) = http_server().await;
    let mut req = get(port, "/redirect");
    req.headers = vec![
        ("Host".into(), "probe.example".into()),
        ("X-Custom".into(), "one".into()),
        ("X-Custom".into(), "two".into()),
        ("User-Agent".into(), "my-agent".into()),
        ("Accept".into(), "".into()),
    ];
    let o = HttpProber::new().probe(&req, T).await;
    assert_eq!(o, ProbeOutcome::success("all good"));
    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), 2);
    // The relative redirect keeps the custom Host and the other headers.
    for (_, h) in seen.iter() {
        assert_eq!(h["host"], "probe.example");
        let custom: Vec<_> = h.get_all("x-custom").iter().collect();
        assert_eq!(custom, ["one", "two"]);
        assert_eq!(h["user-agent"], "my-agent");
        assert!(h.get("accept").is_none());
        assert_eq!(h.get_all("host").iter().count(), 1);
    }
}

#[tokio::test]
async fn https_skips_certificate_verification() {
    let (port, seen) = https_server().await;
    let mut req = get(port, "/redirect");
    req.scheme = Scheme::Https;
    let o = HttpProber::new().probe(&req, T).await;
    assert_eq!(o, ProbeOutcome::success("all good"));
    assert_eq!(seen.lock().unwrap().len(), 2);

    // Plain HTTP to a TLS port fails (the server hangs up on the garbage handshake).
    let o = HttpProber::new()
        .probe(&get(port, "/ok"), Duration::from_secs(2))
        .await;
    assert_eq!(o.result, ProbeResult::Failure);
}
