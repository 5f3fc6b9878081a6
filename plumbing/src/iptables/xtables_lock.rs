//! One iptables command at a time: this process's own turn-taking plus the node's xtables lock.
//!
//! With the nf_tables backend, two `iptables-restore` processes committing at once into one
//! network namespace make the one that has to retry fail ("CHAIN_USER_ADD failed (File
//! exists)"), even across IP families. So every iptables, iptables-save and iptables-restore
//! this process runs takes its turn through one [`XtablesGate`] (both families, and both
//! roles when the kubelet hosts the proxy). While it holds the turn it also holds the node's
//! xtables lock (`flock` on `/run/xtables.lock`, or `$XTABLES_LOCKFILE`), as upstream's
//! iptables utility does, so other agents on the node that honour that lock wait too, unless
//! the binary about to run takes that lock itself (iptables-legacy with `-w`): holding it here
//! then would make the child wait for us.
//!
//! [`Gated`] puts any [`IptablesRunner`] behind a gate.

use std::fs::{File, OpenOptions, TryLockError};
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use tokio::sync::{Mutex, OwnedMutexGuard};
use tokio::time::Instant;

use super::{Error, IptablesRunner, IptablesVersion, Position, Result, TableName};
use crate::cidr::IpFamily;

/// Where iptables keeps its lock unless `XTABLES_LOCKFILE` says otherwise.
pub const DEFAULT_LOCK_PATH: &str = "/run/xtables.lock";

/// How long to wait for another process to release the xtables lock (iptables' own `-w 5`).
pub const LOCK_WAIT: Duration = Duration::from_secs(5);

const LOCK_POLL: Duration = Duration::from_millis(100);

#[derive(Debug)]
struct GateInner {
    turn: Arc<Mutex<()>>,
    lock_path: Option<PathBuf>,
    wait: Duration,
}

/// Turn-taking for iptables commands; clones share the turn.
#[derive(Clone, Debug)]
pub struct XtablesGate {
    inner: Arc<GateInner>,
}

/// Held while one command runs: the process's turn and, when taken, the xtables lock.
#[derive(Debug)]
pub struct GateGuard {
    _turn: OwnedMutexGuard<()>,
    _lock: Option<File>,
}

impl XtablesGate {
    /// The gate every runner of this process shares, with the node's xtables lock.
    pub fn process() -> XtablesGate {
        static GATE: OnceLock<XtablesGate> = OnceLock::new();
        GATE.get_or_init(|| {
            let path = std::env::var_os("XTABLES_LOCKFILE")
                .filter(|p| !p.is_empty())
                .map_or_else(|| PathBuf::from(DEFAULT_LOCK_PATH), PathBuf::from);
            XtablesGate::new(Some(path), LOCK_WAIT)
        })
        .clone()
    }

    /// A gate of its own (tests): `lock_path` None takes turns without a lock file.
    pub fn new(lock_path: Option<PathBuf>, wait: Duration) -> XtablesGate {
        XtablesGate {
            inner: Arc::new(GateInner {
                turn: Arc::new(Mutex::new(())),
                lock_path,
                wait,
            }),
        }
    }

    pub fn lock_path(&self) -> Option<&Path> {
        self.inner.lock_path.as_deref()
    }

    /// Waits for this process's turn, then (when `file_lock`) for the xtables lock.
    pub async fn enter(&self, file_lock: bool) -> Result<GateGuard> {
        let turn = self.inner.turn.clone().lock_owned().await;
        let lock = match (&self.inner.lock_path, file_lock) {
            (Some(path), true) => Some(acquire(path, self.inner.wait).await?),
            _ => None,
        };
        Ok(GateGuard {
            _turn: turn,
            _lock: lock,
        })
    }
}

