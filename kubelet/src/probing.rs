//! The kubelet's side of the `probes` crate: exec probes run through the CRI's ExecSync.

use crate::runtime::{Runtime, RuntimeError};
use futures::future::BoxFuture;
use probes::{ExecError, ExecOutput, ExecRunner};
use std::sync::Arc;
use std::time::Duration;

/// Runs exec probes with CRI ExecSync.
pub struct CriExec(pub Arc<dyn Runtime>);

impl ExecRunner for CriExec {
    fn exec_sync(
        &self,
        container_id: &str,
        cmd: &[String],
        timeout: Duration,
    ) -> BoxFuture<'_, Result<ExecOutput, ExecError>> {
        let id = container_id.to_string();
        let cmd = cmd.to_vec();
        Box::pin(async move {
            match self.0.exec_sync(&id, &cmd, timeout).await {
                Ok(r) => Ok(ExecOutput {
                    exit_code: r.exit_code,
                    stdout: r.stdout,
                    stderr: r.stderr,
                }),
                // The runtime enforces the timeout and reports it as DeadlineExceeded.
                Err(RuntimeError::Call { message, .. })
                    if message.starts_with("DeadlineExceeded") =>
                {
                    Err(ExecError::Timeout {
                        command: cmd.join(" "),
                    })
                }
                Err(e) => Err(ExecError::Runtime(e.to_string())),
            }
        })
    }
}
