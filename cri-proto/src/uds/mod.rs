//! Unix-socket gRPC servers that accept the `:authority` non-Go clients send.
//!
//! gRPC clients other than grpc-go name a unix-socket channel's authority after the socket:
//! grpc-python and the other C-core clients send the percent-encoded path
//! (`%2Fvar%2Flib%2Fkubelet%2Fdevice-plugins%2Fkubelet.sock`), grpc-java and grpc-dotnet the
//! path itself. h2 parses `:authority` as an HTTP authority before any tonic or tower layer
//! sees the request, finds neither valid and resets the stream with `PROTOCOL_ERROR`; it has no
//! setting to relax that. Go's gRPC server ignores the authority, so plugins and monitoring
//! agents written in Python, Java or C# work against the upstream kubelet.
//!
//! [`LenientAuthority`] wraps each accepted connection and, on the bytes the client sends,
//! replaces such an `:authority` value with `localhost` cut or padded to the same length
//! (`hpack` keeps the client's and the server's header tables in step that way). Everything
//! else passes unchanged; what the wrapper cannot follow (a malformed block, frames out of
//! order) it passes through as it came and leaves to h2 to refuse. [`incoming`] is what every
//! unix-socket server of the agent hands to `serve_with_incoming*`.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{UnixListener, UnixStream};
use tokio_stream::{Stream, StreamExt};
use tonic::transport::server::Connected;

mod hpack;
mod huffman;

/// The connections of `listener`, each wrapped in [`LenientAuthority`].
pub fn incoming(
    listener: UnixListener,
) -> impl Stream<Item = io::Result<LenientAuthority<UnixStream>>> + Send + 'static {
    tokio_stream::wrappers::UnixListenerStream::new(listener).map(|r| r.map(LenientAuthority::new))
}

/// A server-side connection whose client `:authority` values h2 would refuse are replaced.
#[derive(Debug)]
pub struct LenientAuthority<S> {
    inner: S,
    rewriter: Rewriter,
    eof: bool,
}

impl<S> LenientAuthority<S> {
    /// Wraps a freshly accepted connection (nothing read from it yet).
    pub fn new(inner: S) -> Self {
        LenientAuthority {
            inner,
            rewriter: Rewriter::default(),
            eof: false,
        }
    }
}

