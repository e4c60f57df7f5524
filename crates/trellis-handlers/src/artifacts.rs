//! Test-artifact capture after command stages: screenshots, videos, reports and traces that a command
//! created or changed are copied into the run record. Looked for: files under `playwright-report/`,
//! `test-results/`, `cypress/videos/`, `cypress/screenshots/`, and `junit*.xml` or `*.trace.zip` anywhere.
//! A run file's `[run.artifacts] include` globs name more files, by their path under the working
//! directory. Only files modified after the command started count. Dependency folders, tool caches and hidden
//! directories are skipped, and so is the runs directory. Files over 10 MB, and files past 50 MB per
//! stage, are left out.
//!
//! The cost does not grow with the number of ordinary files. A capture walks the working tree
//! (pruned as above, at most [`MAX_DIRS`] directories); once a walk has seen more than
//! [`WATCH_FROM`] entries, the next one puts an inotify watch on each directory it reads, and later
//! captures read only what the kernel reports changed since — new files and folders, files written —
//! and stat only the files that could be artifacts. A small tree is walked every time: that costs
//! less than watching, whose end (closing the inotify instance) waits on the kernel for ~15 ms.
//! Where watching is not possible (no inotify, its watch limit reached, its queue overflowed) a
//! capture walks the tree again, within the same bound. A capture that reaches the bound says so.

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify, WatchDescriptor};
use parking_lot::Mutex;
use trellis_engine::Artifact;

const MAX_FILE: u64 = 10 * 1024 * 1024;
const MAX_STAGE: u64 = 50 * 1024 * 1024;
/// The most directories of a working tree a scan looks at.
pub const MAX_DIRS: usize = 20_000;
/// How many entries (files and folders) a walk may see before the tree is watched rather than
/// walked again.
pub const WATCH_FROM: usize = 1_000;
const ARTIFACT_DIRS: &[&[&str]] = &[
    &["playwright-report"],
    &["test-results"],
    &["cypress", "videos"],
    &["cypress", "screenshots"],
];
const SKIPPED_DIRS: &[&str] = &["node_modules", "target", "__pycache__", "venv"];

/// Whether a directory (by its path under the working tree) is an artifact folder or inside one.
fn in_artifact_dir(relative: &Path) -> bool {
    let components: Vec<&str> = relative
        .components()
        .filter_map(|c| c.as_os_str().to_str())
        .collect();
    ARTIFACT_DIRS
        .iter()
        .any(|dir| components.windows(dir.len()).any(|w| w == *dir))
}

/// Whether a file name is an artifact's wherever it is: `junit*.xml`, `*.trace.zip`.
fn is_artifact_name(name: &str) -> bool {
    let lower = name.to_ascii_lowercase();
    let xml = Path::new(&lower).extension().is_some_and(|e| e == "xml");
    (lower.starts_with("junit") && xml) || lower.ends_with(".trace.zip")
}

/// Whether a directory name is never scanned: dependency folders, tool caches, hidden directories.
fn skipped_name(name: &str) -> bool {
    name.starts_with('.') || SKIPPED_DIRS.contains(&name)
}

/// Whether a scan of the working tree skips this entry: dependency folders, tool caches, hidden
/// directories, and `exclude` (the runs directory).
pub(crate) fn skipped(entry: &walkdir::DirEntry, exclude: &Path) -> bool {
    entry.depth() > 0
        && entry.file_type().is_dir()
        && (entry.path() == exclude || entry.file_name().to_str().is_some_and(skipped_name))
}

/// The runs directory of a stage directory (`<runs dir>/<run>/stages/<stage>`), which scans of the
/// working tree never enter.
pub fn runs_dir(stage_dir: &Path) -> PathBuf {
    stage_dir
        .ancestors()
        .nth(3)
        .map(Path::to_path_buf)
        .unwrap_or_default()
}

/// What a scan found: the artifacts (copied, and those left out with the reason) and whether the
/// tree was larger than [`MAX_DIRS`] directories, so part of it was not looked at.
#[derive(Debug, Default)]
pub struct Captured {
    pub artifacts: Vec<Artifact>,
    pub truncated: bool,
}

