//! `/logs/`: the node's log directory (`/var/log`) as upstream serves it (Go's file server:
//! a directory is an HTML listing, a file its bytes). A path with a `..` element is refused with
//! 400 `invalid URL path`; a symlink that leads outside the directory (an absolute one
//! included) is 404, as if absent, and so is anything but a file or a directory (a FIFO or
//! device node is never opened). Containers can write here (a hostPath on /var/log), so the
//! path is resolved and opened in one race-free step beneath the directory's descriptor
//! ([`crate::fs_at::open_beneath`]), never checked and then opened by name.
//! The directory is a constructor argument ([`super::logs::Logs::node_log_dir`]); upstream has
//! no setting for it. Reads run on the blocking pool and stream in bounded chunks. With
//! NodeLogQuery on, `?query=…` is answered by [`super::log_query`] first.

use super::AppState;
use crate::fs_at::{self, Opened};
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use std::io::Read;
use std::path::{Path, PathBuf};
use tokio::sync::mpsc;

/// What a `/logs/` path resolves to.
#[derive(Debug)]
pub enum Resolved {
    /// A path with a `..` element (400).
    Invalid,
    /// Missing, unreadable or outside the directory (404).
    NotFound,
    /// A directory asked for without its trailing slash: redirect here (301).
    Redirect(String),
    /// A directory listing (HTML).
    Listing(String),
    File(std::fs::File),
}

/// Percent-decodes a URL path; `None` when it is not valid UTF-8 after decoding.
fn percent_decode(s: &str) -> Option<String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' && i + 2 < b.len() {
            let hex = std::str::from_utf8(&b[i + 1..i + 3]).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

fn escape_html(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&#34;")
        .replace('\'', "&#39;")
}

/// `name` as a URL path: every byte but ASCII letters, digits, `-._~` and `/` percent-encoded,
/// so a name cannot carry a scheme (`javascript:`), a query, a fragment or markup.
fn percent_encode_path(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    for b in name.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~' | b'/') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Resolves `url_path` (the request's path below `/logs`, e.g. `/syslog`) beneath `root`.
/// Blocking: run it on the blocking pool.
pub fn resolve(root: &Path, url_path: &str) -> Resolved {
    let Some(decoded) = percent_decode(url_path) else {
        return Resolved::NotFound;
    };
    if decoded.split(['/', '\\']).any(|e| e == "..") {
        return Resolved::Invalid;
    }
    let rel: PathBuf = decoded
        .split('/')
        .filter(|e| !e.is_empty() && *e != ".")
        .collect();
    // One race-free open beneath the directory: a pod with a hostPath on it can plant and
    // swap symlinks, FIFOs and device nodes there at any moment.
    // The directory itself is the node's, trusted: its own path lets an absolute symlink
    // into it be followed (from its descriptor).
    let base = root.canonicalize().ok();
    let opened = fs_at::open_trusted_dir(root)
        .map_err(|_| ())
        .and_then(|dir| fs_at::open_beneath(&dir, &rel, base.as_deref()).map_err(|_| ()));
    match opened {
        Err(()) | Ok(Opened::Other) => Resolved::NotFound,
        Ok(Opened::File(f)) => Resolved::File(f),
        Ok(Opened::Dir(dir)) => {
            if !decoded.ends_with('/') {
                let last = rel
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_default();
                return Resolved::Redirect(format!("{last}/"));
            }
            let Ok(entries) = fs_at::entries(&dir) else {
                return Resolved::NotFound;
            };
            Resolved::Listing(listing(entries))
        }
    }
}

