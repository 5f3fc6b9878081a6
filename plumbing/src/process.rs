//! Child processes, run one way: every run is killed after a timeout, and the output kept is
//! capped. Standard input is written while the output is read, so a child that answers as it
//! reads (`cat`, `nft` echoing) cannot stall against a full pipe.
//!
//! Callers keep their own error types and messages: they map [`RunError`] into them.

use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use thiserror::Error;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};

/// The standard output kept by default: larger than any rule dump (`iptables-save`,
/// `nft list`, `conntrack -L`) of a big cluster, small enough to bound a runaway child.
pub const DEFAULT_STDOUT_CAP: usize = 256 << 20;
/// The standard error kept by default; the rest is dropped ([`Output::stderr_truncated`]).
pub const DEFAULT_STDERR_CAP: usize = 1 << 20;

/// Why a run did not produce an [`Output`].
#[derive(Debug, Error)]
pub enum RunError {
    /// The program could not be started.
    #[error("{source}")]
    Spawn { source: std::io::Error },
    /// Writing its input or reading its output or status failed.
    #[error("{source}")]
    Io { source: std::io::Error },
    /// It was still running after `after`; it was killed.
    #[error("did not finish within {after:?}")]
    Timeout { after: Duration },
    /// It wrote more than `cap` bytes to standard output; the output is not returned.
    #[error("wrote more than {cap} bytes to standard output")]
    TooMuchOutput { cap: usize },
}

impl RunError {
    /// The error as an `io::Error`, for callers whose error type wraps one (any variant but
    /// a timeout, which callers report on its own).
    pub fn into_io(self) -> std::io::Error {
        match self {
            RunError::Spawn { source } | RunError::Io { source } => source,
            other => std::io::Error::other(other.to_string()),
        }
    }
}

/// A finished run.
#[derive(Debug)]
pub struct Output {
    pub status: ExitStatus,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    /// Standard error went past its cap; `stderr` holds its start.
    pub stderr_truncated: bool,
}

impl Output {
    pub fn stdout_lossy(&self) -> String {
        String::from_utf8_lossy(&self.stdout).into_owned()
    }

    pub fn stderr_lossy(&self) -> String {
        String::from_utf8_lossy(&self.stderr).into_owned()
    }
}

/// One run of a program: its argument vector, optional standard input, timeout and caps.
#[derive(Debug, Clone)]
pub struct Command<'a> {
    argv: Vec<String>,
    stdin: Option<&'a [u8]>,
    /// Set in the child's environment, over what it inherits.
    env: Vec<(String, String)>,
    timeout: Duration,
    stdout_cap: usize,
    stderr_cap: usize,
}

impl<'a> Command<'a> {
    /// `argv[0]` is the program; `timeout` bounds the whole run, spawn to exit.
    pub fn new(argv: Vec<String>, timeout: Duration) -> Self {
        Command {
            argv,
            stdin: None,
            env: Vec::new(),
            timeout,
            stdout_cap: DEFAULT_STDOUT_CAP,
            stderr_cap: DEFAULT_STDERR_CAP,
        }
    }

    /// `program` with `args`, run through `prefix` (e.g. `ip netns exec NS`; empty for none).
    pub fn prefixed<S: AsRef<str>>(
        prefix: &[String],
        program: &str,
        args: &[S],
        timeout: Duration,
    ) -> Self {
        let mut argv = prefix.to_vec();
        argv.push(program.to_string());
        argv.extend(args.iter().map(|a| a.as_ref().to_string()));
        Command::new(argv, timeout)
    }

    /// Feeds `data` on standard input (otherwise it is `/dev/null`).
    pub fn stdin(mut self, data: &'a [u8]) -> Self {
        self.stdin = Some(data);
        self
    }

    /// Sets `vars` in the child's environment (it inherits this process's; later values of
    /// a name win).
    pub fn envs(mut self, vars: impl IntoIterator<Item = (String, String)>) -> Self {
        self.env.extend(vars);
        self
    }

    pub fn stdout_cap(mut self, bytes: usize) -> Self {
        self.stdout_cap = bytes;
        self
    }

    pub fn stderr_cap(mut self, bytes: usize) -> Self {
        self.stderr_cap = bytes;
        self
    }

    pub fn argv(&self) -> &[String] {
        &self.argv
    }

    /// Runs it to the end, or kills it at the timeout (and when the future is dropped).
    pub async fn run(self) -> Result<Output, RunError> {
        let Some((program, args)) = self.argv.split_first() else {
            return Err(RunError::Spawn {
                source: std::io::Error::new(std::io::ErrorKind::InvalidInput, "empty command"),
            });
        };
        let mut cmd = tokio::process::Command::new(program);
        cmd.args(args)
            .envs(self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .stdin(if self.stdin.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        let (input, stdout_cap, stderr_cap) = (self.stdin, self.stdout_cap, self.stderr_cap);
        // kill_on_drop: a child still running when the timeout drops this future is killed.
        let work = async move {
            let mut child = cmd.spawn().map_err(|source| RunError::Spawn { source })?;
            let pipe_in = child.stdin.take();
            let pipe_out = child.stdout.take();
            let pipe_err = child.stderr.take();
            let write = async move {
                if let (Some(mut pipe), Some(data)) = (pipe_in, input) {
                    pipe.write_all(data).await?;
                    // Dropping the pipe closes it: the child sees the end of its input.
                }
                Ok::<_, std::io::Error>(())
            };
            let (wrote, out, err) = tokio::join!(
                write,
                read_capped(pipe_out, stdout_cap),
                read_capped(pipe_err, stderr_cap)
            );
            let io = |source| RunError::Io { source };
            wrote.map_err(io)?;
            let (stdout, stdout_over) = out.map_err(io)?;
            let (stderr, stderr_truncated) = err.map_err(io)?;
            let status = child.wait().await.map_err(io)?;
            if stdout_over {
                return Err(RunError::TooMuchOutput { cap: stdout_cap });
            }
            Ok(Output {
                status,
                stdout,
                stderr,
                stderr_truncated,
            })
        };
        tokio::time::timeout(self.timeout, work)
            .await
            .map_err(|_| RunError::Timeout {
                after: self.timeout,
            })?
    }
}

/// Reads `pipe` to its end, keeping at most `cap` bytes (the rest is read and dropped, so the
/// child never blocks on a full pipe). Returns what was kept and whether anything was dropped.
async fn read_capped<R: AsyncRead + Unpin>(
    pipe: Option<R>,
    cap: usize,
) -> std::io::Result<(Vec<u8>, bool)> {
    let Some(mut pipe) = pipe else {
        return Ok((Vec::new(), false));
    };
    let mut kept = Vec::new();
    let mut over = false;
    let mut chunk = vec![0u8; 64 << 10];
    loop {
        let n = pipe.read(&mut chunk).await?;
        if n == 0 {
            return Ok((kept, over));
        }
        let room = cap.saturating_sub(kept.len());
        kept.extend_from_slice(&chunk[..n.min(room)]);
        over |= n > room;
    }
}

#[cfg(test)]
mod tests;
