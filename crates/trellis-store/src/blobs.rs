//! The content-addressed blob store: each value is stored once, under the SHA-256 of its bytes, and
//! referred to as `blob://sha256/<hex>`.

use std::fmt::Write as _;
use std::io;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};
use trellis_engine::services::{BLOB_PREFIX, BlobStore};

use crate::run_dir::write_atomically;

pub struct FileBlobs {
    dir: PathBuf,
}

impl FileBlobs {
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self { dir: dir.into() }
    }

    fn file_of(&self, reference: &str) -> Option<PathBuf> {
        let hex = reference.strip_prefix(BLOB_PREFIX)?;
        (hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_hexdigit())).then(|| self.dir.join(hex))
    }
}

impl BlobStore for FileBlobs {
    fn put(&self, bytes: &[u8]) -> io::Result<String> {
        let hex = Sha256::digest(bytes)
            .iter()
            .fold(String::with_capacity(64), |mut hex, b| {
                let _ = write!(hex, "{b:02x}");
                hex
            });
        let path = self.dir.join(&hex);
        if !path.exists() {
            std::fs::create_dir_all(&self.dir)?;
            write_atomically(&path, bytes)?;
        }
        Ok(format!("{BLOB_PREFIX}{hex}"))
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