impl<S: Connected> Connected for LenientAuthority<S> {
    type ConnectInfo = S::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.inner.connect_info()
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for LenientAuthority<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        loop {
            if this.rewriter.take_output(buf) || this.eof {
                return Poll::Ready(Ok(()));
            }
            if this.rewriter.passing_through() {
                return Pin::new(&mut this.inner).poll_read(cx, buf);
            }
            let mut tmp = [0u8; 8192];
            let mut read = ReadBuf::new(&mut tmp);
            ready!(Pin::new(&mut this.inner).poll_read(cx, &mut read))?;
            if read.filled().is_empty() {
                this.eof = true;
                this.rewriter.finish();
            } else {
                this.rewriter.feed(read.filled());
            }
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for LenientAuthority<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const FRAME_HEADER: usize = 9;
/// Payload limit of the frames the rewriter emits: the smallest SETTINGS_MAX_FRAME_SIZE a
/// server may advertise, so any server takes them.
const MAX_FRAME: usize = 16_384;
/// A header block longer than this is passed on as it came (h2 caps header lists far lower).
const MAX_BLOCK: usize = 1 << 20;

const HEADERS: u8 = 0x1;
const PUSH_PROMISE: u8 = 0x5;
const CONTINUATION: u8 = 0x9;
const END_STREAM: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const PADDED: u8 = 0x8;
const PRIORITY: u8 = 0x20;

/// The client-to-server byte stream's rewriter: bytes in (`feed`), bytes out (`take_output`).
#[derive(Debug)]
struct Rewriter {
    input: Vec<u8>,
    output: Vec<u8>,
    out_pos: usize,
    /// Bytes of the connection preface still to pass.
    preface: usize,
    /// Set once the stream is not one the rewriter can follow: the rest passes unchanged.
    passthrough: bool,
    pending: Option<Pending>,
    table: hpack::Table,
}

/// A header block begun by HEADERS and not yet ended by END_HEADERS.
#[derive(Debug)]
struct Pending {
    /// The frames as received, sent on unchanged when the block needs no change.
    original: Vec<u8>,
    block: Vec<u8>,
    flags: u8,
    stream_id: [u8; 4],
    priority: Option<[u8; 5]>,
}

impl Default for Rewriter {
    fn default() -> Self {
        Rewriter {
            input: Vec::new(),
            output: Vec::new(),
            out_pos: 0,
            preface: PREFACE.len(),
            passthrough: false,
            pending: None,
            table: hpack::Table::default(),
        }
    }
}

impl Rewriter {
    /// True once every byte goes through unchanged and none is held back.
    fn passing_through(&self) -> bool {
        self.passthrough && self.out_pos == self.output.len() && self.input.is_empty()
    }

    /// Moves processed bytes into `buf`; false when there are none.
    fn take_output(&mut self, buf: &mut ReadBuf<'_>) -> bool {
        let ready = &self.output[self.out_pos..];
        if ready.is_empty() {
            return false;
        }
        let n = ready.len().min(buf.remaining());
        buf.put_slice(&ready[..n]);
        self.out_pos += n;
        if self.out_pos == self.output.len() {
            self.output.clear();
            self.out_pos = 0;
        }
        true
    }

    /// At end of input: whatever is held back goes out as it came.
    fn finish(&mut self) {
        if let Some(p) = self.pending.take() {
            self.output.extend_from_slice(&p.original);
        }
        self.output.append(&mut self.input);
        self.passthrough = true;
    }

    fn feed(&mut self, data: &[u8]) {
        self.input.extend_from_slice(data);
        if self.preface > 0 {
            let n = self.preface.min(self.input.len());
            let want = &PREFACE[PREFACE.len() - self.preface..][..n];
            if self.input[..n] != *want {
                // Not HTTP/2 with prior knowledge: nothing to rewrite.
                self.passthrough = true;
            }
            self.output.extend(self.input.drain(..n));
            self.preface -= n;
        }
        while !self.passthrough && self.input.len() >= FRAME_HEADER {
            let len = u32::from_be_bytes([0, self.input[0], self.input[1], self.input[2]]) as usize;
            if self.input.len() < FRAME_HEADER + len {
                break;
            }
            let frame: Vec<u8> = self.input.drain(..FRAME_HEADER + len).collect();
            self.on_frame(frame);
        }
        if self.passthrough {
            self.output.append(&mut self.input);
        }
    }

    fn on_frame(&mut self, frame: Vec<u8>) {
        let (kind, flags) = (frame[3], frame[4]);
        match kind {
            HEADERS if self.pending.is_none() => match headers(&frame) {
                Some(pending) => {
                    self.pending = Some(pending);
                    if flags & END_HEADERS != 0 {
                        self.complete();
                    }
                }
                None => self.give_up(&frame),
            },
            CONTINUATION if self.pending.is_some() => {
                let p = self.pending.as_mut().expect("checked");
                p.original.extend_from_slice(&frame);
                p.block.extend_from_slice(&frame[FRAME_HEADER..]);
                if p.original.len() > MAX_BLOCK {
                    self.give_up(&[]);
                } else if flags & END_HEADERS != 0 {
                    self.complete();
                }
            }
            HEADERS | CONTINUATION | PUSH_PROMISE => self.give_up(&frame),
            _ if self.pending.is_some() => self.give_up(&frame),
            _ => self.output.extend_from_slice(&frame),
        }
    }

    /// Sends what is held back and `frame` unchanged, and stops rewriting.
    fn give_up(&mut self, frame: &[u8]) {
        if let Some(p) = self.pending.take() {
            self.output.extend_from_slice(&p.original);
        }
        self.output.extend_from_slice(frame);
        self.passthrough = true;
    }

    fn complete(&mut self) {
        let p = self.pending.take().expect("a block is pending");
        match self.table.rewrite(&p.block) {
            Ok(None) => self.output.extend_from_slice(&p.original),
            Ok(Some(block)) => {
                tracing::debug!(
                    "replaced a client :authority that is not an HTTP authority (a unix socket path)"
                );
                self.emit(&p, &block);
            }
            Err(hpack::Malformed) => {
                self.output.extend_from_slice(&p.original);
                self.passthrough = true;
            }
        }
    }

    /// Writes `block` as HEADERS (with the original's END_STREAM and priority) and as many
    /// CONTINUATION frames as it needs.
    fn emit(&mut self, p: &Pending, block: &[u8]) {
        let prio: &[u8] = p.priority.as_ref().map_or(&[], |b| b.as_slice());
        let first = block.len().min(MAX_FRAME - prio.len());
        let mut rest = block[first..].chunks(MAX_FRAME).peekable();
        let mut flags = p.flags & (END_STREAM | PRIORITY);
        if rest.peek().is_none() {
            flags |= END_HEADERS;
        }
        self.frame(HEADERS, flags, p.stream_id, &[prio, &block[..first]]);
        while let Some(chunk) = rest.next() {
            let flags = if rest.peek().is_none() {
                END_HEADERS
            } else {
                0
            };
            self.frame(CONTINUATION, flags, p.stream_id, &[chunk]);
        }
    }

    fn frame(&mut self, kind: u8, flags: u8, stream_id: [u8; 4], parts: &[&[u8]]) {
        let len: usize = parts.iter().map(|p| p.len()).sum();
        self.output
            .extend_from_slice(&(len as u32).to_be_bytes()[1..]);
        self.output.extend_from_slice(&[kind, flags]);
        self.output.extend_from_slice(&stream_id);
        for p in parts {
            self.output.extend_from_slice(p);
        }
    }
}

/// The header block fragment of a HEADERS frame, without padding and priority; `None` when
/// the frame's lengths do not add up.
fn headers(frame: &[u8]) -> Option<Pending> {
    let flags = frame[4];
    let payload = &frame[FRAME_HEADER..];
    let mut start = 0;
    let mut end = payload.len();
    if flags & PADDED != 0 {
        let pad = usize::from(*payload.first()?);
        start = 1;
        end = end.checked_sub(pad).filter(|&e| e >= start)?;
    }
    let priority = if flags & PRIORITY != 0 {
        let p: [u8; 5] = payload.get(start..start + 5)?.try_into().ok()?;
        start += 5;
        Some(p)
    } else {
        None
    };
    Some(Pending {
        original: frame.to_vec(),
        block: payload.get(start..end)?.to_vec(),
        flags,
        stream_id: frame[5..9].try_into().ok()?,
        priority,
    })
}

#[cfg(test)]
mod tests;
