//! The `/var/log/containers` symlinks log shippers tail (upstream's legacy log symlinks,
//! `kuberuntime/legacy.go`): after a container starts, `<pod>_<namespace>_<container>-<id>.log`
//! points at its CRI log file (the name cut to 255 bytes with the suffix, as upstream); the
//! link goes before the container is removed (by the pod worker or container GC), and every
//! container GC removes dangling `*.log` links except those of containers that have not
//! exited (a rotation briefly leaves a running container's link dangling).
//!
//! Safer than upstream where it matters: a name part that is not a plain name (`/`, `..`,
//! anything outside `[A-Za-z0-9._-]`, an ID outside `[A-Za-z0-9]`) makes no link; every
//! operation goes through the directory opened without following a symlink (a directory
//! swapped for a link is refused, nothing is created or removed elsewhere); an entry already
//! at the name is replaced atomically (upstream keeps it, so a planted link would be shipped
//! as the container's log). The file work is behind [`LinkDir`] (blocking pool).

use super::{LogError, Result, blocking};
use crate::runtime::LABEL_POD_NAMESPACE;
use crate::runtime::{Container, ContainerState, LABEL_CONTAINER_NAME, LABEL_POD_NAME};
use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Upstream's directory (`legacyContainerLogsDir`).
pub const DEFAULT_DIR: &str = "/var/log/containers";
/// Test hook: another directory for the links (the e2e tests run many agents on one host).
/// Not a setting: the agent warns when it is set.
pub const DIR_ENV: &str = "KUBELET_TEST_CONTAINER_LOG_LINKS_DIR";
const SUFFIX: &str = ".log";
/// ext4's longest file name.
const MAX_NAME: usize = 255;

/// The link directory: [`DEFAULT_DIR`], or [`DIR_ENV`]'s (a warning says so).
pub fn dir_from_env() -> PathBuf {
    match std::env::var_os(DIR_ENV).filter(|v| !v.is_empty()) {
        Some(dir) => {
            let dir = PathBuf::from(dir);
            tracing::warn!(dir = %dir.display(), "{DIR_ENV} (a test hook) is set: container log symlinks go there instead of {DEFAULT_DIR}");
            dir
        }
        None => PathBuf::from(DEFAULT_DIR),
    }
}

/// Upstream's link name for a container, or why none is made.
pub fn link_name(pod: &str, namespace: &str, container: &str, id: &str) -> Result<String> {
    for (what, value) in [
        ("pod name", pod),
        ("namespace", namespace),
        ("container name", container),
    ] {
        let plain = value
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b));
        if value.is_empty() || !plain {
            return Err(LogError::LinkName {
                what,
                value: value.to_string(),
            });
        }
    }
    if id.is_empty() || !id.bytes().all(|b| b.is_ascii_alphanumeric()) {
        return Err(LogError::LinkName {
            what: "container ID",
            value: id.to_string(),
        });
    }
    let mut name = format!("{pod}_{namespace}_{container}-{id}");
    // ASCII only (checked above): any byte is a character boundary.
    name.truncate(MAX_NAME - SUFFIX.len());
    name.push_str(SUFFIX);
    Ok(name)
}

/// The container ID (or the start of it, when the name was cut) in a link name, as upstream
/// reads it back: after the last `-`, before `.log`, at least 6 characters.
pub fn id_from_link_name(name: &str) -> Option<&str> {
    let last = name.rsplit('-').next()?;
    let id = last.strip_suffix(SUFFIX)?;
    (id.len() >= 6).then_some(id)
}

/// The dangling links container GC removes: all but those whose container (found by the ID
/// in the name, which may be cut) exists and has not exited.
pub fn links_to_remove(dangling: &[String], containers: &[&Container]) -> Vec<String> {
    dangling
        .iter()
        .filter(|name| {
            let live = id_from_link_name(name).is_some_and(|id| {
                containers
                    .iter()
                    .any(|c| c.id.starts_with(id) && c.state != ContainerState::Exited)
            });
            !live
        })
        .cloned()
        .collect()
}

