//! The file side of log rotation: which rotated files go and which are compressed (pure
//! [`plan`]), and the blocking file work that carries it out.

use super::{LogError, Result};
use crate::fs_at;
use std::ffi::{OsStr, OsString};
use std::io::Write;
use std::path::{Path, PathBuf};

/// Upstream's suffix of a compressed rotated log.
pub const COMPRESS_SUFFIX: &str = ".gz";
/// Upstream's suffix of a compression in progress (left over when interrupted).
pub const TMP_SUFFIX: &str = ".tmp";

/// What looking at one container's log came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The runtime keeps no log file for it.
    NoLog,
    /// Below `containerLogMaxSize`.
    Small,
    /// Renamed to `rotated`; the runtime reopened `path`.
    Rotated { path: PathBuf, rotated: PathBuf },
}

/// What to do with a log's rotated files (`<log>.*`) before the current file is rotated.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Plan {
    /// Leftovers of an interrupted rotation (`.tmp` files, files already compressed) and the
    /// oldest rotated files beyond `max_files - 2`, oldest first.
    pub remove: Vec<String>,
    /// The rotated files that stay but are not compressed yet.
    pub compress: Vec<String>,
}

/// Upstream's decision for the rotated files of one log (names in any order). The current
/// file and the one about to be rotated count towards `max_files`, so `max_files - 2` rotated
/// files stay; all of them end up compressed (the newest rotated file is only made after
/// this, and stays uncompressed until the next rotation).
pub fn plan(rotated: &[String], max_files: usize) -> Plan {
    let mut p = Plan::default();
    let mut in_use: Vec<String> = Vec::new();
    for l in rotated {
        let unused = l.ends_with(TMP_SUFFIX)
            || (!l.ends_with(COMPRESS_SUFFIX)
                && rotated
                    .iter()
                    .any(|o| *o == format!("{l}{COMPRESS_SUFFIX}")));
        if unused {
            p.remove.push(l.clone());
        } else {
            in_use.push(l.clone());
        }
    }
    // Timestamps sort as text; `x.gz` sorts right after `x`.
    in_use.sort();
    let keep = max_files.saturating_sub(2);
    let excess = in_use.len().saturating_sub(keep);
    p.remove.extend(in_use.drain(..excess));
    p.compress = in_use
        .into_iter()
        .filter(|l| !l.ends_with(COMPRESS_SUFFIX))
        .collect();
    p
}

/// `<log>.<YYYYMMDD-hhmmss>` (upstream's `20060102-150405` format) in `zone`.
pub fn rotated_name(log: &Path, now: jiff::Timestamp, zone: &jiff::tz::TimeZone) -> PathBuf {
    let stamp = now.to_zoned(zone.clone()).strftime("%Y%m%d-%H%M%S");
    let mut s = log.as_os_str().to_os_string();
    s.push(format!(".{stamp}"));
    PathBuf::from(s)
}

/// The kubelet's local time zone as Go's `time.Local` finds it: `$TZ` (empty: UTC; a name
/// under /usr/share/zoneinfo or an absolute path), else /etc/localtime; UTC when unreadable.
/// Reads files: call it on the blocking pool.
pub fn local_zone() -> jiff::tz::TimeZone {
    let path = match std::env::var("TZ") {
        Ok(tz) if tz.is_empty() || tz == "UTC" => return jiff::tz::TimeZone::UTC,
        Ok(tz) => {
            let tz = tz.trim_start_matches(':').to_string();
            if tz.starts_with('/') {
                PathBuf::from(tz)
            } else {
                Path::new("/usr/share/zoneinfo").join(tz)
            }
        }
        Err(_) => PathBuf::from("/etc/localtime"),
    };
    std::fs::read(&path)
        .ok()
        .and_then(|b| jiff::tz::TimeZone::tzif("localtime", &b).ok())
        .unwrap_or(jiff::tz::TimeZone::UTC)
}

