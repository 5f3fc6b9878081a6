//! The node's journal, as NodeLogQuery reads it: a narrow trait over `journalctl`
//! ([`Journalctl`], the real one; `fake::FakeJournal` in tests). Every run is bounded by the
//! query's deadline and killed when the client goes away.

use axum::body::Bytes;
use futures::stream::BoxStream;
use std::process::Stdio;
use std::time::Duration;
use tokio::io::AsyncReadExt;
use tokio::time::Instant;

/// How one run of the journal ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Chunk {
    /// Output (stdout, then stderr, as upstream writes both to the client).
    Data(Bytes),
    /// The command could not run or was cut by the deadline (not a non-zero exit).
    Failed(String),
}

/// `journalctl`, as NodeLogQuery uses it.
#[async_trait::async_trait]
pub trait Journal: Send + Sync {
    /// `journalctl --field _SYSTEMD_UNIT`: the units the journal knows; `None` when that fails
    /// (no journald: the services' logs are then looked for as files).
    async fn units(&self, deadline: Instant) -> Option<String>;
    /// Runs `journalctl args…`, streaming its output until it ends or `deadline`.
    fn run(&self, args: Vec<String>, deadline: Instant) -> BoxStream<'static, Chunk>;
}

/// The real `journalctl` (found on PATH).
#[derive(Debug, Clone)]
pub struct Journalctl {
    pub program: String,
}

impl Default for Journalctl {
    fn default() -> Self {
        Journalctl {
            program: "journalctl".into(),
        }
    }
}

/// Most bytes of stderr kept for the client.
const MAX_STDERR: u64 = 64 * 1024;

#[async_trait::async_trait]
impl Journal for Journalctl {
    async fn units(&self, deadline: Instant) -> Option<String> {
        let child = tokio::process::Command::new(&self.program)
            .args(["--field", "_SYSTEMD_UNIT"])
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .output();
        match tokio::time::timeout_at(deadline, child).await {
            Ok(Ok(out)) if out.status.success() => {
                Some(String::from_utf8_lossy(&out.stdout).into_owned())
            }
            _ => None,
        }
    }

    fn run(&self, args: Vec<String>, deadline: Instant) -> BoxStream<'static, Chunk> {
        let program = self.program.clone();
        let (tx, rx) = tokio::sync::mpsc::channel::<Chunk>(8);
        tokio::spawn(async move {
            let spawned = tokio::process::Command::new(&program)
                .args(&args)
                .env("SYSTEMD_PAGER", "")
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .kill_on_drop(true)
                .spawn();
            let mut child = match spawned {
                Ok(c) => c,
                Err(e) => {
                    let _ = tx.send(Chunk::Failed(format!("{program}: {e}"))).await;
                    return;
                }
            };
            let (Some(mut out), Some(err)) = (child.stdout.take(), child.stderr.take()) else {
                return;
            };
            let stderr = tokio::spawn(async move {
                let mut buf = Vec::new();
                let _ = err.take(MAX_STDERR).read_to_end(&mut buf).await;
                buf
            });
            let copy = async {
                let mut buf = vec![0u8; 32 * 1024];
                loop {
                    match out.read(&mut buf).await {
                        Ok(0) | Err(_) => return true,
                        Ok(n) => {
                            if tx
                                .send(Chunk::Data(Bytes::copy_from_slice(&buf[..n])))
                                .await
                                .is_err()
                            {
                                return false; // the client went away
                            }
                        }
                    }
                }
            };
            match tokio::time::timeout_at(deadline, copy).await {
                Ok(true) => {}
                Ok(false) => return, // dropping `child` kills it
                Err(_) => {
                    let _ = tx.send(Chunk::Failed("deadline exceeded".into())).await;
                    return;
                }
            }
            if let Ok(Ok(buf)) = tokio::time::timeout(Duration::from_secs(1), stderr).await
                && !buf.is_empty()
            {
                let _ = tx.send(Chunk::Data(Bytes::from(buf))).await;
            }
            if let Err(e) = tokio::time::timeout_at(deadline, child.wait()).await {
                let _ = tx.send(Chunk::Failed(e.to_string())).await;
            }
        });
        Box::pin(futures::stream::unfold(rx, |mut rx| async move {
            rx.recv().await.map(|c| (c, rx))
        }))
    }
}

#[cfg(any(test, feature = "test-util"))]
pub mod fake;

#[cfg(test)]
mod tests;
