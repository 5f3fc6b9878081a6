//! Listing the plugin sockets under the registry directory (blocking: run it on the blocking
//! pool).

use std::collections::BTreeMap;
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

/// Deepest subdirectory searched below the registry directory (plugins use one level).
const MAX_DEPTH: usize = 4;
/// Most entries looked at in one pass, so that a directory flooded with files cannot stall
/// the manager.
const MAX_ENTRIES: usize = 4096;

/// Identifies one socket file: a socket deleted and made again at the same path is a new
/// plugin (upstream compares the creation timestamp).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SocketId {
    pub dev: u64,
    pub ino: u64,
    pub ctime_ns: i128,
}

/// Creates the registry directory if missing.
pub(super) fn ensure_dir(dir: &Path) -> std::io::Result<()> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o750)
        .create(dir)
}

/// Every unix socket under `dir` whose name does not start with `.`, by path. Symlinks are not
/// followed (neither to sockets nor to directories): a plugin's socket lives here itself.
pub(super) fn sockets(dir: &Path) -> BTreeMap<PathBuf, SocketId> {
    let mut out = BTreeMap::new();
    let mut budget = MAX_ENTRIES;
    walk(dir, 0, &mut budget, &mut out);
    out
}

fn walk(dir: &Path, depth: usize, budget: &mut usize, out: &mut BTreeMap<PathBuf, SocketId>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        if *budget == 0 {
            return;
        }
        *budget -= 1;
        if entry.file_name().as_encoded_bytes().starts_with(b".") {
            continue;
        }
        // symlink_metadata: the entry itself, never what a symlink names.
        let Ok(meta) = std::fs::symlink_metadata(entry.path()) else {
            continue;
        };
        let ft = meta.file_type();
        if ft.is_dir() && depth < MAX_DEPTH {
            walk(&entry.path(), depth + 1, budget, out);
        } else if ft.is_socket() {
            out.insert(
                entry.path(),
                SocketId {
                    dev: meta.dev(),
                    ino: meta.ino(),
                    ctime_ns: i128::from(meta.ctime()) * 1_000_000_000
                        + i128::from(meta.ctime_nsec()),
                },
            );
        }
    }
}
