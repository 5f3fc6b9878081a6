//! `/containerLogs/{ns}/{pod}/{container}`: a container's CRI log file, read as upstream's
//! kuberuntime/logs does (PodLogOptions `follow`, `previous`, `tailLines` (and the old `tail`),
//! `sinceSeconds`/`sinceTime`, `timestamps`, `limitBytes`, `stream`), with upstream's query
//! validation and status codes.
//!
//! Like upstream's ReadLogs, only the container's current file (`<restart>.log`) is read:
//! `tailLines` and `previous` see the lines of that file only, never the rotated
//! `<restart>.log.<timestamp>` and `.gz` files ([`crate::logs`]). A follow stream notices a
//! rotation (a new file at the path) and, after the rest of the old file, continues in the
//! new one (upstream switches at once and may drop the old file's last lines). File reads run on the blocking pool; a follow stream polls at
//! most every 250 ms, asks the runtime at most once a second whether the container still runs, and ends at the end of
//! the file once it does not (or is gone), or when the client goes away. At most a few chunks
//! of 32 KiB are buffered per stream.

use super::AppState;
use axum::body::{Body, Bytes};
use axum::extract::{Path as UrlPath, State};
use axum::http::{StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use k8s_openapi::api::core::v1::Pod;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::time::Duration;
use tokio::sync::mpsc;

/// How often a follow stream looks for new bytes at the end of the file.
const FOLLOW_POLL: Duration = Duration::from_millis(250);
/// How often a follow stream at the end of the file asks the runtime whether the container
/// still runs (upstream's forced check period is 1 s).
const RUNTIME_CHECK: Duration = Duration::from_secs(1);
/// One read from the log file.
const CHUNK: usize = 32 * 1024;
/// Chunks queued towards a slow client before reading pauses.
const QUEUE: usize = 4;
/// A line longer than this without a newline is passed on in pieces (the runtime splits
/// lines at 16 KiB, so only a damaged file gets here).
const MAX_LINE: usize = 1024 * 1024;

/// What the log handlers know about a container the runtime reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogContainer {
    pub running: bool,
    /// The restart number the runtime's log file is named after (`<restart>.log`).
    pub restart: u32,
}

/// The runtime as the log handlers see it (a narrow edge, so tests fake it).
#[async_trait::async_trait]
pub trait ContainerLookup: Send + Sync {
    /// The container with this runtime ID, `None` when the runtime no longer has it.
    async fn lookup(&self, id: &str) -> Option<LogContainer>;
}

/// The container runtime, filled in once the agent has connected to it.
#[derive(Default)]
pub struct RuntimeLookup(OnceLock<Arc<dyn crate::runtime::Runtime>>);

impl RuntimeLookup {
    pub fn set(&self, rt: Arc<dyn crate::runtime::Runtime>) {
        let _ = self.0.set(rt);
    }

    /// The runtime, once connected.
    pub fn get(&self) -> Option<&Arc<dyn crate::runtime::Runtime>> {
        self.0.get()
    }
}

#[async_trait::async_trait]
impl ContainerLookup for RuntimeLookup {
    async fn lookup(&self, id: &str) -> Option<LogContainer> {
        let rt = self.0.get()?;
        let s = rt.container_status(id).await.ok()?;
        let restart = s
            .annotations
            .get(crate::runtime::ANN_RESTART_COUNT)
            .and_then(|v| v.parse().ok())
            .unwrap_or(s.attempt);
        Some(LogContainer {
            running: s.state == crate::runtime::ContainerState::Running,
            restart,
        })
    }
}

/// Where logs are and how containers are looked up; part of [`AppState`].
pub struct Logs {
    /// `podLogsDir` (`/var/log/pods`).
    pub pod_logs_dir: PathBuf,
    /// The directory `/logs/` serves (`/var/log`); `None` when `enableSystemLogHandler` is false.
    pub node_log_dir: Option<PathBuf>,
    pub containers: Arc<dyn ContainerLookup>,
}

/// Which streams of the log the client wants (`stream`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Streams {
    All,
    Stdout,
    Stderr,
}

