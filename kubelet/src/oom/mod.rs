//! System OOM events, as upstream's oom watcher (pkg/kubelet/oom with cAdvisor's oomparser):
//! the kernel's log (/dev/kmsg) is read from the start of its ring buffer, each OOM report is
//! parsed ([`Parser`], pure), and one whose victim is the root cgroup (`/`: the whole node
//! ran out of memory, not a container past its limit) becomes a Warning event `SystemOOM` on
//! the Node: `System OOM encountered, victim process: <name>, pid: <pid>`. Like upstream,
//! the reports still in the ring buffer when the agent starts are reported again.
//!
//! The kernel log is the [`KernelLog`] trait ([`DevKmsg`] reads /dev/kmsg without blocking,
//! on the blocking pool, once a second; a fake beside it). An unreadable /dev/kmsg (no
//! permission, a container without it) is one log line, and the rest of the agent runs on.
//! Containers killed at their own memory limit are reported in their status instead
//! (`OOMKilled`, from the runtime).

use crate::events::{EventRecorder, EventType};
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// Upstream's event reason.
pub const SYSTEM_OOM_EVENT: &str = "SystemOOM";

/// One OOM kill as the kernel reported it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OomInstance {
    pub pid: u32,
    pub process_name: String,
    /// The cgroup of the killed task (`/` when unknown).
    pub container_name: String,
    /// The cgroup whose limit was hit (`/`: the node's memory).
    pub victim_container_name: String,
    pub constraint: String,
}

impl OomInstance {
    fn new() -> OomInstance {
        OomInstance {
            pid: 0,
            process_name: String::new(),
            container_name: "/".into(),
            victim_container_name: "/".into(),
            constraint: String::new(),
        }
    }

    /// The Node event's message when this was a system OOM (upstream's wording).
    pub fn system_oom_message(&self) -> Option<String> {
        if self.victim_container_name != "/" {
            return None;
        }
        let mut m = String::from("System OOM encountered");
        if !self.process_name.is_empty() && self.pid != 0 {
            m.push_str(&format!(
                ", victim process: {}, pid: {}",
                self.process_name, self.pid
            ));
        }
        Some(m)
    }
}

/// The message of one /dev/kmsg record (`<prio>,<seq>,<usec>,<flags>;<message>\n[ KEY=value]`).
pub fn kmsg_message(record: &str) -> Option<&str> {
    let (_, rest) = record.split_once(';')?;
    Some(rest.split('\n').next().unwrap_or(rest))
}

/// Turns kernel log messages into OOM kills, as cAdvisor's oomparser: a report starts at
/// `invoked oom-killer:` and ends at the `oom-kill:` summary naming `oom_memcg` or at
/// `Killed process <pid> (<name>)`.
#[derive(Debug, Default)]
pub struct Parser {
    current: Option<OomInstance>,
}

impl Parser {
    /// Feeds one message; the OOM kill it completes, if any.
    pub fn feed(&mut self, message: &str) -> Option<OomInstance> {
        let Some(cur) = self.current.as_mut() else {
            if message.contains("invoked oom-killer:") {
                self.current = Some(OomInstance::new());
            }
            return None;
        };
        let finished = summary(message, cur) || killed_process(message, cur);
        if finished {
            return self.current.take();
        }
        None
    }
}

/// The `oom-kill:constraint=...,oom_memcg=...,task_memcg=...,task=...,pid=...` summary
/// (kernels since 5.0); true when it named `oom_memcg`. A global OOM says `global_oom`
/// instead: the report then ends at the "Killed process" line, with the victim `/`.
/// Older kernels' `Task in X killed as a result of limit of Y` names both cgroups.
fn summary(message: &str, cur: &mut OomInstance) -> bool {
    if let Some(rest) = message
        .find("oom-kill:")
        .map(|i| &message[i + "oom-kill:".len()..])
    {
        let field = |k: &str| {
            rest.split(',')
                .find_map(|kv| kv.strip_prefix(k)?.strip_prefix('='))
                .map(str::to_string)
        };
        let Some(victim) = field("oom_memcg") else {
            return false;
        };
        cur.victim_container_name = victim;
        cur.container_name = field("task_memcg").unwrap_or_else(|| "/".into());
        cur.constraint = field("constraint").unwrap_or_default();
        cur.process_name = field("task").unwrap_or_default();
        cur.pid = field("pid").and_then(|p| p.parse().ok()).unwrap_or(0);
        return true;
    }
    if let Some(i) = message.find("Task in ") {
        let rest = &message[i + "Task in ".len()..];
        if let Some((task, limit)) = rest.split_once(" killed as a result of limit of ") {
            let abs = |p: &str| format!("/{}", p.trim().trim_start_matches('/'));
            cur.container_name = abs(task);
            cur.victim_container_name = abs(limit);
        }
    }
    false
}