/// Upstream's grabIptablesLocks: open (creating, 0600) and poll a non-blocking exclusive
/// flock until `wait` runs out. Closing the file releases it.
async fn acquire(path: &Path, wait: Duration) -> Result<File> {
    let lock_err = |reason: String| Error::Lock {
        path: path.display().to_string(),
        reason,
    };
    let owned = path.to_path_buf();
    let file = tokio::task::spawn_blocking(move || {
        use std::os::unix::fs::OpenOptionsExt;
        OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(owned)
    })
    .await
    .map_err(|e| lock_err(e.to_string()))?
    .map_err(|e| lock_err(e.to_string()))?;
    let deadline = Instant::now() + wait;
    loop {
        match file.try_lock() {
            Ok(()) => return Ok(file),
            Err(TryLockError::WouldBlock) if Instant::now() < deadline => {
                tokio::time::sleep(LOCK_POLL).await;
            }
            Err(TryLockError::WouldBlock) => {
                return Err(lock_err(format!(
                    "another process held it for more than {wait:?}"
                )));
            }
            Err(TryLockError::Error(e)) => return Err(lock_err(e.to_string())),
        }
    }
}

/// An [`IptablesRunner`] whose every call waits for its turn at `gate`.
#[derive(Clone, Debug)]
pub struct Gated<R> {
    inner: R,
    gate: XtablesGate,
}

impl<R: IptablesRunner> Gated<R> {
    pub fn new(inner: R, gate: XtablesGate) -> Self {
        Gated { inner, gate }
    }

    pub fn inner(&self) -> &R {
        &self.inner
    }

    async fn enter(&self) -> Result<GateGuard> {
        self.gate.enter(!self.inner.takes_xtables_lock()).await
    }
}

impl<R: IptablesRunner> IptablesRunner for Gated<R> {
    fn family(&self) -> IpFamily {
        self.inner.family()
    }

    fn takes_xtables_lock(&self) -> bool {
        self.inner.takes_xtables_lock()
    }

    async fn version(&self) -> Result<IptablesVersion> {
        let _turn = self.enter().await?;
        self.inner.version().await
    }

    async fn restore(&self, data: &str, noflush: bool) -> Result<()> {
        let _turn = self.enter().await?;
        self.inner.restore(data, noflush).await
    }

    async fn save(&self, table: TableName) -> Result<String> {
        let _turn = self.enter().await?;
        self.inner.save(table).await
    }

    async fn save_all(&self) -> Result<String> {
        let _turn = self.enter().await?;
        self.inner.save_all().await
    }

    async fn ensure_chain(&self, table: TableName, chain: &str) -> Result<bool> {
        let _turn = self.enter().await?;
        self.inner.ensure_chain(table, chain).await
    }

    async fn chain_exists(&self, table: TableName, chain: &str) -> Result<bool> {
        let _turn = self.enter().await?;
        self.inner.chain_exists(table, chain).await
    }

    async fn ensure_rule(
        &self,
        position: Position,
        table: TableName,
        chain: &str,
        args: &[String],
    ) -> Result<bool> {
        let _turn = self.enter().await?;
        self.inner.ensure_rule(position, table, chain, args).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn holds_the_file_lock_while_a_command_runs() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("xtables.lock");
        let gate = XtablesGate::new(Some(path.clone()), Duration::from_millis(300));
        let guard = gate.enter(true).await.unwrap();
        // Another process (here: another open file description) cannot take it meanwhile.
        let other = File::open(&path).unwrap();
        assert!(matches!(other.try_lock(), Err(TryLockError::WouldBlock)));
        drop(guard);
        other.try_lock().expect("released when the command is done");
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);

        // Held elsewhere past the wait: a clear error naming the file, not a hang.
        let e = gate.enter(true).await.unwrap_err();
        assert!(e.to_string().contains("xtables.lock"), "{e}");
        // A binary that locks by itself runs without our file lock.
        drop(gate.enter(false).await.unwrap());
    }

    #[tokio::test]
    async fn clones_share_the_turn() {
        let gate = XtablesGate::new(None, LOCK_WAIT);
        let other = gate.clone();
        let first = gate.enter(true).await.unwrap();
        let waiting = tokio::spawn(async move { other.enter(true).await.map(|_| ()) });
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!waiting.is_finished(), "second caller waits for the turn");
        drop(first);
        waiting.await.unwrap().unwrap();
    }
}
