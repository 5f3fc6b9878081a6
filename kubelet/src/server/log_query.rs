//! NodeLogQuery: `/logs/?query=…` (with `enableSystemLogQuery: true` and the `NodeLogQuery`
//! gate, as upstream). The parameters (`query`, `sinceTime`, `untilTime`, `tailLines`,
//! `pattern`, `boot`) are parsed and validated as upstream's newNodeLogQuery and validate,
//! with its field-error messages: a bad value is 400, a query that fails validation (or names
//! a path besides) 406. A query for services reads the journal through `journalctl` (argv
//! only, no shell; service names limited to `[a-zA-Z0-9-_@]`, at most 4; the whole answer
//! bounded by 30 s; gzipped when `Accept-Encoding` is exactly `gzip`, as upstream); a
//! service the journal does not know (or a node without journald) is
//! looked for as `/var/log/<svc>`, `<svc>.log` or `<svc>/<svc>.log`, never outside the
//! directory: each is opened in one race-free step beneath the directory's descriptor
//! ([`crate::fs_at::open_beneath`]; containers can write there), and only a regular
//! file is read. A query naming one file (it has a `/`) serves that file as `/logs/<file>` does.

use super::journal::{Chunk, Journal};
use crate::fs_at;
use axum::body::{Body, Bytes};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use futures::StreamExt;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio::time::Instant;

/// Upstream's limits.
pub const MAX_TAIL_LINES: i64 = 100_000;
pub const MAX_SERVICE_LENGTH: usize = 256;
pub const MAX_SERVICES: usize = 4;
/// Upstream's deadline for the whole answer.
pub const DEADLINE: Duration = Duration::from_secs(30);

/// One parsed query (upstream's nodeLogQuery).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Query {
    pub services: Vec<String>,
    pub files: Vec<String>,
    pub since: Option<jiff::Timestamp>,
    pub until: Option<jiff::Timestamp>,
    pub tail_lines: Option<i64>,
    pub boot: Option<i64>,
    pub pattern: String,
}

impl Query {
    /// Whether any option besides `query` is set.
    pub fn has_options(&self) -> bool {
        self.since.is_some()
            || self.until.is_some()
            || self.tail_lines.is_some()
            || self.boot.is_some()
            || !self.pattern.is_empty()
    }
}

/// Go's `%q` of a string, near enough (Rust's debug quoting).
fn q(s: &str) -> String {
    format!("{s:?}")
}

/// Go's `%#v` of a `[]string`.
fn go_strings(v: &[String]) -> String {
    let items: Vec<String> = v.iter().map(|s| q(s)).collect();
    format!("[]string{{{}}}", items.join(", "))
}

/// Go's `%v` of a `[]string`.
fn go_list(v: &[String]) -> String {
    format!("[{}]", v.join(" "))
}

/// Go's `Time.String()` in UTC.
fn go_time(t: jiff::Timestamp) -> String {
    t.strftime("%Y-%m-%d %H:%M:%S +0000 UTC").to_string()
}

/// apimachinery's ErrorList.ToAggregate().Error().
pub fn aggregate(errs: &[String]) -> String {
    match errs {
        [one] => one.clone(),
        many => format!("[{}]", many.join(", ")),
    }
}

/// Go's `strconv.Atoi`, with its error text.
fn atoi(v: &str) -> Result<i64, String> {
    let digits = v.strip_prefix(['+', '-']).unwrap_or(v);
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!("strconv.Atoi: parsing {}: invalid syntax", q(v)));
    }
    v.parse::<i64>()
        .map_err(|_| format!("strconv.Atoi: parsing {}: value out of range", q(v)))
}

fn rfc3339(v: &str) -> Option<jiff::Timestamp> {
    // Go's time.RFC3339: a `T`, seconds, an optional fraction, `Z` or a numeric offset.
    let b = v.as_bytes();
    if b.len() < 20
        || b[10] != b'T'
        || !(v.ends_with('Z') || b[b.len() - 6] == b'+' || b[b.len() - 6] == b'-')
    {
        return None;
    }
    v.parse().ok()
}

