//! `volumeMounts[].subPath`, resolved beneath its volume as upstream's subpath_linux.go does.
//!
//! A container can write symlinks into its volumes. A subPath resolved by path (following
//! them) could name anything on the host, and the runtime would bind-mount it into the next
//! container. So the path is walked one component at a time from a file descriptor of the
//! volume ([`crate::fs_at::walk_beneath`]: each step an `openat` with `O_NOFOLLOW`), symlinks
//! are followed by hand only while they stay inside the volume, missing directories are
//! created the same way, and the object reached is bound by
//! its descriptor onto `<pod dir>/volume-subpaths/<volume>/<container>/<index>`: that mount,
//! not a path a container could swap meanwhile, is what the runtime gets.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};

use crate::fs_at;
use std::path::{Component, Path, PathBuf};

use thiserror::Error;

/// Directory of the per-container subPath bind mounts in a pod's directory.
pub const SUBPATHS_DIR: &str = "volume-subpaths";

#[derive(Debug, Error)]
pub enum SubpathError {
    #[error("invalid subPath {0:?}: must be a relative path without '..'")]
    Invalid(String),
    #[error("subPath {subpath:?} of volume {volume:?} escapes the volume through symlinks")]
    Escapes { volume: String, subpath: String },
    #[error("subPath {subpath:?} of volume {volume:?}: too many levels of symbolic links")]
    Loop { volume: String, subpath: String },
    #[error("subPath {subpath:?} of volume {volume:?}: {op}: {source}")]
    Io {
        volume: String,
        subpath: String,
        op: &'static str,
        #[source]
        source: std::io::Error,
    },
}

/// What a container mount of a subPath needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubpathMount<'a> {
    /// The volume's directory on the host.
    pub volume_path: &'a Path,
    pub volume_name: &'a str,
    pub subpath: &'a str,
    pub container: &'a str,
    /// The mount's index in the container's `volumeMounts`.
    pub index: usize,
}

/// The OS edge of subPath mounts: bind-mounting a resolved descriptor, and unmounting.
pub trait Binder: Send + Sync + std::fmt::Debug {
    /// Bind-mounts the object open as `fd` onto `target` (which exists), replacing a mount
    /// already there.
    fn bind_fd(&self, fd: &File, target: &Path) -> std::io::Result<()>;
    /// Unmounts every mount at or below `dir` (deepest first); Ok once none is left.
    fn unmount_below(&self, dir: &Path) -> std::io::Result<()>;
    /// Mounts a tmpfs (of at most `size` bytes) on `dir` unless one is there already.
    fn ensure_tmpfs(&self, dir: &Path, size: Option<u64>) -> std::io::Result<()> {
        let _ = (dir, size);
        Err(std::io::Error::new(
            std::io::ErrorKind::Unsupported,
            "this mounter cannot mount tmpfs",
        ))
    }
    /// Puts `dir` on a shared mount unless the mount holding it is shared already (upstream's
    /// `MakeRShared`: bind `dir` onto itself, then make it rshared).
    fn make_rshared(&self, dir: &Path) -> std::io::Result<()> {
        let _ = dir;
        Err(std::io::Error::new(
            std::io::ErrorKind::Unsupported,
            "this mounter cannot make mounts shared",
        ))
    }
    /// Mounts a hugetlbfs with `option` (`pagesize=2Mi`) on `dir` unless one is there already.
    fn ensure_hugetlbfs(&self, dir: &Path, option: &str) -> std::io::Result<()> {
        let _ = (dir, option);
        Err(std::io::Error::new(
            std::io::ErrorKind::Unsupported,
            "this mounter cannot mount hugetlbfs",
        ))
    }
}