fn io(what: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> LogError {
    let path = path.to_path_buf();
    move |source| LogError::Io { what, path, source }
}

/// A log's directory, open: every file operation below is relative to its descriptor with
/// one-component names and never follows a symlink. A pod with a hostPath on /var/log can
/// plant links, FIFOs and swapped directories here; they are removed or refused, never
/// followed (no host file read into a `.gz`, none written through a planted `.tmp`).
struct LogDir {
    fd: std::os::fd::OwnedFd,
    path: PathBuf,
}

impl LogDir {
    /// The directory of `log`, with `log`'s file name.
    fn of(log: &Path) -> Result<(LogDir, OsString)> {
        let path = log.parent().unwrap_or(Path::new(".")).to_path_buf();
        let name = log.file_name().map(OsStr::to_os_string).unwrap_or_default();
        let fd = fs_at::open_dir(&path).map_err(io("open log directory", &path))?;
        Ok((LogDir { fd, path }, name))
    }

    fn full(&self, name: &OsStr) -> PathBuf {
        self.path.join(name)
    }

    /// The names in the directory that start with `prefix`.
    fn names_with(&self, prefix: &str) -> Result<Vec<OsString>> {
        let entries = fs_at::entries(&self.fd).map_err(io("list log files in", &self.path))?;
        Ok(entries
            .into_iter()
            .map(|(n, _)| n)
            .filter(|n| n.to_string_lossy().starts_with(prefix))
            .collect())
    }

    /// Unlinks `name` (a symlink itself, never what it names); absent is fine.
    fn remove(&self, name: &OsStr) -> Result<()> {
        match nix::unistd::unlinkat(&self.fd, name, nix::unistd::UnlinkatFlags::NoRemoveDir) {
            Ok(()) | Err(nix::errno::Errno::ENOENT) => Ok(()),
            Err(e) => Err(io("remove log", &self.full(name))(e.into())),
        }
    }

    fn rename(&self, from: &OsStr, to: &OsStr) -> Result<()> {
        fs_at::rename_at(&self.fd, from, to).map_err(io("rename log", &self.full(from)))
    }

    /// Gzips the regular file `name` into `<name>.tmp` (made new, never through a link),
    /// renames that to `<name>.gz` and removes `name`. Anything but a regular file under a
    /// rotated log's name is not the runtime's: it is removed, not read.
    fn compress(&self, name: &OsStr) -> Result<()> {
        use nix::fcntl::OFlag;
        use nix::sys::stat::Mode;
        let log = self.full(name);
        let flags = OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC;
        let src = match nix::fcntl::openat(&self.fd, name, flags, Mode::empty()) {
            Ok(fd) => std::fs::File::from(fd),
            Err(nix::errno::Errno::ELOOP) => return self.remove_planted(name),
            Err(e) => return Err(io("open log", &log)(e.into())),
        };
        let meta = src.metadata().map_err(io("stat log file", &log))?;
        if !meta.file_type().is_file() {
            drop(src);
            return self.remove_planted(name);
        }
        let mut tmp = name.to_os_string();
        tmp.push(TMP_SUFFIX);
        let mut gz_name = name.to_os_string();
        gz_name.push(COMPRESS_SUFFIX);
        self.remove(&tmp)?;
        let result = (|| -> Result<()> {
            use std::os::unix::fs::PermissionsExt;
            let create = OFlag::O_WRONLY
                | OFlag::O_CREAT
                | OFlag::O_EXCL
                | OFlag::O_NOFOLLOW
                | OFlag::O_CLOEXEC;
            let mode = Mode::from_bits_truncate(meta.permissions().mode() & 0o777);
            let out = nix::fcntl::openat(&self.fd, tmp.as_os_str(), create, mode)
                .map(std::fs::File::from)
                .map_err(|e| io("create temporary log", &self.full(&tmp))(e.into()))?;
            let _ = out.set_permissions(meta.permissions());
            let mut gz = flate2::write::GzEncoder::new(out, flate2::Compression::default());
            let mut src = src;
            std::io::copy(&mut src, &mut gz).map_err(io("compress log", &log))?;
            let mut out = gz.finish().map_err(io("compress log", &log))?;
            out.flush().map_err(io("compress log", &log))?;
            fs_at::rename_at(&self.fd, &tmp, &gz_name)
                .map_err(io("rename compressed log to", &self.full(&gz_name)))?;
            self.remove(name)
        })();
        // Best effort: nothing is left behind when compression failed.
        let _ = self.remove(&tmp);
        result
    }

    fn remove_planted(&self, name: &OsStr) -> Result<()> {
        tracing::warn!(file = %self.full(name).display(), "Removing a rotated log that is not a regular file");
        self.remove(name)
    }
}

/// The names next to `log` that start with `<log file name><suffix>`.
fn siblings(dir: &LogDir, name: &OsStr, suffix: &str) -> Result<Vec<String>> {
    let prefix = format!("{}{suffix}", name.to_string_lossy());
    Ok(dir
        .names_with(&prefix)?
        .into_iter()
        .map(|n| n.to_string_lossy().into_owned())
        .collect())
}

/// Every rotated file of `log` (`<log>.*`) except leftovers, oldest first, then `log`: what
/// upstream's GetAllLogs returns.
pub fn all_logs(log: &Path) -> Result<Vec<String>> {
    let (dir, name) = LogDir::of(log)?;
    let rotated = siblings(&dir, &name, ".")?;
    let p = plan(&rotated, usize::MAX);
    let mut inuse: Vec<String> = rotated
        .into_iter()
        .filter(|l| !p.remove.contains(l))
        .map(|l| dir.full(OsStr::new(&l)).to_string_lossy().into_owned())
        .collect();
    inuse.sort();
    inuse.push(log.to_string_lossy().into_owned());
    Ok(inuse)
}

/// Gzips `log` into `<log>.tmp`, renames that to `<log>.gz` and removes `log`, as upstream,
/// all from the directory's descriptor (see [`LogDir`]).
pub fn compress(log: &Path) -> Result<()> {
    let (dir, name) = LogDir::of(log)?;
    dir.compress(&name)
}

/// Renames `from` to `to`, both in one directory.
pub fn rename(from: &Path, to: &Path) -> Result<()> {
    let (dir, from_name) = LogDir::of(from)?;
    let to_name = to.file_name().unwrap_or_default();
    if to.parent() != from.parent() {
        return Err(io("rename log", from)(
            std::io::ErrorKind::InvalidInput.into(),
        ));
    }
    dir.rename(&from_name, to_name)
}

/// Everything before the runtime reopens the log: the [`plan`] for the rotated files
/// (removals, then compression), then `log` renamed to `rotated`.
pub fn prepare_and_rename(log: &Path, rotated: &Path, max_files: usize) -> Result<()> {
    let (dir, name) = LogDir::of(log)?;
    let p = plan(&siblings(&dir, &name, ".")?, max_files);
    for l in &p.remove {
        dir.remove(OsStr::new(l))?;
    }
    for l in &p.compress {
        dir.compress(OsStr::new(l))?;
    }
    rename(log, rotated)
}

/// Removes `<log>*`: the current file and every rotated one.
pub fn remove_all(log: &Path) -> Result<()> {
    let (dir, name) = match LogDir::of(log) {
        Ok(d) => d,
        // No directory: nothing to remove.
        Err(LogError::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {
            return Ok(());
        }
        Err(e) => return Err(e),
    };
    siblings(&dir, &name, "")?
        .iter()
        .try_for_each(|f| dir.remove(OsStr::new(f)))
}
