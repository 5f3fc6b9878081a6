//! The wire side of the streaming proxy (`/exec`, `/attach`, `/portForward`): the runtime's
//! streaming URL, the upgrade request head sent to it, its response head, relaying a refusal,
//! and splicing the two upgraded connections. The handlers in `streaming.rs` decide what to proxy.

use super::logs::Refusal;
use axum::body::Body;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;

/// Dialing the runtime's streaming server, and reading its response head.
pub const BACKEND_TIMEOUT: Duration = Duration::from_secs(10);
/// The largest response head accepted from the runtime.
const MAX_HEAD: usize = 16 * 1024;
/// The largest non-101 response body relayed from the runtime.
const MAX_ERROR_BODY: usize = 64 * 1024;
/// One read while splicing.
const SPLICE_BUF: usize = 32 * 1024;
/// How long ending a session may take: the last writes and each shutdown (Go's TLS close
/// gives its close_notify the same 5 s).
pub(super) const CLOSE_TIMEOUT: Duration = Duration::from_secs(5);

fn refuse(status: StatusCode, body: impl Into<String>) -> Refusal {
    Refusal::new(status, body)
}

/// Where a runtime streaming URL points.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Backend {
    /// `host:port`, to dial and for the `Host` header.
    pub authority: String,
    /// Path and query, as the request target.
    pub target: String,
}

/// Splits an `http://host:port/path?query` streaming URL (https is refused: containerd and
/// CRI-O serve plain HTTP on loopback by default).
pub fn backend(url: &str) -> Result<Backend, Refusal> {
    let bad = |m: String| refuse(StatusCode::INTERNAL_SERVER_ERROR, m);
    let uri: http::Uri = url
        .parse()
        .map_err(|e| bad(format!("runtime streaming URL {url:?}: {e}")))?;
    if uri.scheme_str() != Some("http") {
        return Err(bad(format!(
            "runtime streaming URL {url:?}: only http:// streaming servers are supported"
        )));
    }
    let auth = uri
        .authority()
        .ok_or_else(|| bad(format!("runtime streaming URL {url:?} has no host")))?;
    let authority = match auth.port_u16() {
        Some(_) => auth.to_string(),
        None => format!("{}:80", auth.host()),
    };
    let target = uri
        .path_and_query()
        .map_or_else(|| "/".to_string(), |p| p.to_string());
    Ok(Backend { authority, target })
}

/// Headers never passed to the runtime: its own Host goes instead, the body is not sent, and
/// the client's credentials are for the kubelet only.
const DROPPED: [header::HeaderName; 5] = [
    header::HOST,
    header::CONTENT_LENGTH,
    header::TRANSFER_ENCODING,
    header::AUTHORIZATION,
    header::PROXY_AUTHORIZATION,
];

/// The request head sent to the runtime: the client's method and headers, the URL's target.
pub fn request_head(method: &http::Method, headers: &HeaderMap, b: &Backend) -> Vec<u8> {
    let mut out = format!(
        "{method} {} HTTP/1.1\r\nHost: {}\r\n",
        b.target, b.authority
    )
    .into_bytes();
    for (name, value) in headers {
        if DROPPED.contains(name) {
            continue;
        }
        out.extend_from_slice(name.as_str().as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"\r\n");
    out
}

/// The runtime's response head, and the bytes already read past it.
#[derive(Debug)]
pub struct BackendHead {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub rest: Vec<u8>,
}

/// Why the runtime's streaming server gave no usable answer (a 500 to the client).
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    #[error("dialing the runtime's streaming server {authority}: {source}")]
    Dial {
        authority: String,
        source: std::io::Error,
    },
    #[error("writing to the runtime's streaming server: {0}")]
    Write(std::io::Error),
    #[error("reading the runtime's response: {0}")]
    Read(std::io::Error),
    #[error("the runtime closed the connection before answering")]
    Closed,
    #[error("the runtime's status: {0}")]
    Status(axum::http::status::InvalidStatusCode),
    #[error("the runtime's response head is too large")]
    TooLarge,
    #[error("the runtime's response: {0}")]
    Parse(httparse::Error),
}

