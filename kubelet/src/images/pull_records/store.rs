//! The records on disk, as upstream's `fsPullRecordsAccessor`: intents in
//! `<root-dir>/image_manager/pulling/`, pulled records in `<root-dir>/image_manager/pulled/`,
//! each file named `sha256-<hex of SHA-256 of the image (intent) or image ID (record)>`,
//! directories 0700, files replaced atomically with mode 0600. Other files (temporary ones
//! included) are ignored. Blocking: call from the blocking pool.

use std::io;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use super::format::{self, ImagePullIntent, ImagePulledRecord};

const PREFIX: &str = "sha256-";

/// Why a record could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: io::Error },
    #[error("failed to deserialize content of file {path:?}: {source}")]
    Decode {
        path: PathBuf,
        source: format::DecodeError,
    },
}

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> StoreError + '_ {
    move |source| StoreError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Upstream's `cacheFilename`.
pub fn file_name(key: &str) -> String {
    format!("{PREFIX}{}", hex::encode(Sha256::digest(key.as_bytes())))
}

/// The two record directories.
#[derive(Debug, Clone)]
pub struct Store {
    pulling: PathBuf,
    pulled: PathBuf,
}

fn mkdir(dir: &Path) -> Result<(), StoreError> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(io_err(dir))
}

impl Store {
    /// The store under `root_dir`, its directories created.
    pub fn open(root_dir: &Path) -> Result<Self, StoreError> {
        let base = root_dir.join("image_manager");
        let s = Store {
            pulling: base.join("pulling"),
            pulled: base.join("pulled"),
        };
        mkdir(&s.pulling)?;
        mkdir(&s.pulled)?;
        Ok(s)
    }

    pub fn pulling_dir(&self) -> &Path {
        &self.pulling
    }

    pub fn pulled_dir(&self) -> &Path {
        &self.pulled
    }

    fn write(dir: &Path, key: &str, bytes: &[u8]) -> Result<(), StoreError> {
        mkdir(dir)?;
        let path = dir.join(file_name(key));
        crate::atomic_file::write_private_atomic(&path, bytes).map_err(io_err(&path))
    }

    fn read(dir: &Path, key: &str) -> Result<Option<(PathBuf, Vec<u8>)>, StoreError> {
        let path = dir.join(file_name(key));
        match std::fs::read(&path) {
            Ok(b) => Ok(Some((path, b))),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(io_err(&path)(e)),
        }
    }

    fn delete(dir: &Path, key: &str) -> Result<(), StoreError> {
        let path = dir.join(file_name(key));
        match std::fs::remove_file(&path) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(io_err(&path)(e)),
            _ => Ok(()),
        }
    }

    /// Every record file of `dir` decoded with `decode`; files that do not read or decode
    /// come back as errors beside the rest.
    fn list<T>(
        dir: &Path,
        decode: impl Fn(&[u8]) -> Result<T, format::DecodeError>,
    ) -> (Vec<T>, Vec<StoreError>) {
        let (mut out, mut errors) = (Vec::new(), Vec::new());
        let entries = match std::fs::read_dir(dir) {
            Ok(e) => e,
            Err(e) => return (out, vec![io_err(dir)(e)]),
        };
        for entry in entries {
            let entry = match entry {
                Ok(e) => e,
                Err(e) => {
                    errors.push(io_err(dir)(e));
                    continue;
                }
            };
            let name = entry.file_name();
            let name = name.to_string_lossy();
            if !name.starts_with(PREFIX)
                || name.ends_with(".tmp")
                || entry.file_type().is_ok_and(|t| t.is_dir())
            {
                continue;
            }
            let path = entry.path();
            match std::fs::read(&path) {
                Ok(b) => match decode(&b) {
                    Ok(v) => out.push(v),
                    Err(source) => errors.push(StoreError::Decode { path, source }),
                },
                Err(e) => errors.push(io_err(&path)(e)),
            }
        }
        (out, errors)
    }

    pub fn write_intent(&self, image: &str) -> Result<(), StoreError> {
        Self::write(
            &self.pulling,
            image,
            &format::encode(&ImagePullIntent::new(image)),
        )
    }

    /// An intent for exactly `image` exists (a file whose content names another image, a
    /// hash collision, does not count).
    pub fn intent_exists(&self, image: &str) -> Result<bool, StoreError> {
        let Some((path, bytes)) = Self::read(&self.pulling, image)? else {
            return Ok(false);
        };
        let intent =
            format::decode_intent(&bytes).map_err(|source| StoreError::Decode { path, source })?;
        Ok(intent.image == image)
    }

    pub fn delete_intent(&self, image: &str) -> Result<(), StoreError> {
        Self::delete(&self.pulling, image)
    }

    pub fn list_intents(&self) -> (Vec<ImagePullIntent>, Vec<StoreError>) {
        Self::list(&self.pulling, format::decode_intent)
    }

    /// The record of `image_ref`: `Ok(None)` when there is none (or the file is another
    /// image's); an error when it does not read or decode.
    pub fn get_pulled(&self, image_ref: &str) -> Result<Option<ImagePulledRecord>, StoreError> {
        let Some((path, bytes)) = Self::read(&self.pulled, image_ref)? else {
            return Ok(None);
        };
        let r =
            format::decode_pulled(&bytes).map_err(|source| StoreError::Decode { path, source })?;
        Ok((r.image_ref == image_ref).then_some(r))
    }

    pub fn write_pulled(&self, record: &ImagePulledRecord) -> Result<(), StoreError> {
        Self::write(&self.pulled, &record.image_ref, &format::encode(record))
    }

    pub fn delete_pulled(&self, image_ref: &str) -> Result<(), StoreError> {
        Self::delete(&self.pulled, image_ref)
    }

    pub fn list_pulled(&self) -> (Vec<ImagePulledRecord>, Vec<StoreError>) {
        Self::list(&self.pulled, format::decode_pulled)
    }
}
