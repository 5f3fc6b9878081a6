//! The OS edge: running iptables, iptables-save and iptables-restore.
//!
//! `IptablesRunner` is the narrow trait the syncer uses; `ExecRunner` implements it with
//! `plumbing::process` (optionally prefixed, e.g. `ip netns exec NS`, for tests), and
//! `FakeRunner` (in `fake`) records calls and can inject failures.

use std::future::Future;
use std::time::Duration;

use crate::process::{self, RunError};
use thiserror::Error;
use tracing::info;

use crate::cidr::IpFamily;

#[cfg(any(test, feature = "test-util"))]
pub mod fake;
pub mod xtables_lock;

pub use xtables_lock::{Gated, XtablesGate};

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
    #[error("cannot parse iptables version from {0:?}")]
    Version(String),
    #[error("{cmd} did not finish within {after:?}; it was killed")]
    Timeout { cmd: String, after: Duration },
    #[error("cannot take the xtables lock {path}: {reason}")]
    Lock { path: String, reason: String },
    #[error("injected failure: {0}")]
    Injected(String),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Which kernel interface the iptables binaries drive (the `-nft` or `-legacy` binaries;
/// upstream's iptables-wrapper calls this the mode).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Variant {
    Nft,
    Legacy,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IptablesVersion {
    pub major: u32,
    pub minor: u32,
    pub patch: u32,
    /// From the `(nf_tables)` / `(legacy)` suffix, when present.
    pub variant: Option<Variant>,
}

impl IptablesVersion {
    /// Parses `iptables v1.8.9 (nf_tables)` (or `... v1.6.0`).
    pub fn parse(output: &str) -> Result<IptablesVersion> {
        let err = || Error::Version(output.trim().to_string());
        let start = output.find(" v").ok_or_else(err)? + 2;
        let rest = &output[start..];
        let end = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let mut parts = rest[..end].split('.').map(|p| p.parse::<u32>());
        let major = parts.next().and_then(|r| r.ok()).ok_or_else(err)?;
        let minor = parts.next().and_then(|r| r.ok()).unwrap_or(0);
        let patch = parts.next().and_then(|r| r.ok()).unwrap_or(0);
        let variant = if output.contains("(nf_tables)") {
            Some(Variant::Nft)
        } else if output.contains("(legacy)") {
            Some(Variant::Legacy)
        } else {
            None
        };
        Ok(IptablesVersion {
            major,
            minor,
            patch,
            variant,
        })
    }

    fn at_least(&self, major: u32, minor: u32, patch: u32) -> bool {
        (self.major, self.minor, self.patch) >= (major, minor, patch)
    }

    /// `MASQUERADE --random-fully` exists from 1.6.2.
    pub fn has_random_fully(&self) -> bool {
        self.at_least(1, 6, 2)
    }

    /// Wait flags for `iptables` (upstream's getIPTablesWaitFlag).
    pub fn wait_flags(&self) -> Vec<String> {
        if self.at_least(1, 6, 1) {
            vec!["-w".into(), "5".into(), "-W".into(), "100000".into()]
        } else if self.at_least(1, 4, 22) {
            vec!["-w".into(), "5".into()]
        } else if self.at_least(1, 4, 20) {
            vec!["-w".into()]
        } else {
            Vec::new()
        }
    }

    /// Wait flags for `iptables-restore` (supported from 1.6.2).
    pub fn restore_wait_flags(&self) -> Vec<String> {
        if self.at_least(1, 6, 2) {
            vec!["-w".into(), "5".into(), "-W".into(), "100000".into()]
        } else {
            Vec::new()
        }
    }
}

/// The iptables tables kube-proxy uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum TableName {
    Filter,
    Nat,
    Mangle,
}

impl TableName {
    pub fn as_str(self) -> &'static str {
        match self {
            TableName::Filter => "filter",
            TableName::Nat => "nat",
            TableName::Mangle => "mangle",
        }
    }
}

/// Where `ensure_rule` puts a missing rule.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Position {
    Prepend,
    Append,
}

