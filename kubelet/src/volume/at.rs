//! File operations relative to an open directory that never follow a symlink: what the
//! kubelet does inside a volume a container may have written to (planted links, swapped
//! directories) stays inside that volume. Every name given here is one path component.
//! Blocking: callers run on the blocking pool.

use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io::Write;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use nix::errno::Errno;
use nix::fcntl::{AtFlags, OFlag};
use nix::sys::stat::{FileStat, Mode, SFlag};
use nix::unistd::{Gid, UnlinkatFlags};

/// What an entry is, read without following it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Dir,
    File,
    Symlink,
    /// FIFO, socket or device node.
    Other,
}

impl Kind {
    fn of(st: &FileStat) -> Kind {
        match SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT {
            SFlag::S_IFDIR => Kind::Dir,
            SFlag::S_IFREG => Kind::File,
            SFlag::S_IFLNK => Kind::Symlink,
            _ => Kind::Other,
        }
    }
}

fn io(e: Errno) -> std::io::Error {
    std::io::Error::from(e)
}

/// A name must be one component: not empty, no `/`, not `.` or `..`.
fn one_component(name: &OsStr) -> std::io::Result<()> {
    let b = name.as_bytes();
    if b.is_empty() || b.contains(&b'/') || b == b"." || b == b".." {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("{name:?} is not one path component"),
        ));
    }
    Ok(())
}

const DIR_FLAGS: OFlag = OFlag::O_RDONLY
    .union(OFlag::O_DIRECTORY)
    .union(OFlag::O_NOFOLLOW)
    .union(OFlag::O_CLOEXEC);

/// Opens the directory `path`; its last component must not be a symlink.
pub fn open_dir(path: &Path) -> std::io::Result<OwnedFd> {
    nix::fcntl::open(path, DIR_FLAGS, Mode::empty()).map_err(io)
}

/// Opens the directory `name` in `dir`, refusing a symlink.
pub fn open_dir_at(dir: impl AsFd, name: &OsStr) -> std::io::Result<OwnedFd> {
    one_component(name)?;
    nix::fcntl::openat(dir, name, DIR_FLAGS, Mode::empty()).map_err(io)
}

/// The kind of `name` in `dir` (not followed); None when it does not exist.
pub fn kind_at(dir: impl AsFd, name: &OsStr) -> std::io::Result<Option<Kind>> {
    one_component(name)?;
    match nix::sys::stat::fstatat(dir, name, AtFlags::AT_SYMLINK_NOFOLLOW) {
        Ok(st) => Ok(Some(Kind::of(&st))),
        Err(Errno::ENOENT) => Ok(None),
        Err(e) => Err(io(e)),
    }
}

/// The target of the symlink `name` in `dir`.
pub fn read_link_at(dir: impl AsFd, name: &OsStr) -> std::io::Result<OsString> {
    one_component(name)?;
    nix::fcntl::readlinkat(dir, name).map_err(io)
}

/// Makes the symlink `name` in `dir` pointing at `target` (which is not checked).
pub fn symlink_at(target: &Path, dir: impl AsFd, name: &OsStr) -> std::io::Result<()> {
    one_component(name)?;
    nix::unistd::symlinkat(target, dir, name).map_err(io)
}

/// Renames `from` to `to` within `dir` (atomically replacing `to`).
pub fn rename_at(dir: impl AsFd, from: &OsStr, to: &OsStr) -> std::io::Result<()> {
    one_component(from)?;
    one_component(to)?;
    let d = dir.as_fd();
    nix::fcntl::renameat(d, from, d, to).map_err(io)
}

/// Creates the directory `name` in `dir` with exactly `mode` and opens it.
pub fn make_dir_at(dir: impl AsFd, name: &OsStr, mode: u32) -> std::io::Result<OwnedFd> {
    one_component(name)?;
    let d = dir.as_fd();
    nix::sys::stat::mkdirat(d, name, Mode::from_bits_truncate(mode)).map_err(io)?;
    let fd = open_dir_at(d, name)?;
    // The umask may have narrowed the mode.
    nix::sys::stat::fchmod(&fd, Mode::from_bits_truncate(mode)).map_err(io)?;
    Ok(fd)
}

/// Creates the file `name` in `dir` (it must not exist) holding `data`, with exactly `mode`.
pub fn write_new_file_at(
    dir: impl AsFd,
    name: &OsStr,
    data: &[u8],
    mode: u32,
) -> std::io::Result<()> {
    one_component(name)?;
    let flags = OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW;
    let fd = nix::fcntl::openat(
        dir,
        name,
        flags | OFlag::O_CLOEXEC,
        Mode::from_bits_truncate(mode),
    )
    .map_err(io)?;
    nix::sys::stat::fchmod(&fd, Mode::from_bits_truncate(mode)).map_err(io)?;
    File::from(fd).write_all(data)
}

/// Reads the regular file `name` in `dir` with its permission bits; None when it is not a
/// regular file (a symlink included) or does not exist.
pub fn read_file_at(dir: impl AsFd, name: &OsStr) -> std::io::Result<Option<(Vec<u8>, u32)>> {
    use std::io::Read;
    one_component(name)?;
    let flags = OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC;
    let fd = match nix::fcntl::openat(dir, name, flags, Mode::empty()) {
        Ok(fd) => fd,
        Err(Errno::ELOOP | Errno::ENOENT) => return Ok(None),
        Err(e) => return Err(io(e)),
    };
    let st = nix::sys::stat::fstat(&fd).map_err(io)?;
    if Kind::of(&st) != Kind::File {
        return Ok(None);
    }
    let mut data = Vec::new();
    File::from(fd).read_to_end(&mut data)?;
    Ok(Some((data, st.st_mode & 0o7777)))
}

