//! A [`Binder`] that mounts nothing: it records what would be bound.

use super::*;
use std::sync::Mutex;

#[derive(Debug, Default)]
pub struct FakeBinder {
    /// (the object's real path, the mount point), per bind.
    pub binds: Mutex<Vec<(PathBuf, PathBuf)>>,
    /// (directory, size) per tmpfs mount.
    pub tmpfs: Mutex<Vec<(PathBuf, Option<u64>)>>,
    /// (directory, option) per hugetlbfs mount.
    pub hugetlbfs: Mutex<Vec<(PathBuf, String)>>,
    /// Directories made rshared.
    pub shared: Mutex<Vec<PathBuf>>,
}

impl Binder for FakeBinder {
    fn bind_fd(&self, fd: &File, target: &Path) -> std::io::Result<()> {
        use std::os::fd::AsRawFd;
        let real = std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd()))?;
        self.binds
            .lock()
            .unwrap()
            .push((real, target.to_path_buf()));
        Ok(())
    }

    fn unmount_below(&self, _dir: &Path) -> std::io::Result<()> {
        Ok(())
    }

    fn ensure_tmpfs(&self, dir: &Path, size: Option<u64>) -> std::io::Result<()> {
        let mut t = self.tmpfs.lock().unwrap();
        if !t.iter().any(|(d, _)| d == dir) {
            t.push((dir.to_path_buf(), size));
        }
        Ok(())
    }

    fn make_rshared(&self, dir: &Path) -> std::io::Result<()> {
        self.shared.lock().unwrap().push(dir.to_path_buf());
        Ok(())
    }

    fn ensure_hugetlbfs(&self, dir: &Path, option: &str) -> std::io::Result<()> {
        let mut h = self.hugetlbfs.lock().unwrap();
        if !h.iter().any(|(d, _)| d == dir) {
            h.push((dir.to_path_buf(), option.to_string()));
        }
        Ok(())
    }
}