/// The iptables operations kube-proxy needs, for one IP family.
pub trait IptablesRunner: Send + Sync + 'static {
    fn family(&self) -> IpFamily;

    /// Whether the binaries take the node's xtables lock themselves (iptables-legacy with
    /// `-w`), so a caller must not hold it around them (see [`Gated`]).
    fn takes_xtables_lock(&self) -> bool {
        false
    }

    /// `iptables --version`.
    fn version(&self) -> impl Future<Output = Result<IptablesVersion>> + Send;

    /// Feeds `data` (one or more `*table … COMMIT` blocks) to `iptables-restore`;
    /// `noflush` keeps chains not mentioned in `data`. Counters are never restored.
    fn restore(&self, data: &str, noflush: bool) -> impl Future<Output = Result<()>> + Send;

    /// `iptables-save -t table`.
    fn save(&self, table: TableName) -> impl Future<Output = Result<String>> + Send;

    /// Every table, as plain `iptables-save` prints them (one run where a runner can).
    fn save_all(&self) -> impl Future<Output = Result<String>> + Send {
        async move {
            let mut all = String::new();
            for t in [TableName::Mangle, TableName::Nat, TableName::Filter] {
                all.push_str(&self.save(t).await?);
            }
            Ok(all)
        }
    }

    /// Creates `chain` if missing; returns true if it already existed.
    fn ensure_chain(
        &self,
        table: TableName,
        chain: &str,
    ) -> impl Future<Output = Result<bool>> + Send;

    /// Whether `chain` exists (used to notice that someone flushed our tables).
    fn chain_exists(
        &self,
        table: TableName,
        chain: &str,
    ) -> impl Future<Output = Result<bool>> + Send;

    /// Adds the rule `args` to `chain` unless an identical one exists (`-C`, then `-I`/`-A`);
    /// returns true if it already existed.
    fn ensure_rule(
        &self,
        position: Position,
        table: TableName,
        chain: &str,
        args: &[String],
    ) -> impl Future<Output = Result<bool>> + Send;
}

/// Real runner: spawns the iptables binaries of one variant and family.
#[derive(Clone, Debug)]
pub struct ExecRunner {
    family: IpFamily,
    /// None for the plain `iptables` binaries until `with_version` reads the variant.
    variant: Option<Variant>,
    /// e.g. `["ip", "netns", "exec", "test-ns"]`; empty in production.
    prefix: Vec<String>,
    iptables: String,
    save: String,
    restore: String,
    wait: Vec<String>,
    restore_wait: Vec<String>,
    /// Overrides [`command_timeout`] (tests).
    timeout: Option<Duration>,
}

struct Output {
    status: std::process::ExitStatus,
    stdout: String,
    stderr: String,
}

impl ExecRunner {
    /// Runner using the default binaries (`iptables`, `iptables-save`, `iptables-restore` or
    /// their ip6 forms) with the newest wait flags. Call `with_version` after probing.
    pub fn new(family: IpFamily) -> Self {
        let base = match family {
            IpFamily::V4 => "iptables",
            IpFamily::V6 => "ip6tables",
        };
        let v = IptablesVersion {
            major: 1,
            minor: 8,
            patch: 0,
            variant: None,
        };
        ExecRunner {
            family,
            variant: None,
            prefix: Vec::new(),
            iptables: base.to_string(),
            save: format!("{base}-save"),
            restore: format!("{base}-restore"),
            wait: v.wait_flags(),
            restore_wait: v.restore_wait_flags(),
            timeout: None,
        }
    }

    /// Uses the explicit `-nft`/`-legacy` binaries (e.g. `iptables-nft-restore`).
    pub fn with_variant(mut self, variant: Variant) -> Self {
        let base = match self.family {
            IpFamily::V4 => "iptables",
            IpFamily::V6 => "ip6tables",
        };
        let suffix = match variant {
            Variant::Nft => "nft",
            Variant::Legacy => "legacy",
        };
        self.variant = Some(variant);
        self.iptables = format!("{base}-{suffix}");
        self.save = format!("{base}-{suffix}-save");
        self.restore = format!("{base}-{suffix}-restore");
        self
    }

