//! The file side of log rotation: which rotated files go and which are compressed (pure
//! [`plan`]), and the blocking file work that carries it out.

use super::{LogError, Result};
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

/// The files next to `log` whose name starts with `<log file name><suffix>`, as full paths.
fn siblings(log: &Path, suffix: &str) -> Result<Vec<String>> {
    let dir = log.parent().unwrap_or(Path::new("."));
    let name = log
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let prefix = format!("{name}{suffix}");
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).map_err(io("list log files in", dir))? {
        let e = e.map_err(io("list log files in", dir))?;
        let n = e.file_name().to_string_lossy().into_owned();
        if n.starts_with(&prefix) {
            out.push(dir.join(n).to_string_lossy().into_owned());
        }
    }
    Ok(out)
}

/// Every rotated file of `log` (`<log>.*`) except leftovers, oldest first, then `log`: what
/// upstream's GetAllLogs returns.
pub fn all_logs(log: &Path) -> Result<Vec<String>> {
    let rotated = siblings(log, ".")?;
    let p = plan(&rotated, usize::MAX);
    let mut inuse: Vec<String> = rotated
        .into_iter()
        .filter(|l| !p.remove.contains(l))
        .collect();
    inuse.sort();
    inuse.push(log.to_string_lossy().into_owned());
    Ok(inuse)
}

/// Gzips `log` into `<log>.tmp`, renames that to `<log>.gz` and removes `log`, as upstream.
pub fn compress(log: &Path) -> Result<()> {
    let meta = std::fs::metadata(log).map_err(io("stat log file", log))?;
    let mut src = std::fs::File::open(log).map_err(io("open log", log))?;
    let tmp = PathBuf::from(format!("{}{TMP_SUFFIX}", log.display()));
    let result = (|| -> Result<()> {
        let out = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .open(&tmp)
            .map_err(io("create temporary log", &tmp))?;
        let _ = out.set_permissions(meta.permissions());
        let mut gz = flate2::write::GzEncoder::new(out, flate2::Compression::default());
        std::io::copy(&mut src, &mut gz).map_err(io("compress log", log))?;
        let mut out = gz.finish().map_err(io("compress log", log))?;
        out.flush().map_err(io("compress log", log))?;
        let gz_path = PathBuf::from(format!("{}{COMPRESS_SUFFIX}", log.display()));
        std::fs::rename(&tmp, &gz_path).map_err(io("rename compressed log to", &gz_path))?;
        std::fs::remove_file(log).map_err(io("remove log after compress", log))
    })();
    // Best effort: nothing is left behind when compression failed.
    let _ = std::fs::remove_file(&tmp);
    result
}

pub fn rename(from: &Path, to: &Path) -> Result<()> {
    std::fs::rename(from, to).map_err(io("rename log", from))
}

fn remove(path: &str) -> Result<()> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            Err(io("remove log", Path::new(path))(e))
        }
        _ => Ok(()),
    }
}

/// Everything before the runtime reopens the log: the [`plan`] for the rotated files
/// (removals, then compression), then `log` renamed to `rotated`.
pub fn prepare_and_rename(log: &Path, rotated: &Path, max_files: usize) -> Result<()> {
    let p = plan(&siblings(log, ".")?, max_files);
    for l in &p.remove {
        remove(l)?;
    }
    for l in &p.compress {
        compress(Path::new(l))?;
    }
    rename(log, rotated)
}

/// Removes `<log>*`: the current file and every rotated one.
pub fn remove_all(log: &Path) -> Result<()> {
    match siblings(log, "") {
        Ok(files) => files.iter().try_for_each(|f| remove(f)),
        // No directory: nothing to remove.
        Err(LogError::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}