/// Upstream's newNodeLogQuery over the request's parameters (in order; the first value of
/// each option counts). `Ok(None)`: no query parameter at all (the file server answers).
pub fn parse(params: &[(String, String)]) -> Result<Option<Query>, String> {
    let first = |k: &str| {
        params
            .iter()
            .find(|(n, _)| n == k)
            .map(|(_, v)| v.as_str())
            .unwrap_or("")
    };
    let mut errs = Vec::new();
    let mut nlq = Query::default();
    let queries: Vec<&String> = params
        .iter()
        .filter(|(n, _)| n == "query")
        .map(|(_, v)| v)
        .collect();
    for q in &queries {
        if q.contains(['/', '\\']) {
            nlq.files.push(q.to_string());
        } else if !q.trim().is_empty() {
            nlq.services.push(q.to_string());
        }
    }
    if !queries.is_empty() && nlq.files.is_empty() && nlq.services.is_empty() {
        errs.push(format!(
            "query: Invalid value: {}: query cannot be empty",
            go_strings(&queries.iter().map(|s| s.to_string()).collect::<Vec<_>>())
        ));
    }
    for (name, slot) in [("sinceTime", &mut nlq.since), ("untilTime", &mut nlq.until)] {
        let v = first(name);
        if !v.is_empty() {
            match rfc3339(v) {
                Some(t) => *slot = Some(t),
                None => errs.push(format!(
                    "{name}: Invalid value: {}: invalid time format",
                    q(v)
                )),
            }
        }
    }
    for (name, slot) in [("boot", &mut nlq.boot), ("tailLines", &mut nlq.tail_lines)] {
        let v = first(name);
        if !v.is_empty() {
            match atoi(v) {
                Ok(n) => *slot = Some(n),
                Err(e) => errs.push(format!("{name}: Invalid value: {}: {e}", q(v))),
            }
        }
    }
    nlq.pattern = first("pattern").to_string();
    if !errs.is_empty() {
        return Err(aggregate(&errs));
    }
    Ok((nlq != Query::default()).then_some(nlq))
}

/// Upstream's safeServiceName (its messages as they are).
fn service_name_problem(s: &str) -> Option<&'static str> {
    if s.len() > MAX_SERVICE_LENGTH {
        return Some("length must be less than 100");
    }
    if !s
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'@'))
    {
        return Some("input contains unsupported characters");
    }
    None
}

/// `file` as a path relative to the log directory: `..` and `.` elements dropped, so they
/// cannot climb out (as upstream's SecureJoin does lexically).
fn relative(file: &str) -> PathBuf {
    file.split('/')
        .filter(|e| !e.is_empty() && *e != "." && *e != "..")
        .collect()
}

/// Whether `file` exists beneath `root` (symlinks followed only while they stay inside),
/// or why not (a stat-like error). Blocking.
pub fn file_beneath(root: &Path, file: &str) -> Result<(), String> {
    let rel = relative(file);
    let why = |e: &fs_at::BeneathError| match e {
        fs_at::BeneathError::Io { source, .. } if !e.is_absent() => source.to_string(),
        _ => "no such file or directory".to_string(),
    };
    fs_at::open_trusted_dir(root)
        .map_err(|source| fs_at::BeneathError::Io { op: "open", source })
        .and_then(|dir| fs_at::resolve_beneath(&dir, &rel, root.canonicalize().ok().as_deref()))
        .map(drop)
        .map_err(|e| format!("stat {}: {}", root.join(&rel).display(), why(&e)))
}

/// Opens the regular file `name` beneath `root` in one race-free step; `NotFound` when it is
/// absent, outside, a directory, or anything but a regular file (a FIFO or device node is
/// never opened). Blocking.
fn open_log_file(root: &Path, name: &str) -> std::io::Result<std::fs::File> {
    let dir = fs_at::open_trusted_dir(root)?;
    match fs_at::open_beneath(&dir, &relative(name), root.canonicalize().ok().as_deref()) {
        Ok(fs_at::Opened::File(f)) => Ok(f),
        Ok(_) => Err(std::io::ErrorKind::NotFound.into()),
        Err(e) if e.is_absent() => Err(std::io::ErrorKind::NotFound.into()),
        Err(fs_at::BeneathError::Io { source, .. }) => Err(source),
        Err(_) => Err(std::io::ErrorKind::NotFound.into()),
    }
}

