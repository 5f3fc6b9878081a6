//! fsGroup volume ownership, as upstream's `SetVolumeOwnership` (pkg/volume/volume_linux.go):
//! every file and directory beneath a volume gets the pod's fsGroup as its group, group
//! read/write (read-only for read-only volumes), and directories get setgid and group
//! execute, so files created later inherit the group. Blocking: run it on the blocking pool.

use std::fs;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use crate::fs_at;

/// Group read/write, or read only for read-only volumes; directories also get execute.
const RW_MASK: u32 = 0o660;
const RO_MASK: u32 = 0o440;
const EXEC_MASK: u32 = 0o110;
const SETGID: u32 = 0o2000;

/// The pod's `fsGroupChangePolicy`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum ChangePolicy {
    /// Walk the whole volume every time it is mounted (upstream's default).
    #[default]
    Always,
    /// Skip the walk when the volume's root already has the group and permissions.
    OnRootMismatch,
}

impl ChangePolicy {
    /// From the pod's field; None (unset) is `Always`, an unknown value an error.
    pub fn from_field(v: Option<&str>) -> Result<Self, OwnershipError> {
        match v {
            None | Some("Always") => Ok(ChangePolicy::Always),
            Some("OnRootMismatch") => Ok(ChangePolicy::OnRootMismatch),
            Some(other) => Err(OwnershipError::Policy(other.to_string())),
        }
    }
}

/// What the walk could not do at all (per-file chown/chmod failures are logged and skipped,
/// as upstream does).
#[derive(Debug, thiserror::Error)]
pub enum OwnershipError {
    #[error("unsupported fsGroupChangePolicy {0:?}")]
    Policy(String),
    #[error("reading {path}: {source}")]
    Walk { path: PathBuf, source: io::Error },
}

/// What one call did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Outcome {
    /// True when OnRootMismatch found the root already right and nothing was walked.
    pub skipped: bool,
    /// Paths visited (the root included).
    pub visited: usize,
    /// Paths whose chown or chmod failed (logged).
    pub failed: usize,
}

/// Whether the volume root lacks the group or the permissions the walk would give it
/// (upstream's requiresPermissionChange).
pub fn requires_permission_change(root: &Path, fs_group: u32, readonly: bool) -> bool {
    let Ok(meta) = fs::metadata(root) else {
        return true;
    };
    if meta.gid() != fs_group || !meta.is_dir() {
        return true;
    }
    let wanted = if readonly { RO_MASK } else { RW_MASK } | SETGID;
    let have = meta.mode() & (0o777 | SETGID);
    have & wanted != wanted
}

/// Gives one object (open as `fd`, of `kind`, with permission bits `mode`) the group and
/// permissions; failures are logged and counted, as upstream does.
fn change_one(
    fd: &OwnedFd,
    kind: fs_at::Kind,
    mode: u32,
    fs_group: u32,
    readonly: bool,
    path: &Path,
) -> bool {
    let mut ok = true;
    if let Err(e) = fs_at::set_group(fd, fs_group) {
        tracing::error!(path = %path.display(), gid = fs_group, error = %e, "failed to change the volume file's group");
        ok = false;
    }
    // Symlinks keep their (meaningless) mode and are never followed.
    if kind == fs_at::Kind::Symlink {
        return ok;
    }
    let mut mask = if readonly { RO_MASK } else { RW_MASK };
    if kind == fs_at::Kind::Dir {
        mask |= SETGID | EXEC_MASK;
    }
    if let Err(e) = fs_at::set_mode(fd, mode | mask) {
        tracing::error!(path = %path.display(), error = %e, "failed to change the volume file's mode");
        ok = false;
    }
    ok
}