/// The link directory as the kubelet touches it (an OS edge; blocking).
pub trait LinkDir: Send + Sync + 'static {
    /// Whether `path` (followed) may exist: false only when it is missing, as upstream.
    fn target_exists(&self, path: &Path) -> std::io::Result<bool>;
    /// Makes `name` a symlink to `target`, atomically replacing whatever is there.
    fn link(&self, name: &str, target: &Path) -> std::io::Result<()>;
    /// Removes `name` (never a directory); a missing one is not an error.
    fn remove(&self, name: &str) -> std::io::Result<()>;
    /// The `*.log` symlinks whose target is missing.
    fn dangling(&self) -> std::io::Result<Vec<String>>;
}

/// The real directory, opened for every operation without following a symlink.
pub struct OsLinkDir {
    pub dir: PathBuf,
}

impl OsLinkDir {
    fn open(&self) -> std::io::Result<std::os::fd::OwnedFd> {
        std::fs::create_dir_all(&self.dir)?;
        crate::fs_at::open_dir(&self.dir).map_err(|e| {
            let is_link = std::fs::symlink_metadata(&self.dir).is_ok_and(|m| m.is_symlink());
            if is_link {
                std::io::Error::other(format!(
                    "{} is a symlink: refused (the links stay in a real directory)",
                    self.dir.display()
                ))
            } else {
                e
            }
        })
    }
}

impl LinkDir for OsLinkDir {
    fn target_exists(&self, path: &Path) -> std::io::Result<bool> {
        match std::fs::metadata(path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
            _ => Ok(true),
        }
    }

    fn link(&self, name: &str, target: &Path) -> std::io::Result<()> {
        use std::sync::atomic::{AtomicU64, Ordering};
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let d = self.open()?;
        // Not `*.log`: the sweep never sees it.
        let tmp = format!(
            ".link-{}-{}.tmp",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        crate::fs_at::symlink_at(target, &d, OsStr::new(&tmp))?;
        let renamed = crate::fs_at::rename_at(&d, OsStr::new(&tmp), OsStr::new(name));
        if renamed.is_err() {
            let _ = crate::fs_at::remove_all_at(&d, OsStr::new(&tmp));
        }
        renamed
    }

    fn remove(&self, name: &str) -> std::io::Result<()> {
        use crate::fs_at::{Kind, kind_at, remove_all_at};
        let d = self.open()?;
        match kind_at(&d, OsStr::new(name))? {
            None => Ok(()),
            Some(Kind::Dir) => Err(std::io::Error::other(format!(
                "{name:?} is a directory: not removed"
            ))),
            Some(_) => remove_all_at(&d, OsStr::new(name)),
        }
    }

    fn dangling(&self) -> std::io::Result<Vec<String>> {
        use crate::fs_at::{Kind, entries};
        let d = self.open()?;
        let mut out = Vec::new();
        for (name, kind) in entries(&d)? {
            let Some(name) = name.to_str().filter(|n| n.ends_with(SUFFIX)) else {
                continue;
            };
            if kind != Kind::Symlink {
                continue;
            }
            let followed = nix::sys::stat::fstatat(&d, name, nix::fcntl::AtFlags::empty());
            if followed == Err(nix::errno::Errno::ENOENT) {
                out.push(name.to_string());
            }
        }
        Ok(out)
    }
}

/// The node's container log links; see the module doc.
pub struct Links {
    dir: PathBuf,
    fs: Arc<dyn LinkDir>,
}

fn io_err(what: &'static str, path: PathBuf) -> impl FnOnce(std::io::Error) -> LogError {
    move |source| LogError::Io { what, path, source }
}

impl Links {
    /// Links in `dir` on the real file system.
    pub fn new(dir: PathBuf) -> Links {
        let fs = Arc::new(OsLinkDir { dir: dir.clone() });
        Links { dir, fs }
    }

