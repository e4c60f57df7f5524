//! A workflow source file held in memory: its name, its text, and a line index used only when rendering
//! diagnostics. Loading rejects files too large for `u32` spans and files that are not UTF-8; the
//! other text files a user writes (prompts, inputs, tokens) are read by the same rules, less a byte
//! order mark ([`read_text`]).

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
    #[error("{path} is too large ({size} bytes; a workflow file may have at most 16 MiB)")]
    TooLarge { path: PathBuf, size: u64 },
    #[error("{path} is not a regular file ({what})")]
    NotAFile { path: PathBuf, what: &'static str },
}

/// The largest workflow (or `@file`) read: larger ones are refused rather than read into memory.
pub const MAX_SOURCE_BYTES: u64 = 16 * 1024 * 1024;

/// What kind of non-regular file a path is, for messages; `None` for a regular file.
pub fn non_regular(meta: &std::fs::Metadata) -> Option<&'static str> {
    use std::os::unix::fs::FileTypeExt as _;
    let kind = meta.file_type();
    if kind.is_file() {
        None
    } else if kind.is_dir() {
        Some("a directory")
    } else if kind.is_char_device() || kind.is_block_device() {
        Some("a device")
    } else if kind.is_fifo() {
        Some("a pipe")
    } else if kind.is_socket() {
        Some("a socket")
    } else {
        Some("not a file")
    }
}

/// The UTF-8 byte order mark, which may open a file and is not part of its text.
const BYTE_ORDER_MARK: char = '\u{feff}';

/// `text` less the byte order mark that may open it. Windows editors save UTF-8 with one; it is
/// not part of the text (YAML, JSON and Graphviz all say so), and left in, it breaks a JSON parse,
/// a token compared byte for byte, or a prompt's first word.
pub fn without_byte_order_mark(mut text: String) -> String {
    if text.starts_with(BYTE_ORDER_MARK) {
        text.drain(..BYTE_ORDER_MARK.len_utf8());
    }
    text
}

/// Why [`read_bounded`] read no text.
enum Unread {
    Io(std::io::Error),
    NotAFile(&'static str),
    TooLarge(u64),
    NotUtf8(usize),
}

/// Opens `path` for reading when it is a regular file, and its size. Opened without waiting (a plain
/// open of a pipe with no writer waits for one forever) and then asked what it is, so what is read is
/// what was looked at: nothing can swap a pipe in between.
fn open_regular(path: &Path) -> Result<(std::fs::File, u64), Unread> {
    use std::os::unix::fs::OpenOptionsExt as _;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::fcntl::OFlag::O_NONBLOCK.bits())
        .open(path)
        .map_err(Unread::Io)?;
    regular(file)
}

/// `file` and its size when it is a regular file (reads of one never wait, whatever flag it was
/// opened with).
fn regular(file: std::fs::File) -> Result<(std::fs::File, u64), Unread> {
    let meta = file.metadata().map_err(Unread::Io)?;
    match non_regular(&meta) {
        Some(what) => Err(Unread::NotAFile(what)),
        None => Ok((file, meta.len())),
    }
}