/// The index of every working tree the command handler has captured in, by root and excluded folder.
#[derive(Default)]
pub struct Trees {
    trees: Mutex<HashMap<(PathBuf, PathBuf), TreeIndex>>,
}

impl Trees {
    /// Copies artifact files under `root` modified since `since` into `dest`, a folder below the run's
    /// record `record`, keeping their relative paths. `exclude` (the runs directory) is never scanned.
    /// `include` (a run file's `[run.artifacts] include`) names more files that are artifacts, by
    /// their path under `root`.
    pub fn capture(
        &self,
        root: &Path,
        since: SystemTime,
        (record, dest): (&Path, &Path),
        (exclude, include): (&Path, Option<&globset::GlobSet>),
    ) -> std::io::Result<Captured> {
        let (found, truncated) = {
            let mut trees = self.trees.lock();
            let index = trees
                .entry((root.to_path_buf(), exclude.to_path_buf()))
                .or_insert_with(|| TreeIndex {
                    include: include.cloned(),
                    ..TreeIndex::default()
                });
            index.scan(root, since, exclude)
        };
        Ok(Captured {
            artifacts: copy(root, found, record, dest)?,
            truncated,
        })
    }
}

/// What inotify is asked to report on each directory: entries added or renamed in or out, files
/// written, the directory itself gone.
fn watch_mask() -> AddWatchFlags {
    AddWatchFlags::IN_CREATE
        | AddWatchFlags::IN_CLOSE_WRITE
        | AddWatchFlags::IN_MOVED_TO
        | AddWatchFlags::IN_MOVED_FROM
        | AddWatchFlags::IN_DELETE_SELF
        | AddWatchFlags::IN_ONLYDIR
        | AddWatchFlags::IN_DONT_FOLLOW
}

/// The watched directories of one working tree (paths relative to its root).
struct Watched {
    inotify: Inotify,
    dirs: HashMap<WatchDescriptor, PathBuf>,
}

/// One working tree as the captures see it.
#[derive(Default)]
pub struct TreeIndex {
    /// `None` while the tree is small, and when watching is not possible: then every capture walks.
    watched: Option<Watched>,
    /// The last walk saw more than [`WATCH_FROM`] entries: the next one watches.
    large: bool,
    /// Files that could be artifacts and were written since watching began: checked at every
    /// capture, since parallel commands share the tree (a file stays until it is gone).
    recent: BTreeSet<PathBuf>,
    /// The run's own artifact globs, besides the usual places.
    include: Option<globset::GlobSet>,
}

