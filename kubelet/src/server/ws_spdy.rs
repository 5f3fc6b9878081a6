//! Websocket `v5.channel.k8s.io` clients of `/exec` and `/attach`, translated to SPDY/3.1
//! towards the runtime, as upstream's StreamTranslatorHandler does: runtimes' streaming
//! servers (containerd 1.6, CRI-O) speak websocket only up to `v4.channel.k8s.io`, which cannot
//! close stdin, while v5 can (a `[255, 0]` message). The kubelet ends the client's websocket
//! itself and opens one SPDY stream per channel on the runtime's URL (`streamType` error,
//! stdin, stdout, stderr, resize); messages and stream data are relayed channel by channel, a
//! v5 stdin close becomes a FIN on the stdin stream.
//!
//! The SPDY side is minimal: header blocks go out as zlib stored blocks (valid zlib, no
//! dictionary needed, so nothing is compressed), incoming header blocks are skipped unread,
//! PINGs are answered, and the session ends when the runtime closes the connection (after it
//! wrote the exit status on the error stream) or the client goes away.

use super::upgrade_proxy::CLOSE_TIMEOUT;
use crate::runtime::StreamFlags;
use base64::Engine;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::Mutex;
use tokio_util::sync::CancellationToken;

/// The websocket protocol this module serves.
pub const V5: &str = "v5.channel.k8s.io";
/// The largest websocket message accepted from a client.
const MAX_MESSAGE: usize = 1 << 20;

/// True when the client offers `v5.channel.k8s.io` in `Sec-WebSocket-Protocol`.
pub fn offers_v5(headers: &http::HeaderMap) -> bool {
    headers
        .get_all(http::header::SEC_WEBSOCKET_PROTOCOL)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|p| p.trim() == V5)
}

/// `Sec-WebSocket-Accept` for a client's `Sec-WebSocket-Key` (RFC 6455 4.2.2).
pub fn accept_key(key: &str) -> String {
    let mut input = key.trim().as_bytes().to_vec();
    input.extend_from_slice(b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11");
    let digest = ring::digest::digest(&ring::digest::SHA1_FOR_LEGACY_USE_ONLY, &input);
    base64::engine::general_purpose::STANDARD.encode(digest.as_ref())
}

/// The SPDY upgrade request sent to the runtime's URL.
pub fn spdy_request(target: &str, authority: &str) -> Vec<u8> {
    format!(
        "POST {target} HTTP/1.1\r\nHost: {authority}\r\nConnection: Upgrade\r\nUpgrade: SPDY/3.1\r\nX-Stream-Protocol-Version: v4.channel.k8s.io\r\nContent-Length: 0\r\n\r\n"
    )
    .into_bytes()
}

/// The channels of a session and the SPDY stream each one uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Channel {
    channel: u8,
    stream: u32,
    kind: &'static str,
}

fn channels(f: StreamFlags) -> Vec<Channel> {
    let mut out = vec![Channel {
        channel: 3,
        stream: 1,
        kind: "error",
    }];
    let mut next = 3;
    let mut add = |on: bool, channel: u8, kind: &'static str| {
        if on {
            out.push(Channel {
                channel,
                stream: next,
                kind,
            });
            next += 2;
        }
    };
    add(f.stdin, 0, "stdin");
    add(f.stdout, 1, "stdout");
    add(f.stderr, 2, "stderr");
    add(f.tty, 4, "resize");
    out
}

/// A SPDY/3 control frame.
fn control(kind: u16, flags: u8, payload: &[u8]) -> Vec<u8> {
    let len = payload.len() as u32;
    let mut f = vec![0x80, 0x03];
    f.extend_from_slice(&kind.to_be_bytes());
    f.push(flags);
    f.extend_from_slice(&len.to_be_bytes()[1..]);
    f.extend_from_slice(payload);
    f
}

/// A SPDY data frame (`fin` half-closes the stream).
pub fn data_frame(stream: u32, fin: bool, payload: &[u8]) -> Vec<u8> {
    let mut f = (stream & 0x7fff_ffff).to_be_bytes().to_vec();
    f.push(u8::from(fin));
    f.extend_from_slice(&(payload.len() as u32).to_be_bytes()[1..]);
    f.extend_from_slice(payload);
    f
}

