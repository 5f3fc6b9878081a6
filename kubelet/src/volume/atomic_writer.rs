//! Writes a volume's files so that a container never sees half an update (upstream's
//! AtomicWriter layout, which tools in containers rely on):
//!
//! ```text
//! <volume>/..2026_11_25_03_14_15.123456789/  the files of one version
//! <volume>/..data -> ..2026_11_25_03_14_15.123456789
//! <volume>/<key>  -> ..data/<key>           one per top-level name
//! ```
//!
//! An update writes a new timestamped directory, points `..data_tmp` at it and renames that
//! over `..data` (one atomic step), then fixes the user-visible links and removes the old
//! directory. Blocking: callers run it on the blocking pool.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt, symlink};
use std::path::{Component, Path, PathBuf};

const DATA_DIR: &str = "..data";
const NEW_DATA_DIR: &str = "..data_tmp";
/// Upstream's limits on payload paths.
const MAX_PATH_LEN: usize = 4096;
const MAX_NAME_LEN: usize = 255;

/// One file of a volume.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileProjection {
    pub data: Vec<u8>,
    /// Permission bits (e.g. 0o644).
    pub mode: u32,
}

/// Relative path → file.
pub type Payload = BTreeMap<String, FileProjection>;

#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    #[error("invalid path {path:?} in the volume's payload: {why}")]
    InvalidPath { path: String, why: &'static str },
    #[error("{op} {}: {source}", .path.display())]
    Io {
        op: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
}

fn io(op: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> WriteError {
    let path = path.to_path_buf();
    move |source| WriteError::Io { op, path, source }
}

/// Checks a payload path as upstream does: relative, no `..` element, no element starting with
/// `..` (those names are the writer's own), bounded lengths.
pub fn validate_path(p: &str) -> Result<(), WriteError> {
    let bad = |why| {
        Err(WriteError::InvalidPath {
            path: p.to_string(),
            why,
        })
    };
    if p.is_empty() {
        return bad("empty");
    }
    if p.len() > MAX_PATH_LEN {
        return bad("longer than 4096 bytes");
    }
    if Path::new(p).is_absolute() {
        return bad("absolute");
    }
    for c in Path::new(p).components() {
        match c {
            Component::Normal(n) => {
                let n = n.to_string_lossy();
                if n.len() > MAX_NAME_LEN {
                    return bad("an element is longer than 255 bytes");
                }
                if n.starts_with("..") {
                    return bad("an element starts with '..'");
                }
            }
            Component::CurDir => {}
            _ => return bad("contains '..'"),
        }
    }
    Ok(())
}

/// What a write did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Written {
    /// The files were already what the payload says.
    Unchanged,
    Updated,
}

/// Makes `dir` hold exactly `payload`, atomically. `dir` must exist.
pub fn write(dir: &Path, payload: &Payload) -> Result<Written, WriteError> {
    for p in payload.keys() {
        validate_path(p)?;
    }
    let data_link = dir.join(DATA_DIR);
    let old = std::fs::read_link(&data_link).ok();
    let user_visible: BTreeSet<String> = payload.keys().map(|p| top_level(p)).collect();
    if let Some(old_dir) = &old
        && same_contents(&dir.join(old_dir), payload)
        && links_in_place(dir, &user_visible)
    {
        return Ok(Written::Unchanged);
    }
    let version = new_version_dir(dir)?;
    for (path, file) in payload {
        let full = version.join(path);
        if let Some(parent) = full.parent() {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o755)
                .create(parent)
                .map_err(io("creating", parent))?;
        }
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(file.mode)
            .open(&full)
            .map_err(io("creating", &full))?;
        f.write_all(&file.data).map_err(io("writing", &full))?;
        // The umask may have narrowed the mode at creation.
        std::fs::set_permissions(&full, std::fs::Permissions::from_mode(file.mode))
            .map_err(io("setting the mode of", &full))?;
    }
    let version_name = version.file_name().map(PathBuf::from).unwrap_or_default();
    let tmp_link = dir.join(NEW_DATA_DIR);
    let _ = std::fs::remove_file(&tmp_link);
    symlink(&version_name, &tmp_link).map_err(io("linking", &tmp_link))?;
    std::fs::rename(&tmp_link, &data_link).map_err(io("renaming to", &data_link))?;
    for name in &user_visible {
        let link = dir.join(name);
        let target = Path::new(DATA_DIR).join(name);
        match std::fs::read_link(&link) {
            Ok(t) if t == target => continue,
            Ok(_) => std::fs::remove_file(&link).map_err(io("replacing", &link))?,
            Err(_) if link.symlink_metadata().is_ok() => {
                remove_any(&link).map_err(io("replacing", &link))?
            }
            Err(_) => {}
        }
        symlink(&target, &link).map_err(io("linking", &link))?;
    }
    // Names of the old version that the new one no longer has.
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if name.starts_with("..") || user_visible.contains(&name) {
                continue;
            }
            if e.file_type().is_ok_and(|t| t.is_symlink()) {
                let _ = std::fs::remove_file(e.path());
            }
        }
    }
    if let Some(old_dir) = old {
        let old_dir = dir.join(old_dir);
        if old_dir != version && old_dir.starts_with(dir) {
            let _ = std::fs::remove_dir_all(&old_dir);
        }
    }
    Ok(Written::Updated)
}

fn top_level(p: &str) -> String {
    Path::new(p)
        .components()
        .find_map(|c| match c {
            Component::Normal(n) => Some(n.to_string_lossy().into_owned()),
            _ => None,
        })
        .unwrap_or_default()
}

