//! The OS edge of the nftables backend: the `nft` binary fed one transaction on stdin
//! (`nft -f -`), each run killed after a timeout; and the start-up check that the kernel
//! has what the rules need.

use std::future::Future;
use std::time::Duration;

use plumbing::process::{self, RunError};
use thiserror::Error;

use super::names::TABLE;
use super::render::family_word;
use crate::model::IpFamily;

#[derive(Debug, Error)]
pub enum Error {
    #[error("failed to run {cmd}: {source}")]
    Spawn {
        cmd: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{cmd} exited with {status}: {stderr}")]
    Failed {
        cmd: String,
        status: String,
        stderr: String,
    },
    #[error("{cmd} did not finish within {after:?}; it was killed")]
    Timeout { cmd: String, after: Duration },
    #[error("injected failure: {0}")]
    Injected(String),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What the nftables proxier needs of the system.
pub trait NftRunner: Send + Sync + 'static {
    /// Applies `text` as one transaction (`nft -f -`): all of it, or nothing.
    fn apply(&self, text: &str) -> impl Future<Output = Result<()>> + Send;

    /// Checks `text` without applying it (`nft --check -f -`): the kernel validates it.
    fn check(&self, text: &str) -> impl Future<Output = Result<()>> + Send;

    /// `nft list <what…>`, e.g. `["chain", "ip", "kube-proxy", "services"]`.
    fn list(&self, what: &[&str]) -> impl Future<Output = Result<String>> + Send;
}

/// Kill a run after 60 s plus 30 s per MiB of transaction (as the iptables runner).
pub fn command_timeout(stdin_bytes: usize) -> Duration {
    Duration::from_secs(60) + Duration::from_secs(30 * (stdin_bytes as u64 / (1 << 20)))
}

/// Runs the `nft` binary (optionally through a prefix such as `ip netns exec NS`).
#[derive(Clone, Debug, Default)]
pub struct ExecNft {
    prefix: Vec<String>,
    timeout: Option<Duration>,
}

impl ExecNft {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn with_prefix(mut self, prefix: Vec<String>) -> Self {
        self.prefix = prefix;
        self
    }

    pub fn with_timeout(mut self, after: Duration) -> Self {
        self.timeout = Some(after);
        self
    }

    async fn run(&self, args: &[&str], stdin: Option<&str>) -> Result<String> {
        let mut all: Vec<&str> = self.prefix.iter().map(String::as_str).collect();
        all.push("nft");
        all.extend_from_slice(args);
        let cmd_line = all.join(" ");
        let after = self
            .timeout
            .unwrap_or_else(|| command_timeout(stdin.map_or(0, str::len)));
        let mut cmd = process::Command::new(all.iter().map(|a| a.to_string()).collect(), after);
        if let Some(data) = stdin {
            cmd = cmd.stdin(data.as_bytes());
        }
        let out = cmd.run().await.map_err(|e| match e {
            RunError::Timeout { after } => Error::Timeout {
                cmd: cmd_line.clone(),
                after,
            },
            e => Error::Spawn {
                cmd: cmd_line.clone(),
                source: e.into_io(),
            },
        })?;
        if out.status.success() {
            Ok(out.stdout_lossy())
        } else {
            let mut stderr = out.stderr_lossy().trim().to_string();
            // A failed command quotes the transaction's offending line: enough of it.
            if stderr.len() > 4096 {
                let mut cut = 4096;
                while !stderr.is_char_boundary(cut) {
                    cut -= 1;
                }
                stderr.truncate(cut);
                stderr.push_str(" …");
            }
            Err(Error::Failed {
                cmd: cmd_line,
                status: out.status.to_string(),
                stderr,
            })
        }
    }
}

impl NftRunner for ExecNft {
    async fn apply(&self, text: &str) -> Result<()> {
        self.run(&["-f", "-"], Some(text)).await.map(drop)
    }

    async fn check(&self, text: &str) -> Result<()> {
        self.run(&["--check", "-f", "-"], Some(text))
            .await
            .map(drop)
    }

    async fn list(&self, what: &[&str]) -> Result<String> {
        let mut args = vec!["list"];
        args.extend_from_slice(what);
        self.run(&args, None).await
    }
}

/// Why this system cannot run the nftables mode, in words an operator can act on.
#[derive(Debug, Error)]
pub enum Unsupported {
    #[error("the nft binary cannot be run ({0}); install the nftables package")]
    NoBinary(String),
    #[error(
        "the kernel lacks nf_tables for the {family} family ({detail}); load nf_tables (modprobe nf_tables) or use --proxy-mode=iptables"
    )]
    NoFamily {
        family: &'static str,
        detail: String,
    },
    #[error(
        "the kernel cannot load balance with `numgen random` ({0}); load nft_numgen (modprobe nft_numgen) or use --proxy-mode=iptables"
    )]
    NoNumgen(String),
}

/// Checks, without changing anything, that the kernel takes a table of `family` and a
/// `numgen random` verdict map (upstream's nftables support check).
pub async fn check_support<R: NftRunner>(
    runner: &R,
    family: IpFamily,
) -> std::result::Result<(), Unsupported> {
    let f = family_word(family);
    let probe = format!("{TABLE}-probe");
    let table = format!("add table {f} {probe}\nadd chain {f} {probe} c\n");
    let detail = |e: Error| match e {
        Error::Failed { stderr, .. } => stderr,
        other => other.to_string(),
    };
    if let Err(e) = runner.check(&table).await {
        return Err(match e {
            Error::Spawn { source, .. } => Unsupported::NoBinary(source.to_string()),
            e => Unsupported::NoFamily {
                family: f,
                detail: detail(e),
            },
        });
    }
    let numgen = format!(
        "{table}add rule {f} {probe} c numgen random mod 2 vmap {{ 0 : accept, 1 : drop }}\n"
    );
    runner
        .check(&numgen)
        .await
        .map_err(|e| Unsupported::NoNumgen(detail(e)))
}
