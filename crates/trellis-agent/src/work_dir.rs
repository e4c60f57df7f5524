//! The agent's confinement: every path a tool is given is resolved against the run's working directory,
//! and one that resolves outside it — an absolute path elsewhere, a `..` that climbs out, or a symlink
//! that points out — is refused before anything is read or written.

#![allow(
    clippy::disallowed_methods,
    reason = "tools resolve paths on the blocking pool, where they do their file work"
)]

use std::path::{Component, Path, PathBuf};

/// The directory an agent may work in, and folders it may only read (the run's record, where the
/// preamble points at large outputs).
#[derive(Debug, Clone)]
pub struct WorkDir {
    /// Canonical: symlinks in the directory's own path are resolved once.
    root: PathBuf,
    readable: Vec<PathBuf>,
    /// Directories the walks of the working directory leave out ([`WorkDir::walk`]).
    unwalked: Vec<PathBuf>,
    /// Fired when the stage that uses the directory ends: a walk of it (grep, glob) stops there,
    /// rather than going on over a large tree on the blocking pool for nobody.
    stop: Option<tokio_util::sync::CancellationToken>,
}

impl WorkDir {
    pub fn new(dir: &Path) -> std::io::Result<Self> {
        Ok(Self {
            root: std::fs::canonicalize(dir)?,
            readable: Vec::new(),
            unwalked: Vec::new(),
            stop: None,
        })
    }

    /// Walks of the directory stop once `stop` fires.
    #[must_use]
    pub fn with_stop(mut self, stop: tokio_util::sync::CancellationToken) -> Self {
        self.stop = Some(stop);
        self
    }

    /// Whether the stage that uses the directory has ended.
    pub fn stopped(&self) -> bool {
        self.stop
            .as_ref()
            .is_some_and(tokio_util::sync::CancellationToken::is_cancelled)
    }

    /// Lets `read_file` read inside `dir` too, and keeps the file tools from writing there even
    /// where `dir` lies inside the working directory (a run record kept under the project).
    #[must_use]
    pub fn with_readable(mut self, dir: &Path) -> Self {
        if let Ok(dir) = std::fs::canonicalize(dir) {
            self.readable.push(dir);
        }
        self
    }

    /// Leaves `dir` out of the walks of the working directory (`grep`, `glob`, the overview, the
    /// notes of where a name is still used): the runs directory kept under a project, whose records
    /// quote the project's files and would be found beside them.
    #[must_use]
    pub fn with_unwalked(mut self, dir: &Path) -> Self {
        if let Ok(dir) = std::fs::canonicalize(dir) {
            self.unwalked.push(dir);
        }
        self
    }