    /// The same runner (variant, wait flags, prefix) for the other family's binaries, e.g.
    /// `ip6tables-nft-restore` beside `iptables-nft-restore`.
    pub fn for_family(&self, family: IpFamily) -> ExecRunner {
        let base = |f: IpFamily| match f {
            IpFamily::V4 => "iptables",
            IpFamily::V6 => "ip6tables",
        };
        let swap = |bin: &str| {
            let rest = bin.strip_prefix(base(self.family)).unwrap_or(bin);
            format!("{}{rest}", base(family))
        };
        ExecRunner {
            family,
            variant: self.variant,
            prefix: self.prefix.clone(),
            iptables: swap(&self.iptables),
            save: swap(&self.save),
            restore: swap(&self.restore),
            wait: self.wait.clone(),
            restore_wait: self.restore_wait.clone(),
            timeout: self.timeout,
        }
    }

    /// Runs every command through `prefix` (e.g. `ip netns exec NS`).
    pub fn with_prefix(mut self, prefix: Vec<String>) -> Self {
        self.prefix = prefix;
        self
    }

    /// Kills any command still running after `after` (default: [`command_timeout`]).
    pub fn with_timeout(mut self, after: Duration) -> Self {
        self.timeout = Some(after);
        self
    }

    /// Adjusts wait flags to what the installed version supports.
    pub fn with_version(mut self, v: &IptablesVersion) -> Self {
        self.variant = self.variant.or(v.variant);
        self.wait = v.wait_flags();
        self.restore_wait = v.restore_wait_flags();
        self
    }

    /// Runs `program`, killing it if it has not finished within [`command_timeout`].
    async fn run(&self, program: &str, args: &[String], stdin: Option<&str>) -> Result<Output> {
        let (bin, all_args): (&str, Vec<&str>) = match self.prefix.split_first() {
            Some((first, rest)) => {
                let mut a: Vec<&str> = rest.iter().map(String::as_str).collect();
                a.push(program);
                a.extend(args.iter().map(String::as_str));
                (first.as_str(), a)
            }
            None => (program, args.iter().map(String::as_str).collect()),
        };
        let cmd_line = format!("{bin} {}", all_args.join(" "));
        let after = self
            .timeout
            .unwrap_or_else(|| command_timeout(stdin.map_or(0, str::len)));
        let mut argv = vec![bin.to_string()];
        argv.extend(all_args.iter().map(|a| a.to_string()));
        let mut cmd = process::Command::new(argv, after);
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
        Ok(Output {
            status: out.status,
            stdout: out.stdout_lossy(),
            stderr: out.stderr_lossy(),
        })
    }

    async fn run_ok(&self, program: &str, args: &[String], stdin: Option<&str>) -> Result<String> {
        let out = self.run(program, args, stdin).await?;
        if out.status.success() {
            Ok(out.stdout)
        } else {
            Err(Error::Failed {
                cmd: format!("{program} {}", args.join(" ")),
                status: out.status.to_string(),
                stderr: out.stderr.trim().to_string(),
            })
        }
    }

    fn table_args(&self, table: TableName, op: &str, chain: &str) -> Vec<String> {
        let mut a = self.wait.clone();
        a.extend([
            "-t".to_string(),
            table.as_str().to_string(),
            op.to_string(),
            chain.to_string(),
        ]);
        a
    }
}

impl IptablesRunner for ExecRunner {
    fn family(&self) -> IpFamily {
        self.family
    }

    async fn version(&self) -> Result<IptablesVersion> {
        let out = self
            .run_ok(&self.iptables, &["--version".to_string()], None)
            .await?;
        IptablesVersion::parse(&out)
    }

    fn takes_xtables_lock(&self) -> bool {
        // Unknown variant: assume it may lock, since holding the lock around a binary that
        // waits for it would stall every command.
        self.variant != Some(Variant::Nft) && !self.restore_wait.is_empty()
    }

    async fn restore(&self, data: &str, noflush: bool) -> Result<()> {
        let mut args = self.restore_wait.clone();
        if noflush {
            args.push("--noflush".into());
        }
        match self.run_ok(&self.restore, &args, Some(data)).await {
            // iptables-nft-restore that lost a commit race with another process retries
            // internally and then fails on the chains it declared; the transaction was
            // aborted as a whole, so running it once more is safe.
            Err(Error::Failed { stderr, .. }) if is_lost_commit_race(&stderr) => {
                info!(
                    cmd = %self.restore,
                    "restore lost a commit race with another process (chain exists); retrying once"
                );
                self.run_ok(&self.restore, &args, Some(data))
                    .await
                    .map(|_| ())
            }
            other => other.map(|_| ()),
        }
    }

