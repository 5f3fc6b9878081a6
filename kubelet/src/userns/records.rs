//! The per-pod record file `<root-dir>/pods/<uid>/userns` (upstream's name and JSON), behind
//! a narrow trait so that the manager's logic is tested without a disk.

use std::io;
use std::path::PathBuf;

/// The record's file name in the pod's directory (upstream's).
pub const RECORD_FILE: &str = "userns";

/// The pods' user namespace records. Blocking.
pub trait PodRecords: Send + Sync + 'static {
    /// The UIDs of the pods that have a directory.
    fn pods(&self) -> io::Result<Vec<String>>;
    /// The pod's record (None: it has none).
    fn read(&self, uid: &str) -> io::Result<Option<Vec<u8>>>;
    /// Writes the pod's record durably (atomically, then the directory synced), making its
    /// directory if needed.
    fn write(&self, uid: &str, data: &[u8]) -> io::Result<()>;
    /// Removes the pod's record (gone already: fine).
    fn remove(&self, uid: &str) -> io::Result<()>;
}

/// The records in `<root-dir>/pods`.
pub struct DirRecords {
    pub pods_dir: PathBuf,
}

impl DirRecords {
    fn file(&self, uid: &str) -> io::Result<PathBuf> {
        if !crate::podspec::is_safe_uid(uid) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "unsafe pod UID",
            ));
        }
        Ok(self.pods_dir.join(uid).join(RECORD_FILE))
    }
}

impl PodRecords for DirRecords {
    fn pods(&self) -> io::Result<Vec<String>> {
        let entries = match std::fs::read_dir(&self.pods_dir) {
            Ok(e) => e,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(e),
        };
        Ok(entries
            .flatten()
            .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|uid| crate::podspec::is_safe_uid(uid))
            .collect())
    }

    fn read(&self, uid: &str) -> io::Result<Option<Vec<u8>>> {
        match std::fs::read(self.file(uid)?) {
            Ok(b) if b.is_empty() => Ok(None),
            Ok(b) => Ok(Some(b)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    fn write(&self, uid: &str, data: &[u8]) -> io::Result<()> {
        let file = self.file(uid)?;
        let dir = file.parent().expect("a pod directory");
        std::fs::create_dir_all(dir)?;
        // Renamed into place, then the directory fsynced: durable, as upstream's.
        crate::atomic_file::write_private_atomic(&file, data)
    }

    fn remove(&self, uid: &str) -> io::Result<()> {
        match std::fs::remove_file(self.file(uid)?) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        }
    }
}

#[cfg(any(test, feature = "test-util"))]
pub mod fake {
    use super::*;
    use std::collections::BTreeMap;
    use std::sync::Mutex;

    /// Records in memory: pod UID → its directory's record (None: a directory without one).
    #[derive(Default)]
    pub struct FakeRecords {
        pub dirs: Mutex<BTreeMap<String, Option<Vec<u8>>>>,
        /// Writes fail (a full disk).
        pub fail_writes: std::sync::atomic::AtomicBool,
    }

    impl PodRecords for FakeRecords {
        fn pods(&self) -> io::Result<Vec<String>> {
            Ok(self.dirs.lock().unwrap().keys().cloned().collect())
        }
        fn read(&self, uid: &str) -> io::Result<Option<Vec<u8>>> {
            Ok(self.dirs.lock().unwrap().get(uid).cloned().flatten())
        }
        fn write(&self, uid: &str, data: &[u8]) -> io::Result<()> {
            if self.fail_writes.load(std::sync::atomic::Ordering::SeqCst) {
                return Err(io::Error::other("no space left on device"));
            }
            self.dirs
                .lock()
                .unwrap()
                .insert(uid.into(), Some(data.to_vec()));
            Ok(())
        }
        fn remove(&self, uid: &str) -> io::Result<()> {
            if let Some(r) = self.dirs.lock().unwrap().get_mut(uid) {
                *r = None;
            }
            Ok(())
        }
    }
}