/// Resolves `m.subpath` beneath `m.volume_path` (creating missing directories) and binds it
/// onto its place under `pod_dir`; returns that place, the host path to give the runtime.
pub fn prepare(
    binder: &dyn Binder,
    pod_dir: &Path,
    m: &SubpathMount<'_>,
) -> Result<PathBuf, SubpathError> {
    let io = |op: &'static str| {
        move |source| SubpathError::Io {
            volume: m.volume_name.to_string(),
            subpath: m.subpath.to_string(),
            op,
            source,
        }
    };
    let target_dir = pod_dir
        .join(SUBPATHS_DIR)
        .join(m.volume_name)
        .join(m.container);
    let target = target_dir.join(m.index.to_string());
    let object = open_beneath(m.volume_path, m.volume_name, m.subpath)?;
    let is_dir = object.metadata().map_err(io("stat"))?.is_dir();
    std::fs::create_dir_all(&target_dir).map_err(io("creating the mount point"))?;
    // A mount left from an earlier start of this container goes first.
    binder
        .unmount_below(&target)
        .map_err(io("unmounting the previous subPath mount"))?;
    match std::fs::symlink_metadata(&target) {
        Ok(meta) if meta.is_dir() == is_dir && !meta.file_type().is_symlink() => {}
        Ok(meta) => {
            if meta.is_dir() {
                std::fs::remove_dir(&target)
            } else {
                std::fs::remove_file(&target)
            }
            .map_err(io("replacing the mount point"))?;
            create_mount_point(&target, is_dir).map_err(io("creating the mount point"))?;
        }
        Err(_) => create_mount_point(&target, is_dir).map_err(io("creating the mount point"))?,
    }
    binder.bind_fd(&object, &target).map_err(io("bind mount"))?;
    Ok(target)
}

fn create_mount_point(target: &Path, is_dir: bool) -> std::io::Result<()> {
    if is_dir {
        std::fs::DirBuilder::new().mode(0o750).create(target)
    } else {
        OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o640)
            .open(target)
            .map(drop)
    }
}

/// Walks `subpath` from `base`, one component at a time, never leaving `base` (the walk of
/// [`fs_at::walk_beneath`]: symlinks are followed by hand, relative ones only, and `..` only
/// back up to `base`); missing directories are created. Returns the object reached, open
/// with `O_PATH`.
pub fn open_beneath(base: &Path, volume: &str, subpath: &str) -> Result<File, SubpathError> {
    let invalid = || SubpathError::Invalid(subpath.to_string());
    let err = |op: &'static str| {
        move |source| SubpathError::Io {
            volume: volume.to_string(),
            subpath: subpath.to_string(),
            op,
            source,
        }
    };
    for c in Path::new(subpath).components() {
        match c {
            Component::Normal(n) if n.to_str().is_some() => {}
            Component::CurDir => {}
            _ => return Err(invalid()),
        }
    }
    let root = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC)
        .open(base)
        .map_err(err("opening the volume"))?;
    match fs_at::walk_beneath(&root, Path::new(subpath), Some(0o750)) {
        Ok(fd) => Ok(File::from(fd)),
        Err(fs_at::BeneathError::Escapes) => Err(SubpathError::Escapes {
            volume: volume.into(),
            subpath: subpath.into(),
        }),
        Err(fs_at::BeneathError::Loop) => Err(SubpathError::Loop {
            volume: volume.into(),
            subpath: subpath.into(),
        }),
        Err(fs_at::BeneathError::Io { op, source }) => Err(err(op)(source)),
    }
}

/// Real bind mounts, through mount(2) on `/proc/self/fd/<fd>` (the object itself, not a path).
#[derive(Debug, Default)]
pub struct KernelBinder;

impl Binder for KernelBinder {
    fn ensure_tmpfs(&self, dir: &Path, size: Option<u64>) -> std::io::Result<()> {
        use nix::mount::{MsFlags, mount};
        if is_likely_mount_point(dir)? {
            return Ok(());
        }
        let options = size.map(|s| format!("size={s}"));
        mount(
            Some("tmpfs"),
            dir,
            Some("tmpfs"),
            MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
            options.as_deref(),
        )
        .map_err(std::io::Error::from)
    }

    fn make_rshared(&self, dir: &Path) -> std::io::Result<()> {
        use nix::mount::{MsFlags, mount};
        let info = std::fs::read_to_string("/proc/self/mountinfo")?;
        if super::shared::is_shared(&info, dir) {
            return Ok(());
        }
        mount(Some(dir), dir, None::<&str>, MsFlags::MS_BIND, None::<&str>)?;
        mount(
            None::<&str>,
            dir,
            None::<&str>,
            MsFlags::MS_SHARED | MsFlags::MS_REC,
            None::<&str>,
        )?;
        Ok(())
    }

    fn ensure_hugetlbfs(&self, dir: &Path, option: &str) -> std::io::Result<()> {
        use nix::mount::{MsFlags, mount};
        if is_likely_mount_point(dir)? {
            return Ok(());
        }
        // As upstream: source "nodev", no flags, the page size option.
        mount(
            Some("nodev"),
            dir,
            Some("hugetlbfs"),
            MsFlags::empty(),
            Some(option),
        )
        .map_err(std::io::Error::from)
    }

