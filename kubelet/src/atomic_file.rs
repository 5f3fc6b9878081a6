//! Atomic file replacement for the kubelet's credentials (private keys, kubeconfigs with client
//! credentials, cert+key PEMs) and certificates.
//!
//! The new content goes to a fresh temporary file in the target's directory (created with
//! `O_EXCL` and the final mode, so a secret is never readable by others, not even briefly), is
//! fsynced, and is renamed over the target; then the directory is fsynced. A reader sees the
//! old file or the new one, never a truncated mix, and a failed write leaves the old file as it
//! was and no temporary file behind.

use std::fs::{File, OpenOptions, Permissions};
use std::io::{self, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// Mode of files holding secrets.
pub const PRIVATE_MODE: u32 = 0o600;
/// Mode of certificates (public material), as upstream's `certutil.WriteCert`.
pub const PUBLIC_MODE: u32 = 0o644;

/// Atomically replaces `path` with `bytes`, mode 0600. The directory must exist. An error
/// from the final directory fsync comes after the rename: the new file is then in place.
pub fn write_private_atomic(path: &Path, bytes: &[u8]) -> io::Result<()> {
    write_with(path, PRIVATE_MODE, |f| f.write_all(bytes))
}

/// Atomically replaces `path` with `bytes`, mode 0644 (certificates, nothing secret).
pub fn write_public_atomic(path: &Path, bytes: &[u8]) -> io::Result<()> {
    write_with(path, PUBLIC_MODE, |f| f.write_all(bytes))
}

/// Atomically replaces `path` with `bytes` at `mode` (e.g. 0755 for an executable).
pub fn write_mode_atomic(path: &Path, mode: u32, bytes: &[u8]) -> io::Result<()> {
    write_with(path, mode, |f| f.write_all(bytes))
}

/// Fsyncs a directory, making renames and new entries in it durable.
pub fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

fn parent_of(path: &Path) -> &Path {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    }
}

/// Creates a new temporary file next to `path` (never an existing one) with `mode`.
fn create_temp(path: &Path, mode: u32) -> io::Result<(File, PathBuf)> {
    let dir = parent_of(path);
    let name = path
        .file_name()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "path has no file name"))?
        .to_string_lossy();
    let mut tries = 0;
    loop {
        let tmp = dir.join(format!(".{name}.tmp-{:016x}", fastrand::u64(..)));
        match OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .open(&tmp)
        {
            Ok(f) => return Ok((f, tmp)),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists && tries < 16 => tries += 1,
            Err(e) => return Err(e),
        }
    }
}

/// The write behind the public functions; `fill` writes the content (a test can make it fail
/// half-way, as a crash or a full disk would).
fn write_with(
    path: &Path,
    mode: u32,
    fill: impl FnOnce(&mut File) -> io::Result<()>,
) -> io::Result<()> {
    let (mut f, tmp) = create_temp(path, mode)?;
    let written = (|| {
        // The umask may have taken bits away at creation; the mode is exact from here on.
        f.set_permissions(Permissions::from_mode(mode))?;
        fill(&mut f)?;
        f.sync_all()?;
        drop(f);
        std::fs::rename(&tmp, path)
    })();
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    sync_dir(parent_of(path))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mode(p: &Path) -> u32 {
        std::fs::metadata(p).unwrap().permissions().mode() & 0o777
    }

    fn entries(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }

    #[test]
    fn private_write_is_0600_and_leaves_no_temp_file() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("kubelet.key");
        write_private_atomic(&p, b"KEY1").unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"KEY1");
        assert_eq!(mode(&p), 0o600);
        // Replacing a file that was world-readable leaves it 0600 too.
        std::fs::set_permissions(&p, Permissions::from_mode(0o644)).unwrap();
        write_private_atomic(&p, b"KEY2").unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"KEY2");
        assert_eq!(mode(&p), 0o600);
        write_public_atomic(&dir.path().join("kubelet.crt"), b"CERT").unwrap();
        assert_eq!(mode(&dir.path().join("kubelet.crt")), 0o644);
        assert_eq!(entries(dir.path()), ["kubelet.crt", "kubelet.key"]);
    }

    #[test]
    fn failed_write_keeps_the_old_file_whole() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("kubelet.conf");
        write_private_atomic(&p, b"old content\n").unwrap();
        // The write dies half-way (a crash, a full disk): the target keeps its old content.
        let err = write_with(&p, PRIVATE_MODE, |f| {
            f.write_all(b"new, trunc")?;
            Err(io::Error::other("disk full"))
        })
        .unwrap_err();
        assert_eq!(err.to_string(), "disk full");
        assert_eq!(std::fs::read(&p).unwrap(), b"old content\n");
        assert_eq!(entries(dir.path()), ["kubelet.conf"]);
        // The rename fails (the target is a non-empty directory): the temp file goes too.
        let d = dir.path().join("taken");
        std::fs::create_dir(&d).unwrap();
        std::fs::write(d.join("inside"), b"x").unwrap();
        assert!(write_private_atomic(&d, b"new").is_err());
        assert_eq!(entries(dir.path()), ["kubelet.conf", "taken"]);
        assert_eq!(entries(&d), ["inside"]);
    }

    #[test]
    fn unwritable_directory_fails_without_touching_the_old_file() {
        let dir = tempfile::tempdir().unwrap();
        let sub = dir.path().join("pki");
        std::fs::create_dir(&sub).unwrap();
        let p = sub.join("kubelet.key");
        write_private_atomic(&p, b"old key").unwrap();
        std::fs::set_permissions(&sub, Permissions::from_mode(0o555)).unwrap();
        // Root ignores directory permissions; then only the error-free path can be checked.
        let root = std::fs::write(sub.join("probe"), b"").is_ok();
        let r = write_private_atomic(&p, b"new key");
        std::fs::set_permissions(&sub, Permissions::from_mode(0o755)).unwrap();
        if root {
            r.unwrap();
            return;
        }
        assert!(r.is_err());
        assert_eq!(std::fs::read(&p).unwrap(), b"old key");
        assert_eq!(entries(&sub), ["kubelet.key"]);
    }

    #[test]
    fn symlinked_target_is_replaced_not_written_through() {
        let dir = tempfile::tempdir().unwrap();
        let elsewhere = dir.path().join("elsewhere");
        std::fs::write(&elsewhere, b"untouched").unwrap();
        let p = dir.path().join("kubelet.key");
        std::os::unix::fs::symlink(&elsewhere, &p).unwrap();
        write_private_atomic(&p, b"KEY").unwrap();
        assert_eq!(std::fs::read(&elsewhere).unwrap(), b"untouched");
        assert!(
            !std::fs::symlink_metadata(&p)
                .unwrap()
                .file_type()
                .is_symlink()
        );
        assert_eq!(std::fs::read(&p).unwrap(), b"KEY");
    }
}