/// SYN_STREAM for `stream` with one `streamtype` header. `first`: this is the session's first
/// header block (it carries the zlib stream header).
pub fn syn_stream(stream: u32, kind: &str, first: bool) -> Vec<u8> {
    let mut raw = 1u32.to_be_bytes().to_vec();
    for s in ["streamtype", kind] {
        raw.extend_from_slice(&(s.len() as u32).to_be_bytes());
        raw.extend_from_slice(s.as_bytes());
    }
    let mut block = if first { vec![0x78, 0x01] } else { vec![] };
    for chunk in raw.chunks(0xffff) {
        // A non-final stored deflate block.
        let n = chunk.len() as u16;
        block.push(0x00);
        block.extend_from_slice(&n.to_le_bytes());
        block.extend_from_slice(&(!n).to_le_bytes());
        block.extend_from_slice(chunk);
    }
    // The empty stored block of a sync flush: a reader hands the data out only once it sees it.
    block.extend_from_slice(&[0x00, 0x00, 0x00, 0xff, 0xff]);
    let mut payload = stream.to_be_bytes().to_vec();
    payload.extend_from_slice(&0u32.to_be_bytes());
    payload.extend_from_slice(&[0, 0]);
    payload.extend_from_slice(&block);
    control(1, 0, &payload)
}

/// An unmasked websocket frame to the client.
fn ws_frame(opcode: u8, payload: &[u8]) -> Vec<u8> {
    let mut f = vec![0x80 | opcode];
    let n = payload.len();
    if n < 126 {
        f.push(n as u8);
    } else if n <= 0xffff {
        f.push(126);
        f.extend_from_slice(&(n as u16).to_be_bytes());
    } else {
        f.push(127);
        f.extend_from_slice(&(n as u64).to_be_bytes());
    }
    f.extend_from_slice(payload);
    f
}

/// One message (or control frame) from the client: opcode and unmasked payload.
async fn read_ws<R: AsyncRead + Unpin>(r: &mut R) -> std::io::Result<(u8, Vec<u8>)> {
    let mut message: Vec<u8> = Vec::new();
    let mut message_op = None;
    loop {
        let mut h = [0u8; 2];
        r.read_exact(&mut h).await?;
        let fin = h[0] & 0x80 != 0;
        let op = h[0] & 0x0f;
        let masked = h[1] & 0x80 != 0;
        let len = match h[1] & 0x7f {
            126 => u64::from(r.read_u16().await?),
            127 => r.read_u64().await?,
            n => u64::from(n),
        };
        if len as usize > MAX_MESSAGE || message.len() + len as usize > MAX_MESSAGE {
            return Err(std::io::Error::other("websocket message too large"));
        }
        let mut mask = [0u8; 4];
        if masked {
            r.read_exact(&mut mask).await?;
        }
        let mut payload = vec![0u8; len as usize];
        r.read_exact(&mut payload).await?;
        if masked {
            for (i, b) in payload.iter_mut().enumerate() {
                *b ^= mask[i % 4];
            }
        }
        if op >= 8 {
            // Control frames may come between fragments; hand them up at once.
            return Ok((op, payload));
        }
        if op != 0 {
            message_op = Some(op);
        }
        message.extend_from_slice(&payload);
        if fin {
            return Ok((message_op.unwrap_or(2), message));
        }
    }
}

type Writer<W> = Arc<Mutex<W>>;

async fn send<W: AsyncWrite + Unpin>(w: &Writer<W>, bytes: &[u8]) -> std::io::Result<()> {
    let mut w = w.lock().await;
    w.write_all(bytes).await?;
    w.flush().await
}