    fn bind_fd(&self, fd: &File, target: &Path) -> std::io::Result<()> {
        use nix::mount::{MsFlags, mount};
        use std::os::fd::AsRawFd;
        let source = PathBuf::from(format!("/proc/self/fd/{}", fd.as_raw_fd()));
        mount(
            Some(&source),
            target,
            None::<&str>,
            MsFlags::MS_BIND,
            None::<&str>,
        )
        .map_err(std::io::Error::from)
    }

    fn unmount_below(&self, dir: &Path) -> std::io::Result<()> {
        use nix::mount::{MntFlags, umount2};
        // Repeat: mounts can be stacked on one point; bounded so a mount that keeps coming
        // back cannot hold this step forever.
        for _ in 0..16 {
            let mut mounts = mounts_below(dir)?;
            if mounts.is_empty() {
                return Ok(());
            }
            mounts.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
            for m in mounts {
                match umount2(&m, MntFlags::MNT_DETACH) {
                    Ok(()) | Err(nix::errno::Errno::EINVAL | nix::errno::Errno::ENOENT) => {}
                    Err(e) => return Err(e.into()),
                }
            }
        }
        Err(std::io::Error::other(format!(
            "mounts below {} keep reappearing",
            dir.display()
        )))
    }
}

/// Whether something is mounted on `dir`: its device differs from its parent's (upstream's
/// IsLikelyNotMountPoint test). Two stat calls, where reading `/proc/self/mountinfo` costs a
/// line per mount on the node on every pod sync.
fn is_likely_mount_point(dir: &Path) -> std::io::Result<bool> {
    use std::os::unix::fs::MetadataExt;
    let here = std::fs::metadata(dir)?;
    let parent = std::fs::symlink_metadata(dir.parent().unwrap_or(Path::new("/")))?;
    Ok(here.dev() != parent.dev())
}

/// Mount points at or below `dir`, from `/proc/self/mountinfo`.
pub fn mounts_below(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    let info = std::fs::read_to_string("/proc/self/mountinfo")?;
    Ok(parse_mountinfo_below(&info, dir))
}

fn parse_mountinfo_below(info: &str, dir: &Path) -> Vec<PathBuf> {
    info.lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(super::shared::unescape_mountinfo)
        .map(PathBuf::from)
        .filter(|p| p.starts_with(dir))
        .collect()
}

#[cfg(any(test, feature = "test-util"))]
pub mod fake;

#[cfg(test)]
mod tests {
    use super::fake::FakeBinder;
    use super::*;
    use std::os::unix::fs::symlink;

    fn real(f: &File) -> PathBuf {
        use std::os::fd::AsRawFd;
        std::fs::read_link(format!("/proc/self/fd/{}", f.as_raw_fd())).unwrap()
    }

    /// The attack: a container leaves `escape -> /` (or `-> ../../..`) in its emptyDir and
    /// is restarted with `subPath: escape`. It is refused; the host's `/` is never opened.
    #[test]
    fn symlinks_out_of_the_volume_are_refused() {
        let d = tempfile::tempdir().unwrap();
        let vol = d.path().join("vol");
        std::fs::create_dir(&vol).unwrap();
        symlink("/", vol.join("abs")).unwrap();
        symlink("../..", vol.join("up")).unwrap();
        std::fs::create_dir(vol.join("a")).unwrap();
        symlink("../../outside", vol.join("a/deep")).unwrap();
        symlink("a/deep", vol.join("chained")).unwrap();
        std::fs::create_dir(d.path().join("outside")).unwrap();
        for sp in ["abs", "up", "a/deep", "chained", "abs/etc", "chained/x"] {
            let e = open_beneath(&vol, "v", sp).unwrap_err();
            assert!(matches!(e, SubpathError::Escapes { .. }), "{sp}: {e}");
        }
        for sp in ["../x", "/etc", "a/../../x"] {
            let e = open_beneath(&vol, "v", sp).unwrap_err();
            assert!(matches!(e, SubpathError::Invalid(_)), "{sp}: {e}");
        }
        symlink("loop", vol.join("loop")).unwrap();
        let e = open_beneath(&vol, "v", "loop").unwrap_err();
        assert!(matches!(e, SubpathError::Loop { .. }), "{e}");
        assert!(!d.path().join("outside/x").exists());
    }