    /// A walk of `root` (a resolved path inside the working directory) that honours `.gitignore`
    /// files, in a git repository or not, and leaves out the directories
    /// [`WorkDir::with_unwalked`] names, unless `root` is inside one (a walk asked for there).
    pub fn walk(&self, root: &Path) -> ignore::WalkBuilder {
        let mut walk = ignore::WalkBuilder::new(root);
        walk.require_git(false);
        let left_out: Vec<PathBuf> = self
            .unwalked
            .iter()
            .filter(|dir| !root.starts_with(dir))
            .cloned()
            .collect();
        if !left_out.is_empty() {
            walk.filter_entry(move |entry| !left_out.iter().any(|dir| entry.path() == dir));
        }
        walk
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The real path `path` names, if it lies inside the working directory. Symlinks are followed as
    /// far as the path exists; the rest of it cannot be a link yet.
    pub fn resolve(&self, path: &str) -> Result<PathBuf, String> {
        self.resolve_within(path, &[])
    }

    /// As [`WorkDir::resolve`], for a file to write: never inside a folder that may only be read.
    pub fn resolve_writable(&self, path: &str) -> Result<PathBuf, String> {
        let resolved = self.resolve(path)?;
        match self.readable.iter().find(|d| resolved.starts_with(d)) {
            Some(dir) => Err(format!(
                "`{path}` is inside the run's record {}, which can only be read",
                dir.display()
            )),
            None => Ok(resolved),
        }
    }

    /// As [`WorkDir::resolve`], also accepting the folders that may be read.
    pub fn resolve_readable(&self, path: &str) -> Result<PathBuf, String> {
        self.resolve_within(path, &self.readable)
    }

    fn resolve_within(&self, path: &str, also: &[PathBuf]) -> Result<PathBuf, String> {
        let inside = |p: &Path| p.starts_with(&self.root) || also.iter().any(|d| p.starts_with(d));
        let given = Path::new(path.trim());
        let joined = if given.is_absolute() {
            given.to_owned()
        } else {
            self.root.join(given)
        };
        let lexical = normalize(&joined).ok_or_else(|| self.outside(path))?;
        if !inside(&lexical) {
            return Err(self.outside(path));
        }
        // Follow links through the part that exists.
        let mut existing = lexical.as_path();
        let mut rest = Vec::new();
        let real = loop {
            if let Ok(real) = std::fs::canonicalize(existing) {
                break real;
            }
            let Some(parent) = existing.parent() else {
                return Err(self.outside(path));
            };
            if let Some(name) = existing.file_name() {
                rest.push(name.to_owned());
            }
            existing = parent;
        };
        // A dangling symlink in the missing part would be written through: refuse it.
        if let Some(first) = rest.last()
            && real
                .join(first)
                .symlink_metadata()
                .is_ok_and(|m| m.file_type().is_symlink())
        {
            return Err(self.outside(path));
        }
        let full = rest.iter().rev().fold(real, |acc, name| acc.join(name));
        if inside(&full) {
            Ok(full)
        } else {
            Err(self.outside(path))
        }
    }

    /// `path` relative to the working directory, for messages and `files_touched`.
    pub fn relative(&self, path: &Path) -> String {
        path.strip_prefix(&self.root)
            .unwrap_or(path)
            .to_string_lossy()
            .into_owned()
    }

    fn outside(&self, path: &str) -> String {
        format!(
            "`{path}` is outside the working directory {}; only paths inside it can be used",
            self.root.display()
        )
    }
}

/// The largest file the file tools read or edit.
pub const MAX_FILE_BYTES: u64 = 64 << 20;

/// Opens the resolved `path` (shown to the model as `shown`) for reading, or for writing when `write`,
/// only if it is a regular file with one name: a FIFO, a device or a socket is refused without
/// blocking (it is opened non-blocking and looked at before anything is read), and so is a file with
/// a second hard link, which could be a file from outside the working directory under a name inside
/// it, and one a link on its way would lead elsewhere (a folder on its way changed since `path` was
/// resolved: [`trellis_process::files::open_resolved`]). A file to write that does not exist is created.
pub fn open_file(path: &Path, shown: &str, write: bool) -> Result<std::fs::File, String> {
    use std::os::unix::fs::MetadataExt as _;
    let not_regular = || {
        format!(
            "`{shown}` is not a regular file (a FIFO, a device or a socket); the file tools read and write regular files only"
        )
    };
    // Looked at first for a clear message (a FIFO without a reader refuses a non-blocking open for
    // writing with a bare "no such device"); the open file is looked at again below.
    if let Ok(meta) = std::fs::symlink_metadata(path)
        && !meta.is_file()
        && !meta.is_dir()
    {
        return Err(not_regular());
    }
    let file = trellis_process::files::open_resolved(path, write).map_err(|e| {
        if trellis_process::files::led_elsewhere(&e) {
            led_elsewhere(shown)
        } else {
            format!("cannot open `{shown}`: {e}")
        }
    })?;
    let meta = file
        .metadata()
        .map_err(|e| format!("cannot read `{shown}`: {e}"))?;
    if meta.is_dir() {
        return Err(format!("`{shown}` is a folder"));
    }
    if !meta.is_file() {
        return Err(not_regular());
    }
    if meta.nlink() > 1 {
        return Err(format!(
            "`{shown}` has {} hard links, and another of its names may lie outside the working directory; the file tools do not use it",
            meta.nlink()
        ));
    }
    if !write && meta.len() > MAX_FILE_BYTES {
        return Err(format!(
            "`{shown}` is {} bytes, more than the file tools read ({MAX_FILE_BYTES}); use the shell to look at part of it",
            meta.len()
        ));
    }
    Ok(file)
}

/// What the model is told of a path a link on its way would have led elsewhere.
fn led_elsewhere(shown: &str) -> String {
    format!(
        "`{shown}` led elsewhere as it was opened (a folder on its way was changed meanwhile); the file tools do not follow it"
    )
}

/// Creates the resolved folder `path` and the folders on its way, following no link
/// ([`trellis_process::files::create_folders`]), with the message the model is shown when it cannot.
pub fn create_folders(path: &Path, shown: &str) -> Result<(), String> {
    trellis_process::files::create_folders(path, 0o777).map_err(|e| {
        if trellis_process::files::led_elsewhere(&e) {
            led_elsewhere(shown)
        } else {
            format!("cannot create the folders of `{shown}`: {e}")
        }
    })
}

/// `path` with `.` and `..` applied, or `None` when `..` climbs above the file system root.
fn normalize(path: &Path) -> Option<PathBuf> {
    let mut out = PathBuf::new();
    for component in path.components() {
        match component {
            Component::ParentDir => {
                if !out.pop() {
                    return None;
                }
            }
            Component::CurDir => {}
            other => out.push(other),
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn work_dir() -> (tempfile::TempDir, WorkDir) {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("src")).unwrap();
        std::fs::write(dir.path().join("src/main.rs"), "fn main() {}").unwrap();
        let work = WorkDir::new(dir.path()).unwrap();
        (dir, work)
    }

    #[test]
    fn paths_inside_resolve_and_new_files_may_be_named() {
        let (_dir, work) = work_dir();
        assert_eq!(
            work.resolve("src/main.rs").unwrap(),
            work.root().join("src/main.rs")
        );
        assert_eq!(
            work.resolve("src/../new/deep/file.txt").unwrap(),
            work.root().join("new/deep/file.txt")
        );
        let absolute = work.root().join("src/main.rs");
        assert_eq!(work.resolve(absolute.to_str().unwrap()).unwrap(), absolute);
        assert_eq!(work.resolve("").unwrap(), work.root());
        assert_eq!(work.relative(&work.root().join("src/x")), "src/x");
    }

    #[test]
    fn readable_folders_are_for_reading_only() {
        let (_dir, work) = work_dir();
        let record = tempfile::tempdir().unwrap();
        std::fs::write(record.path().join("blob.json"), "{}").unwrap();
        let work = work.with_readable(record.path());
        let blob = record.path().join("blob.json");
        let blob = blob.to_str().unwrap();
        assert!(work.resolve_readable(blob).is_ok());
        assert!(work.resolve(blob).is_err());
    }

    #[test]
    fn a_record_inside_the_working_directory_can_be_read_but_not_written() {
        let (dir, work) = work_dir();
        let record = dir.path().join("runs/R1");
        std::fs::create_dir_all(record.join("blobs")).unwrap();
        let work = work.with_readable(&record);
        assert!(work.resolve_readable("runs/R1/blobs/b").is_ok());
        let error = work.resolve_writable("runs/R1/../R1/blobs/b").unwrap_err();
        assert!(error.contains("can only be read"), "{error}");
        assert!(work.resolve_writable("runs/R2/x").is_ok());
        assert!(work.resolve_writable("src/main.rs").is_ok());
    }

    #[test]
    fn walks_leave_the_runs_directory_out_unless_asked_to_walk_it() {
        let (dir, work) = work_dir();
        std::fs::create_dir_all(dir.path().join("runs/R1")).unwrap();
        std::fs::write(dir.path().join("runs/R1/prompt.md"), "x").unwrap();
        let work = work.with_unwalked(&dir.path().join("runs"));
        let walked = |root: &Path| -> Vec<String> {
            let mut paths: Vec<String> = work
                .walk(root)
                .build()
                .filter_map(Result::ok)
                .map(|e| work.relative(e.path()))
                .filter(|p| p.starts_with("runs"))
                .collect();
            paths.sort();
            paths
        };
        assert_eq!(walked(work.root()), [] as [String; 0]);
        let runs = work.resolve("runs/R1").unwrap();
        assert_eq!(walked(&runs), ["runs/R1", "runs/R1/prompt.md"]);
    }

    #[test]
    fn climbing_out_absolute_paths_and_symlinks_out_are_refused() {
        let (dir, work) = work_dir();
        let outside = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink(outside.path(), dir.path().join("escape")).unwrap();
        std::os::unix::fs::symlink(outside.path().join("missing"), dir.path().join("dangling"))
            .unwrap();
        for path in [
            "../x",
            "src/../../x",
            "/etc/passwd",
            "escape/file",
            "escape",
            "dangling",
        ] {
            let error = work.resolve(path).unwrap_err();
            assert!(
                error.contains("outside the working directory"),
                "{path}: {error}"
            );
        }
    }

    #[test]
    fn a_folder_swapped_for_a_link_between_resolving_and_opening_does_not_lead_out() {
        use std::io::Read as _;
        let (_dir, work) = work_dir();
        // A command left running swaps `d` for a link out of the working directory and back.
        let Some(swapping) = trellis_test::folder_swapped_for_a_link_out(work.root()) else {
            return;
        };
        // Without the look at where the open file is, reads got "secret" here.
        for _ in 0..5_000 {
            let Ok(path) = work.resolve("d/f") else {
                continue;
            };
            if let Ok(mut file) = open_file(&path, "d/f", false) {
                let mut text = String::new();
                file.read_to_string(&mut text).unwrap();
                assert_eq!(
                    text, "mine",
                    "read through a link out of the working directory"
                );
            }
        }
        assert_eq!(swapping.opened_outside(), 0, "a file outside was opened");
    }

    #[test]
    fn folders_and_files_made_while_a_folder_is_swapped_for_a_link_are_never_made_outside() {
        let (_dir, work) = work_dir();
        let Some(swapping) = trellis_test::folder_swapped_for_a_link_out(work.root()) else {
            return;
        };
        // Without the folders made one by one, following no link, some were made there.
        for n in 0..2_000 {
            let folder = work.root().join(format!("d/made{n}/deeper"));
            if create_folders(&folder, "made").is_ok() {
                let _ = open_file(&folder.join("new.txt"), "new.txt", true);
            }
        }
        let made: Vec<_> = std::fs::read_dir(swapping.outside().unwrap())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(made, ["f"], "made outside the working directory");
    }
}
