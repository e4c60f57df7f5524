//! Which files a CLI agent touched, as the outputs document says: in a git repository, the files
//! git knows (`git ls-files`, tracked and untracked but not ignored) before and after the session,
//! compared — a path that appears, disappears, or whose size or modification time changed was
//! touched — plus the files of any commits the agent made. Git only lists paths and compares trees
//! here; it never reads a working-tree file, so no filter driver a stage wrote into the
//! repository's configuration runs (`git diff` against the working tree would run one). Outside a
//! repository, a snapshot of the working tree's file sizes and modification times, skipping what
//! artifact capture skips and bounded to [`MAX_FILES`] files. Paths are relative to the working
//! directory; the runs directory is never counted. Everything here blocks: it runs on the blocking
//! pool.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::SystemTime;

use trellis_engine::CancellationToken;
use walkdir::WalkDir;

use crate::artifacts;

/// Files of a working tree outside git that a snapshot looks at.
pub(crate) const MAX_FILES: usize = 20_000;
/// The empty tree, the base of a repository's first commit.
const EMPTY_TREE: &str = "4b825dc642cb6eb9a060e54bf8d69288fbee4904";

/// A file's size and modification time; `None` when it does not exist.
type Fingerprint = Option<(u64, SystemTime)>;

/// How a snapshot knows the working tree.
#[derive(PartialEq)]
enum Tracking {
    /// Through git, at this `HEAD` (none before the first commit).
    Git { head: Option<String> },
    /// By walking the files.
    Tree,
}

pub(crate) struct Snapshot {
    tracking: Tracking,
    files: BTreeMap<String, Fingerprint>,
    /// The tree had more files than a snapshot looks at.
    pub truncated: bool,
}

fn git(root: &Path, args: &[&str]) -> Option<Vec<u8>> {
    let output = trellis_process::git::command()
        .args(args)
        .current_dir(root)
        .env("GIT_OPTIONAL_LOCKS", "0")
        .stderr(std::process::Stdio::null())
        .output()
        .ok()?;
    output.status.success().then_some(output.stdout)
}

/// NUL-separated paths.
fn paths(bytes: &[u8]) -> impl Iterator<Item = String> + '_ {
    bytes
        .split(|b| *b == 0)
        .filter(|p| !p.is_empty())
        .map(|p| String::from_utf8_lossy(p).into_owned())
}

#[allow(clippy::disallowed_methods, reason = "runs on the blocking pool")]
fn fingerprint(path: &Path) -> Fingerprint {
    let meta = std::fs::symlink_metadata(path).ok()?;
    Some((meta.len(), meta.modified().ok()?))
}

/// The files git knows under `root`, relative to it: those in the index, and the others not ignored.
fn git_files(root: &Path) -> Vec<String> {
    let mut found = Vec::new();
    for args in [
        &["ls-files", "-z"][..],
        &["ls-files", "--others", "--exclude-standard", "-z"],
    ] {
        if let Some(out) = git(root, args) {
            found.extend(paths(&out));
        }
    }
    found
}

/// Whether a path (relative to `root`) lies in the excluded directory.
fn excluded(root: &Path, path: &str, exclude: &Path) -> bool {
    root.join(path).starts_with(exclude)
}

impl Snapshot {
    /// The files under `root` (but `exclude`) as they are now; a walk of a tree outside git stops
    /// early, marked truncated, once `stop` fires (the stage has ended).
    pub(crate) fn take(root: &Path, exclude: &Path, stop: &CancellationToken) -> Snapshot {
        let in_git = git(root, &["rev-parse", "--is-inside-work-tree"])
            .is_some_and(|out| out.starts_with(b"true"));
        if in_git {
            let head = git(root, &["rev-parse", "-q", "--verify", "HEAD"])
                .map(|out| String::from_utf8_lossy(&out).trim().to_owned());
            let files = git_files(root)
                .into_iter()
                .filter(|p| !excluded(root, p, exclude))
                .map(|p| {
                    let print = fingerprint(&root.join(&p));
                    (p, print)
                })
                .collect();
            return Snapshot {
                tracking: Tracking::Git { head },
                files,
                truncated: false,
            };
        }
        let mut files = BTreeMap::new();
        let mut truncated = false;
        let walk = WalkDir::new(root)
            .follow_links(false)
            .into_iter()
            .filter_entry(|e| !artifacts::skipped(e, exclude))
            .filter_map(Result::ok)
            .filter(|e| !e.file_type().is_dir());
        for entry in walk {
            if files.len() == MAX_FILES || stop.is_cancelled() {
                truncated = true;
                break;
            }
            let Ok(relative) = entry.path().strip_prefix(root) else {
                continue;
            };
            let print = entry
                .metadata()
                .ok()
                .and_then(|m| Some((m.len(), m.modified().ok()?)));
            files.insert(relative.to_string_lossy().into_owned(), print);
        }
        Snapshot {
            tracking: Tracking::Tree,
            files,
            truncated,
        }
    }