/// The entries of `dir` (without `.` and `..`) with their kinds, read without following.
pub fn entries(dir: impl AsFd) -> std::io::Result<Vec<(OsString, Kind)>> {
    let d = dir.as_fd();
    let mut list = nix::dir::Dir::openat(d, ".", DIR_FLAGS, Mode::empty()).map_err(io)?;
    let mut out = Vec::new();
    for e in list.iter() {
        let e = e.map_err(io)?;
        let name = OsStr::from_bytes(e.file_name().to_bytes());
        if name == "." || name == ".." {
            continue;
        }
        if let Some(kind) = kind_at(d, name)? {
            out.push((name.to_os_string(), kind));
        }
    }
    Ok(out)
}

/// Removes `name` from `dir` with everything beneath it. Symlinks are removed, never
/// followed; a directory swapped for a symlink while this runs is refused by `O_NOFOLLOW`,
/// so nothing outside `dir` is touched. A missing `name` is not an error.
pub fn remove_all_at(dir: impl AsFd, name: &OsStr) -> std::io::Result<()> {
    let d = dir.as_fd();
    match kind_at(d, name)? {
        None => Ok(()),
        Some(Kind::Dir) => {
            let sub = open_dir_at(d, name)?;
            for (child, _) in entries(&sub)? {
                remove_all_at(&sub, &child)?;
            }
            drop(sub);
            ignore_missing(nix::unistd::unlinkat(d, name, UnlinkatFlags::RemoveDir))
        }
        Some(_) => ignore_missing(nix::unistd::unlinkat(d, name, UnlinkatFlags::NoRemoveDir)),
    }
}

fn ignore_missing(r: nix::Result<()>) -> std::io::Result<()> {
    match r {
        Ok(()) | Err(Errno::ENOENT) => Ok(()),
        Err(e) => Err(io(e)),
    }
}

/// Sets the group of the object `fd` is open on (any kind, an `O_PATH` one included).
pub fn set_group(fd: impl AsFd, gid: u32) -> std::io::Result<()> {
    nix::unistd::fchownat(
        fd,
        "",
        None,
        Some(Gid::from_raw(gid)),
        AtFlags::AT_EMPTY_PATH,
    )
    .map_err(io)
}

/// Opens `name` in `dir` as an `O_PATH` handle on the entry itself (a symlink is not
/// followed), with its metadata: enough to change its group and mode without opening
/// (and so without triggering) a device or a FIFO.
pub fn open_path_at(dir: impl AsFd, name: &OsStr) -> std::io::Result<(OwnedFd, Kind, u32)> {
    one_component(name)?;
    let flags = OFlag::O_PATH | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    let fd = nix::fcntl::openat(dir, name, flags, Mode::empty()).map_err(io)?;
    let st = nix::sys::stat::fstat(&fd).map_err(io)?;
    Ok((fd, Kind::of(&st), st.st_mode & 0o7777))
}

/// Sets the permission bits of the object `fd` is open on (not a symlink). Through procfs,
/// so that an `O_PATH` handle works: the kernel resolves `/proc/self/fd/N` to the very
/// object, not to a path.
pub fn set_mode(fd: impl AsFd, mode: u32) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let p = format!("/proc/self/fd/{}", fd.as_fd().as_raw_fd());
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    #[test]
    fn remove_all_at_never_follows_links_out() {
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("keep"), b"x").unwrap();
        let d = tempfile::tempdir().unwrap();
        let v = d.path().join("v");
        std::fs::create_dir_all(v.join("a/b")).unwrap();
        std::fs::write(v.join("a/b/f"), b"y").unwrap();
        symlink(outside.path(), v.join("a/out")).unwrap();
        symlink(outside.path().join("keep"), v.join("a/b/file-out")).unwrap();
        let dir = open_dir(d.path()).unwrap();
        remove_all_at(&dir, OsStr::new("v")).unwrap();
        assert!(!v.exists());
        assert_eq!(std::fs::read(outside.path().join("keep")).unwrap(), b"x");
        // Missing: fine.
        remove_all_at(&dir, OsStr::new("v")).unwrap();
    }

    #[test]
    fn names_must_be_one_component() {
        let d = tempfile::tempdir().unwrap();
        let dir = open_dir(d.path()).unwrap();
        for bad in ["", "..", ".", "a/b", "../x"] {
            assert!(kind_at(&dir, OsStr::new(bad)).is_err(), "{bad:?}");
            assert!(remove_all_at(&dir, OsStr::new(bad)).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn a_symlinked_directory_is_not_opened() {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir(d.path().join("real")).unwrap();
        symlink("real", d.path().join("link")).unwrap();
        let dir = open_dir(d.path()).unwrap();
        assert!(open_dir_at(&dir, OsStr::new("real")).is_ok());
        assert!(open_dir_at(&dir, OsStr::new("link")).is_err());
        assert!(open_dir(&d.path().join("link")).is_err());
        assert_eq!(
            kind_at(&dir, OsStr::new("link")).unwrap(),
            Some(Kind::Symlink)
        );
        assert_eq!(read_file_at(&dir, OsStr::new("link")).unwrap(), None);
    }
}