/// Reads a response head from `conn` (at most [`MAX_HEAD`] bytes).
pub async fn read_head<R: AsyncRead + Unpin>(conn: &mut R) -> Result<BackendHead, BackendError> {
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 4096];
    loop {
        let n = conn.read(&mut chunk).await.map_err(BackendError::Read)?;
        if n == 0 {
            return Err(BackendError::Closed);
        }
        buf.extend_from_slice(&chunk[..n]);
        let mut hdrs = [httparse::EMPTY_HEADER; 64];
        let mut resp = httparse::Response::new(&mut hdrs);
        match resp.parse(&buf) {
            Ok(httparse::Status::Complete(len)) => {
                let status =
                    StatusCode::from_u16(resp.code.unwrap_or(0)).map_err(BackendError::Status)?;
                let mut headers = HeaderMap::new();
                for h in resp.headers.iter() {
                    if let (Ok(n), Ok(v)) = (
                        header::HeaderName::from_bytes(h.name.as_bytes()),
                        HeaderValue::from_bytes(h.value),
                    ) {
                        headers.append(n, v);
                    }
                }
                return Ok(BackendHead {
                    status,
                    headers,
                    rest: buf[len..].to_vec(),
                });
            }
            Ok(httparse::Status::Partial) if buf.len() < MAX_HEAD => {}
            Ok(httparse::Status::Partial) => {
                return Err(BackendError::TooLarge);
            }
            Err(e) => return Err(BackendError::Parse(e)),
        }
    }
}

/// Dials the runtime's streaming server, sends `head` and reads its answer, all within
/// [`BACKEND_TIMEOUT`]; a 500 response when that fails.
pub(super) async fn dial(
    url: &str,
    b: &Backend,
    head: &[u8],
) -> Result<(TcpStream, BackendHead), Response> {
    let fail = |m: String| {
        tracing::warn!(url, error = %m, "streaming proxy failed");
        refuse(StatusCode::INTERNAL_SERVER_ERROR, m).into_response()
    };
    let dialed = tokio::time::timeout(BACKEND_TIMEOUT, async {
        let mut conn =
            TcpStream::connect(&b.authority)
                .await
                .map_err(|source| BackendError::Dial {
                    authority: b.authority.clone(),
                    source,
                })?;
        conn.write_all(head).await.map_err(BackendError::Write)?;
        let head = read_head(&mut conn).await?;
        Ok::<_, BackendError>((conn, head))
    })
    .await;
    match dialed {
        Ok(Ok(x)) => {
            tracing::debug!(url, status = %x.1.status, "runtime streaming server answered");
            Ok(x)
        }
        Ok(Err(e)) => Err(fail(e.to_string())),
        Err(_) => Err(fail(format!(
            "the runtime's streaming server {} did not answer within {BACKEND_TIMEOUT:?}",
            b.authority
        ))),
    }
}

/// The runtime's 101 headers, minus framing headers hyper writes itself.
pub(super) fn head_headers(h: &HeaderMap) -> HeaderMap {
    let mut out = h.clone();
    out.remove(header::CONTENT_LENGTH);
    out.remove(header::TRANSFER_ENCODING);
    out
}

/// Answers the client when the runtime did not switch protocols. An error (4xx, 5xx) is
/// relayed with its status, headers and body, as upstream's UpgradeAwareHandler echoes it.
/// Anything else — a redirect above all — is neither followed nor passed on: the client gets
/// upstream's 500 `invalid upgrade response: status code N` (CVE-2020-8559: a redirect handed
/// back would send the client, with its credentials, wherever the runtime points).
pub(super) async fn relay_error(mut conn: TcpStream, head: BackendHead) -> Response {
    if head.status.as_u16() < 400 {
        let msg = format!(
            "invalid upgrade response: status code {}",
            head.status.as_u16()
        );
        tracing::warn!(error = %msg, location = ?head.headers.get(header::LOCATION), "streaming proxy failed");
        drop(conn);
        return refuse(StatusCode::INTERNAL_SERVER_ERROR, format!("{msg}\n")).into_response();
    }
    let want = head
        .headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<usize>().ok())
        .unwrap_or(MAX_ERROR_BODY)
        .min(MAX_ERROR_BODY);
    let mut body = head.rest;
    let _ = tokio::time::timeout(BACKEND_TIMEOUT, async {
        let mut chunk = [0u8; 4096];
        while body.len() < want {
            match conn.read(&mut chunk).await {
                Ok(0) | Err(_) => break,
                Ok(n) => body.extend_from_slice(&chunk[..n]),
            }
        }
    })
    .await;
    body.truncate(want);
    let mut resp = Response::new(Body::from(body));
    *resp.status_mut() = head.status;
    for (n, v) in head_headers(&head.headers).iter() {
        if n != header::CONNECTION {
            resp.headers_mut().append(n, v.clone());
        }
    }
    resp
}

