//! File operations relative to an open directory that never follow a symlink: what the
//! kubelet does inside a volume a container may have written to (planted links, swapped
//! directories) stays inside that volume. Every name given here is one path component,
//! except for the resolvers beneath a directory ([`resolve_beneath`], [`open_beneath`],
//! [`walk_beneath`], [`open_regular_beneath`]), which follow symlinks only while they stay
//! beneath it; [`usage`] is a descriptor-relative `du`.
//! Blocking: callers run on the blocking pool.

use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io::Write;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
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

/// Opens the directory `path` (symlinks in it followed) as an `O_PATH` handle: for a
/// directory the kubelet was configured with, not one a container writes, to resolve
/// beneath with [`resolve_beneath`] / [`open_beneath`].
pub fn open_trusted_dir(path: &Path) -> std::io::Result<OwnedFd> {
    let flags = OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC;
    nix::fcntl::open(path, flags, Mode::empty()).map_err(io)
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

/// Most symlinks followed while resolving one path beneath a directory (the kernel's limit).
pub const MAX_SYMLINKS: usize = 40;

/// Why a path could not be resolved beneath its directory.
#[derive(Debug, thiserror::Error)]
pub enum BeneathError {
    /// Through `..`, an absolute path or symlink, or a magic link, it leaves the directory.
    #[error("the path leads outside its directory")]
    Escapes,
    #[error("too many levels of symbolic links")]
    Loop,
    #[error("{op}: {source}")]
    Io {
        op: &'static str,
        #[source]
        source: std::io::Error,
    },
}

impl BeneathError {
    /// Whether it means "nothing there": missing, or outside (which counts as absent).
    pub fn is_absent(&self) -> bool {
        match self {
            BeneathError::Escapes | BeneathError::Loop => true,
            BeneathError::Io { source, .. } => {
                matches!(source.raw_os_error(), Some(libc::ENOENT | libc::ENOTDIR))
            }
        }
    }
}

fn beneath_io(op: &'static str) -> impl Fn(Errno) -> BeneathError {
    move |e| BeneathError::Io { op, source: io(e) }
}

const PATH_FLAGS: OFlag = OFlag::O_PATH
    .union(OFlag::O_NOFOLLOW)
    .union(OFlag::O_CLOEXEC);

/// Walks `rel` from the directory `root` one component at a time, never leaving it:
/// every step is an `openat(O_PATH | O_NOFOLLOW)` from the directory reached so far,
/// symlinks are followed by hand (relative ones only, read from their own descriptor), and
/// `..` climbs back only as far as `root`. With `create_dirs`, a missing component is made
/// as a directory with that mode. Returns the object reached as an `O_PATH` descriptor.
pub fn walk_beneath(
    root: impl AsFd,
    rel: &Path,
    create_dirs: Option<u32>,
) -> Result<OwnedFd, BeneathError> {
    walk(root.as_fd(), rel, create_dirs, None)
}

/// [`walk_beneath`]; with `root_path` (the directory's own absolute path, trusted), an
/// absolute symlink to somewhere under it is followed from `root` again, as the path it names.
fn walk(
    root: BorrowedFd<'_>,
    rel: &Path,
    create_dirs: Option<u32>,
    root_path: Option<&Path>,
) -> Result<OwnedFd, BeneathError> {
    use std::path::Component;
    let mut todo: Vec<OsString> = Vec::new();
    push_components(&mut todo, rel)?;
    let first = root
        .as_fd()
        .try_clone_to_owned()
        .map_err(|source| BeneathError::Io {
            op: "opening the directory",
            source,
        })?;
    // The directories walked so far, `root` first: `..` pops one.
    let mut dirs: Vec<OwnedFd> = vec![first];
    let mut links = 0;
    while let Some(name) = todo.pop() {
        if name == ".." {
            if dirs.len() == 1 {
                return Err(BeneathError::Escapes);
            }
            dirs.pop();
            continue;
        }
        let dir = dirs.last().expect("root is never popped");
        let opened = match nix::fcntl::openat(dir, name.as_os_str(), PATH_FLAGS, Mode::empty()) {
            Ok(fd) => fd,
            Err(Errno::ENOENT) if create_dirs.is_some() => {
                let mode = Mode::from_bits_truncate(create_dirs.unwrap_or(0o750));
                match nix::sys::stat::mkdirat(dir, name.as_os_str(), mode) {
                    Ok(()) | Err(Errno::EEXIST) => {}
                    Err(e) => return Err(beneath_io("creating a directory")(e)),
                }
                nix::fcntl::openat(dir, name.as_os_str(), PATH_FLAGS, Mode::empty())
                    .map_err(beneath_io("opening"))?
            }
            Err(e) => return Err(beneath_io("opening")(e)),
        };
        let st = nix::sys::stat::fstat(&opened).map_err(beneath_io("stat"))?;
        match Kind::of(&st) {
            Kind::Symlink => {
                links += 1;
                if links > MAX_SYMLINKS {
                    return Err(BeneathError::Loop);
                }
                // From the descriptor: the name may point elsewhere by now.
                let target =
                    nix::fcntl::readlinkat(&opened, "").map_err(beneath_io("reading a symlink"))?;
                let mut target = Path::new(&target);
                if target.components().next() == Some(Component::RootDir) {
                    target = root_path
                        .and_then(|p| target.strip_prefix(p).ok())
                        .ok_or(BeneathError::Escapes)?;
                    dirs.truncate(1);
                }
                push_components(&mut todo, target)?;
            }
            Kind::Dir => dirs.push(opened),
            _ if todo.is_empty() => dirs.push(opened),
            _ => {
                return Err(beneath_io("walking")(Errno::ENOTDIR));
            }
        }
    }
    Ok(dirs.pop().expect("at least root"))
}

/// Queues `path`'s components (last first, for popping); an absolute path escapes.
fn push_components(todo: &mut Vec<OsString>, path: &Path) -> Result<(), BeneathError> {
    use std::path::Component;
    for c in path.components().rev() {
        match c {
            Component::Normal(n) => todo.push(n.to_os_string()),
            Component::ParentDir => todo.push("..".into()),
            Component::CurDir => {}
            Component::RootDir | Component::Prefix(_) => return Err(BeneathError::Escapes),
        }
    }
    Ok(())
}

/// `rel` beneath `root` as an `O_PATH` descriptor, symlinks followed only while they stay
/// beneath: one `openat2(RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS)` where the kernel has it
/// (5.6+), else [`walk_beneath`]. The kernel refuses every absolute symlink; with
/// `root_path` (the directory's own canonical path, trusted, not container-written) the
/// walk then follows those that name somewhere under it, from `root` again.
pub fn resolve_beneath(
    root: impl AsFd,
    rel: &Path,
    root_path: Option<&Path>,
) -> Result<OwnedFd, BeneathError> {
    use nix::fcntl::{OpenHow, ResolveFlag};
    use std::sync::atomic::{AtomicBool, Ordering};
    static NO_OPENAT2: AtomicBool = AtomicBool::new(false);
    let root = root.as_fd();
    // openat2 does not take an empty path for the directory itself.
    let rel = if rel.as_os_str().is_empty() {
        Path::new(".")
    } else {
        rel
    };
    if !NO_OPENAT2.load(Ordering::Relaxed) {
        let how = OpenHow::new()
            .flags(OFlag::O_PATH | OFlag::O_CLOEXEC)
            .resolve(ResolveFlag::RESOLVE_BENEATH | ResolveFlag::RESOLVE_NO_MAGICLINKS);
        // EAGAIN: a rename raced a `..`; the kernel asks to try again.
        for _ in 0..8 {
            match nix::fcntl::openat2(root, rel, how) {
                Ok(fd) => return Ok(fd),
                Err(Errno::EAGAIN) => continue,
                // Escapes, or an absolute symlink the walk may follow inside.
                Err(Errno::EXDEV) if root_path.is_some() => break,
                Err(Errno::EXDEV) => return Err(BeneathError::Escapes),
                Err(Errno::ELOOP) => return Err(BeneathError::Loop),
                // No openat2 (old kernel, or a seccomp filter that hides it).
                Err(Errno::ENOSYS | Errno::EPERM) => {
                    NO_OPENAT2.store(true, Ordering::Relaxed);
                    break;
                }
                Err(e) => return Err(beneath_io("opening")(e)),
            }
        }
    }
    walk(root, rel, None, root_path)
}

/// What [`open_beneath`] found.
#[derive(Debug)]
pub enum Opened {
    /// A regular file, open for reading.
    File(File),
    /// A directory, open for listing ([`entries`]).
    Dir(OwnedFd),
    /// Anything else (FIFO, socket, device node): never opened, so never read or triggered.
    Other,
}

/// Opens `rel` beneath `root` for reading, race-free: resolved to an `O_PATH` descriptor by
/// [`resolve_beneath`], looked at through it, and only a regular file or a directory is then
/// opened, through `/proc/self/fd/<n>` (the very object resolved, not a path that could have
/// been swapped since). A FIFO or device node a container planted is never opened.
pub fn open_beneath(
    root: impl AsFd,
    rel: &Path,
    root_path: Option<&Path>,
) -> Result<Opened, BeneathError> {
    reopen(resolve_beneath(root, rel, root_path)?)
}

/// Opens the regular file `path`, which lies under the trusted directory `root`, in one
/// race-free step from `root`'s descriptor ([`open_beneath`]): for files such as container
/// logs that a pod with a hostPath could replace (or whose directories it could swap) with a
/// symlink or a FIFO. A path out of `root`, or a symlink leading out, reads as absent
/// (`ENOENT`); anything but a regular file is refused. Blocking.
pub fn open_regular_beneath(root: &Path, path: &Path) -> std::io::Result<File> {
    let absent = || std::io::Error::from_raw_os_error(libc::ENOENT);
    let rel = path.strip_prefix(root).map_err(|_| absent())?;
    let dir = open_trusted_dir(root)?;
    match open_beneath(&dir, rel, None) {
        Ok(Opened::File(f)) => Ok(f),
        Ok(_) => Err(std::io::Error::other("not a regular file")),
        Err(BeneathError::Io { source, .. }) => Err(source),
        Err(BeneathError::Escapes | BeneathError::Loop) => Err(absent()),
    }
}

/// The object `fd` (an `O_PATH` handle) is on, opened for reading if it is a regular file or
/// a directory.
fn reopen(fd: OwnedFd) -> Result<Opened, BeneathError> {
    let st = nix::sys::stat::fstat(&fd).map_err(beneath_io("stat"))?;
    let flags = match Kind::of(&st) {
        Kind::File => OFlag::O_RDONLY | OFlag::O_NOCTTY | OFlag::O_CLOEXEC,
        Kind::Dir => DIR_FLAGS.difference(OFlag::O_NOFOLLOW),
        _ => return Ok(Opened::Other),
    };
    let proc = format!("/proc/self/fd/{}", fd.as_raw_fd());
    let opened =
        nix::fcntl::open(proc.as_str(), flags, Mode::empty()).map_err(beneath_io("reopening"))?;
    Ok(match Kind::of(&st) {
        Kind::File => Opened::File(File::from(opened)),
        _ => Opened::Dir(opened),
    })
}

#[cfg(test)]
pub mod race;
pub mod usage;

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

    /// Both ways of resolving beneath: the kernel's (openat2) and the walk used without it.
    type Resolver = fn(BorrowedFd<'_>, &Path) -> Result<OwnedFd, BeneathError>;
    const RESOLVERS: [(&str, Resolver); 2] = [
        ("openat2", |r, p| resolve_beneath(r, p, None)),
        ("walk", |r, p| walk_beneath(r, p, None)),
    ];

    fn read_beneath(resolver: Resolver, root: &Path, rel: &str) -> Option<String> {
        use std::io::Read;
        let dir = open_trusted_dir(root).unwrap();
        match reopen(resolver(dir.as_fd(), Path::new(rel)).ok()?).ok()? {
            Opened::File(mut f) => {
                let mut s = String::new();
                f.read_to_string(&mut s).unwrap();
                Some(s)
            }
            _ => None,
        }
    }

    #[test]
    fn resolving_beneath_follows_links_only_inside() {
        let d = tempfile::tempdir().unwrap();
        let root = d.path().join("root");
        std::fs::create_dir_all(root.join("a/b")).unwrap();
        std::fs::write(root.join("a/b/f"), "in").unwrap();
        std::fs::write(d.path().join("secret"), "SECRET").unwrap();
        symlink("b/f", root.join("a/rel-in")).unwrap();
        symlink("../a/b/f", root.join("a/up-in")).unwrap();
        symlink("a/b", root.join("dir-in")).unwrap();
        symlink(d.path().join("secret"), root.join("abs-out")).unwrap();
        symlink(root.join("a/b/f"), root.join("abs-in")).unwrap();
        symlink("../secret", root.join("rel-out")).unwrap();
        symlink("../../../secret", root.join("a/b/deep-out")).unwrap();
        symlink("/proc/self/root/etc/hostname", root.join("magic")).unwrap();
        symlink("loop", root.join("loop")).unwrap();
        for (name, resolver) in RESOLVERS {
            for ok in ["a/b/f", "a/rel-in", "a/up-in", "dir-in/f", "./a/b/../b/f"] {
                assert_eq!(
                    read_beneath(resolver, &root, ok).as_deref(),
                    Some("in"),
                    "{name} {ok}"
                );
            }
            for bad in [
                "abs-out",
                "abs-in",
                "rel-out",
                "a/b/deep-out",
                "magic",
                "../secret",
                "a/../../secret",
                "/etc/hostname",
            ] {
                assert_eq!(read_beneath(resolver, &root, bad), None, "{name} {bad}");
            }
            let dir = open_trusted_dir(&root).unwrap();
            assert!(
                matches!(
                    resolver(dir.as_fd(), Path::new("rel-out")),
                    Err(BeneathError::Escapes)
                ),
                "{name}"
            );
            assert!(
                matches!(
                    resolver(dir.as_fd(), Path::new("loop")),
                    Err(BeneathError::Loop)
                ),
                "{name}"
            );
            let missing = resolver(dir.as_fd(), Path::new("a/nope")).unwrap_err();
            assert!(missing.is_absent(), "{name} {missing}");
            let through_file = resolver(dir.as_fd(), Path::new("a/b/f/x")).unwrap_err();
            assert!(through_file.is_absent(), "{name} {through_file}");
        }
    }

    /// A directory swapped for a symlink out while resolving never yields the file outside,
    /// on either resolver.
    #[test]
    fn a_directory_swapped_for_a_symlink_mid_walk_never_leads_outside() {
        let d = tempfile::tempdir().unwrap();
        let root = d.path().join("root");
        std::fs::create_dir_all(root.join("d/e")).unwrap();
        std::fs::write(root.join("d/e/f"), "in").unwrap();
        std::fs::create_dir_all(d.path().join("out/e")).unwrap();
        std::fs::write(d.path().join("out/e/f"), "SECRET").unwrap();
        symlink("../out", root.join("x")).unwrap();
        for (name, resolver) in RESOLVERS {
            let swapper = race::Swapper::start(&root, "d", "x");
            let mut inside = 0;
            let leaked = race::race(50_000, std::time::Duration::from_secs(4), || {
                match read_beneath(resolver, &root, "d/e/f").as_deref() {
                    Some("in") => inside += 1,
                    Some(other) => return Some(other.to_string()),
                    None => {}
                }
                None
            });
            let swaps = swapper.stop();
            assert_eq!(leaked, None, "{name}");
            assert!(
                swaps > 0 && inside > 0,
                "{name}: {swaps} swaps, {inside} reads"
            );
        }
    }

    /// With the directory's own path given, an absolute symlink naming a place under it is
    /// followed (from the directory's descriptor); one naming anything else still escapes.
    #[test]
    fn absolute_links_inside_are_followed_when_the_root_path_is_given() {
        let d = tempfile::tempdir().unwrap();
        let root = d.path().join("root");
        std::fs::create_dir_all(root.join("a")).unwrap();
        std::fs::write(root.join("a/f"), "in").unwrap();
        std::fs::write(d.path().join("secret"), "SECRET").unwrap();
        std::fs::create_dir(d.path().join("rootx")).unwrap();
        std::fs::write(d.path().join("rootx/f"), "SECRET").unwrap();
        symlink(root.join("a"), root.join("abs-dir")).unwrap();
        symlink(d.path().join("secret"), root.join("abs-out")).unwrap();
        symlink(d.path().join("rootx/f"), root.join("abs-sibling")).unwrap();
        symlink(d.path().join("root/../secret"), root.join("abs-up")).unwrap();
        let base = root.canonicalize().unwrap();
        let dir = open_trusted_dir(&root).unwrap();
        type WithRoot = fn(BorrowedFd<'_>, &Path, &Path) -> Result<OwnedFd, BeneathError>;
        let ways: [(&str, WithRoot); 2] = [
            ("openat2", |r, p, b| resolve_beneath(r, p, Some(b))),
            ("walk", |r, p, b| walk(r, p, None, Some(b))),
        ];
        for (name, way) in ways {
            let read = |rel: &str| match reopen(way(dir.as_fd(), Path::new(rel), &base).ok()?) {
                Ok(Opened::File(f)) => std::io::read_to_string(f).ok(),
                _ => None,
            };
            assert_eq!(read("abs-dir/f").as_deref(), Some("in"), "{name}");
            for bad in ["abs-out", "abs-sibling", "abs-up", "/etc/hostname"] {
                assert_eq!(read(bad), None, "{name} {bad}");
            }
        }
    }

    #[test]
    fn only_files_and_directories_are_opened() {
        let d = tempfile::tempdir().unwrap();
        nix::unistd::mkfifo(&d.path().join("fifo"), Mode::from_bits_truncate(0o600)).unwrap();
        std::fs::create_dir(d.path().join("dir")).unwrap();
        let dir = open_trusted_dir(d.path()).unwrap();
        assert!(matches!(
            open_beneath(&dir, Path::new("fifo"), None),
            Ok(Opened::Other)
        ));
        let Ok(Opened::Dir(sub)) = open_beneath(&dir, Path::new("dir"), None) else {
            panic!("a directory");
        };
        assert!(entries(&sub).unwrap().is_empty());
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
