//! A finished container's `terminated.message`, as upstream's kuberuntime computes it: the
//! runtime's message, then what the container wrote to its `terminationMessagePath` (the last
//! 4096 bytes), or, with `terminationMessagePolicy: FallbackToLogsOnError`, when that file is
//! empty and the container failed, the tail of its log (80 lines, of which the last 2048
//! bytes).
//! Reads files: call it on the blocking pool.

use crate::runtime::{
    ANN_TERMINATION_MESSAGE_PATH, ANN_TERMINATION_MESSAGE_POLICY, ContainerStatus,
};
use std::io::{Read, Seek, SeekFrom};
use std::path::Path;

/// Upstream `MaxContainerTerminationMessageLength`.
pub const MAX_MESSAGE_BYTES: u64 = 4096;
/// Upstream `MaxContainerTerminationMessageLogLines` and `...LogLength`.
pub const MAX_LOG_LINES: usize = 80;
pub const MAX_LOG_BYTES: usize = 2048;

/// The message of exited container `c`, whose termination file (on the host) is
/// `message_file` and whose CRI log is `log_file` (under `podLogsDir`, `log_root`).
pub fn exit_message(
    c: &ContainerStatus,
    message_file: &Path,
    log_root: &Path,
    log_file: &Path,
) -> String {
    let path = c
        .annotations
        .get(ANN_TERMINATION_MESSAGE_PATH)
        .map(String::as_str)
        .unwrap_or("");
    let policy = c
        .annotations
        .get(ANN_TERMINATION_MESSAGE_POLICY)
        .map(String::as_str)
        .unwrap_or("File");
    // A container that could not even start has no logs to fall back to.
    let fallback =
        policy == "FallbackToLogsOnError" && c.exit_code != 0 && c.reason != "ContainerCannotRun";
    let (mut text, check_logs) = if path.is_empty() {
        (String::new(), fallback)
    } else {
        match read_at_most(message_file, MAX_MESSAGE_BYTES) {
            Ok(data) => {
                let empty = data.is_empty();
                (data, fallback && empty)
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => (String::new(), fallback),
            Err(e) => (
                format!(
                    "Error on reading termination log {}: {e}",
                    message_file.display()
                ),
                false,
            ),
        }
    };
    if check_logs {
        text = log_tail(log_root, log_file, MAX_LOG_LINES, MAX_LOG_BYTES);
    }
    match (c.message.is_empty(), text.is_empty()) {
        (_, true) => c.message.clone(),
        (true, false) => text,
        (false, false) => format!("{}: {text}", c.message),
    }
}

/// The last `max` bytes of a file (upstream `tail.ReadAtMost`).
pub fn read_at_most(path: &Path, max: u64) -> std::io::Result<String> {
    read_file_at_most(std::fs::File::open(path)?, max)
}

fn read_file_at_most(mut f: std::fs::File, max: u64) -> std::io::Result<String> {
    let len = f.metadata()?.len();
    if len > max {
        f.seek(SeekFrom::Start(len - max))?;
    }
    let mut buf = Vec::with_capacity(len.min(max) as usize);
    f.take(max).read_to_end(&mut buf)?;
    Ok(String::from_utf8_lossy(&buf).into_owned())
}

/// The content of the last `lines` entries of a CRI-format log (`<time> <stream> <P|F>
/// <text>`), at most its last `max_bytes` (upstream reads into a ring buffer). The log lies
/// under `root` (`podLogsDir`), where a pod with a hostPath on /var/log can plant symlinks
/// and FIFOs: it is opened race-free beneath `root`, a regular file only.
pub fn log_tail(root: &Path, path: &Path, lines: usize, max_bytes: usize) -> String {
    // Only the end of the file matters: 80 entries of a few KiB at most.
    let read =
        crate::fs_at::open_regular_beneath(root, path).and_then(|f| read_file_at_most(f, 1 << 20));
    let raw = match read {
        Ok(raw) => raw,
        Err(e) => return format!("Error on reading termination message from logs: {e}"),
    };
    let entries: Vec<&str> = raw.lines().filter(|l| !l.is_empty()).collect();
    let mut out = String::new();
    for line in &entries[entries.len().saturating_sub(lines)..] {
        let mut parts = line.splitn(4, ' ');
        let (_time, _stream, tag) = (parts.next(), parts.next(), parts.next());
        let text = parts.next().unwrap_or("");
        out.push_str(text);
        if tag != Some("P") {
            out.push('\n');
        }
    }
    if out.len() > max_bytes {
        let mut start = out.len() - max_bytes;
        while !out.is_char_boundary(start) {
            start += 1;
        }
        out.drain(..start);
    }
    out
}
