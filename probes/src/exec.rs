//! The exec probe: run a command in the container (through the CRI, via [`ExecRunner`]).
//!
//! Upstream (`pkg/probe/exec`): exit code 0 is success, any other exit code is failure, and the
//! output is stdout+stderr capped at 10 KiB. A timeout is a failure (the `ExecProbeTimeout`
//! behaviour, on by default) whose output is the timeout error text; any other error leaves
//! the result unknown (the prober retries and then discards it).

use std::time::Duration;

use futures::future::BoxFuture;

use crate::outcome::ProbeOutcome;

/// Upstream `maxReadLength`: at most 10 KiB of command output is kept.
pub const MAX_EXEC_OUTPUT: usize = 10 * 1024;

/// Extra time given to the runner past the probe timeout before we stop waiting for it: the
/// runner (CRI `ExecSync`) is expected to enforce `timeout` itself.
const RUNNER_GRACE: Duration = Duration::from_secs(1);

/// Output of a command run to completion inside a container.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ExecOutput {
    pub exit_code: i32,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
}

/// Why a command could not be run to completion.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum ExecError {
    /// The command did not finish within the timeout.
    #[error("command {command:?} timed out")]
    Timeout { command: String },
    /// The runtime could not run the command (container gone, CRI error, ...).
    #[error("{0}")]
    Runtime(String),
}

/// Runs a command synchronously inside a container; the kubelet implements it with CRI
/// `ExecSync`. Implementations should stop the command after `timeout` and return
/// [`ExecError::Timeout`].
pub trait ExecRunner: Send + Sync {
    fn exec_sync(
        &self,
        container_id: &str,
        cmd: &[String],
        timeout: Duration,
    ) -> BoxFuture<'_, Result<ExecOutput, ExecError>>;
}

/// Runs an exec probe.
pub async fn probe(
    runner: &dyn ExecRunner,
    container_id: &str,
    cmd: &[String],
    timeout: Duration,
) -> ProbeOutcome {
    let joined = cmd.join(" ");
    let res = tokio::time::timeout(
        timeout + RUNNER_GRACE,
        runner.exec_sync(container_id, cmd, timeout),
    )
    .await
    .unwrap_or(Err(ExecError::Timeout { command: joined }));
    match res {
        Ok(out) => {
            let mut data = out.stdout;
            data.extend_from_slice(&out.stderr);
            data.truncate(MAX_EXEC_OUTPUT);
            let output = String::from_utf8_lossy(&data).into_owned();
            tracing::trace!(container_id, exit_code = out.exit_code, output = %output, "exec probe response");
            if out.exit_code == 0 {
                ProbeOutcome::success(output)
            } else {
                ProbeOutcome::failure(output)
            }
        }
        Err(err @ ExecError::Timeout { .. }) => ProbeOutcome::failure(err.to_string()),
        Err(err) => ProbeOutcome::unknown(err.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::outcome::ProbeResult;
    use std::sync::Mutex;

    /// A fake runner: returns a canned answer, or never finishes when `hang` is set.
    struct Fake {
        answer: Result<ExecOutput, ExecError>,
        hang: bool,
        seen: Mutex<Vec<(String, Vec<String>, Duration)>>,
    }

    impl Fake {
        fn new(answer: Result<ExecOutput, ExecError>) -> Self {
            Fake {
                answer,
                hang: false,
                seen: Mutex::new(Vec::new()),
            }
        }
    }

    impl ExecRunner for Fake {
        fn exec_sync(
            &self,
            container_id: &str,
            cmd: &[String],
            timeout: Duration,
        ) -> BoxFuture<'_, Result<ExecOutput, ExecError>> {
            self.seen
                .lock()
                .unwrap()
                .push((container_id.to_string(), cmd.to_vec(), timeout));
            Box::pin(async move {
                if self.hang {
                    std::future::pending::<()>().await;
                }
                self.answer.clone()
            })
        }
    }

    fn cmd() -> Vec<String> {
        vec!["cat".to_string(), "/tmp/healthy".to_string()]
    }

    #[tokio::test]
    async fn exit_zero_is_success_with_combined_output() {
        let fake = Fake::new(Ok(ExecOutput {
            exit_code: 0,
            stdout: b"out ".to_vec(),
            stderr: b"err".to_vec(),
        }));
        let o = probe(&fake, "cid", &cmd(), Duration::from_secs(3)).await;
        assert_eq!(o, ProbeOutcome::success("out err"));
        let seen = fake.seen.lock().unwrap();
        assert_eq!(seen[0], ("cid".to_string(), cmd(), Duration::from_secs(3)));
    }

    #[tokio::test]
    async fn nonzero_exit_is_failure() {
        let fake = Fake::new(Ok(ExecOutput {
            exit_code: 1,
            stdout: b"no such file".to_vec(),
            stderr: vec![],
        }));
        let o = probe(&fake, "cid", &cmd(), Duration::from_secs(1)).await;
        assert_eq!(o, ProbeOutcome::failure("no such file"));
    }

    #[tokio::test]
    async fn output_is_capped_at_10k() {
        let fake = Fake::new(Ok(ExecOutput {
            exit_code: 0,
            stdout: vec![b'a'; 20_000],
            stderr: b"tail".to_vec(),
        }));
        let o = probe(&fake, "cid", &cmd(), Duration::from_secs(1)).await;
        assert_eq!(o.output.len(), MAX_EXEC_OUTPUT);
    }

    #[tokio::test]
    async fn runner_timeout_is_failure() {
        let fake = Fake::new(Err(ExecError::Timeout {
            command: "cat /tmp/healthy".into(),
        }));
        let o = probe(&fake, "cid", &cmd(), Duration::from_secs(1)).await;
        assert_eq!(o.result, ProbeResult::Failure);
        assert_eq!(o.output, r#"command "cat /tmp/healthy" timed out"#);
    }

    #[tokio::test(start_paused = true)]
    async fn hung_runner_times_out_as_failure() {
        let mut fake = Fake::new(Ok(ExecOutput::default()));
        fake.hang = true;
        let start = tokio::time::Instant::now();
        let o = probe(&fake, "cid", &cmd(), Duration::from_secs(2)).await;
        assert_eq!(o.result, ProbeResult::Failure);
        assert!(o.output.contains("timed out"), "{}", o.output);
        assert_eq!(start.elapsed(), Duration::from_secs(2) + RUNNER_GRACE);
    }

    #[tokio::test]
    async fn runtime_error_is_unknown() {
        let fake = Fake::new(Err(ExecError::Runtime("container not found".into())));
        let o = probe(&fake, "cid", &cmd(), Duration::from_secs(1)).await;
        assert_eq!(o, ProbeOutcome::unknown("container not found"));
    }
}