/// Go's file server's HTML listing of a directory's entries (a directory's name ends in `/`;
/// a symlink is listed as itself, not followed). A link is `./` and the percent-encoded name,
/// HTML-escaped: always relative to this directory, whatever a file's name (a crafted name
/// such as `javascript:alert(1)` or `"><script>` stays a file name). The text is the name,
/// HTML-escaped.
fn listing(entries: Vec<(std::ffi::OsString, fs_at::Kind)>) -> String {
    let mut names: Vec<String> = entries
        .into_iter()
        .map(|(name, kind)| {
            let mut n = name.to_string_lossy().into_owned();
            if kind == fs_at::Kind::Dir {
                n.push('/');
            }
            n
        })
        .collect();
    names.sort();
    let mut html = String::from(
        "<!doctype html>\n<meta name=\"viewport\" content=\"width=device-width\">\n<pre>\n",
    );
    for n in names {
        let href = escape_html(&format!("./{}", percent_encode_path(&n)));
        let text = escape_html(&n);
        html.push_str(&format!("<a href=\"{href}\">{text}</a>\n"));
    }
    html.push_str("</pre>\n");
    html
}

/// GET `/logs/` and `/logs/{*path}`.
pub async fn node_logs(
    State(s): State<AppState>,
    headers: axum::http::HeaderMap,
    uri: Uri,
) -> Response {
    let Some(root) = s.logs.node_log_dir.clone() else {
        // enableSystemLogHandler: false, upstream does not register the handler.
        return (StatusCode::NOT_FOUND, "404 page not found\n").into_response();
    };
    let mut path = uri.path().strip_prefix("/logs").unwrap_or("/").to_string();
    if let Some(journal) = s.debug.log_query.clone() {
        use super::log_query::{http_error, parse, serve_services, validate, wants_gzip};
        let params = axum::extract::Query::<Vec<(String, String)>>::try_from_uri(&uri)
            .map(|q| q.0)
            .unwrap_or_default();
        match parse(&params) {
            Err(e) => return http_error(StatusCode::BAD_REQUEST, &e),
            Ok(None) => {}
            Ok(Some(q)) => {
                if path != "/" {
                    return http_error(
                        StatusCode::NOT_ACCEPTABLE,
                        "path not allowed in query mode",
                    );
                }
                let (q2, r2) = (q.clone(), root.clone());
                match tokio::task::spawn_blocking(move || validate(&q2, &r2)).await {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => return http_error(StatusCode::NOT_ACCEPTABLE, &e),
                    Err(e) => return http_error(StatusCode::INTERNAL_SERVER_ERROR, &e.to_string()),
                }
                if !q.services.is_empty() {
                    return serve_services(q, root, journal, wants_gzip(&headers));
                }
                if let [file] = q.files.as_slice() {
                    path = format!("/{}", file.trim_start_matches('/'));
                }
            }
        }
    }
    let resolved = tokio::task::spawn_blocking(move || resolve(&root, &path)).await;
    match resolved {
        Ok(Resolved::Invalid) => (StatusCode::BAD_REQUEST, "invalid URL path\n").into_response(),
        Ok(Resolved::NotFound) => (StatusCode::NOT_FOUND, "404 page not found\n").into_response(),
        Ok(Resolved::Redirect(to)) => {
            (StatusCode::MOVED_PERMANENTLY, [(header::LOCATION, to)]).into_response()
        }
        Ok(Resolved::Listing(html)) => {
            ([(header::CONTENT_TYPE, "text/html; charset=utf-8")], html).into_response()
        }
        Ok(Resolved::File(f)) => (
            [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
            stream_file(f),
        )
            .into_response(),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
    }
}

/// The file's bytes, read on the blocking pool a chunk at a time; reading stops when the
/// client goes away.
fn stream_file(mut f: std::fs::File) -> Body {
    let (tx, rx) = mpsc::channel::<Bytes>(4);
    tokio::task::spawn_blocking(move || {
        loop {
            let mut buf = vec![0u8; 32 * 1024];
            match f.read(&mut buf) {
                Ok(0) | Err(_) => return,
                Ok(n) => {
                    buf.truncate(n);
                    if tx.blocking_send(Bytes::from(buf)).is_err() {
                        return;
                    }
                }
            }
        }
    });
    let stream = futures::stream::unfold(rx, |mut rx| async move {
        rx.recv()
            .await
            .map(|b| (Ok::<_, std::convert::Infallible>(b), rx))
    });
    Body::from_stream(stream)
}

#[cfg(test)]
mod tests;