    async fn save(&self, table: TableName) -> Result<String> {
        self.run_ok(
            &self.save,
            &["-t".to_string(), table.as_str().to_string()],
            None,
        )
        .await
    }

    async fn save_all(&self) -> Result<String> {
        self.run_ok(&self.save, &[], None).await
    }

    async fn ensure_chain(&self, table: TableName, chain: &str) -> Result<bool> {
        let out = self
            .run(&self.iptables, &self.table_args(table, "-N", chain), None)
            .await?;
        if out.status.success() {
            return Ok(false);
        }
        // Exit status 1 with "Chain already exists" is the "it was there" answer.
        if out.status.code() == Some(1) && out.stderr.contains("already exists") {
            return Ok(true);
        }
        Err(Error::Failed {
            cmd: format!("{} -t {} -N {chain}", self.iptables, table.as_str()),
            status: out.status.to_string(),
            stderr: out.stderr.trim().to_string(),
        })
    }

    async fn chain_exists(&self, table: TableName, chain: &str) -> Result<bool> {
        let out = self
            .run(&self.iptables, &self.table_args(table, "-S", chain), None)
            .await?;
        Ok(out.status.success())
    }

    async fn ensure_rule(
        &self,
        position: Position,
        table: TableName,
        chain: &str,
        args: &[String],
    ) -> Result<bool> {
        let mut check = self.table_args(table, "-C", chain);
        check.extend(args.iter().cloned());
        let out = self.run(&self.iptables, &check, None).await?;
        if out.status.success() {
            return Ok(true);
        }
        let op = match position {
            Position::Prepend => "-I",
            Position::Append => "-A",
        };
        let mut add = self.table_args(table, op, chain);
        add.extend(args.iter().cloned());
        self.run_ok(&self.iptables, &add, None).await.map(|_| false)
    }
}

/// How long one command may run: a minute, plus half a minute per MiB fed to a restore
/// (iptables-nft-restore loads ~10 MiB, 10k services, in under two minutes here).
pub fn command_timeout(stdin_bytes: usize) -> Duration {
    const MIB: u64 = 1 << 20;
    Duration::from_secs(60 + 30 * (stdin_bytes as u64).div_ceil(MIB))
}

/// iptables-nft-restore's failure after it lost a race with another process's commit.
fn is_lost_commit_race(stderr: &str) -> bool {
    stderr.contains("CHAIN_USER_ADD failed (File exists)")
}

/// How the system's iptables variant was chosen.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VariantDecision {
    pub variant: Variant,
    pub reason: &'static str,
}

fn has_kubelet_chains(save_output: &str) -> bool {
    save_output
        .lines()
        .any(|l| l.starts_with(":KUBE-IPTABLES-HINT") || l.starts_with(":KUBE-KUBELET-CANARY"))
}

fn rule_count(save_output: &str) -> usize {
    save_output.lines().filter(|l| l.starts_with('-')).count()
}

/// The choice upstream's iptables-wrapper makes, as a pure function of save outputs (None =
/// that binary failed or is missing): kubelet's hint chains in the nft mangle table win, then
/// the hint chains in legacy, then whichever variant holds more rules (ties go to nft).
pub fn decide_variant(
    nft_mangle: Option<&str>,
    legacy_all: Option<&str>,
    nft_all: Option<&str>,
) -> VariantDecision {
    if nft_mangle.is_some_and(has_kubelet_chains) {
        return VariantDecision {
            variant: Variant::Nft,
            reason: "kubelet hint chains in iptables-nft",
        };
    }
    if legacy_all.is_some_and(has_kubelet_chains) {
        return VariantDecision {
            variant: Variant::Legacy,
            reason: "kubelet hint chains in iptables-legacy",
        };
    }
    let legacy = legacy_all.map_or(0, rule_count);
    let nft = nft_all.map_or(0, rule_count);
    if legacy > nft {
        VariantDecision {
            variant: Variant::Legacy,
            reason: "more rules in iptables-legacy",
        }
    } else {
        VariantDecision {
            variant: Variant::Nft,
            reason: "default (nft has at least as many rules)",
        }
    }
}