/// `Killed process <pid> (<name>)`.
fn killed_process(message: &str, cur: &mut OomInstance) -> bool {
    let Some(i) = message.find("Killed process ") else {
        return false;
    };
    let rest = &message[i + "Killed process ".len()..];
    let Some((pid, after)) = rest.split_once(" (") else {
        return false;
    };
    let (Ok(pid), Some(end)) = (pid.parse::<u32>(), after.rfind(')')) else {
        return false;
    };
    cur.pid = pid;
    cur.process_name = after[..end].to_string();
    true
}

/// The kernel's log, one record at a time.
pub trait KernelLog: Send {
    /// The records available now (possibly none); an error ends the watch.
    fn read_available(&mut self) -> std::io::Result<Vec<String>>;
}

/// /dev/kmsg, opened without blocking: each read returns one record.
pub struct DevKmsg(std::fs::File);

impl DevKmsg {
    pub fn open() -> std::io::Result<DevKmsg> {
        use std::os::unix::fs::OpenOptionsExt;
        std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK)
            .open("/dev/kmsg")
            .map(DevKmsg)
    }
}

impl KernelLog for DevKmsg {
    fn read_available(&mut self) -> std::io::Result<Vec<String>> {
        use std::io::Read;
        let mut out = Vec::new();
        let mut buf = vec![0u8; 8192];
        // Bounded, so one turn never runs long however chatty the kernel is.
        for _ in 0..4096 {
            match self.0.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => out.push(String::from_utf8_lossy(&buf[..n]).into_owned()),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                // Records were overwritten before we read them: go on with the next ones.
                Err(e) if e.raw_os_error() == Some(libc::EPIPE) => continue,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            }
        }
        Ok(out)
    }
}

/// How often the kernel log is read.
const POLL: Duration = Duration::from_secs(1);

/// Watches the kernel log until `cancel` fires, recording a `SystemOOM` event on the Node for
/// each system OOM. `open` runs on the blocking pool; when it fails the watch is skipped
/// with one log line.
pub async fn run<L: KernelLog + 'static>(
    open: impl FnOnce() -> std::io::Result<L> + Send + 'static,
    events: Arc<dyn EventRecorder>,
    node_name: String,
    cancel: CancellationToken,
) {
    let log = match tokio::task::spawn_blocking(open).await {
        Ok(Ok(l)) => l,
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "cannot read the kernel log (/dev/kmsg): system OOM events will not be reported");
            return;
        }
        Err(_) => return,
    };
    let node = crate::events::node_ref(&node_name);
    let mut parser = Parser::default();
    let mut log = Some(log);
    loop {
        let Some(mut l) = log.take() else { return };
        let read = tokio::task::spawn_blocking(move || {
            let r = l.read_available();
            (l, r)
        })
        .await;
        let records = match read {
            Ok((l, Ok(records))) => {
                log = Some(l);
                records
            }
            Ok((_, Err(e))) => {
                tracing::error!(error = %e, "Unexpectedly stopped receiving OOM notifications");
                return;
            }
            Err(_) => return,
        };
        for r in &records {
            let Some(msg) = kmsg_message(r) else { continue };
            let Some(oom) = parser.feed(msg) else {
                continue;
            };
            if let Some(message) = oom.system_oom_message() {
                tracing::info!(process = %oom.process_name, pid = oom.pid, "Got sys oom event");
                events.record(&node, EventType::Warning, SYSTEM_OOM_EVENT, &message);
            } else {
                tracing::debug!(cgroup = %oom.victim_container_name, process = %oom.process_name, pid = oom.pid, "cgroup OOM kill");
            }
        }
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tokio::time::sleep(POLL) => {}
        }
    }
}

/// A kernel log fed by tests.
#[cfg(any(test, feature = "test-util"))]
pub mod fake {
    use std::sync::{Arc, Mutex};

    /// Records pushed with [`FakeKernelLog::push`] are returned by the next read.
    #[derive(Clone, Default)]
    pub struct FakeKernelLog(pub Arc<Mutex<Vec<String>>>);

    impl FakeKernelLog {
        pub fn push(&self, record: &str) {
            self.0.lock().unwrap().push(record.to_string());
        }
    }

    impl super::KernelLog for FakeKernelLog {
        fn read_available(&mut self) -> std::io::Result<Vec<String>> {
            Ok(std::mem::take(&mut *self.0.lock().unwrap()))
        }
    }
}

#[cfg(test)]
mod tests;
