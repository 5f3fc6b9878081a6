//! The kubelet's root directory on a shared mount, as upstream's `MakeRShared` makes it at
//! start: mounts with HostToContainer or Bidirectional propagation need their source on a
//! shared (or slave) mount, which a host whose `/` is private does not give.

use std::path::{Path, PathBuf};

/// Whether the mount that holds `path` is shared (a `shared:N` optional field), from
/// `/proc/self/mountinfo` text: the longest mount point that contains `path`.
pub fn is_shared(mountinfo: &str, path: &Path) -> bool {
    let mut best: Option<(PathBuf, bool)> = None;
    for line in mountinfo.lines() {
        let fields: Vec<&str> = line.split(' ').collect();
        let Some(point) = fields.get(4) else { continue };
        let point = PathBuf::from(unescape_mountinfo(point));
        if !path.starts_with(&point) {
            continue;
        }
        // Optional fields run from the 7th field to the "-" separator.
        let shared = fields
            .iter()
            .skip(6)
            .take_while(|f| **f != "-")
            .any(|f| f.starts_with("shared:"));
        let longer = best
            .as_ref()
            .is_none_or(|(p, _)| point.components().count() >= p.components().count());
        if longer {
            best = Some((point, shared));
        }
    }
    best.is_some_and(|(_, shared)| shared)
}

/// Makes the kubelet's root directory rshared through `make_rshared` (a mounter's
/// `Binder::make_rshared`), off the async workers. Upstream refuses to start without it; here
/// a failure is logged, and only propagation mounts of volumes under the root directory are
/// affected.
pub async fn make_root_dir_rshared(
    make_rshared: impl FnOnce(&Path) -> std::io::Result<()> + Send + 'static,
    root: PathBuf,
) {
    let dir = root.clone();
    let done = tokio::task::spawn_blocking(move || {
        std::fs::create_dir_all(&dir)?;
        make_rshared(&dir)
    })
    .await;
    match done {
        Ok(Ok(())) => tracing::debug!(dir = %root.display(), "root directory is on a shared mount"),
        Ok(Err(e)) => {
            tracing::warn!(dir = %root.display(), error = %e, "making the root directory rshared failed: HostToContainer and Bidirectional mounts of its volumes will fail")
        }
        Err(e) => tracing::warn!(error = %e, "making the root directory rshared panicked"),
    }
}

/// mountinfo escapes space, tab, newline and backslash as `\ooo`.
pub(super) fn unescape_mountinfo(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            let v = (b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0');
            out.push(v);
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests;