/// Upstream's nodeLogQuery.validate (blocking: it looks at a queried file). `Err`: the
/// aggregated field errors.
pub fn validate(n: &Query, root: &Path) -> Result<(), String> {
    let mut errs = Vec::new();
    for s in &n.services {
        if let Some(why) = service_name_problem(s) {
            errs.push(format!("query: Invalid value: {}: {why}", q(s)));
        }
    }
    if n.services.len() > MAX_SERVICES {
        errs.push(format!(
            "query: Too many: {}: must have at most {MAX_SERVICES} items",
            n.services.len()
        ));
    }
    match (n.files.len(), n.services.len()) {
        (0, 0) => errs.push("query: Required value: cannot be empty with options".into()),
        (f, s) if f > 0 && s > 0 => errs.push(format!(
            "query: Invalid value: {}: cannot specify a file and service",
            q(&format!("{}, {}", go_list(&n.files), go_list(&n.services)))
        )),
        (f, _) if f > 1 => errs.push(format!(
            "query: Invalid value: {}: cannot specify more than one file",
            go_strings(&n.files)
        )),
        (1, _) if n.has_options() => errs.push(format!(
            "query: Invalid value: {}: cannot specify file with options",
            go_strings(&n.files)
        )),
        (1, _) => {
            if let Err(e) = file_beneath(root, &n.files[0]) {
                errs.push(format!(
                    "query: Invalid value: {}: {e}",
                    go_strings(&n.files)
                ));
            }
        }
        _ => {}
    }
    if let (Some(since), Some(until)) = (n.since, n.until)
        && since > until
    {
        errs.push(format!(
            "untilTime: Invalid value: {}: must be after `sinceTime`",
            go_time(until)
        ));
    }
    if let Some(b) = n.boot
        && b > 0
    {
        errs.push(format!("boot: Invalid value: {b}: must be less than 1"));
    }
    if let Some(t) = n.tail_lines
        && !(0..=MAX_TAIL_LINES).contains(&t)
    {
        errs.push(format!(
            "tailLines: Invalid value: {t}: must be between 0 and {MAX_TAIL_LINES}, inclusive"
        ));
    }
    if let Err(e) = regex_syntax::Parser::new().parse(&n.pattern) {
        let why = match &e {
            regex_syntax::Error::Parse(p) => p.kind().to_string(),
            regex_syntax::Error::Translate(t) => t.kind().to_string(),
            other => other.to_string(),
        };
        errs.push(format!(
            "pattern: Invalid value: {}: error parsing regexp: {why}",
            q(&n.pattern)
        ));
    }
    if errs.is_empty() {
        Ok(())
    } else {
        Err(aggregate(&errs))
    }
}

/// Upstream's dateLayout (`2006-1-2 15:4:5`), in UTC (journalctl runs with `--utc`).
fn journal_time(t: jiff::Timestamp) -> String {
    let d = t.to_zoned(jiff::tz::TimeZone::UTC).datetime();
    format!(
        "{}-{}-{} {}:{}:{}",
        d.year(),
        d.month(),
        d.day(),
        d.hour(),
        d.minute(),
        d.second()
    )
}

/// Upstream's getLoggingCmd arguments for `services`.
pub fn journal_args(n: &Query, services: &[String]) -> Vec<String> {
    let mut a = vec!["--utc".to_string(), "--no-pager".to_string()];
    if let Some(t) = n.since {
        a.push(format!("--since={}", journal_time(t)));
    }
    if let Some(t) = n.until {
        a.push(format!("--until={}", journal_time(t)));
    }
    if let Some(l) = n.tail_lines {
        a.push("--pager-end".into());
        a.push(format!("--lines={l}"));
    }
    for s in services.iter().filter(|s| !s.is_empty()) {
        a.push(format!("--unit={s}"));
    }
    if !n.pattern.is_empty() {
        a.push(format!("--grep={}", n.pattern));
    }
    if let Some(b) = n.boot {
        a.push("--boot".into());
        a.push(b.to_string());
    }
    a.push("--output=short-precise".into());
    a
}

/// The candidate files of a service that does not log to the journal, in upstream's order.
pub fn service_files(service: &str) -> [String; 3] {
    [
        service.to_string(),
        format!("{service}.log"),
        format!("{service}/{service}.log"),
    ]
}

/// Sends the file's bytes in chunks until its end or `deadline`.
fn send_file(
    mut f: std::fs::File,
    tx: &mpsc::Sender<Bytes>,
    deadline: Instant,
) -> std::io::Result<()> {
    loop {
        if Instant::now() >= deadline {
            return Ok(());
        }
        let mut buf = vec![0u8; 32 * 1024];
        let n = f.read(&mut buf)?;
        if n == 0 {
            return Ok(());
        }
        buf.truncate(n);
        if tx.blocking_send(Bytes::from(buf)).is_err() {
            return Ok(());
        }
    }
}

/// Upstream's heuristicsCopyFileLogs for one service (blocking).
fn copy_service_files(root: &Path, service: &str, tx: &mpsc::Sender<Bytes>, deadline: Instant) {
    let mut last: Option<std::io::Error> = None;
    for name in service_files(service) {
        let sent = open_log_file(root, &name).and_then(|f| send_file(f, tx, deadline));
        match sent {
            Ok(()) => return,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => last = Some(e),
            Err(e) => {
                last = Some(e);
                break;
            }
        }
    }
    let msg = match last {
        Some(e) if e.kind() == std::io::ErrorKind::NotFound => {
            format!("\nlog not found for {service}\n")
        }
        Some(e) => format!("\nerror getting log for {service}: {e}\n"),
        None => return,
    };
    let _ = tx.blocking_send(Bytes::from(msg));
}