/// PodLogOptions as the kubelet reads them from the query.
#[derive(Debug, Clone, PartialEq)]
pub struct LogOptions {
    pub follow: bool,
    pub previous: bool,
    pub timestamps: bool,
    pub tail_lines: Option<i64>,
    pub limit_bytes: Option<i64>,
    pub since_seconds: Option<i64>,
    /// `sinceTime`, in nanoseconds since the epoch.
    pub since_time: Option<i128>,
    pub stream: Option<String>,
}

/// A query the kubelet refuses, with upstream's status and body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub status: StatusCode,
    pub body: String,
}

impl Refusal {
    pub(crate) fn new(status: StatusCode, body: impl Into<String>) -> Refusal {
        Refusal {
            status,
            body: body.into(),
        }
    }
}

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        (
            self.status,
            [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
            self.body,
        )
            .into_response()
    }
}

/// A boolean query parameter: Go's spellings, and a bare `?follow` (empty value) is true.
fn go_bool(v: &str) -> Option<bool> {
    if v.is_empty() {
        return Some(true);
    }
    plumbing::go::parse_bool(v)
}

/// Parses the query as upstream decodes PodLogOptions (v1): a value that does not decode is
/// 400 `{"message": "Unable to decode query."}`, a decoded one that fails validation is 422
/// `{"message": "Invalid request."}`. The last value of a repeated parameter wins.
pub fn parse_options(query: &[(String, String)]) -> Result<LogOptions, Refusal> {
    let undecodable = || {
        Refusal::new(
            StatusCode::BAD_REQUEST,
            r#"{"message": "Unable to decode query."}"#,
        )
    };
    let mut o = LogOptions {
        follow: false,
        previous: false,
        timestamps: false,
        tail_lines: None,
        limit_bytes: None,
        since_seconds: None,
        since_time: None,
        stream: None,
    };
    let mut tail: Option<&str> = None;
    for (k, v) in query {
        let int = || v.parse::<i64>().map_err(|_| undecodable());
        let flag = || go_bool(v).ok_or_else(undecodable);
        match k.as_str() {
            "follow" => o.follow = flag()?,
            "previous" => o.previous = flag()?,
            "timestamps" => o.timestamps = flag()?,
            "insecureSkipTLSVerifyBackend" => {
                flag()?;
            }
            "tailLines" => o.tail_lines = Some(int()?),
            "limitBytes" => o.limit_bytes = Some(int()?),
            "sinceSeconds" => o.since_seconds = Some(int()?),
            "sinceTime" => o.since_time = Some(parse_rfc3339(v).ok_or_else(undecodable)?),
            "stream" => o.stream = Some(v.clone()),
            "tail" => tail = Some(v.as_str()),
            _ => {}
        }
    }
    // The old `tail` parameter overrides tailLines; "all" means no limit.
    match tail {
        Some("all") => o.tail_lines = None,
        Some(t) if !t.is_empty() => o.tail_lines = Some(t.parse().map_err(|_| undecodable())?),
        _ => {}
    }
    let invalid = Refusal::new(
        StatusCode::UNPROCESSABLE_ENTITY,
        r#"{"message": "Invalid request."}"#,
    );
    let bad_stream = !matches!(
        o.stream.as_deref(),
        None | Some("All" | "Stdout" | "Stderr")
    );
    if o.tail_lines.is_some_and(|n| n < 0)
        || o.limit_bytes.is_some_and(|n| n < 1)
        || o.since_seconds.is_some_and(|n| n < 1)
        || (o.since_seconds.is_some() && o.since_time.is_some())
        || bad_stream
        || (o.tail_lines.is_some() && o.stream.as_deref().is_some_and(|s| s != "All"))
    {
        return Err(invalid);
    }
    Ok(o)
}

impl LogOptions {
    fn streams(&self) -> Streams {
        match self.stream.as_deref() {
            Some("Stdout") => Streams::Stdout,
            Some("Stderr") => Streams::Stderr,
            _ => Streams::All,
        }
    }

    /// The earliest timestamp to show, in nanoseconds since the epoch.
    fn since(&self, now_nanos: i128) -> Option<i128> {
        self.since_time.or(self
            .since_seconds
            .map(|s| now_nanos - i128::from(s) * 1_000_000_000))
    }
}

fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// An RFC 3339 time (`2016-10-06T00:17:09.669794202Z`, or with an offset) as nanoseconds
/// since the epoch.
pub fn parse_rfc3339(s: &str) -> Option<i128> {
    let b = s.as_bytes();
    if b.len() < 20 || b[4] != b'-' || b[7] != b'-' || !matches!(b[10], b'T' | b't') {
        return None;
    }
    if b[13] != b':' || b[16] != b':' {
        return None;
    }
    let num = |r: std::ops::Range<usize>| -> Option<i64> {
        let t = s.get(r)?;
        t.bytes()
            .all(|c| c.is_ascii_digit())
            .then(|| t.parse().ok())?
    };
    let (y, mo, d) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (h, mi, se) = (num(11..13)?, num(14..16)?, num(17..19)?);
    if !(1..=12).contains(&mo) || !(1..=31).contains(&d) || h > 23 || mi > 59 || se > 60 {
        return None;
    }
    // Every slice below is checked (`get`): a multi-byte character where an ASCII one belongs
    // makes the time undecodable, never a panic.
    let mut rest = s.get(19..)?;
    let mut frac: i128 = 0;
    if let Some(r) = rest.strip_prefix('.') {
        let digits = r.bytes().take_while(|c| c.is_ascii_digit()).count();
        if digits == 0 || digits > 9 {
            return None;
        }
        frac = r.get(..digits)?.parse::<i128>().ok()? * 10i128.pow(9 - digits as u32);
        rest = r.get(digits..)?;
    }
    let offset = match rest {
        "Z" | "z" => 0,
        o if o.len() == 6
            && (o.starts_with('+') || o.starts_with('-'))
            && o.get(3..4) == Some(":") =>
        {
            let oh = num(s.len() - 5..s.len() - 3)?;
            let om = num(s.len() - 2..s.len())?;
            let v = oh * 3600 + om * 60;
            if o.starts_with('-') { -v } else { v }
        }
        _ => return None,
    };
    let secs = days_from_civil(y, mo, d) * 86_400 + h * 3600 + mi * 60 + se - offset;
    Some(i128::from(secs) * 1_000_000_000 + frac)
}

fn now_nanos() -> i128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as i128)
        .unwrap_or(0)
}

/// One record of the CRI log format: `<RFC3339Nano> <stdout|stderr> <F|P> <content>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record<'a> {
    pub timestamp: &'a [u8],
    pub stderr: bool,
    pub partial: bool,
    pub content: &'a [u8],
}

/// Parses one line (without its newline) of a CRI log file.
pub fn parse_record(line: &[u8]) -> Option<Record<'_>> {
    let mut parts = line.splitn(4, |c| *c == b' ');
    let timestamp = parts.next()?;
    let stderr = match parts.next()? {
        b"stdout" => false,
        b"stderr" => true,
        _ => return None,
    };
    let (partial, content) = match (parts.next(), parts.next()) {
        (Some(b"P"), c) => (true, c.unwrap_or_default()),
        (Some(b"F"), c) => (false, c.unwrap_or_default()),
        // Before tags existed, the rest of the line was the content.
        (Some(first), rest) => {
            let start = first.as_ptr() as usize - line.as_ptr() as usize;
            let _ = rest;
            (false, &line[start..])
        }
        (None, _) => (false, &b""[..]),
    };
    Some(Record {
        timestamp,
        stderr,
        partial,
        content,
    })
}

/// Turns CRI log lines into what the client sees, applying stream, since, timestamps and
/// limitBytes as upstream's log writer does.
pub struct Writer {
    streams: Streams,
    since: Option<i128>,
    timestamps: bool,
    /// Bytes still allowed by limitBytes.
    remaining: Option<u64>,
}

impl Writer {
    pub fn new(o: &LogOptions, now_nanos: i128) -> Writer {
        Writer {
            streams: o.streams(),
            since: o.since(now_nanos),
            timestamps: o.timestamps,
            remaining: o.limit_bytes.map(|n| n.max(0) as u64),
        }
    }

    /// True once limitBytes has been written.
    pub fn full(&self) -> bool {
        self.remaining == Some(0)
    }