    /// Links through `fs` (a fake in tests).
    pub fn with(dir: PathBuf, fs: Arc<dyn LinkDir>) -> Links {
        Links { dir, fs }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// After container `id` started: its link to `log` (the sandbox's log directory joined
    /// with the container's log path). None: no log path, or the file is missing (upstream
    /// makes no link that would dangle).
    pub async fn create(
        &self,
        pod: &str,
        namespace: &str,
        container: &str,
        id: &str,
        log: Option<PathBuf>,
    ) -> Result<Option<PathBuf>> {
        let Some(log) = log else {
            return Ok(None);
        };
        let name = link_name(pod, namespace, container, id)?;
        let (fs, path) = (self.fs.clone(), self.dir.join(&name));
        blocking(move || {
            if !fs
                .target_exists(&log)
                .map_err(io_err("stat", log.clone()))?
            {
                return Ok(None);
            }
            fs.link(&name, &log)
                .map_err(io_err("create container log symlink", path.clone()))?;
            Ok(Some(path))
        })
        .await
    }

    /// Before container `id` (with its CRI `labels`) is removed: its link goes. A container
    /// whose labels make no link name had none.
    pub async fn remove(&self, id: &str, labels: &BTreeMap<String, String>) -> Result<()> {
        let label = |k: &str| labels.get(k).map_or("", String::as_str);
        let Ok(name) = link_name(
            label(LABEL_POD_NAME),
            label(LABEL_POD_NAMESPACE),
            label(LABEL_CONTAINER_NAME),
            id,
        ) else {
            return Ok(());
        };
        let (fs, path) = (self.fs.clone(), self.dir.join(&name));
        blocking(move || {
            fs.remove(&name)
                .map_err(io_err("remove container log symlink", path))
        })
        .await
    }

    /// Removes the dangling links of containers that are gone or exited (`containers`: what
    /// the runtime holds now); the names removed.
    pub async fn sweep(&self, containers: &[&Container]) -> Result<Vec<String>> {
        let (fs, dir) = (self.fs.clone(), self.dir.clone());
        let dangling = blocking(move || fs.dangling().map_err(io_err("list", dir))).await?;
        let doomed = links_to_remove(&dangling, containers);
        let (fs, dir) = (self.fs.clone(), self.dir.clone());
        blocking(move || {
            let mut removed = Vec::new();
            for name in doomed {
                match fs.remove(&name) {
                    Ok(()) => removed.push(name),
                    Err(e) => {
                        tracing::error!(error = %e, path = %dir.join(&name).display(), "Failed to remove container log dead symlink");
                    }
                }
            }
            Ok(removed)
        })
        .await
    }
}

#[async_trait::async_trait]
impl crate::runtime::LogLinks for Links {
    async fn remove_logs(
        &self,
        runtime: &dyn crate::runtime::Runtime,
        c: &Container,
    ) -> Result<(), crate::runtime::LinkError> {
        super::clean(runtime, &c.id).await?;
        Ok(Links::remove(self, &c.id, &c.labels).await?)
    }

    async fn sweep_links(&self, containers: &[&Container]) -> usize {
        match self.sweep(containers).await {
            Ok(removed) => {
                for name in &removed {
                    tracing::debug!(path = %self.dir.join(name).display(), "Removed symlink");
                }
                removed.len()
            }
            Err(e) => {
                tracing::error!(error = %e, "Failed to remove dead container log symlinks");
                0
            }
        }
    }
}

/// A recording fake of [`LinkDir`]: entries by name → target; every target exists but
/// those in `missing`.
#[cfg(test)]
#[derive(Default)]
pub struct FakeLinkDir {
    pub links: std::sync::Mutex<BTreeMap<String, PathBuf>>,
    pub missing: std::sync::Mutex<std::collections::HashSet<PathBuf>>,
}

#[cfg(test)]
impl LinkDir for FakeLinkDir {
    fn target_exists(&self, path: &Path) -> std::io::Result<bool> {
        Ok(!self.missing.lock().unwrap().contains(path))
    }

    fn link(&self, name: &str, target: &Path) -> std::io::Result<()> {
        self.links
            .lock()
            .unwrap()
            .insert(name.to_string(), target.to_path_buf());
        Ok(())
    }

    fn remove(&self, name: &str) -> std::io::Result<()> {
        self.links.lock().unwrap().remove(name);
        Ok(())
    }

    fn dangling(&self) -> std::io::Result<Vec<String>> {
        let missing = self.missing.lock().unwrap();
        Ok(self
            .links
            .lock()
            .unwrap()
            .iter()
            .filter(|(n, t)| n.ends_with(SUFFIX) && missing.contains(*t))
            .map(|(n, _)| n.clone())
            .collect())
    }
}

#[cfg(test)]
mod tests;