impl TreeIndex {
    /// The artifact files modified since `since`, with their sizes, and whether the bound was hit.
    #[allow(
        clippy::disallowed_methods,
        reason = "called on the blocking pool after the command ends"
    )]
    fn scan(
        &mut self,
        root: &Path,
        since: SystemTime,
        exclude: &Path,
    ) -> (Vec<(PathBuf, u64)>, bool) {
        let mut truncated = false;
        if !self.drain(root, exclude) {
            // Not watched (yet), or the watch was lost: walk the whole tree, watching it when it is
            // large and watching is possible.
            self.watched = self
                .large
                .then(|| Inotify::init(InitFlags::IN_NONBLOCK | InitFlags::IN_CLOEXEC).ok())
                .flatten()
                .map(|inotify| Watched {
                    inotify,
                    dirs: HashMap::new(),
                });
            let walk = self.walk(root, PathBuf::new(), exclude);
            truncated = walk.truncated;
            self.large = walk.entries > WATCH_FROM;
        }
        let mut found = Vec::new();
        self.recent.retain(|file| {
            let Ok(meta) = std::fs::symlink_metadata(root.join(file)) else {
                return false;
            };
            if meta.is_file() && meta.modified().is_ok_and(|m| m >= since) {
                found.push((file.clone(), meta.len()));
            }
            true
        });
        found.sort();
        (found, truncated)
    }

    /// Takes in what the kernel reported since the last capture. `false` when the index cannot say
    /// what changed (nothing is watched yet, or events were lost) and the tree must be walked.
    fn drain(&mut self, root: &Path, exclude: &Path) -> bool {
        let Some(watched) = self.watched.as_mut() else {
            return false;
        };
        let mut new_dirs = Vec::new();
        loop {
            let events = match watched.inotify.read_events() {
                Ok(events) if !events.is_empty() => events,
                Err(nix::errno::Errno::EINTR) => continue,
                Ok(_) | Err(nix::errno::Errno::EAGAIN) => break,
                Err(_) => return false,
            };
            for event in events {
                if event.mask.contains(AddWatchFlags::IN_Q_OVERFLOW) {
                    return false;
                }
                if event.mask.contains(AddWatchFlags::IN_IGNORED) {
                    watched.dirs.remove(&event.wd);
                    continue;
                }
                let (Some(dir), Some(name)) = (watched.dirs.get(&event.wd), event.name) else {
                    continue;
                };
                let path = dir.join(&name);
                if !event.mask.contains(AddWatchFlags::IN_ISDIR) {
                    if is_candidate(&path, self.include.as_ref()) {
                        self.recent.insert(path);
                    }
                } else if event.mask.contains(AddWatchFlags::IN_MOVED_FROM) {
                    // Its watches now name the wrong place: forget them (the new place, if it is
                    // in the tree, comes as a folder moved in).
                    let gone: Vec<WatchDescriptor> = watched
                        .dirs
                        .iter()
                        .filter(|(_, watched)| watched.starts_with(&path))
                        .map(|(wd, _)| *wd)
                        .collect();
                    for wd in gone {
                        let _ = watched.inotify.rm_watch(wd);
                        watched.dirs.remove(&wd);
                    }
                } else if name.to_str().is_none_or(|n| !skipped_name(n)) {
                    new_dirs.push(path);
                }
            }
        }
        for dir in new_dirs {
            if self.walk(root, dir, exclude).truncated {
                return false;
            }
        }
        true
    }

    /// Walks the folder `start` (under `root`), watching each directory before reading it when the
    /// tree is watched, and keeps the files in it that could be artifacts.
    #[allow(
        clippy::disallowed_methods,
        reason = "called on the blocking pool after the command ends"
    )]
    fn walk(&mut self, root: &Path, start: PathBuf, exclude: &Path) -> Walk {
        let mut pending = vec![start];
        let mut walked = 0;
        let mut entries_seen = 0;
        while let Some(relative) = pending.pop() {
            let path = root.join(&relative);
            if path == exclude {
                continue;
            }
            walked += 1;
            let watching = self.watched.as_ref().map_or(0, |w| w.dirs.len());
            if walked > MAX_DIRS || watching > MAX_DIRS {
                return Walk {
                    truncated: true,
                    entries: entries_seen,
                };
            }
            if let Some(watched) = self.watched.as_mut() {
                match watched.inotify.add_watch(&path, watch_mask()) {
                    Ok(wd) => {
                        watched.dirs.insert(wd, relative.clone());
                    }
                    // The kernel's watch limit: walk every time from now on.
                    Err(nix::errno::Errno::ENOSPC) => self.watched = None,
                    Err(_) => continue,
                }
            }
            let Ok(entries) = std::fs::read_dir(&path) else {
                continue;
            };
            let artifact_dir = in_artifact_dir(&relative);
            for entry in entries.filter_map(Result::ok) {
                entries_seen += 1;
                let Ok(kind) = entry.file_type() else {
                    continue;
                };
                let name = entry.file_name();
                let text = name.to_str().unwrap_or_default();
                if kind.is_dir() {
                    if !skipped_name(text) {
                        pending.push(relative.join(&name));
                    }
                } else if kind.is_file() {
                    let file = relative.join(&name);
                    if artifact_dir
                        || is_artifact_name(text)
                        || self.include.as_ref().is_some_and(|g| g.is_match(&file))
                    {
                        self.recent.insert(file);
                    }
                }
            }
        }
        Walk {
            truncated: false,
            entries: entries_seen,
        }
    }
}

