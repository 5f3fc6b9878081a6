//! An [`FsUsage`](super::FsUsage) answering fixed figures and counting its calls, for tests.

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use crate::volume::csi::client::VolumeStats;

/// Answers `stats` for every path (an error for paths in `failing`); records each path asked.
#[derive(Debug, Default)]
pub struct FakeFsUsage {
    pub stats: Mutex<VolumeStats>,
    pub failing: Mutex<Vec<PathBuf>>,
    pub asked: Mutex<Vec<PathBuf>>,
}

impl super::FsUsage for FakeFsUsage {
    fn usage(&self, path: &Path) -> std::io::Result<VolumeStats> {
        self.asked.lock().unwrap().push(path.to_path_buf());
        if self.failing.lock().unwrap().iter().any(|p| p == path) {
            return Err(std::io::Error::other("statfs failed"));
        }
        Ok(*self.stats.lock().unwrap())
    }
}