    /// Symlinks that stay inside the volume work, as a configMap volume's keys
    /// (`key -> ..data/key`, `..data -> ..2024_01_01`) need.
    #[test]
    fn symlinks_inside_the_volume_resolve() {
        let d = tempfile::tempdir().unwrap();
        let vol = d.path().join("vol");
        std::fs::create_dir_all(vol.join("..2024_01_01")).unwrap();
        std::fs::write(vol.join("..2024_01_01/app.conf"), "x=1").unwrap();
        symlink("..2024_01_01", vol.join("..data")).unwrap();
        symlink("..data/app.conf", vol.join("app.conf")).unwrap();
        std::fs::create_dir(vol.join("sub")).unwrap();
        symlink("../app.conf", vol.join("sub/up")).unwrap();
        for sp in ["app.conf", "sub/up", "./app.conf"] {
            let f = open_beneath(&vol, "cfg", sp).unwrap();
            assert_eq!(
                real(&f),
                vol.join("..2024_01_01/app.conf").canonicalize().unwrap()
            );
        }
        // Missing directories are created, inside the volume.
        let f = open_beneath(&vol, "cfg", "new/dir").unwrap();
        assert!(f.metadata().unwrap().is_dir());
        assert!(vol.join("new/dir").is_dir());
        // A file in the middle of the path is an error, not a mount of something else.
        let e = open_beneath(&vol, "cfg", "app.conf/x").unwrap_err();
        assert!(e.to_string().contains("walking"), "{e}");
    }

    #[test]
    fn prepare_binds_the_resolved_object_under_the_pod_dir() {
        let d = tempfile::tempdir().unwrap();
        let vol = d.path().join("vol");
        std::fs::create_dir_all(vol.join("data")).unwrap();
        std::fs::write(vol.join("data/f"), "x").unwrap();
        let pod_dir = d.path().join("pod");
        let binder = FakeBinder::default();
        let m = SubpathMount {
            volume_path: &vol,
            volume_name: "v",
            subpath: "data/f",
            container: "app",
            index: 2,
        };
        let target = prepare(&binder, &pod_dir, &m).unwrap();
        assert_eq!(target, pod_dir.join("volume-subpaths/v/app/2"));
        assert!(target.is_file(), "a file mount point for a file");
        let binds = binder.binds.lock().unwrap().clone();
        assert_eq!(
            binds,
            vec![(vol.join("data/f").canonicalize().unwrap(), target.clone())]
        );
        // A later start where the subPath is now a directory: the mount point follows.
        std::fs::remove_file(vol.join("data/f")).unwrap();
        std::fs::create_dir(vol.join("data/f")).unwrap();
        let target = prepare(&binder, &pod_dir, &m).unwrap();
        assert!(target.is_dir());
    }

    #[test]
    fn mountinfo_lines_below_a_dir() {
        let info = "\
36 35 98:0 /mnt1 /mnt/parent rw,noatime master:1 - ext3 /dev/root rw
37 36 98:0 / /var/lib/kubelet/pods/u1/volume-subpaths/v/c/0 rw - ext4 /dev/sda rw
38 36 98:0 / /var/lib/kubelet/pods/u1/volume-subpaths/with\\040space rw - ext4 /dev/sda rw
39 36 98:0 / /var/lib/kubelet/pods/u10/x rw - ext4 /dev/sda rw
";
        let got = parse_mountinfo_below(info, Path::new("/var/lib/kubelet/pods/u1"));
        assert_eq!(
            got,
            vec![
                PathBuf::from("/var/lib/kubelet/pods/u1/volume-subpaths/v/c/0"),
                PathBuf::from("/var/lib/kubelet/pods/u1/volume-subpaths/with space"),
            ]
        );
    }