/// Relays a v5 websocket `client` and a SPDY `runtime` connection (already upgraded; `rest`:
/// bytes the runtime sent after its 101) until either ends, `idle` passes without traffic, or
/// `cancel` fires. True when it ended by the idle timeout.
pub async fn translate<C, R>(
    client: C,
    runtime: R,
    rest: Vec<u8>,
    flags: StreamFlags,
    idle: Duration,
    cancel: &CancellationToken,
) -> bool
where
    C: AsyncRead + AsyncWrite + Unpin + Send,
    R: AsyncRead + AsyncWrite + Unpin + Send,
{
    let chans = channels(flags);
    let (mut cr, cw) = tokio::io::split(client);
    let (rr, rw) = tokio::io::split(runtime);
    let mut rr = tokio::io::AsyncReadExt::chain(std::io::Cursor::new(rest), rr);
    let cw = Arc::new(Mutex::new(cw));
    let rw = Arc::new(Mutex::new(rw));
    let activity = Arc::new(std::sync::Mutex::new(tokio::time::Instant::now()));
    let touch =
        || *activity.lock().unwrap_or_else(|e| e.into_inner()) = tokio::time::Instant::now();

    // Open every stream first, as SPDY clients of the v4 protocol do.
    let mut opening = Vec::new();
    for (i, c) in chans.iter().enumerate() {
        opening.extend(syn_stream(c.stream, c.kind, i == 0));
    }
    if send(&rw, &opening).await.is_err() {
        return false;
    }

    let to_runtime = async {
        loop {
            let (op, msg) = match read_ws(&mut cr).await {
                Ok(m) => m,
                Err(_) => return,
            };
            touch();
            let out = match op {
                8 => return,
                9 => {
                    let _ = send(&cw, &ws_frame(10, &msg)).await;
                    continue;
                }
                1 | 2 if !msg.is_empty() => match msg[0] {
                    255 => {
                        // v5 close: `[255, channel]`.
                        match msg
                            .get(1)
                            .and_then(|ch| chans.iter().find(|c| c.channel == *ch))
                        {
                            Some(c) => data_frame(c.stream, true, &[]),
                            None => continue,
                        }
                    }
                    ch => match chans
                        .iter()
                        .find(|c| c.channel == ch && (ch == 0 || ch == 4))
                    {
                        Some(c) => data_frame(c.stream, false, &msg[1..]),
                        None => continue,
                    },
                },
                _ => continue,
            };
            if send(&rw, &out).await.is_err() {
                return;
            }
        }
    };
    let to_client = async {
        loop {
            let mut h = [0u8; 8];
            if rr.read_exact(&mut h).await.is_err() {
                return;
            }
            let len = u32::from_be_bytes([0, h[5], h[6], h[7]]) as usize;
            let mut payload = vec![0u8; len];
            if rr.read_exact(&mut payload).await.is_err() {
                return;
            }
            touch();
            if h[0] & 0x80 != 0 {
                match u16::from_be_bytes([h[2], h[3]]) {
                    // PING: answer with the same ID.
                    6 => {
                        let _ = send(&rw, &control(6, 0, &payload)).await;
                    }
                    // GOAWAY: the runtime is done.
                    7 => return,
                    _ => {}
                }
                continue;
            }
            let stream = u32::from_be_bytes([h[0], h[1], h[2], h[3]]) & 0x7fff_ffff;
            let Some(c) = chans.iter().find(|c| c.stream == stream) else {
                continue;
            };
            if payload.is_empty() {
                continue;
            }
            let mut msg = Vec::with_capacity(payload.len() + 1);
            msg.push(c.channel);
            msg.extend_from_slice(&payload);
            if send(&cw, &ws_frame(2, &msg)).await.is_err() {
                return;
            }
        }
    };
    let idle_watch = async {
        loop {
            let last = *activity.lock().unwrap_or_else(|e| e.into_inner());
            let deadline = last + idle;
            if tokio::time::Instant::now() >= deadline {
                return;
            }
            tokio::time::sleep_until(deadline).await;
        }
    };
    let idled = tokio::select! {
        _ = to_runtime => false,
        _ = to_client => false,
        _ = idle_watch => true,
        _ = cancel.cancelled() => false,
    };
    // A normal websocket close (1000) towards the client, then both sides end; bounded, so a
    // client that stopped reading cannot hold the session (and the runtime's) forever.
    let _ = tokio::time::timeout(CLOSE_TIMEOUT, async {
        let _ = send(&cw, &ws_frame(8, &1000u16.to_be_bytes())).await;
        let _ = cw.lock().await.shutdown().await;
    })
    .await;
    let _ = tokio::time::timeout(CLOSE_TIMEOUT, async {
        let _ = rw.lock().await.shutdown().await;
    })
    .await;
    idled
}

#[cfg(test)]
mod tests;