    /// Appends one file line's output to `out`.
    pub fn line(&mut self, line: &[u8], out: &mut Vec<u8>) {
        if self.full() {
            return;
        }
        let Some(r) = parse_record(line) else {
            tracing::debug!("skipping a log line not in the CRI log format");
            return;
        };
        match (self.streams, r.stderr) {
            (Streams::Stdout, true) | (Streams::Stderr, false) => return,
            _ => {}
        }
        if let Some(since) = self.since {
            let ts = std::str::from_utf8(r.timestamp)
                .ok()
                .and_then(parse_rfc3339);
            if ts.is_none_or(|t| t < since) {
                return;
            }
        }
        let mut msg = Vec::with_capacity(r.timestamp.len() + r.content.len() + 2);
        if self.timestamps {
            msg.extend_from_slice(r.timestamp);
            msg.push(b' ');
        }
        msg.extend_from_slice(r.content);
        if !r.partial {
            msg.push(b'\n');
        }
        if let Some(rem) = self.remaining.as_mut() {
            let n = msg.len().min(*rem as usize);
            msg.truncate(n);
            *rem -= n as u64;
        }
        out.extend_from_slice(&msg);
    }
}

/// Where the last `n` lines of the file start (a final line without its newline counts).
pub fn tail_start(f: &mut std::fs::File, n: u64) -> std::io::Result<u64> {
    let len = f.seek(SeekFrom::End(0))?;
    if n == 0 {
        return Ok(len);
    }
    let mut pos = len;
    let mut seen = 0u64;
    let mut buf = vec![0u8; 8192];
    let mut last = true;
    while pos > 0 {
        let step = (pos as usize).min(buf.len());
        pos -= step as u64;
        f.seek(SeekFrom::Start(pos))?;
        f.read_exact(&mut buf[..step])?;
        for i in (0..step).rev() {
            if buf[i] != b'\n' {
                continue;
            }
            // The newline ending the file closes the last line; it starts none.
            if last && pos + i as u64 == len - 1 {
                continue;
            }
            seen += 1;
            if seen == n {
                return Ok(pos + i as u64 + 1);
            }
        }
        last = false;
    }
    Ok(0)
}

/// The container to read, chosen as upstream's validateContainerLogStatus does.
#[derive(Debug, Clone, PartialEq)]
pub struct Target {
    /// The runtime's container ID (without the `containerd://` prefix).
    pub id: String,
    /// The restart number from the pod status (the runtime's wins when it still has it).
    pub restart: u32,
    pub path_dir: PathBuf,
}

/// Finds the pod and container to read, with upstream's 404/400 answers.
pub fn find_target(
    pods: &[Pod],
    logs_dir: &Path,
    ns: &str,
    name: &str,
    container: &str,
    previous: bool,
) -> Result<Target, Refusal> {
    let pod = pods
        .iter()
        .find(|p| {
            p.metadata.namespace.as_deref().unwrap_or("default") == ns
                && p.metadata.name.as_deref() == Some(name)
        })
        .ok_or_else(|| {
            Refusal::new(
                StatusCode::NOT_FOUND,
                format!("pod {name:?} does not exist"),
            )
        })?;
    let spec = pod.spec.clone().unwrap_or_default();
    let in_spec = spec.containers.iter().any(|c| c.name == container)
        || spec
            .init_containers
            .iter()
            .flatten()
            .any(|c| c.name == container)
        || spec
            .ephemeral_containers
            .iter()
            .flatten()
            .any(|c| c.name == container);
    if !in_spec {
        return Err(Refusal::new(
            StatusCode::NOT_FOUND,
            format!("container {container:?} not found in pod {name:?}"),
        ));
    }
    let bad = |msg: String| Refusal::new(StatusCode::BAD_REQUEST, msg);
    let status = pod.status.clone().unwrap_or_default();
    let cs = status
        .container_statuses
        .iter()
        .flatten()
        .chain(status.init_container_statuses.iter().flatten())
        .chain(status.ephemeral_container_statuses.iter().flatten())
        .find(|s| s.name == container)
        .ok_or_else(|| {
            bad(format!(
                "container {container:?} in pod {name:?} is not available"
            ))
        })?;
    let restarts = cs.restart_count.max(0) as u32;
    let last_id = cs
        .last_state
        .as_ref()
        .and_then(|s| s.terminated.as_ref())
        .and_then(|t| t.container_id.clone())
        .filter(|id| !id.is_empty());
    let state = cs.state.clone().unwrap_or_default();
    let (id, restart) = if previous {
        let id = last_id.ok_or_else(|| {
            bad(format!(
                "previous terminated container {container:?} in pod {name:?} not found"
            ))
        })?;
        (id, restarts.saturating_sub(1))
    } else if state.running.is_some() || state.terminated.is_some() {
        let id = cs.container_id.clone().unwrap_or_default();
        (id, restarts)
    } else if let Some(id) = last_id {
        // Waiting to restart: the last run's log.
        (id, restarts.saturating_sub(1))
    } else {
        let reason = state.waiting.and_then(|w| w.reason).unwrap_or_default();
        return Err(bad(format!(
            "container {container:?} in pod {name:?} is waiting to start: {reason}"
        )));
    };
    let id = match id.split_once("://") {
        Some((_, bare)) => bare.to_string(),
        None => id,
    };
    if id.is_empty() {
        return Err(bad(format!(
            "container {container:?} in pod {name:?} is not available"
        )));
    }
    let uid = pod.metadata.uid.as_deref().unwrap_or_default();
    Ok(Target {
        id,
        restart,
        path_dir: logs_dir.join(format!("{ns}_{name}_{uid}")).join(container),
    })
}