/// What a walk of (part of) a tree saw.
struct Walk {
    /// It stopped at the bound.
    truncated: bool,
    /// How many files and folders it read.
    entries: usize,
}

/// Whether a file (by its path under the working tree) could be an artifact: in the usual places, or
/// named by the run's `include` globs.
fn is_candidate(relative: &Path, include: Option<&globset::GlobSet>) -> bool {
    let name = relative
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or_default();
    relative.parent().is_some_and(in_artifact_dir)
        || is_artifact_name(name)
        || include.is_some_and(|g| g.is_match(relative))
}

/// Copies what was found into `dest` (below the record `record`), within the size limits; returns
/// every artifact found, in path order: those copied, and those left out with the reason.
///
/// Below the record's folder, a command that may write the runs directory (Landlock, or none, with
/// the runs directory inside the working tree) could have planted links — `artifacts/<node>` made a
/// link to a folder of the user's — to have its files written there. So the record's folder is
/// resolved, and the folders and files below it are made following no link: a planted one fails
/// the capture, and nothing is written through it.
#[allow(
    clippy::disallowed_methods,
    reason = "called on the blocking pool after the command ends"
)]
fn copy(
    root: &Path,
    found: Vec<(PathBuf, u64)>,
    record: &Path,
    dest: &Path,
) -> std::io::Result<Vec<Artifact>> {
    use trellis_process::files::{Access, create_folders, open_record, record_folder_mode};
    // Most captures find nothing: the record's folder is resolved only for what there is to copy.
    if found.is_empty() {
        return Ok(Vec::new());
    }
    let below = dest.strip_prefix(record).map_err(|_| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "the artifacts' folder is not in the run's record",
        )
    })?;
    let dest = std::fs::canonicalize(record)?.join(below);
    let mut artifacts = Vec::new();
    let mut total = 0;
    for (path, bytes) in found {
        let skipped = if bytes > MAX_FILE {
            Some("larger than 10 MB".to_owned())
        } else if total + bytes > MAX_STAGE {
            Some("past the stage's 50 MB of artifacts".to_owned())
        } else {
            None
        };
        if skipped.is_none() {
            let target = dest.join(&path);
            if let Some(parent) = target.parent() {
                create_folders(parent, record_folder_mode())?;
            }
            let mut into = open_record(&target, Access::Replace)?;
            std::io::copy(&mut std::fs::File::open(root.join(&path))?, &mut into)?;
            total += bytes;
        }
        artifacts.push(Artifact {
            path: path.display().to_string(),
            bytes,
            skipped,
        });
    }
    Ok(artifacts)
}

#[cfg(test)]
#[allow(clippy::disallowed_methods, reason = "tests set up files")]
mod tests {
    use super::*;

    #[test]
    fn recognises_artifacts() {
        assert!(is_candidate(Path::new("test-results/login/shot.png"), None));
        assert!(is_candidate(Path::new("web/cypress/videos/a.mp4"), None));
        assert!(is_candidate(Path::new("reports/junit-unit.xml"), None));
        assert!(is_candidate(Path::new("trace/run.trace.zip"), None));
        assert!(!is_candidate(Path::new("cypress/fixtures/a.json"), None));
        assert!(!is_candidate(Path::new("src/main.rs"), None));
        let include = trellis_engine::settings::glob_set(&["coverage/**".into(), "*.lcov".into()]);
        assert!(is_candidate(
            Path::new("coverage/index.html"),
            include.as_ref()
        ));
        assert!(is_candidate(Path::new("out/unit.lcov"), include.as_ref()));
        assert!(!is_candidate(Path::new("src/main.rs"), include.as_ref()));
    }

    /// A file system time that is surely after anything written so far (file times come from a
    /// coarse clock, so a stage's start is taken from a file written at that moment).
    fn now_on_disk(dir: &Path) -> SystemTime {
        std::thread::sleep(std::time::Duration::from_millis(20));
        let marker = dir.join("marker");
        std::fs::write(&marker, b"").unwrap();
        std::fs::metadata(&marker).unwrap().modified().unwrap()
    }

