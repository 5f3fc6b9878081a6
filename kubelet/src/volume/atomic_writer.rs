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
use std::ffi::{OsStr, OsString};
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

use crate::fs_at;

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

fn io(op: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> WriteError + use<> {
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
///
/// Everything happens relative to an open descriptor of `dir` and never follows a symlink:
/// whatever a container planted in the volume (`..data` pointing out of it, a link in place
/// of a directory), the writer only ever creates, links and removes entries of `dir`
/// itself. `..data` is trusted only when it names, in one component, a directory of `dir`
/// in upstream's timestamp form.
pub fn write(dir: &Path, payload: &Payload) -> Result<Written, WriteError> {
    for p in payload.keys() {
        validate_path(p)?;
    }
    let root = fs_at::open_dir(dir).map_err(io("opening", dir))?;
    let old = current_version(&root);
    let user_visible: BTreeSet<String> = payload.keys().map(|p| top_level(p)).collect();
    if let Some(old_dir) = &old
        && same_contents(&root, old_dir, payload)
        && links_in_place(&root, &user_visible)
    {
        return Ok(Written::Unchanged);
    }
    let (version_name, version) = new_version_dir(&root, dir)?;
    let version_path = dir.join(&version_name);
    for (path, file) in payload {
        write_payload_file(&version, path, file)
            .map_err(io("creating", &version_path.join(path)))?;
    }
    let tmp_link = OsStr::new(NEW_DATA_DIR);
    let linking = |e| io("linking", &dir.join(NEW_DATA_DIR))(e);
    fs_at::remove_all_at(&root, tmp_link).map_err(linking)?;
    fs_at::symlink_at(Path::new(&version_name), &root, tmp_link).map_err(linking)?;
    fs_at::rename_at(&root, tmp_link, OsStr::new(DATA_DIR))
        .map_err(io("renaming to", &dir.join(DATA_DIR)))?;
    for name in &user_visible {
        let link = OsStr::new(name);
        let target = Path::new(DATA_DIR).join(name);
        let replacing = io("replacing", &dir.join(name));
        match fs_at::read_link_at(&root, link) {
            Ok(t) if Path::new(&t) == target => continue,
            _ => fs_at::remove_all_at(&root, link).map_err(replacing)?,
        }
        fs_at::symlink_at(&target, &root, link).map_err(io("linking", &dir.join(name)))?;
    }
    // Names of the old version that the new one no longer has, and every version directory
    // but the new one (whatever `..data` said before: only names in the writer's own form).
    for (name, kind) in fs_at::entries(&root).map_err(io("reading", dir))? {
        let text = name.to_string_lossy();
        let stale_link = !text.starts_with("..")
            && !user_visible.contains(text.as_ref())
            && kind == fs_at::Kind::Symlink;
        let old_version =
            kind == fs_at::Kind::Dir && is_version_name(&name) && name != version_name;
        if stale_link || old_version {
            fs_at::remove_all_at(&root, &name).map_err(io("removing", &dir.join(&name)))?;
        }
    }
    Ok(Written::Updated)
}

/// `..2006_01_02_15_04_05.<digits>`: the names upstream's writer (and this one) gives its
/// version directories. Nothing else is ever taken for one.
fn is_version_name(name: &OsStr) -> bool {
    let b = name.as_bytes();
    let Some(rest) = b.strip_prefix(b"..") else {
        return false;
    };
    // YYYY_MM_DD_HH_MM_SS.
    const STAMP: &[u8] = b"dddd_dd_dd_dd_dd_dd.";
    if rest.len() <= STAMP.len() {
        return false;
    }
    let (stamp, suffix) = rest.split_at(STAMP.len());
    let stamp_ok = stamp.iter().zip(STAMP).all(|(c, want)| match want {
        b'd' => c.is_ascii_digit(),
        other => c == other,
    });
    stamp_ok && suffix.iter().all(u8::is_ascii_digit)
}

/// The version `..data` names, when it is one of this volume's own version directories.
fn current_version(root: &OwnedFd) -> Option<OsString> {
    let target = fs_at::read_link_at(root, OsStr::new(DATA_DIR)).ok()?;
    if !is_version_name(&target) {
        tracing::warn!(target = ?target, "ignoring a volume's ..data link that does not name one of its version directories");
        return None;
    }
    matches!(fs_at::kind_at(root, &target), Ok(Some(fs_at::Kind::Dir))).then_some(target)
}

/// Writes one payload file beneath the fresh version directory, creating its parents.
fn write_payload_file(version: &OwnedFd, path: &str, file: &FileProjection) -> std::io::Result<()> {
    let names: Vec<&OsStr> = Path::new(path)
        .components()
        .filter_map(|c| match c {
            Component::Normal(n) => Some(n),
            _ => None,
        })
        .collect();
    let Some((last, parents)) = names.split_last() else {
        return Err(std::io::ErrorKind::InvalidInput.into());
    };
    let mut held: Option<OwnedFd> = None;
    for name in parents {
        let cur = held.as_ref().unwrap_or(version);
        let next = match fs_at::kind_at(cur, name)? {
            None => fs_at::make_dir_at(cur, name, 0o755)?,
            Some(fs_at::Kind::Dir) => fs_at::open_dir_at(cur, name)?,
            Some(_) => return Err(std::io::ErrorKind::NotADirectory.into()),
        };
        held = Some(next);
    }
    fs_at::write_new_file_at(
        held.as_ref().unwrap_or(version),
        last,
        &file.data,
        file.mode,
    )
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

fn new_version_dir(root: &OwnedFd, dir: &Path) -> Result<(OsString, OwnedFd), WriteError> {
    let stamp = jiff::Timestamp::now()
        .strftime("..%Y_%m_%d_%H_%M_%S.")
        .to_string();
    for attempt in 0u32..100 {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let name = OsString::from(format!("{stamp}{}", nanos.wrapping_add(attempt)));
        match fs_at::make_dir_at(root, &name, 0o755) {
            Ok(fd) => return Ok((name, fd)),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(io("creating", &dir.join(&name))(e)),
        }
    }
    Err(io("creating a version directory in", dir)(
        std::io::Error::other("100 names taken"),
    ))
}

/// Whether the version directory `name` holds exactly the payload (same files, bytes and
/// modes, nothing else).
fn same_contents(root: &OwnedFd, name: &OsStr, payload: &Payload) -> bool {
    let Ok(version) = fs_at::open_dir_at(root, name) else {
        return false;
    };
    let mut found = 0usize;
    same_below(&version, "", payload, &mut found) && found == payload.len()
}

fn same_below(dir: &OwnedFd, prefix: &str, payload: &Payload, found: &mut usize) -> bool {
    let Ok(entries) = fs_at::entries(dir) else {
        return false;
    };
    entries.into_iter().all(|(name, kind)| {
        let rel = format!("{prefix}{}", name.to_string_lossy());
        match kind {
            fs_at::Kind::Dir => fs_at::open_dir_at(dir, &name)
                .is_ok_and(|sub| same_below(&sub, &format!("{rel}/"), payload, found)),
            fs_at::Kind::File => {
                *found += 1;
                let Some(want) = payload.get(&rel) else {
                    return false;
                };
                matches!(fs_at::read_file_at(dir, &name), Ok(Some((data, mode))) if mode == want.mode && data == want.data)
            }
            fs_at::Kind::Symlink | fs_at::Kind::Other => false,
        }
    })
}

fn links_in_place(root: &OwnedFd, names: &BTreeSet<String>) -> bool {
    names.iter().all(|n| {
        fs_at::read_link_at(root, OsStr::new(n))
            .is_ok_and(|t| Path::new(&t) == Path::new(DATA_DIR).join(n))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{PermissionsExt, symlink};

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

    /// CVE-2017-1002102: a container that could write into the volume points `..data` (or a
    /// user-visible name) out of it; the next write must not delete or follow anything there.
    #[test]
    fn planted_links_never_make_the_writer_touch_anything_outside() {
        let host = tempfile::tempdir().unwrap();
        let victim = host.path().join("victim");
        std::fs::create_dir(&victim).unwrap();
        std::fs::write(victim.join("precious"), b"keep").unwrap();
        let vol = host
            .path()
            .join("pods/uid/volumes/kubernetes.io~downward-api/info");
        std::fs::create_dir_all(&vol).unwrap();
        write(&vol, &payload(&[("labels", "a=1", 0o644)])).unwrap();
        let depth = "../".repeat(12);
        let escape = format!("{depth}{}", victim.display());
        for planted in [
            escape.as_str(),
            "../../../../victim",
            victim.to_str().unwrap(),
        ] {
            std::fs::remove_file(vol.join("..data")).unwrap();
            symlink(planted, vol.join("..data")).unwrap();
            // A user-visible name swapped for a link to the victim too.
            std::fs::remove_file(vol.join("labels")).unwrap();
            symlink(&victim, vol.join("labels")).unwrap();
            assert_eq!(
                write(&vol, &payload(&[("labels", "a=2", 0o644)])).unwrap(),
                Written::Updated,
                "{planted}"
            );
            assert_eq!(std::fs::read(victim.join("precious")).unwrap(), b"keep");
            assert_eq!(std::fs::read_to_string(vol.join("labels")).unwrap(), "a=2");
            let data = std::fs::read_link(vol.join("..data")).unwrap();
            assert!(is_version_name(data.as_os_str()), "{data:?}");
        }
        // Exactly one version directory is left.
        let versions = std::fs::read_dir(&vol)
            .unwrap()
            .flatten()
            .filter(|e| is_version_name(&e.file_name()))
            .count();
        assert_eq!(versions, 1);
    }

    #[test]
    fn an_old_version_holding_links_out_is_removed_without_following_them() {
        let host = tempfile::tempdir().unwrap();
        let outside = host.path().join("outside");
        std::fs::create_dir(&outside).unwrap();
        std::fs::write(outside.join("f"), b"keep").unwrap();
        let vol = host.path().join("vol");
        std::fs::create_dir(&vol).unwrap();
        write(&vol, &payload(&[("a", "1", 0o644)])).unwrap();
        let v1 = vol.join(std::fs::read_link(vol.join("..data")).unwrap());
        symlink(&outside, v1.join("dirlink")).unwrap();
        symlink(outside.join("f"), v1.join("filelink")).unwrap();
        write(&vol, &payload(&[("a", "2", 0o644)])).unwrap();
        assert!(!v1.exists());
        assert_eq!(std::fs::read(outside.join("f")).unwrap(), b"keep");
    }

    #[test]
    fn a_version_holding_a_symlink_is_not_taken_as_current() {
        let host = tempfile::tempdir().unwrap();
        std::fs::write(host.path().join("secret"), b"a").unwrap();
        let vol = host.path().join("vol");
        std::fs::create_dir(&vol).unwrap();
        write(&vol, &payload(&[("k", "a", 0o644)])).unwrap();
        let v1 = vol.join(std::fs::read_link(vol.join("..data")).unwrap());
        std::fs::remove_file(v1.join("k")).unwrap();
        symlink(host.path().join("secret"), v1.join("k")).unwrap();
        // Same bytes and mode behind the link, but a link is never a payload file.
        assert_eq!(
            write(&vol, &payload(&[("k", "a", 0o644)])).unwrap(),
            Written::Updated
        );
        let mode = std::fs::symlink_metadata(vol.join("..data/k")).unwrap();
        assert!(mode.is_file() && mode.permissions().mode() & 0o777 == 0o644);
    }

    #[test]
    fn version_names_are_upstreams_timestamp_form_only() {
        for ok in ["..2026_11_25_03_14_15.123456789", "..2017_01_02_03_04_05.1"] {
            assert!(is_version_name(OsStr::new(ok)), "{ok}");
        }
        for bad in [
            "..data",
            "../../etc",
            "..2026_11_25_03_14_15.",
            "..2026_11_25_03_14_15.12/..",
            "..2026_11_25_03_14_15.1a",
            "2026_11_25_03_14_15.1",
            "..2026-11-25_03_14_15.1",
            "/..2026_11_25_03_14_15.1",
        ] {
            assert!(!is_version_name(OsStr::new(bad)), "{bad}");
        }
    }
}