/// Reads `file` whole as UTF-8 text, but no more than [`MAX_SOURCE_BYTES`] (one byte past it tells a
/// file too large, or one that grew after it was measured at `size`: the buffer is sized to it, one
/// allocation without doubling's slack).
fn read_bounded(file: std::fs::File, size: u64) -> Result<String, Unread> {
    use std::io::Read as _;
    if size > MAX_SOURCE_BYTES {
        return Err(Unread::TooLarge(size));
    }
    let mut bytes = Vec::with_capacity(usize::try_from(size).unwrap_or(0).saturating_add(1));
    file.take(MAX_SOURCE_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(Unread::Io)?;
    if bytes.len() as u64 > MAX_SOURCE_BYTES {
        return Err(Unread::TooLarge(bytes.len() as u64));
    }
    String::from_utf8(bytes).map_err(|e| Unread::NotUtf8(e.utf8_error().valid_up_to()))
}

/// Reads a text file the user wrote (a prompt, an inputs or answers file, a token, a skill) as
/// [`std::fs::read_to_string`] does, [`without_byte_order_mark`]. A pipe reads as a file does
/// (`--inputs <(...)`), but no more than [`MAX_SOURCE_BYTES`] is read: an endless one
/// (`/dev/zero`) is an error, not all the memory there is.
pub fn read_text(path: &Path) -> std::io::Result<String> {
    let file = std::fs::File::open(path)?;
    text_read(read_bounded(file, 0))
}

/// Reads a text file Trellis looks for by name in the directory tree `within`, rather than one the
/// user named (a project's `.mcp.json` or `.fabro/project.toml`, a skill, a memory file, the
/// `status.json` an agent left), as [`read_text`] does, but only a regular file inside `within`: a
/// pipe planted there (by a cloned repository, or a stage of an earlier run) would hold the run
/// forever, a link to a device (`/dev/zero`) would be read to the limit, and a link to a file
/// elsewhere (`~/.git-credentials`) would have Trellis read the user's secrets for whoever planted
/// it — into a parse error's quoted line, or a model's prompt. A path that leads out of `within`
/// (a link to `/dev/zero` included, or one a folder on the way leads to only once the path was
/// checked: the open follows no link, so nothing outside is even opened) is an error of kind
/// [`std::io::ErrorKind::PermissionDenied`];
/// inside it, a pipe, a device or a folder is one of kind [`std::io::ErrorKind::InvalidInput`] that
/// says what it is; a file that is not there is `NotFound` (or `NotADirectory`, when a folder on
/// its way is a file).
pub fn read_found_text(path: &Path, within: &Path) -> std::io::Result<String> {
    let real = std::fs::canonicalize(path)?;
    let root = std::fs::canonicalize(within)?;
    if !real.starts_with(&root) {
        return Err(std::io::Error::new(
            std::io::ErrorKind::PermissionDenied,
            format!(
                "it leads outside {} (to {}), where Trellis does not follow it",
                root.display(),
                real.display()
            ),
        ));
    }
    // The check above and the open are two steps: a folder on the way swapped for a link in
    // between would lead the open elsewhere. `real` holds no link, so the open follows none.
    let opened = trellis_process::files::open_resolved(&real, false).map_err(|e| {
        if trellis_process::files::led_elsewhere(&e) {
            std::io::Error::new(
                std::io::ErrorKind::PermissionDenied,
                format!(
                    "it led elsewhere as it was opened (a folder on its way was changed for a link after it was found inside {}), where Trellis does not follow it",
                    root.display()
                ),
            )
        } else {
            e
        }
    });
    text_read(
        opened
            .map_err(Unread::Io)
            .and_then(regular)
            .and_then(|(file, size)| read_bounded(file, size)),
    )
}

/// What [`read_text`] and [`read_found_text`] answer for what [`read_bounded`] read.
fn text_read(read: Result<String, Unread>) -> std::io::Result<String> {
    use std::io::{Error, ErrorKind};
    match read {
        Ok(text) => Ok(without_byte_order_mark(text)),
        Err(Unread::Io(e)) => Err(e),
        Err(Unread::NotAFile(what)) => Err(Error::new(
            ErrorKind::InvalidInput,
            format!("it is {what}, not a regular file"),
        )),
        Err(Unread::TooLarge(_)) => Err(Error::new(
            ErrorKind::FileTooLarge,
            format!(
                "it holds more than {} MiB, the most Trellis reads",
                MAX_SOURCE_BYTES >> 20
            ),
        )),
        Err(Unread::NotUtf8(offset)) => Err(Error::new(
            ErrorKind::InvalidData,
            format!("it is not UTF-8 text (invalid byte at offset {offset})"),
        )),
    }
}

/// One source file: the workflow as the user wrote it.
#[derive(Debug, Clone)]
pub struct SourceFile {
    name: String,
    path: Option<PathBuf>,
    text: String,
    /// Where each line starts, found when a position is first asked for (a file without
    /// diagnostics never is).
    line_starts: std::sync::OnceLock<Vec<u32>>,
}

impl SourceFile {
    /// An in-memory source, named for diagnostics (tests, generated workflows). A byte order mark
    /// opening the text (Windows editors save UTF-8 with one) is not part of the workflow: YAML says
    /// so, and Graphviz skips it too. Positions count from after it, as editors show them.
    pub fn new(name: impl Into<String>, text: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            path: None,
            text: without_byte_order_mark(text.into()),
            line_starts: std::sync::OnceLock::new(),
        }
    }

    fn line_starts(&self) -> &[u32] {
        self.line_starts.get_or_init(|| {
            std::iter::once(0)
                .chain(self.text.match_indices('\n').map(|(i, _)| i as u32 + 1))
                .collect()
        })
    }

    /// Reads a file from disk.
    pub fn load(path: &Path) -> Result<Self, SourceError> {
        let io = |source| SourceError::Io {
            path: path.to_path_buf(),
            source,
        };
        let text = open_regular(path)
            .and_then(|(file, size)| read_bounded(file, size))
            .map_err(|unread| match unread {
                Unread::Io(source) => io(source),
                Unread::NotAFile(what) => SourceError::NotAFile {
                    path: path.to_path_buf(),
                    what,
                },
                Unread::TooLarge(size) => SourceError::TooLarge {
                    path: path.to_path_buf(),
                    size,
                },
                Unread::NotUtf8(offset) => SourceError::NotUtf8 {
                    path: path.to_path_buf(),
                    offset,
                },
            })?;
        let mut file = Self::new(path.display().to_string(), text);
        file.path = Some(path.to_path_buf());
        Ok(file)
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// The same file (name and path) holding `text` instead: a workflow whose structure its inputs
    /// fill in is compiled as filled in.
    #[must_use]
    pub fn with_text(self, text: String) -> Self {
        let mut file = Self::new(self.name, text);
        file.path = self.path;
        file
    }

    /// The same file under another name in diagnostics (a server names files relative to the
    /// folder it serves, never by their absolute path).
    #[must_use]
    pub fn named(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
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
        let line = self.line_starts().partition_point(|&start| start <= offset) - 1;
        let start = self.line_starts()[line] as usize;
        let end = (offset as usize).min(self.text.len());
        let column = self
            .text
            .get(start..end)
            .map_or(end - start, |s| s.chars().count());
        (line + 1, column + 1)
    }

    /// The text of the line holding a byte offset, without its line break.
    pub fn line_text(&self, offset: u32) -> &str {
        let line = self.line_starts().partition_point(|&start| start <= offset) - 1;
        let start = self.line_starts()[line] as usize;
        let end = self
            .line_starts()
            .get(line + 1)
            .map_or(self.text.len(), |&next| next as usize);
        self.text
            .get(start..end)
            .unwrap_or_default()
            .trim_end_matches(['\n', '\r'])
    }

    /// How far a byte offset is from the start of its line, in bytes.
    pub fn line_offset(&self, offset: u32) -> usize {
        let line = self.line_starts().partition_point(|&start| start <= offset) - 1;
        (offset - self.line_starts()[line]) as usize
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
    fn user_text_is_read_less_its_byte_order_mark_and_no_further_than_the_limit() {
        let dir = tempfile::tempdir().unwrap();
        let marked = dir.path().join("marked.json");
        std::fs::write(&marked, "\u{feff}{}").unwrap();
        assert_eq!(read_text(&marked).unwrap(), "{}");
        let binary = dir.path().join("binary");
        std::fs::write(&binary, b"ab\xff").unwrap();
        assert_eq!(
            read_text(&binary).unwrap_err().to_string(),
            "it is not UTF-8 text (invalid byte at offset 2)"
        );
        let endless = read_text(Path::new("/dev/zero")).unwrap_err();
        assert_eq!(endless.kind(), std::io::ErrorKind::FileTooLarge);
        assert_eq!(
            endless.to_string(),
            "it holds more than 16 MiB, the most Trellis reads"
        );
    }

    #[test]
    fn a_file_looked_for_is_read_only_when_it_is_a_regular_file() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let found = root.join(".mcp.json");
        std::fs::write(&found, "\u{feff}{}").unwrap();
        assert_eq!(read_found_text(&found, root).unwrap(), "{}");
        // A pipe with no writer: a plain open would wait for one forever.
        let pipe = root.join("pipe.toml");
        nix::unistd::mkfifo(&pipe, nix::sys::stat::Mode::S_IRWXU).unwrap();
        let refused = read_found_text(&pipe, root).unwrap_err();
        assert_eq!(refused.kind(), std::io::ErrorKind::InvalidInput);
        assert_eq!(refused.to_string(), "it is a pipe, not a regular file");
        assert_eq!(
            read_found_text(root, root).unwrap_err().to_string(),
            "it is a directory, not a regular file"
        );
        let missing = read_found_text(&root.join("missing"), root).unwrap_err();
        assert_eq!(missing.kind(), std::io::ErrorKind::NotFound);
        std::fs::write(root.join("file"), "").unwrap();
        let beyond = read_found_text(&root.join("file/project.toml"), root).unwrap_err();
        assert_eq!(beyond.kind(), std::io::ErrorKind::NotADirectory);
        // A workflow named on the command line is refused the same way, without waiting.
        assert_eq!(
            SourceFile::load(&pipe).unwrap_err().to_string(),
            format!("{} is not a regular file (a pipe)", pipe.display())
        );
    }

    #[test]
    fn a_file_looked_for_is_read_only_inside_its_tree() {
        let outside = tempfile::tempdir().unwrap();
        let secret = outside.path().join(".git-credentials");
        std::fs::write(&secret, "https://me:token@example.com\n").unwrap();
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::create_dir(root.join(".fabro")).unwrap();
        std::fs::write(root.join("shared.toml"), "x = 1\n").unwrap();
        // A link inside the tree is followed; one out of it is not, nor is one to a device.
        let inside = root.join(".fabro/project.toml");
        std::os::unix::fs::symlink("../shared.toml", &inside).unwrap();
        assert_eq!(read_found_text(&inside, root).unwrap(), "x = 1\n");
        let linked = root.join(".mcp.json");
        std::os::unix::fs::symlink(&secret, &linked).unwrap();
        let refused = read_found_text(&linked, root).unwrap_err();
        assert_eq!(refused.kind(), std::io::ErrorKind::PermissionDenied);
        let real_root = std::fs::canonicalize(root).unwrap();
        let real_secret = std::fs::canonicalize(&secret).unwrap();
        assert_eq!(
            refused.to_string(),
            format!(
                "it leads outside {} (to {}), where Trellis does not follow it",
                real_root.display(),
                real_secret.display()
            )
        );
        assert!(!refused.to_string().contains("token"));
        let device = root.join("AGENTS.md");
        std::os::unix::fs::symlink("/dev/zero", &device).unwrap();
        assert_eq!(
            read_found_text(&device, root).unwrap_err().kind(),
            std::io::ErrorKind::PermissionDenied
        );
        // A folder on the way that leads out is refused the same way.
        let away = root.join("away");
        std::os::unix::fs::symlink(outside.path(), &away).unwrap();
        assert_eq!(
            read_found_text(&away.join(".git-credentials"), root)
                .unwrap_err()
                .kind(),
            std::io::ErrorKind::PermissionDenied
        );
    }

    #[test]
    fn a_folder_swapped_for_a_link_while_a_file_is_looked_for_does_not_lead_the_read_out() {
        let dir = tempfile::tempdir().unwrap();
        let root = std::fs::canonicalize(dir.path()).unwrap();
        // `d` is a folder, then a link out of the tree, then a folder again.
        let Some(swapping) = trellis_test::folder_swapped_for_a_link_out(&root) else {
            return;
        };
        // Without the second look, each of three runs of this test read "secret" here; with only
        // that look after a plain open, each run opened it (and read nothing).
        for _ in 0..5_000 {
            match read_found_text(&root.join("d/f"), &root) {
                Ok(text) => assert_eq!(text, "mine", "read through a link out of the tree"),
                Err(e) => assert_eq!(e.kind(), std::io::ErrorKind::PermissionDenied, "{e}"),
            }
        }
        assert_eq!(swapping.opened_outside(), 0, "a file outside was opened");
    }

    #[test]
    fn line_col_counts_from_one_and_in_characters() {
        let file = SourceFile::new("t", "ab\né x\n");
        assert_eq!(file.line_col(0), (1, 1));
        assert_eq!(file.line_col(3), (2, 1));
        assert_eq!(file.line_col(6), (2, 3));
        assert_eq!(file.line_col(8), (3, 1));
    }

    #[test]
    fn a_byte_order_mark_opening_the_text_is_not_part_of_it() {
        let file = SourceFile::new("t", "\u{feff}ab\n\u{feff}c");
        assert_eq!(file.text(), "ab\n\u{feff}c");
        assert_eq!(file.line_col(0), (1, 1));
    }
}