fn remove_any(p: &Path) -> std::io::Result<()> {
    if p.symlink_metadata()?.is_dir() {
        std::fs::remove_dir_all(p)
    } else {
        std::fs::remove_file(p)
    }
}

fn new_version_dir(dir: &Path) -> Result<PathBuf, WriteError> {
    let stamp = jiff::Timestamp::now()
        .strftime("..%Y_%m_%d_%H_%M_%S.")
        .to_string();
    for attempt in 0u32..100 {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let p = dir.join(format!("{stamp}{}", nanos.wrapping_add(attempt)));
        match std::fs::DirBuilder::new().mode(0o755).create(&p) {
            Ok(()) => {
                std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755))
                    .map_err(io("setting the mode of", &p))?;
                return Ok(p);
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(io("creating", &p)(e)),
        }
    }
    Err(io("creating a version directory in", dir)(
        std::io::Error::other("100 names taken"),
    ))
}

/// Whether `version` holds exactly the payload (same files, bytes and modes).
fn same_contents(version: &Path, payload: &Payload) -> bool {
    let mut found = 0usize;
    let ok = walk_files(version, version, &mut |rel, path| {
        found += 1;
        let Some(want) = payload.get(rel) else {
            return false;
        };
        let mode_ok = std::fs::symlink_metadata(path)
            .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o7777 == want.mode);
        mode_ok && std::fs::read(path).is_ok_and(|d| d == want.data)
    });
    ok && found == payload.len()
}

fn walk_files(root: &Path, dir: &Path, f: &mut dyn FnMut(&str, &Path) -> bool) -> bool {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return false;
    };
    for e in entries.flatten() {
        let path = e.path();
        let Ok(t) = e.file_type() else {
            return false;
        };
        if t.is_dir() {
            if !walk_files(root, &path, f) {
                return false;
            }
        } else {
            let rel = path
                .strip_prefix(root)
                .map(|r| r.to_string_lossy().into_owned())
                .unwrap_or_default();
            if !f(&rel, &path) {
                return false;
            }
        }
    }
    true
}

fn links_in_place(dir: &Path, names: &BTreeSet<String>) -> bool {
    names
        .iter()
        .all(|n| std::fs::read_link(dir.join(n)).is_ok_and(|t| t == Path::new(DATA_DIR).join(n)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn payload(files: &[(&str, &str, u32)]) -> Payload {
        files
            .iter()
            .map(|(p, d, m)| {
                (
                    p.to_string(),
                    FileProjection {
                        data: d.as_bytes().to_vec(),
                        mode: *m,
                    },
                )
            })
            .collect()
    }

    #[test]
    fn layout_is_upstreams_and_updates_swap_data() {
        let d = tempfile::tempdir().unwrap();
        let dir = d.path();
        let p1 = payload(&[("token", "t1", 0o644), ("sub/ca.crt", "ca", 0o600)]);
        assert_eq!(write(dir, &p1).unwrap(), Written::Updated);
        assert_eq!(std::fs::read_to_string(dir.join("token")).unwrap(), "t1");
        assert_eq!(
            std::fs::read_to_string(dir.join("sub/ca.crt")).unwrap(),
            "ca"
        );
        assert_eq!(
            std::fs::read_link(dir.join("token")).unwrap(),
            Path::new("..data/token")
        );
        let v1 = std::fs::read_link(dir.join("..data")).unwrap();
        assert!(v1.to_string_lossy().starts_with("..20"), "{v1:?}");
        let mode = |p: &str| std::fs::metadata(dir.join(p)).unwrap().permissions().mode() & 0o7777;
        assert_eq!((mode("token"), mode("sub/ca.crt")), (0o644, 0o600));
        // Same payload: nothing written.
        assert_eq!(write(dir, &p1).unwrap(), Written::Unchanged);
        assert_eq!(std::fs::read_link(dir.join("..data")).unwrap(), v1);
        // An update: new version, old one and dropped names gone.
        let p2 = payload(&[("token", "t2", 0o644)]);
        assert_eq!(write(dir, &p2).unwrap(), Written::Updated);
        assert_eq!(std::fs::read_to_string(dir.join("token")).unwrap(), "t2");
        assert!(!dir.join(&v1).exists());
        assert!(dir.join("sub").symlink_metadata().is_err());
        // A mode change alone is an update.
        let p3 = payload(&[("token", "t2", 0o400)]);
        assert_eq!(write(dir, &p3).unwrap(), Written::Updated);
        assert_eq!(mode("token"), 0o400);
    }

    #[test]
    fn hostile_paths_are_refused_before_anything_is_written() {
        let d = tempfile::tempdir().unwrap();
        for p in ["/etc/passwd", "../x", "a/../../x", "..data", "a/..b", ""] {
            let e = write(d.path(), &payload(&[(p, "x", 0o644)])).unwrap_err();
            assert!(matches!(e, WriteError::InvalidPath { .. }), "{p}: {e}");
        }
        let long = "a".repeat(256);
        assert!(write(d.path(), &payload(&[(&long, "x", 0o644)])).is_err());
        assert_eq!(std::fs::read_dir(d.path()).unwrap().count(), 0);
    }

    #[test]
    fn an_empty_payload_is_an_empty_volume() {
        let d = tempfile::tempdir().unwrap();
        write(d.path(), &payload(&[("a", "1", 0o644)])).unwrap();
        assert_eq!(write(d.path(), &Payload::new()).unwrap(), Written::Updated);
        assert!(d.path().join("a").symlink_metadata().is_err());
        assert!(d.path().join("..data").exists());
    }
}