/// GET `/containerLogs/{ns}/{pod}/{container}`.
pub async fn container_logs(
    State(s): State<AppState>,
    UrlPath((ns, pod, container)): UrlPath<(String, String, String)>,
    uri: Uri,
) -> Response {
    let query = axum::extract::Query::<Vec<(String, String)>>::try_from_uri(&uri)
        .map(|q| q.0)
        .unwrap_or_default();
    match serve(&s.logs, &s.statuses.pods(), &ns, &pod, &container, &query).await {
        Ok(body) => (
            [
                (header::CONTENT_TYPE, "text/plain; charset=utf-8"),
                (header::CACHE_CONTROL, "no-cache"),
            ],
            body,
        )
            .into_response(),
        Err(r) => r.into_response(),
    }
}

/// The log body for a request, or upstream's refusal.
pub async fn serve(
    logs: &Logs,
    pods: &[Pod],
    ns: &str,
    pod: &str,
    container: &str,
    query: &[(String, String)],
) -> Result<Body, Refusal> {
    let opts = parse_options(query)?;
    let target = find_target(pods, &logs.pod_logs_dir, ns, pod, container, opts.previous)?;
    let live = logs.containers.lookup(&target.id).await;
    let restart = live.map_or(target.restart, |c| c.restart);
    let path = target.path_dir.join(format!("{restart}.log"));
    let tail = opts.tail_lines.map(|n| n as u64);
    let opened = {
        let (root, path) = (logs.pod_logs_dir.clone(), path.clone());
        tokio::task::spawn_blocking(move || -> std::io::Result<(std::fs::File, u64)> {
            let mut f = open_container_log(&root, &path)?;
            let start = match tail {
                Some(n) => tail_start(&mut f, n)?,
                None => 0,
            };
            f.seek(SeekFrom::Start(start))?;
            Ok((f, start))
        })
        .await
    };
    let file = match opened {
        Ok(Ok((f, _))) => f,
        Ok(Err(e)) => {
            return Err(Refusal::new(
                StatusCode::BAD_REQUEST,
                format!(
                    "failed to open log file {:?}: {e}",
                    path.display().to_string()
                ),
            ));
        }
        Err(e) => {
            return Err(Refusal::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                e.to_string(),
            ));
        }
    };
    let (tx, rx) = mpsc::channel::<Bytes>(QUEUE);
    let writer = Writer::new(&opts, now_nanos());
    let follow = opts.follow && !opts.previous;
    tokio::spawn(pump(
        file,
        logs.pod_logs_dir.clone(),
        path,
        writer,
        follow.then(|| (logs.containers.clone(), target.id.clone())),
        tx,
    ));
    let stream = futures::stream::unfold(rx, |mut rx| async move {
        rx.recv()
            .await
            .map(|b| (Ok::<_, std::convert::Infallible>(b), rx))
    });
    Ok(Body::from_stream(stream))
}

