//! hostPath volumes: upstream's `type` checks (and the two `OrCreate` kinds). Blocking.

use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::PathBuf;

/// A hostPath `type` check that failed, in upstream's words.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
#[error("hostPath type check failed: {0}")]
pub struct HostPathError(pub String);

/// Checks (and for `DirectoryOrCreate` / `FileOrCreate` makes) `path` as `kind` says.
pub fn check(path: &str, kind: Option<&str>) -> Result<PathBuf, HostPathError> {
    let p = PathBuf::from(path);
    let meta = || std::fs::metadata(&p);
    let not = |what: &str| HostPathError(format!("{path} is not {what}"));
    match kind.unwrap_or("") {
        "" => {}
        "DirectoryOrCreate" => {
            if !p.exists() {
                std::fs::DirBuilder::new()
                    .recursive(true)
                    .create(&p)
                    .map_err(|e| HostPathError(format!("creating {path}: {e}")))?;
            }
            if !meta().is_ok_and(|m| m.is_dir()) {
                return Err(not("a directory"));
            }
        }
        "Directory" => {
            if !meta().is_ok_and(|m| m.is_dir()) {
                return Err(not("a directory"));
            }
        }
        "FileOrCreate" => {
            if !p.exists() {
                std::fs::OpenOptions::new()
                    .write(true)
                    .create(true)
                    .truncate(false)
                    .mode(0o644)
                    .open(&p)
                    .map_err(|e| HostPathError(format!("creating {path}: {e}")))?;
            }
            if !meta().is_ok_and(|m| m.is_file()) {
                return Err(not("a file"));
            }
        }
        "File" => {
            if !meta().is_ok_and(|m| m.is_file()) {
                return Err(not("a file"));
            }
        }
        "Socket" => {
            if !meta().is_ok_and(|m| m.file_type().is_socket()) {
                return Err(not("a socket file"));
            }
        }
        "CharDevice" => {
            if !meta().is_ok_and(|m| m.file_type().is_char_device()) {
                return Err(not("a character device"));
            }
        }
        "BlockDevice" => {
            if !meta().is_ok_and(|m| m.file_type().is_block_device()) {
                return Err(not("a block device"));
            }
        }
        other => return Err(HostPathError(format!("invalid type {other:?} for {path}"))),
    }
    Ok(p)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_type_is_checked() {
        let d = tempfile::tempdir().unwrap();
        let dir = d.path().display().to_string();
        let file = d.path().join("f");
        std::fs::write(&file, "x").unwrap();
        let file = file.display().to_string();
        assert!(check(&dir, Some("Directory")).is_ok());
        assert_eq!(
            check(&file, Some("Directory")).unwrap_err().to_string(),
            format!("hostPath type check failed: {file} is not a directory")
        );
        assert!(check(&file, Some("File")).is_ok());
        assert!(check(&dir, Some("File")).is_err());
        assert!(check(&file, Some("Socket")).is_err());
        assert!(check("/dev/null", Some("CharDevice")).is_ok());
        assert!(check("/dev/null", Some("BlockDevice")).is_err());
        assert!(check("/nonexistent/x", None).is_ok());
        let made = d.path().join("a/b").display().to_string();
        assert!(check(&made, Some("DirectoryOrCreate")).unwrap().is_dir());
        let new_file = d.path().join("g").display().to_string();
        assert!(check(&new_file, Some("FileOrCreate")).unwrap().is_file());
        assert!(check(&dir, Some("Pipe")).is_err());
    }
}