/// Applies `fs_group` to everything beneath `dir`. The walk goes from directory descriptor
/// to directory descriptor and never follows a symlink (a link is re-grouped itself), so a
/// container that plants links or swaps directories for links cannot make it change anything
/// outside the volume. With no fsGroup nothing happens; with `OnRootMismatch` a root that
/// already matches is left alone.
pub fn set_volume_ownership(
    dir: &Path,
    fs_group: Option<i64>,
    policy: ChangePolicy,
    readonly: bool,
) -> Result<Outcome, OwnershipError> {
    let mut out = Outcome::default();
    let Some(gid) = fs_group.and_then(|g| u32::try_from(g).ok()) else {
        return Ok(out);
    };
    if policy == ChangePolicy::OnRootMismatch && !requires_permission_change(dir, gid, readonly) {
        tracing::debug!(dir = %dir.display(), gid, "volume root already matches fsGroup: skipping the walk");
        out.skipped = true;
        return Ok(out);
    }
    let walk_err = |path: &Path| {
        let path = path.to_path_buf();
        move |source| OwnershipError::Walk { path, source }
    };
    let root = fs_at::open_dir(dir).map_err(walk_err(dir))?;
    let mode = fs::metadata(format!("/proc/self/fd/{}", root.as_raw_fd()))
        .map_err(walk_err(dir))?
        .mode()
        & 0o7777;
    out.visited += 1;
    if !change_one(&root, fs_at::Kind::Dir, mode, gid, readonly, dir) {
        out.failed += 1;
    }
    // Open directories still to walk, with their paths (for logs only).
    let mut stack: Vec<(OwnedFd, PathBuf)> = vec![(root, dir.to_path_buf())];
    while let Some((parent, parent_path)) = stack.pop() {
        for (name, _) in fs_at::entries(&parent).map_err(walk_err(&parent_path))? {
            let path = parent_path.join(&name);
            let (fd, kind, mode) = match fs_at::open_path_at(&parent, &name) {
                Ok(x) => x,
                // Gone since it was listed.
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => return Err(walk_err(&path)(e)),
            };
            out.visited += 1;
            if !change_one(&fd, kind, mode, gid, readonly, &path) {
                out.failed += 1;
            }
            if kind == fs_at::Kind::Dir {
                drop(fd);
                match fs_at::open_dir_at(&parent, &name) {
                    Ok(sub) => stack.push((sub, path)),
                    // Swapped for something else since: not ours to follow.
                    Err(e) => {
                        tracing::warn!(path = %path.display(), error = %e, "a volume directory changed during the fsGroup walk; skipping it")
                    }
                }
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn is_root() -> bool {
        fs::read_to_string("/proc/self/status")
            .ok()
            .and_then(|s| {
                s.lines()
                    .find(|l| l.starts_with("Uid:"))
                    .and_then(|l| l.split_whitespace().nth(2).map(|u| u == "0"))
            })
            .unwrap_or(false)
    }

    fn tree() -> tempfile::TempDir {
        let d = tempfile::tempdir().unwrap();
        fs::create_dir(d.path().join("sub")).unwrap();
        fs::write(d.path().join("sub/file"), b"x").unwrap();
        fs::set_permissions(d.path().join("sub/file"), fs::Permissions::from_mode(0o600)).unwrap();
        fs::set_permissions(d.path().join("sub"), fs::Permissions::from_mode(0o700)).unwrap();
        std::os::unix::fs::symlink("/etc/hostname", d.path().join("link")).unwrap();
        d
    }

    fn mode(p: &Path) -> u32 {
        fs::symlink_metadata(p).unwrap().mode() & 0o7777
    }

    #[test]
    fn group_bits_and_setgid_on_dirs() {
        // The process's own group needs no privilege to chown to.
        let d = tree();
        let own = fs::metadata(d.path()).unwrap().gid();
        let out =
            set_volume_ownership(d.path(), Some(own.into()), ChangePolicy::Always, false).unwrap();
        assert_eq!((out.visited, out.failed, out.skipped), (4, 0, false));
        assert_eq!(mode(&d.path().join("sub")), 0o2770);
        assert_eq!(mode(&d.path().join("sub/file")), 0o660);
        let ro = tree();
        set_volume_ownership(ro.path(), Some(own.into()), ChangePolicy::Always, true).unwrap();
        assert_eq!(mode(&ro.path().join("sub/file")), 0o640);
        assert_eq!(mode(&ro.path().join("sub")), 0o2750);
        // No fsGroup: nothing is touched.
        let none = tree();
        let out = set_volume_ownership(none.path(), None, ChangePolicy::Always, false).unwrap();
        assert_eq!(out.visited, 0);
        assert_eq!(mode(&none.path().join("sub/file")), 0o600);
    }

    #[test]
    fn chown_to_fs_group_and_on_root_mismatch_skips_a_matching_root() {
        if !is_root() {
            eprintln!("skipping: changing a file's group to another gid needs root");
            return;
        }
        let d = tree();
        let out = set_volume_ownership(d.path(), Some(4242), ChangePolicy::OnRootMismatch, false)
            .unwrap();
        assert!(!out.skipped);
        for p in ["", "sub", "sub/file", "link"] {
            assert_eq!(
                fs::symlink_metadata(d.path().join(p)).unwrap().gid(),
                4242,
                "{p}"
            );
        }
        // The link's target outside the volume is not touched.
        assert_ne!(fs::metadata("/etc/hostname").unwrap().gid(), 4242);
        // Root already right: a file changed since is left alone under OnRootMismatch...
        fs::set_permissions(d.path().join("sub/file"), fs::Permissions::from_mode(0o600)).unwrap();
        let out = set_volume_ownership(d.path(), Some(4242), ChangePolicy::OnRootMismatch, false)
            .unwrap();
        assert!(out.skipped);
        assert_eq!(mode(&d.path().join("sub/file")), 0o600);
        // ...and fixed under Always.
        set_volume_ownership(d.path(), Some(4242), ChangePolicy::Always, false).unwrap();
        assert_eq!(mode(&d.path().join("sub/file")), 0o660);
    }

    #[test]
    fn policy_field() {
        assert_eq!(
            ChangePolicy::from_field(None).unwrap(),
            ChangePolicy::Always
        );
        assert_eq!(
            ChangePolicy::from_field(Some("OnRootMismatch")).unwrap(),
            ChangePolicy::OnRootMismatch
        );
        assert!(ChangePolicy::from_field(Some("Never")).is_err());
    }

    #[test]
    fn links_to_outside_are_regrouped_themselves_never_followed() {
        let outside = tempfile::tempdir().unwrap();
        fs::write(outside.path().join("f"), b"x").unwrap();
        fs::set_permissions(outside.path().join("f"), fs::Permissions::from_mode(0o600)).unwrap();
        fs::set_permissions(outside.path(), fs::Permissions::from_mode(0o700)).unwrap();
        let d = tree();
        std::os::unix::fs::symlink(outside.path(), d.path().join("sub/dirlink")).unwrap();
        std::os::unix::fs::symlink(outside.path().join("f"), d.path().join("filelink")).unwrap();
        let own = fs::metadata(d.path()).unwrap().gid();
        let out =
            set_volume_ownership(d.path(), Some(own.into()), ChangePolicy::Always, false).unwrap();
        // root, sub, sub/file, link, sub/dirlink, filelink: nothing behind the links.
        assert_eq!((out.visited, out.failed), (6, 0));
        assert_eq!(mode(&outside.path().join("f")), 0o600);
        assert_eq!(mode(outside.path()), 0o700);
        assert_eq!(mode(&d.path().join("sub/file")), 0o660);
    }
}