/// Opens the container log `path` (beneath `root`, `podLogsDir`) race-free: a pod with a
/// hostPath on /var/log can replace a log (or a directory above it) with a symlink to a host
/// file, or with a FIFO ([`crate::fs_at::open_regular_beneath`]). Blocking.
fn open_container_log(root: &Path, path: &Path) -> std::io::Result<std::fs::File> {
    crate::fs_at::open_regular_beneath(root, path)
}

/// Reads the file from where it is positioned and sends the output until the end (or, when
/// following, until the container stops or the client goes away).
async fn pump(
    file: std::fs::File,
    root: PathBuf,
    path: PathBuf,
    mut writer: Writer,
    follow: Option<(Arc<dyn ContainerLookup>, String)>,
    tx: mpsc::Sender<Bytes>,
) {
    let mut file = Some(file);
    let mut pending: Vec<u8> = Vec::new();
    // Following: set once the container no longer runs; the file is then read to its end.
    let mut last_round = false;
    let mut checked: Option<tokio::time::Instant> = None;
    // The new file after a rotation, opened once the old one is read to its end.
    let mut next: Option<std::fs::File> = None;
    loop {
        let Some(f) = file.take() else { return };
        let read = tokio::task::spawn_blocking(move || {
            let mut f = f;
            let mut buf = vec![0u8; CHUNK];
            let r = f.read(&mut buf).map(|n| {
                buf.truncate(n);
                buf
            });
            (f, r)
        })
        .await;
        let Ok((f, r)) = read else { return };
        file = Some(f);
        let chunk = match r {
            Ok(c) => c,
            Err(e) => {
                tracing::debug!(path = %path.display(), error = %e, "reading a container log failed");
                return;
            }
        };
        let eof = chunk.is_empty();
        pending.extend_from_slice(&chunk);
        let mut out = Vec::new();
        let mut start = 0;
        while let Some(i) = pending[start..].iter().position(|c| *c == b'\n') {
            writer.line(&pending[start..start + i], &mut out);
            start += i + 1;
        }
        pending.drain(..start);
        if pending.len() > MAX_LINE || (eof && follow.is_none()) {
            // Upstream writes an incomplete last line when not following.
            if !pending.is_empty() {
                writer.line(&pending, &mut out);
                pending.clear();
            }
        }
        if !out.is_empty() && tx.send(Bytes::from(out)).await.is_err() {
            return;
        }
        if writer.full() {
            return;
        }
        if !eof {
            continue;
        }
        let Some((containers, id)) = follow.as_ref() else {
            return;
        };
        if let Some(n) = next.take() {
            // The rotated file is read to its end: go on in the new one.
            file = Some(n);
            continue;
        }
        if last_round {
            return;
        }
        if checked.is_none_or(|t| t.elapsed() >= RUNTIME_CHECK) {
            checked = Some(tokio::time::Instant::now());
            if !containers.lookup(id).await.is_some_and(|c| c.running) {
                last_round = true;
                continue;
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(FOLLOW_POLL) => {}
            _ = tx.closed() => return,
        }
        // A rotated file (renamed, a new one at the path): what was written to the old one
        // before the rename is read first, then the stream continues in the new one.
        let (Some(f), p, r) = (file.take(), path.clone(), root.clone()) else {
            return;
        };
        let swapped = tokio::task::spawn_blocking(move || {
            use std::os::unix::fs::MetadataExt;
            let same = match (f.metadata(), std::fs::metadata(&p)) {
                (Ok(a), Ok(b)) => a.ino() == b.ino() && a.dev() == b.dev(),
                _ => true,
            };
            let new = if same {
                None
            } else {
                open_container_log(&r, &p).ok()
            };
            (f, new)
        })
        .await;
        match swapped {
            Ok((f, new)) => {
                file = Some(f);
                next = new;
            }
            Err(_) => return,
        }
    }
}

#[cfg(test)]
mod tests;
