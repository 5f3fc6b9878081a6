//! Container log rotation, as upstream's ContainerLogManager (pkg/kubelet/logs): every
//! `containerLogMonitorInterval` the running containers are listed, and `containerLogMaxWorkers`
//! workers look at each one's CRI log file. A file of at least `containerLogMaxSize` bytes is
//! rotated ([`rotate`]): leftovers of an interrupted rotation go, the oldest rotated files go
//! until `containerLogMaxFiles - 2` remain, those are gzipped, the current file is renamed to
//! `<log>.<YYYYMMDD-hhmmss>` (the kubelet's local time) and the runtime is asked to reopen
//! it (CRI `ReopenContainerLog`); when that fails the file is renamed back. So a container
//! keeps at most `containerLogMaxFiles` files: the current one, the newest rotated one
//! (uncompressed, so readers can finish it) and older ones as `.gz`.
//!
//! [`clean`] removes a container's files (the current and rotated ones) before the kubelet
//! removes the container, as upstream's Clean. File work runs on the blocking pool.

pub mod links;
pub mod rotate;
pub mod settings;

use crate::runtime::{ContainerState, Runtime, RuntimeError};
use futures::StreamExt;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

pub use links::Links;
pub use rotate::{Outcome, Plan, plan};

/// A failed rotation or clean-up of one container's logs.
#[derive(Debug, thiserror::Error)]
pub enum LogError {
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
    #[error("failed to {what} {path:?}: {source}")]
    Io {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("failed to reopen container log {id:?}: {source}")]
    Reopen {
        id: String,
        #[source]
        source: RuntimeError,
    },
    #[error("no container log symlink: the {what} {value:?} is not a plain name")]
    LinkName { what: &'static str, value: String },
    #[error("log file work did not finish: {0}")]
    Join(String),
}

pub type Result<T, E = LogError> = std::result::Result<T, E>;

/// The rotation settings (`containerLogMaxSize`, `containerLogMaxFiles`,
/// `containerLogMaxWorkers`, `containerLogMonitorInterval`), validated as upstream.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Settings {
    /// Bytes; a negative size turns rotation off, as upstream.
    pub max_size: i64,
    pub max_files: usize,
    pub max_workers: usize,
    #[serde(with = "plumbing::duration::serde_opt_plain")]
    pub monitor_interval: Duration,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            max_size: 10 * 1024 * 1024,
            max_files: 5,
            max_workers: 1,
            monitor_interval: Duration::from_secs(10),
        }
    }
}

impl Settings {
    /// Validates the four settings as upstream's validation and NewContainerLogManager do
    /// (the error texts are theirs). `None` means unset (upstream's defaults: 10Mi, 5, 1, 10s).
    pub fn new(
        max_size: Option<&str>,
        max_files: Option<i64>,
        max_workers: Option<i64>,
        monitor_interval: Option<Duration>,
    ) -> Result<Settings, String> {
        let d = Settings::default();
        let workers = max_workers.unwrap_or(d.max_workers as i64);
        if workers < 1 {
            return Err("containerLogMaxWorkers must be greater than or equal to 1".into());
        }
        let interval = monitor_interval.unwrap_or(d.monitor_interval);
        if interval < Duration::from_secs(3) {
            return Err("containerLogMonitorInterval must be a positive time duration greater than or equal to 3s".into());
        }
        let files = max_files.unwrap_or(d.max_files as i64);
        if files <= 1 {
            return Err(format!("invalid MaxFiles {files}, must be > 1"));
        }
        let max_size = match max_size {
            None => d.max_size,
            Some(s) => {
                let v = plumbing::quantity::parse_value(s)
                    .map_err(|e| format!("failed to parse container log max size {s:?}: {e}"))?;
                i64::try_from(v).map_err(|_| {
                    format!("failed to parse container log max size {s:?}: invalid max log size")
                })?
            }
        };
        Ok(Settings {
            max_size,
            max_files: files as usize,
            max_workers: workers as usize,
            monitor_interval: interval,
        })
    }

    /// False when `containerLogMaxSize` is negative (upstream then runs no manager).
    pub fn enabled(&self) -> bool {
        self.max_size >= 0
    }
}

/// The log rotation loop; owned by the app's task set.
pub struct Manager {
    runtime: Arc<dyn Runtime>,
    settings: Settings,
    /// Each running container's log path: it never changes during a container's life, so
    /// ContainerStatus is asked once per container instead of every round (upstream asks
    /// every round: 11 calls a second at 110 pods).
    paths: std::sync::Mutex<HashMap<String, String>>,
}

impl Manager {
    pub fn new(runtime: Arc<dyn Runtime>, settings: Settings) -> Manager {
        Manager {
            runtime,
            settings,
            paths: Default::default(),
        }
    }