/// Runs one upgraded session: the bytes the runtime sent after its 101 go to the client
/// first, then [`splice`] until it ends, then both connections are shut down, each within
/// [`CLOSE_TIMEOUT`] (a TLS shutdown writes close_notify, which a client that stopped reading
/// would otherwise hold forever, and with it the runtime's connection and the process).
pub(super) async fn relay_upgraded<C, R>(
    mut client: C,
    mut conn: R,
    rest: Vec<u8>,
    idle: Duration,
    cancel: &CancellationToken,
) -> SpliceEnd
where
    C: AsyncRead + AsyncWrite + Unpin,
    R: AsyncRead + AsyncWrite + Unpin,
{
    let mut end = SpliceEnd::Closed;
    let sent = rest.is_empty()
        || matches!(
            tokio::time::timeout(idle, write_flush(&mut client, &rest)).await,
            Ok(Ok(()))
        );
    if sent {
        end = splice(&mut client, &mut conn, idle, cancel).await;
    }
    let _ = tokio::time::timeout(CLOSE_TIMEOUT, client.shutdown()).await;
    let _ = tokio::time::timeout(CLOSE_TIMEOUT, conn.shutdown()).await;
    end
}

/// Why a splice ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpliceEnd {
    /// One side closed (or failed).
    Closed,
    /// No byte either way for the idle timeout.
    Idle,
    /// The agent is shutting down.
    Cancelled,
}

/// Copies bytes both ways until either side ends, `idle` passes with no byte either way, or
/// `cancel` fires (upstream ends the proxy when either direction ends).
pub async fn splice<A, B>(
    a: &mut A,
    b: &mut B,
    idle: Duration,
    cancel: &CancellationToken,
) -> SpliceEnd
where
    A: AsyncRead + AsyncWrite + Unpin,
    B: AsyncRead + AsyncWrite + Unpin,
{
    let (mut ar, mut aw) = tokio::io::split(a);
    let (mut br, mut bw) = tokio::io::split(b);
    let mut abuf = vec![0u8; SPLICE_BUF];
    let mut bbuf = vec![0u8; SPLICE_BUF];
    let deadline = tokio::time::sleep(idle);
    tokio::pin!(deadline);
    loop {
        let moved = tokio::select! {
            r = ar.read(&mut abuf) => match r {
                Ok(0) | Err(_) => return SpliceEnd::Closed,
                Ok(n) => tokio::time::timeout(idle, write_flush(&mut bw, &abuf[..n])).await,
            },
            r = br.read(&mut bbuf) => match r {
                Ok(0) | Err(_) => return SpliceEnd::Closed,
                Ok(n) => tokio::time::timeout(idle, write_flush(&mut aw, &bbuf[..n])).await,
            },
            _ = &mut deadline => return SpliceEnd::Idle,
            _ = cancel.cancelled() => return SpliceEnd::Cancelled,
        };
        match moved {
            Ok(Ok(())) => {}
            Ok(Err(_)) => return SpliceEnd::Closed,
            Err(_) => return SpliceEnd::Idle,
        }
        deadline.as_mut().reset(tokio::time::Instant::now() + idle);
    }
}

async fn write_flush<W: AsyncWrite + Unpin>(w: &mut W, buf: &[u8]) -> std::io::Result<()> {
    w.write_all(buf).await?;
    w.flush().await
}
