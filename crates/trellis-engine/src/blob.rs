//! Large values kept out of the context: blob references and the store that holds their bytes.

use std::io;
use std::path::PathBuf;

/// Blob references look like `blob://sha256/<hex>`.
pub const BLOB_PREFIX: &str = "blob://sha256/";
/// The reference of no bytes (a quiet command's output): what it stands for is known without a read.
pub const EMPTY_BLOB: &str =
    "blob://sha256/e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";
/// Context values whose JSON is longer than this are stored as blobs.
pub const BLOB_THRESHOLD: usize = 100 * 1024;

/// Content-addressed storage for large values and command output.
pub trait BlobStore: Send + Sync {
    /// Stores bytes once and returns their reference.
    fn put(&self, bytes: &[u8]) -> io::Result<String>;
    fn get(&self, reference: &str) -> io::Result<Vec<u8>>;
    /// A file holding the blob, for preambles that point at content instead of inlining it.
    fn path_of(&self, reference: &str) -> Option<PathBuf>;
    /// Makes the blobs stored so far durable, for a store that writes them without waiting for the
    /// disk: the record calls it before it syncs the journal entries that name them.
    fn sync(&self) -> io::Result<()> {
        Ok(())
    }
}