    /// A [`Binder`] that runs `swap` once, between the resolution of the subPath and the bind
    /// (`prepare` calls `unmount_below` after `open_beneath` and before `bind_fd`), then
    /// binds through `inner`: the window CVE-2021-25741 used.
    struct SwapBeforeBind<'a> {
        inner: &'a dyn Binder,
        swap: std::sync::Mutex<Option<Box<dyn FnOnce() + Send + 'a>>>,
    }

    impl std::fmt::Debug for SwapBeforeBind<'_> {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.debug_struct("SwapBeforeBind").finish_non_exhaustive()
        }
    }

    impl Binder for SwapBeforeBind<'_> {
        fn bind_fd(&self, fd: &File, target: &Path) -> std::io::Result<()> {
            self.inner.bind_fd(fd, target)
        }

        fn unmount_below(&self, dir: &Path) -> std::io::Result<()> {
            if let Some(swap) = self.swap.lock().unwrap().take() {
                swap();
            }
            self.inner.unmount_below(dir)
        }
    }

    /// `vol/<dir>` becomes `vol/<dir>.moved`, and `vol/<dir>` a symlink to the host's
    /// `outside` directory (which holds the same names).
    fn swap_for_symlink(vol: &Path, dir: &str, outside: &Path) -> Box<dyn FnOnce() + Send> {
        let (from, to, outside) = (
            vol.join(dir),
            vol.join(format!("{dir}.moved")),
            outside.to_path_buf(),
        );
        Box::new(move || {
            std::fs::rename(&from, &to).unwrap();
            symlink(&outside, &from).unwrap();
        })
    }

    /// A volume `vol` with `data/mine` and `a/b/mine`, and a host directory `outside` with
    /// the same names (`secret` instead of `mine`).
    fn volume_and_host(d: &Path) -> (PathBuf, PathBuf) {
        let vol = d.join("vol");
        let outside = d.join("outside");
        for base in [&vol, &outside] {
            std::fs::create_dir_all(base.join("data")).unwrap();
            std::fs::create_dir_all(base.join("a/b")).unwrap();
        }
        for dir in ["data", "a/b"] {
            std::fs::write(vol.join(dir).join("mine"), "volume").unwrap();
            std::fs::write(outside.join(dir).join("secret"), "host").unwrap();
        }
        (vol, outside)
    }

    /// CVE-2021-25741: the subPath (or a directory on its way) is swapped for a symlink to the
    /// host after it was checked and before it is mounted. The bind takes the object that was
    /// resolved (now renamed inside the volume), never what the path names at bind time.
    #[test]
    fn cve_2021_25741_a_swap_after_the_check_cannot_redirect_the_bind() {
        for (subpath, swapped, resolved) in [
            ("data", "data", "data.moved"),
            ("a/b", "a", "a.moved/b"),
            ("a/b", "a/b", "a/b.moved"),
        ] {
            let d = tempfile::tempdir().unwrap();
            let (vol, outside) = volume_and_host(d.path());
            let fake = FakeBinder::default();
            let binder = SwapBeforeBind {
                inner: &fake,
                swap: std::sync::Mutex::new(Some(swap_for_symlink(
                    &vol,
                    swapped,
                    &outside.join(swapped),
                ))),
            };
            let m = SubpathMount {
                volume_path: &vol,
                volume_name: "v",
                subpath,
                container: "app",
                index: 0,
            };
            let target = prepare(&binder, &d.path().join("pod"), &m).unwrap();
            assert!(
                std::fs::symlink_metadata(vol.join(swapped))
                    .unwrap()
                    .file_type()
                    .is_symlink(),
                "the swap happened before the bind"
            );
            let binds = fake.binds.lock().unwrap().clone();
            assert_eq!(
                binds,
                vec![(vol.join(resolved).canonicalize().unwrap(), target)],
                "{subpath} with {swapped} swapped: the resolved object is bound"
            );
        }
    }

    /// CVE-2021-25741 on the kernel: the same swap, with real bind mounts (in a private mount
    /// namespace of a thread of this test, gone with it). What the mount point shows is the
    /// volume's directory, not the host's.
    #[test]
    fn cve_2021_25741_kernel_bind_mounts_the_resolved_object() {
        if !nix::unistd::Uid::effective().is_root() {
            eprintln!("SKIPPED: bind mounts need root");
            return;
        }
        let outcome = std::thread::spawn(|| -> Result<Vec<String>, String> {
            use nix::mount::{MsFlags, mount};
            use nix::sched::{CloneFlags, unshare};
            unshare(CloneFlags::CLONE_NEWNS).map_err(|e| format!("unshare: {e}"))?;
            mount(
                None::<&str>,
                "/",
                None::<&str>,
                MsFlags::MS_REC | MsFlags::MS_PRIVATE,
                None::<&str>,
            )
            .map_err(|e| format!("making / private: {e}"))?;
            let d = tempfile::tempdir().unwrap();
            let (vol, outside) = volume_and_host(d.path());
            let kernel = KernelBinder;
            let binder = SwapBeforeBind {
                inner: &kernel,
                swap: std::sync::Mutex::new(Some(swap_for_symlink(&vol, "a", &outside.join("a")))),
            };
            let pod_dir = d.path().join("pod");
            let m = SubpathMount {
                volume_path: &vol,
                volume_name: "v",
                subpath: "a/b",
                container: "app",
                index: 0,
            };
            let target = prepare(&binder, &pod_dir, &m).map_err(|e| e.to_string())?;
            let mut seen: Vec<String> = std::fs::read_dir(&target)
                .unwrap()
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect();
            seen.sort();
            kernel.unmount_below(&pod_dir).unwrap();
            Ok(seen)
        })
        .join()
        .unwrap();
        match outcome {
            Ok(seen) => assert_eq!(seen, vec!["mine".to_string()], "the volume's a/b"),
            Err(e) if e.starts_with("unshare") => eprintln!("SKIPPED: {e}"),
            Err(e) => panic!("{e}"),
        }
    }

    /// CVE-2021-25741 during the walk: another thread keeps exchanging `vol/a` (a directory)
    /// with `vol/a.alt` (a symlink to the host's directory) while the subPath `a/b` is
    /// resolved again and again. Whatever the interleaving, the object reached is inside the
    /// volume or the walk is refused; the host's directory is never opened.
    #[test]
    fn cve_2021_25741_components_swapped_during_the_walk_never_escape() {
        use nix::fcntl::{AT_FDCWD, RenameFlags, renameat2};
        use std::sync::atomic::{AtomicBool, Ordering};
        let d = tempfile::tempdir().unwrap();
        let (vol, outside) = volume_and_host(d.path());
        symlink(outside.join("a"), vol.join("a.alt")).unwrap();
        let vol_real = vol.canonicalize().unwrap();
        let stop = AtomicBool::new(false);
        let (mut inside, mut refused, mut exchanges) = (0u32, 0u32, 0u32);
        std::thread::scope(|s| {
            let flipper = s.spawn(|| {
                let mut n = 0u32;
                while !stop.load(Ordering::Relaxed) && n < 1_000_000 {
                    renameat2(
                        AT_FDCWD,
                        &vol.join("a"),
                        AT_FDCWD,
                        &vol.join("a.alt"),
                        RenameFlags::RENAME_EXCHANGE,
                    )
                    .unwrap();
                    n += 1;
                }
                n
            });
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(3);
            for _ in 0..20_000 {
                if std::time::Instant::now() > deadline {
                    break;
                }
                match open_beneath(&vol, "v", "a/b") {
                    Ok(f) => {
                        let got = real(&f);
                        assert!(got.starts_with(&vol_real), "escaped to {}", got.display());
                        inside += 1;
                    }
                    Err(SubpathError::Escapes { .. }) => refused += 1,
                    Err(e) => panic!("{e}"),
                }
            }
            stop.store(true, Ordering::Relaxed);
            exchanges = flipper.join().unwrap();
        });
        eprintln!("{inside} walks inside, {refused} refused, {exchanges} exchanges");
        assert!(
            exchanges > 0 && inside > 0 && refused > 0,
            "both states were seen: {inside} inside, {refused} refused, {exchanges} exchanges"
        );
        assert!(!outside.join("a/b/mine").exists());
    }

    /// The real binder: a tmpfs is mounted once however often a sync asks for it, and goes
    /// with unmount_below.
    #[test]
    fn kernel_tmpfs_is_mounted_once_and_unmounted() {
        if !nix::unistd::Uid::effective().is_root() {
            eprintln!("SKIPPED: mounting a tmpfs needs root");
            return;
        }
        let d = tempfile::tempdir().unwrap();
        let dir = d.path().join("vol");
        std::fs::create_dir(&dir).unwrap();
        assert!(!is_likely_mount_point(&dir).unwrap());
        let b = KernelBinder;
        if let Err(e) = b.ensure_tmpfs(&dir, Some(1 << 20)) {
            eprintln!("SKIPPED: mount(2) refused here: {e}");
            return;
        }
        b.ensure_tmpfs(&dir, Some(1 << 20)).unwrap();
        let mounted = mounts_below(&dir).unwrap();
        b.unmount_below(&dir).unwrap();
        assert_eq!(mounted, vec![dir.clone()], "one tmpfs, not one per call");
        assert!(!is_likely_mount_point(&dir).unwrap());
    }
}
