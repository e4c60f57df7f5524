//! The content-addressed blob store: each value is stored once, under the SHA-256 of its bytes, and
//! referred to as `blob://sha256/<hex>`.
//!
//! A blob is written whole (a temp file renamed into place) without waiting for the disk: a command
//! stage's output would otherwise cost a sync on the way to the next stage. The record syncs the
//! blobs written since its last sync before it syncs the journal entries that name them
//! ([`BlobStore::sync`]), and a resume checks the blobs the journal names past its last snapshot
//! ([`crate::RunDir::checkpoint_to_resume`]), so a crash of the machine loses at most the entries
//! the journal itself could lose.

use std::fmt::Write as _;
use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use parking_lot::Mutex;
use sha2::{Digest, Sha256};
use trellis_engine::services::{BLOB_PREFIX, BlobStore};

use crate::run_dir::write_whole;

pub struct FileBlobs {
    dir: PathBuf,
    /// The blobs written and not yet synced.
    unsynced: Mutex<Vec<PathBuf>>,
    /// Whether the folder's own name has been synced (once).
    named: AtomicBool,
}

impl FileBlobs {
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self {
            dir: dir.into(),
            unsynced: Mutex::default(),
            named: AtomicBool::new(false),
        }
    }

    #[cfg(test)]
    pub(crate) fn unsynced_is_empty(&self) -> bool {
        self.unsynced.lock().is_empty()
    }

    /// Whether `reference` names a blob and its file does not hold it whole: missing, or holding
    /// bytes whose SHA-256 is not its name (a crash of the machine may leave one so, see the
    /// module's note). Not a text that only looks like a reference.
    pub(crate) fn is_damaged(&self, reference: &str) -> bool {
        self.file_of(reference).is_some_and(|path| {
            !std::fs::read(path).is_ok_and(|bytes| reference.ends_with(&digest(&bytes)))
        })
    }

    fn file_of(&self, reference: &str) -> Option<PathBuf> {
        let hex = reference.strip_prefix(BLOB_PREFIX)?;
        (hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_hexdigit())).then(|| self.dir.join(hex))
    }
}

/// The name of `bytes`: their SHA-256, in hexadecimal.
fn digest(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .fold(String::with_capacity(64), |mut hex, b| {
            let _ = write!(hex, "{b:02x}");
            hex
        })
}

/// Whether the file at `path` holds exactly `bytes` (a blob a crash of the machine cut short does
/// not, and is written again). The length first: a quiet command's empty output needs no read.
fn holds(path: &Path, bytes: &[u8]) -> bool {
    std::fs::metadata(path).is_ok_and(|m| m.len() == bytes.len() as u64)
        && (bytes.is_empty() || std::fs::read(path).is_ok_and(|held| held == bytes))
}

impl BlobStore for FileBlobs {
    fn put(&self, bytes: &[u8]) -> io::Result<String> {
        let hex = digest(bytes);
        let path = self.dir.join(&hex);
        if !holds(&path, bytes) {
            match write_whole(&path, bytes) {
                // The run's first blob: its folder is made then.
                Err(error) if error.kind() == io::ErrorKind::NotFound => {
                    crate::run_dir::private_dir(&self.dir)?;
                    write_whole(&path, bytes)?;
                }
                written => written?,
            }
            self.unsynced.lock().push(path);
        }
        Ok(format!("{BLOB_PREFIX}{hex}"))
    }

    fn sync(&self) -> io::Result<()> {
        let written = std::mem::take(&mut *self.unsynced.lock());
        if written.is_empty() {
            return Ok(());
        }
        let synced = written
            .iter()
            .try_for_each(|path| File::open(path)?.sync_data())
            // Their names, and (the first time) the folder's in the run's.
            .and_then(|()| File::open(&self.dir)?.sync_all())
            .and_then(|()| match self.dir.parent() {
                Some(parent) if !self.named.load(Ordering::Relaxed) => {
                    File::open(parent)?.sync_all()?;
                    self.named.store(true, Ordering::Relaxed);
                    Ok(())
                }
                _ => Ok(()),
            });
        if synced.is_err() {
            // Synced by the next call, or reported again.
            self.unsynced.lock().extend(written);
        }
        synced
    }

    fn get(&self, reference: &str) -> io::Result<Vec<u8>> {
        let path = self.file_of(reference).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("not a blob reference: {reference}"),
            )
        })?;
        std::fs::read(path)
    }

    fn path_of(&self, reference: &str) -> Option<PathBuf> {
        self.file_of(reference).filter(|p| Path::exists(p))
    }
}

#[cfg(test)]
mod tests {
    use trellis_engine::services::EMPTY_BLOB;

    use super::*;

    #[test]
    fn stores_once_by_content() {
        let dir = tempfile::tempdir().unwrap();
        let blobs = FileBlobs::new(dir.path());
        let a = blobs.put(b"hello").unwrap();
        assert_eq!(
            a,
            "blob://sha256/2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824"
        );
        assert_eq!(blobs.put(b"hello").unwrap(), a);
        assert_eq!(blobs.get(&a).unwrap(), b"hello");
        assert_eq!(blobs.put(b"").unwrap(), EMPTY_BLOB);
        assert!(blobs.get("blob://sha256/../../etc/passwd").is_err());
    }
}