/// Whether the client asked for a gzipped answer the way upstream's journalServer checks
/// it: the `Accept-Encoding` header is exactly `gzip` (a list such as `gzip, deflate` is not).
pub fn wants_gzip(headers: &axum::http::HeaderMap) -> bool {
    headers
        .get(header::ACCEPT_ENCODING)
        .is_some_and(|v| v.as_bytes() == b"gzip")
}

/// Upstream's journalServer: the services' logs (journal, else files), as a streamed
/// `text/plain;charset=UTF-8` answer bounded by [`DEADLINE`]; with `gzip` (see
/// [`wants_gzip`]) compressed at the fastest level with `Content-Encoding: gzip`, as upstream.
pub fn serve_services(n: Query, root: PathBuf, journal: Arc<dyn Journal>, gzip: bool) -> Response {
    let (tx, rx) = mpsc::channel::<Bytes>(8);
    tokio::spawn(async move {
        let deadline = Instant::now() + DEADLINE;
        let units = journal.units(deadline).await;
        let (native, files): (Vec<String>, Vec<String>) =
            n.services.iter().cloned().partition(|s| {
                units
                    .as_deref()
                    .is_some_and(|u| u.contains(&format!("{s}.service")))
            });
        if !native.is_empty() {
            let mut out = journal.run(journal_args(&n, &native), deadline);
            while let Some(chunk) = out.next().await {
                match chunk {
                    Chunk::Data(b) => {
                        if tx.send(b).await.is_err() {
                            return;
                        }
                    }
                    Chunk::Failed(why) => {
                        tracing::debug!(reason = %why, "node log query: journalctl did not run to its end");
                        if n.boot.unwrap_or(0) == 0 {
                            let _ = tx
                                .send(Bytes::from_static(
                                    b"\nerror: journal output not available\n",
                                ))
                                .await;
                        }
                    }
                }
            }
        }
        if files.is_empty() {
            return;
        }
        if n.has_options() {
            let msg = format!(
                "\noptions present and query resolved to log files for {}\ntry without specifying options\n",
                go_list(&files)
            );
            let _ = tx.send(Bytes::from(msg)).await;
            return;
        }
        let _ = tokio::task::spawn_blocking(move || {
            for s in &files {
                copy_service_files(&root, s, &tx, deadline);
            }
        })
        .await;
    });
    if gzip {
        return (
            [
                (header::CONTENT_TYPE, "text/plain;charset=UTF-8"),
                (header::CONTENT_ENCODING, "gzip"),
            ],
            Body::from_stream(gzip_stream(rx)),
        )
            .into_response();
    }
    let stream = futures::stream::unfold(rx, |mut rx| async move {
        rx.recv()
            .await
            .map(|b| (Ok::<_, std::convert::Infallible>(b), rx))
    });
    (
        [(header::CONTENT_TYPE, "text/plain;charset=UTF-8")],
        Body::from_stream(stream),
    )
        .into_response()
}

/// The chunks from `rx`, gzipped as they come (what the compressor has produced so far is
/// sent with each chunk; the trailer once `rx` ends).
fn gzip_stream(
    rx: mpsc::Receiver<Bytes>,
) -> impl futures::Stream<Item = Result<Bytes, std::io::Error>> {
    use flate2::{Compression, write::GzEncoder};
    use std::io::Write;
    let enc = Some(GzEncoder::new(Vec::new(), Compression::fast()));
    futures::stream::unfold((rx, enc), |(mut rx, enc)| async move {
        let mut enc = enc?;
        loop {
            match rx.recv().await {
                Some(b) => {
                    if let Err(e) = enc.write_all(&b) {
                        return Some((Err(e), (rx, None)));
                    }
                    let out = std::mem::take(enc.get_mut());
                    if !out.is_empty() {
                        return Some((Ok(Bytes::from(out)), (rx, Some(enc))));
                    }
                }
                None => {
                    let done = enc.finish().map(Bytes::from);
                    return Some((done, (rx, None)));
                }
            }
        }
    })
}

/// Go's http.Error.
pub fn http_error(status: StatusCode, msg: &str) -> Response {
    (
        status,
        [
            (header::CONTENT_TYPE, "text/plain; charset=utf-8"),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        ],
        format!("{msg}\n"),
    )
        .into_response()
}

#[cfg(test)]
mod tests;
