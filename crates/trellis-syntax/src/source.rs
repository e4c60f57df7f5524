//! A workflow source file held in memory: its name, its text, and a line index used only when rendering
//! diagnostics. Loading rejects files too large for `u32` spans and files that are not UTF-8.

use std::path::{Path, PathBuf};

/// Why a source file could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    #[error("cannot read {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} is not valid UTF-8 text (invalid byte at offset {offset})")]
    NotUtf8 { path: PathBuf, offset: usize },
    #[error("{path} is too large ({size} bytes; the limit is 4 GiB)")]
    TooLarge { path: PathBuf, size: usize },
}

/// One source file: the workflow as the user wrote it.
#[derive(Debug, Clone)]
pub struct SourceFile {
    name: String,
    path: Option<PathBuf>,
    text: String,
    line_starts: Vec<u32>,
}

impl SourceFile {
    /// An in-memory source, named for diagnostics (tests, generated workflows).
    pub fn new(name: impl Into<String>, text: impl Into<String>) -> Self {
        let text = text.into();
        let line_starts = std::iter::once(0)
            .chain(text.match_indices('\n').map(|(i, _)| i as u32 + 1))
            .collect();
        Self {
            name: name.into(),
            path: None,
            text,
            line_starts,
        }
    }

    /// Reads a file from disk.
    pub fn load(path: &Path) -> Result<Self, SourceError> {
        let bytes = std::fs::read(path).map_err(|source| SourceError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        if u32::try_from(bytes.len()).is_err() {
            return Err(SourceError::TooLarge {
                path: path.to_path_buf(),
                size: bytes.len(),
            });
        }
        let text = String::from_utf8(bytes).map_err(|e| SourceError::NotUtf8 {
            path: path.to_path_buf(),
            offset: e.utf8_error().valid_up_to(),
        })?;
        let mut file = Self::new(path.display().to_string(), text);
        file.path = Some(path.to_path_buf());
        Ok(file)
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// The path the file was loaded from, if it came from disk.
    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    pub fn text(&self) -> &str {
        &self.text
    }

    /// The 1-based line and column (in characters) of a byte offset.
    pub fn line_col(&self, offset: u32) -> (usize, usize) {
        let line = self.line_starts.partition_point(|&start| start <= offset) - 1;
        let start = self.line_starts[line] as usize;
        let end = (offset as usize).min(self.text.len());
        let column = self
            .text
            .get(start..end)
            .map_or(end - start, |s| s.chars().count());
        (line + 1, column + 1)
    }

    /// Whether the file is YAML (by extension), as opposed to DOT.
    pub fn is_yaml(&self) -> bool {
        let path = self
            .path
            .clone()
            .unwrap_or_else(|| PathBuf::from(&self.name));
        path.extension()
            .and_then(|e| e.to_str())
            .is_some_and(|e| e.eq_ignore_ascii_case("yaml") || e.eq_ignore_ascii_case("yml"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn line_col_counts_from_one_and_in_characters() {
        let file = SourceFile::new("t", "ab\né x\n");
        assert_eq!(file.line_col(0), (1, 1));
        assert_eq!(file.line_col(3), (2, 1));
        assert_eq!(file.line_col(6), (2, 3));
        assert_eq!(file.line_col(8), (3, 1));
    }
}