/// Probes the system like iptables-wrapper. `prefix` as in `ExecRunner::with_prefix`.
/// Never writes: legacy-save is run without `-t` so it does not create the mangle table.
pub async fn detect_variant(family: IpFamily, prefix: Vec<String>) -> VariantDecision {
    let nft = ExecRunner::new(family)
        .with_variant(Variant::Nft)
        .with_prefix(prefix.clone());
    let legacy = ExecRunner::new(family)
        .with_variant(Variant::Legacy)
        .with_prefix(prefix);
    let nft_mangle = nft.save(TableName::Mangle).await.ok();
    if nft_mangle.as_deref().is_some_and(has_kubelet_chains) {
        return decide_variant(nft_mangle.as_deref(), None, None);
    }
    let legacy_all = legacy.run_ok(&legacy.save, &[], None).await.ok();
    let nft_all = nft.run_ok(&nft.save, &[], None).await.ok();
    decide_variant(
        nft_mangle.as_deref(),
        legacy_all.as_deref(),
        nft_all.as_deref(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_versions() {
        let v = IptablesVersion::parse("iptables v1.8.9 (nf_tables)\n").unwrap();
        assert_eq!(
            (v.major, v.minor, v.patch, v.variant),
            (1, 8, 9, Some(Variant::Nft))
        );
        assert!(v.has_random_fully());
        let v = IptablesVersion::parse("iptables v1.6.0").unwrap();
        assert_eq!(v.variant, None);
        assert!(!v.has_random_fully());
        assert_eq!(v.wait_flags(), vec!["-w", "5"]);
        assert!(v.restore_wait_flags().is_empty());
        let v = IptablesVersion::parse("ip6tables v1.8.7 (legacy)").unwrap();
        assert_eq!(v.variant, Some(Variant::Legacy));
        assert!(IptablesVersion::parse("garbage").is_err());
    }

    #[test]
    fn other_family_keeps_variant_and_prefix() {
        let prefix = vec!["ip".to_string(), "netns".into(), "exec".into(), "n".into()];
        let v4 = ExecRunner::new(IpFamily::V4)
            .with_variant(Variant::Legacy)
            .with_prefix(prefix.clone());
        let v6 = v4.for_family(IpFamily::V6);
        assert_eq!(v6.family, IpFamily::V6);
        assert_eq!(
            (v6.iptables.as_str(), v6.save.as_str(), v6.restore.as_str()),
            (
                "ip6tables-legacy",
                "ip6tables-legacy-save",
                "ip6tables-legacy-restore"
            )
        );
        assert_eq!(v6.prefix, prefix);
        let back = v6.for_family(IpFamily::V4);
        assert_eq!(back.restore, "iptables-legacy-restore");
        assert_eq!(
            ExecRunner::new(IpFamily::V4)
                .for_family(IpFamily::V6)
                .restore,
            "ip6tables-restore"
        );
    }

    #[test]
    fn variant_decision_follows_iptables_wrapper() {
        let hint = "*mangle\n:KUBE-IPTABLES-HINT - [0:0]\nCOMMIT\n";
        let canary = "*mangle\n:KUBE-KUBELET-CANARY - [0:0]\nCOMMIT\n";
        assert_eq!(decide_variant(Some(hint), None, None).variant, Variant::Nft);
        assert_eq!(
            decide_variant(Some("*mangle\nCOMMIT\n"), Some(canary), None).variant,
            Variant::Legacy
        );
        let many = "-A INPUT -j ACCEPT\n-A OUTPUT -j ACCEPT\n";
        assert_eq!(
            decide_variant(None, Some(many), Some("")).variant,
            Variant::Legacy
        );
        assert_eq!(
            decide_variant(None, Some(""), Some("")).variant,
            Variant::Nft
        );
        assert_eq!(decide_variant(None, None, None).variant, Variant::Nft);
    }
}

#[cfg(test)]
mod exec_tests {
    //! `ExecRunner` against stand-in scripts (through its prefix): no iptables, no root.

    use std::os::unix::fs::PermissionsExt;
    use std::path::Path;

    use super::*;

    /// A stand-in for the binaries: `prefix` runs it with the real command line as arguments.
    fn script(dir: &Path, name: &str, body: &str) -> Vec<String> {
        let path = dir.join(name);
        std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        vec![path.display().to_string()]
    }

    #[tokio::test]
    async fn a_hung_restore_is_killed_after_its_timeout() {
        let dir = tempfile::tempdir().unwrap();
        let pid_file = dir.path().join("pid");
        let hang = script(
            dir.path(),
            "hang",
            &format!("echo $$ > {}; exec sleep 60", pid_file.display()),
        );
        let runner = ExecRunner::new(IpFamily::V4)
            .with_variant(Variant::Nft)
            .with_prefix(hang)
            .with_timeout(Duration::from_millis(300));
        let started = std::time::Instant::now();
        let e = runner.restore("*nat\nCOMMIT\n", true).await.unwrap_err();
        assert!(matches!(e, Error::Timeout { .. }), "{e}");
        assert!(e.to_string().contains("iptables-nft-restore"), "{e}");
        assert!(started.elapsed() < Duration::from_secs(10));
        // The child is gone, not left running.
        let pid = std::fs::read_to_string(&pid_file).unwrap();
        let proc_dir = format!("/proc/{}", pid.trim());
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while Path::new(&proc_dir).exists()
            && std::fs::read_to_string(format!("{proc_dir}/stat"))
                .is_ok_and(|s| !s.contains(") Z "))
            && std::time::Instant::now() < deadline
        {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let alive =
            std::fs::read_to_string(format!("{proc_dir}/stat")).is_ok_and(|s| !s.contains(") Z "));
        assert!(!alive, "the hung restore ({proc_dir}) was not killed");
    }

    #[tokio::test]
    async fn a_restore_that_lost_a_commit_race_runs_once_more() {
        let dir = tempfile::tempdir().unwrap();
        let count = dir.path().join("count");
        // Fails like iptables-nft-restore beside another process's commit, the first time only.
        let flaky = script(
            dir.path(),
            "flaky",
            &format!(
                "cat > /dev/null; echo x >> {c}; if [ $(wc -l < {c}) -eq 1 ]; then \
                 echo 'iptables-nft-restore: line 23: CHAIN_USER_ADD failed (File exists): chain KUBE-SERVICES' >&2; exit 4; fi",
                c = count.display()
            ),
        );
        let runner = ExecRunner::new(IpFamily::V4)
            .with_variant(Variant::Nft)
            .with_prefix(flaky.clone());
        runner.restore("*nat\nCOMMIT\n", true).await.unwrap();
        assert_eq!(std::fs::read_to_string(&count).unwrap().lines().count(), 2);

        // Any other failure is reported as it is, without a second run.
        let failing = script(
            dir.path(),
            "failing",
            &format!(
                "cat > /dev/null; echo x >> {c}; echo 'line 3: RULE_APPEND failed (No such file or directory)' >&2; exit 4",
                c = count.display()
            ),
        );
        std::fs::remove_file(&count).unwrap();
        let runner = runner.with_prefix(failing);
        let e = runner.restore("*nat\nCOMMIT\n", true).await.unwrap_err();
        assert!(e.to_string().contains("RULE_APPEND"), "{e}");
        assert_eq!(std::fs::read_to_string(&count).unwrap().lines().count(), 1);
    }

    #[test]
    fn timeouts_grow_with_the_restore_text() {
        assert_eq!(command_timeout(0), Duration::from_secs(60));
        assert_eq!(command_timeout(1), Duration::from_secs(90));
        // 10k services: an ~11.6 MB restore.
        assert_eq!(
            command_timeout(11_600_000),
            Duration::from_secs(60 + 30 * 12)
        );
    }

    #[test]
    fn who_takes_the_xtables_lock() {
        let nft = ExecRunner::new(IpFamily::V4).with_variant(Variant::Nft);
        assert!(
            !nft.takes_xtables_lock(),
            "iptables-nft ignores the lock file"
        );
        let legacy = ExecRunner::new(IpFamily::V4).with_variant(Variant::Legacy);
        assert!(
            legacy.takes_xtables_lock(),
            "iptables-legacy -w locks by itself"
        );
        let old = IptablesVersion::parse("iptables v1.6.0").unwrap();
        assert!(
            !legacy.with_version(&old).takes_xtables_lock(),
            "restore without -w: the caller must lock, as upstream does"
        );
    }
}
