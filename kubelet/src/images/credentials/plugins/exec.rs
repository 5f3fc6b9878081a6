//! The OS edge of credential provider plugins: run `<bin dir>/<name> args...` with the
//! request on standard input and the provider's `env` over the kubelet's environment, kill
//! it at the timeout, keep a bounded answer.

use std::path::PathBuf;
use std::time::Duration;

/// A plugin's answer is a small JSON document; more than this is a broken or hostile plugin.
pub const STDOUT_CAP: usize = 1 << 20;
/// What is kept of its standard error for the error message.
pub const STDERR_CAP: usize = 4 << 10;

/// One run of a plugin.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Invocation {
    pub program: PathBuf,
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
    pub stdin: Vec<u8>,
    pub timeout: Duration,
}

/// Why a run gave no answer; the text is upstream's cause (`exit status 1`, `context
/// deadline exceeded`) followed by what the plugin wrote to standard error.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{cause}: {stderr}")]
pub struct ExecError {
    pub cause: String,
    pub stderr: String,
}

/// Runs plugins.
#[async_trait::async_trait]
pub trait PluginExec: Send + Sync + 'static {
    /// The plugin's standard output when it exits 0.
    async fn run(&self, inv: Invocation) -> Result<Vec<u8>, ExecError>;
}

/// Runs them as child processes.
#[derive(Debug, Default, Clone, Copy)]
pub struct ProcessExec;

#[async_trait::async_trait]
impl PluginExec for ProcessExec {
    async fn run(&self, inv: Invocation) -> Result<Vec<u8>, ExecError> {
        let mut argv = vec![inv.program.to_string_lossy().into_owned()];
        argv.extend(inv.args);
        let out = plumbing::process::Command::new(argv, inv.timeout)
            .stdin(&inv.stdin)
            .envs(inv.env)
            .stdout_cap(STDOUT_CAP)
            .stderr_cap(STDERR_CAP)
            .run()
            .await
            .map_err(|e| ExecError {
                cause: match e {
                    plumbing::process::RunError::Timeout { .. } => {
                        "context deadline exceeded".to_string()
                    }
                    other => other.to_string(),
                },
                stderr: String::new(),
            })?;
        if !out.status.success() {
            let cause = match out.status.code() {
                Some(c) => format!("exit status {c}"),
                None => format!("{}", out.status),
            };
            return Err(ExecError {
                cause,
                stderr: out.stderr_lossy(),
            });
        }
        Ok(out.stdout)
    }
}