    fn paths(&self) -> std::sync::MutexGuard<'_, HashMap<String, String>> {
        self.paths.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The container's log path, from the cache or ContainerStatus.
    async fn log_path(&self, id: &str) -> Result<String> {
        if let Some(p) = self.paths().get(id) {
            return Ok(p.clone());
        }
        let path = self.runtime.container_status(id).await?.log_path;
        self.paths().insert(id.to_string(), path.clone());
        Ok(path)
    }

    /// Every monitor interval, looks at every running container's log until `cancel` fires.
    pub async fn run(self, cancel: CancellationToken) {
        if !self.settings.enabled() {
            tracing::info!("container log rotation is off (containerLogMaxSize is negative)");
            return;
        }
        tracing::info!(
            workers = self.settings.max_workers,
            monitor_period = ?self.settings.monitor_interval,
            "Initializing container log rotate workers"
        );
        let zone = match tokio::task::spawn_blocking(rotate::local_zone).await {
            Ok(z) => z,
            Err(_) => jiff::tz::TimeZone::UTC,
        };
        loop {
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = self.rotate_all(&zone) => {}
            }
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = tokio::time::sleep(self.settings.monitor_interval) => {}
            }
        }
    }

    /// One round: every running container, `max_workers` at a time.
    pub async fn rotate_all(&self, zone: &jiff::tz::TimeZone) {
        let containers = match self.runtime.list_containers().await {
            Ok(c) => c,
            Err(e) => {
                tracing::error!(error = %e, "Failed to rotate container logs: failed to list containers");
                return;
            }
        };
        // Only running containers write; a stopped one keeps its last file as it is.
        let ids: Vec<String> = containers
            .into_iter()
            .filter(|c| c.state == ContainerState::Running)
            .map(|c| c.id)
            .collect();
        self.paths().retain(|id, _| ids.contains(id));
        futures::stream::iter(ids)
            .for_each_concurrent(self.settings.max_workers, |id| async move {
                match self.rotate_one(&id, zone).await {
                    Ok(Outcome::Rotated { path, rotated }) => {
                        tracing::debug!(container = %id, path = %path.display(), rotated = %rotated.display(), "rotated container log");
                    }
                    Ok(_) => {}
                    Err(e) => {
                        tracing::error!(error = %e, container = %id, "Failed to rotate log for container");
                    }
                }
            })
            .await;
    }

    /// Looks at one container's log and rotates it when it reached the size limit.
    pub async fn rotate_one(&self, id: &str, zone: &jiff::tz::TimeZone) -> Result<Outcome> {
        let log_path = self.log_path(id).await?;
        if log_path.is_empty() {
            return Ok(Outcome::NoLog);
        }
        let path = PathBuf::from(&log_path);
        let size = match blocking_size(&path).await? {
            Some(n) => n,
            None => {
                // Gone (a rotation interrupted after the rename): the runtime makes a new one.
                self.runtime.reopen_container_log(id).await?;
                blocking_size(&path).await?.ok_or_else(|| LogError::Io {
                    what: "stat container log after reopen",
                    path: path.clone(),
                    source: std::io::ErrorKind::NotFound.into(),
                })?
            }
        };
        if (size as i128) < i128::from(self.settings.max_size) {
            return Ok(Outcome::Small);
        }
        let rotated = rotate::rotated_name(&path, jiff::Timestamp::now(), zone);
        {
            let (path, rotated, max_files) =
                (path.clone(), rotated.clone(), self.settings.max_files);
            blocking(move || rotate::prepare_and_rename(&path, &rotated, max_files)).await?;
        }
        if let Err(e) = self.runtime.reopen_container_log(id).await {
            // Renamed back, so the next round tries again (upstream does the same).
            let (from, to) = (rotated.clone(), path.clone());
            if let Err(re) = blocking(move || rotate::rename(&from, &to)).await {
                tracing::error!(error = %re, container = %id, "Failed to rename rotated log back");
            }
            return Err(LogError::Reopen {
                id: id.to_string(),
                source: e,
            });
        }
        Ok(Outcome::Rotated { path, rotated })
    }
}

async fn blocking<T: Send + 'static>(f: impl FnOnce() -> Result<T> + Send + 'static) -> Result<T> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| LogError::Join(e.to_string()))?
}

async fn blocking_size(path: &Path) -> Result<Option<u64>> {
    let p = path.to_path_buf();
    // The file itself: a symlink planted under the log's name is not sized by its target.
    blocking(move || match std::fs::symlink_metadata(&p) {
        Ok(m) => Ok(Some(m.len())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(LogError::Io {
            what: "stat container log",
            path: p,
            source,
        }),
    })
    .await
}

/// Removes every log file of container `id` (`<log path>*`: the current file and the rotated
/// ones), as upstream's Clean before a container is removed.
pub async fn clean(runtime: &dyn Runtime, id: &str) -> Result<()> {
    let status = runtime.container_status(id).await?;
    if status.log_path.is_empty() {
        return Ok(());
    }
    let path = PathBuf::from(status.log_path);
    blocking(move || rotate::remove_all(&path)).await
}

#[cfg(test)]
mod tests;