    fn scan(index: &mut TreeIndex, root: &Path, since: SystemTime) -> Vec<String> {
        let runs = root.join("runs");
        let (found, _) = index.scan(root, since, &runs);
        found
            .into_iter()
            .map(|(p, _)| p.display().to_string())
            .collect()
    }

    #[test]
    fn the_index_finds_new_and_rewritten_artifacts_and_only_those() {
        finds_new_and_rewritten_artifacts(false);
        finds_new_and_rewritten_artifacts(true);
    }

    /// The same captures, walking the tree each time or (`watched`) watching it from the first.
    fn finds_new_and_rewritten_artifacts(watched: bool) {
        let work = tempfile::tempdir().unwrap();
        let root = work.path().join("tree");
        std::fs::create_dir_all(root.join("src/deep")).unwrap();
        std::fs::create_dir_all(root.join("runs/r1")).unwrap();
        std::fs::create_dir_all(root.join("node_modules/x")).unwrap();
        std::fs::write(root.join("src/deep/junit-old.xml"), b"old").unwrap();
        std::fs::write(root.join("src/main.rs"), b"fn main() {}").unwrap();
        let mut index = TreeIndex {
            large: watched,
            ..TreeIndex::default()
        };
        let first = now_on_disk(work.path());
        assert!(scan(&mut index, &root, first).is_empty(), "nothing new yet");
        assert_eq!(index.watched.is_some(), watched);

        let second = now_on_disk(work.path());
        std::fs::write(root.join("src/deep/junit-old.xml"), b"rewritten in place").unwrap();
        std::fs::write(root.join("src/main.rs"), b"changed, but not an artifact").unwrap();
        std::fs::create_dir_all(root.join("web/test-results/login")).unwrap();
        std::fs::write(root.join("web/test-results/login/shot.png"), b"png").unwrap();
        std::fs::write(root.join("runs/r1/junit.xml"), b"in the runs directory").unwrap();
        std::fs::write(root.join("node_modules/x/junit.xml"), b"a dependency's").unwrap();
        assert_eq!(
            scan(&mut index, &root, second),
            ["src/deep/junit-old.xml", "web/test-results/login/shot.png"]
        );

        let third = now_on_disk(work.path());
        std::fs::write(root.join("src/junit-new.xml"), b"new").unwrap();
        std::fs::remove_dir_all(root.join("web")).unwrap();
        assert_eq!(scan(&mut index, &root, third), ["src/junit-new.xml"]);
        assert!(
            !index.recent.iter().any(|p| p.starts_with("web")),
            "removed files are forgotten"
        );

        let fourth = now_on_disk(work.path());
        assert!(
            scan(&mut index, &root, fourth).is_empty(),
            "an idle stage finds nothing"
        );
    }

    #[test]
    fn a_large_tree_is_watched_from_the_second_capture_and_a_small_one_never() {
        let work = tempfile::tempdir().unwrap();
        let root = work.path().join("tree");
        std::fs::create_dir_all(root.join("src")).unwrap();
        let mut small = TreeIndex::default();
        let since = now_on_disk(work.path());
        scan(&mut small, &root, since);
        scan(&mut small, &root, since);
        assert!(small.watched.is_none(), "a small tree is walked");

        for i in 0..=WATCH_FROM {
            std::fs::write(root.join(format!("src/file{i}.txt")), b"").unwrap();
        }
        let mut large = TreeIndex::default();
        let first = now_on_disk(work.path());
        assert_eq!(scan(&mut large, &root, first), [] as [String; 0]);
        assert!(large.watched.is_none(), "the first walk only counts");
        assert_eq!(scan(&mut large, &root, first), [] as [String; 0]);
        assert!(large.watched.is_some(), "the second walk watches");
        let later = now_on_disk(work.path());
        std::fs::create_dir_all(root.join("src/test-results")).unwrap();
        std::fs::write(root.join("src/test-results/shot.png"), b"png").unwrap();
        std::fs::write(root.join("src/junit.xml"), b"<testsuite/>").unwrap();
        assert_eq!(
            scan(&mut large, &root, later),
            ["src/junit.xml", "src/test-results/shot.png"]
        );
    }
}