    /// The files touched between this snapshot and `after`, sorted.
    pub(crate) fn touched(&self, after: &Snapshot, root: &Path, exclude: &Path) -> Vec<String> {
        let mut touched: Vec<String> = after
            .files
            .iter()
            .filter(|(path, print)| self.files.get(*path) != Some(print))
            .map(|(path, _)| path.clone())
            .chain(
                self.files
                    .keys()
                    .filter(|path| !after.files.contains_key(*path))
                    .cloned(),
            )
            .collect();
        if let (Tracking::Git { head: before }, Tracking::Git { head: Some(now) }) =
            (&self.tracking, &after.tracking)
            && before.as_ref() != Some(now)
        {
            let from = before.as_deref().unwrap_or(EMPTY_TREE);
            if let Some(out) = git(
                root,
                &[
                    "diff",
                    "--no-ext-diff",
                    "--name-only",
                    "-z",
                    "--relative",
                    from,
                    now,
                ],
            ) {
                touched.extend(paths(&out).filter(|p| !excluded(root, p, exclude)));
            }
        }
        touched.sort();
        touched.dedup();
        touched
    }
}

#[cfg(test)]
#[allow(clippy::disallowed_methods, reason = "tests set up files")]
mod tests {
    use std::process::Command;

    use trellis_test::git;

    use super::*;

    #[test]
    #[allow(
        clippy::disallowed_macros,
        reason = "a test's message, which the test harness captures as it captures eprintln! alone"
    )]
    fn git_changes_and_commits_are_touched_and_the_runs_directory_is_not() {
        if Command::new("git").arg("--version").output().is_err() {
            eprintln!("skipping: git is not installed");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let runs = root.join("runs");
        std::fs::write(root.join("a.txt"), "a").unwrap();
        std::fs::write(root.join("dirty.txt"), "d").unwrap();
        git(root, &["init", "-q"]);
        git(root, &["add", "-A"]);
        git(root, &["commit", "-q", "-m", "one"]);
        std::fs::write(root.join("dirty.txt"), "dirty before").unwrap();
        let before = Snapshot::take(root, &runs, &CancellationToken::new());
        // The agent commits a new file, edits a tracked one, and the run record grows.
        std::fs::write(root.join("committed.txt"), "c").unwrap();
        git(root, &["add", "committed.txt"]);
        git(root, &["commit", "-q", "-m", "two"]);
        std::fs::write(root.join("a.txt"), "changed").unwrap();
        std::fs::create_dir(&runs).unwrap();
        std::fs::write(runs.join("events.jsonl"), "{}").unwrap();
        let after = Snapshot::take(root, &runs, &CancellationToken::new());
        assert_eq!(
            before.touched(&after, root, &runs),
            ["a.txt", "committed.txt"]
        );
    }

    /// A stage may write a filter driver into the repository's configuration; listing the files
    /// runs none, even for a file whose content git would have to read again to compare.
    #[test]
    fn a_filter_driver_planted_in_the_repository_does_not_run() {
        if Command::new("git").arg("--version").output().is_err() {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("repo");
        std::fs::create_dir(&root).unwrap();
        let runs = root.join("runs");
        std::fs::write(root.join("a.txt"), "a").unwrap();
        std::fs::write(root.join(".gitattributes"), "*.txt filter=evil\n").unwrap();
        git(&root, &["init", "-q"]);
        git(&root, &["add", "-A"]);
        git(&root, &["commit", "-q", "-m", "one"]);
        let ran = dir.path().join("ran");
        let driver = format!("touch {}; cat", ran.display());
        git(&root, &["config", "filter.evil.clean", &driver]);
        git(&root, &["config", "filter.evil.process", &driver]);
        let before = Snapshot::take(&root, &runs, &CancellationToken::new());
        // Same size, a new time: git would read the file through the filter to compare it.
        std::fs::write(root.join("a.txt"), "b").unwrap();
        let after = Snapshot::take(&root, &runs, &CancellationToken::new());
        assert_eq!(before.touched(&after, &root, &runs), ["a.txt"]);
        assert!(!ran.exists(), "the planted filter ran");
    }

    #[test]
    fn outside_git_new_changed_and_deleted_files_are_touched() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let runs = root.join("runs");
        std::fs::write(root.join("same.txt"), "s").unwrap();
        std::fs::write(root.join("gone.txt"), "g").unwrap();
        std::fs::write(root.join("grows.txt"), "x").unwrap();
        std::fs::create_dir_all(root.join("node_modules/x")).unwrap();
        let before = Snapshot::take(root, &runs, &CancellationToken::new());
        std::fs::remove_file(root.join("gone.txt")).unwrap();
        std::fs::write(root.join("grows.txt"), "xx").unwrap();
        std::fs::create_dir(root.join("src")).unwrap();
        std::fs::write(root.join("src/new.rs"), "n").unwrap();
        std::fs::write(root.join("node_modules/x/skipped.js"), "n").unwrap();
        let after = Snapshot::take(root, &runs, &CancellationToken::new());
        assert!(!after.truncated);
        assert_eq!(
            before.touched(&after, root, &runs),
            ["gone.txt", "grows.txt", "src/new.rs"]
        );
    }

    #[test]
    fn a_walk_outside_git_stops_when_the_stage_has_ended() {
        let dir = tempfile::tempdir().unwrap();
        for n in 0..20 {
            std::fs::write(dir.path().join(format!("f{n}.txt")), "x").unwrap();
        }
        let runs = dir.path().join("runs");
        let whole = Snapshot::take(dir.path(), &runs, &CancellationToken::new());
        assert_eq!(whole.files.len(), 20);
        assert!(!whole.truncated);
        let stop = CancellationToken::new();
        stop.cancel();
        let stopped = Snapshot::take(dir.path(), &runs, &stop);
        assert!(stopped.truncated);
        assert!(stopped.files.is_empty());
    }
}
