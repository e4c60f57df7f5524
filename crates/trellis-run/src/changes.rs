//! What a run changed in its working directory (Fabro's "Files Changed"): the working tree as it
//! was when the run started and when it ended, as git trees, and the diff between them (or between
//! the start and now, while the run goes on).
//!
//! Only in a git repository. The user's repository is only read: its objects (as an alternate of a
//! store of the run's own, `changes/git` in the run record) and its index (copied, so only the files
//! whose size or time changed are read again). Every `git` call runs with that store as its git
//! directory and its own empty configuration, so nothing the run's commands wrote into the working
//! directory — a `.git/config` naming a file-system monitor or a filter, hooks, `.git/info`
//! attributes — runs a program outside their sandbox. The runs directory is never part of the tree.
//! Everything here blocks: call it on the blocking pool.

#![allow(
    clippy::disallowed_methods,
    reason = "blocking by design: callers run it on the blocking pool"
)]

use std::os::unix::ffi::OsStrExt as _;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The diff is cut at this many bytes.
pub const MAX_DIFF_BYTES: usize = 1024 * 1024;

/// A run's changes, as `trellis show --changes` and the API show them.
#[derive(Debug, Clone, serde::Serialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
pub struct Changes {
    /// The files changed, in path order, with the lines added and removed (`None` for a binary
    /// file).
    pub files: Vec<ChangedFile>,
    /// The unified diff (`git diff` format), cut at [`MAX_DIFF_BYTES`].
    pub diff: String,
    /// The diff was cut.
    pub truncated: bool,
    /// The run has not ended: the diff is to the working tree as it is now.
    pub live: bool,
}

#[derive(Debug, Clone, serde::Serialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
pub struct ChangedFile {
    /// Relative to the run's working directory.
    pub path: String,
    pub added: Option<u64>,
    pub removed: Option<u64>,
}

/// Where a run's change record lives in its run directory.
fn store(run_root: &Path) -> PathBuf {
    run_root.join("changes")
}

/// The repository the working directory is in: its top directory and its git directory (a `.git`
/// directory, or the one a `.git` file names, as a linked worktree's does).
fn repository(work_dir: &Path) -> Option<(PathBuf, PathBuf)> {
    let work_dir = std::fs::canonicalize(work_dir).ok()?;
    work_dir.ancestors().find_map(|dir| {
        let dot_git = dir.join(".git");
        if dot_git.is_dir() {
            return Some((dir.to_path_buf(), dot_git));
        }
        let text = std::fs::read_to_string(&dot_git).ok()?;
        let named = text.strip_prefix("gitdir:")?.trim();
        Some((dir.to_path_buf(), dir.join(named)))
    })
}

/// The object directory of a git directory (a linked worktree's is its main repository's).
fn objects_of(git_dir: &Path) -> PathBuf {
    let common = std::fs::read_to_string(git_dir.join("commondir"))
        .map_or_else(|_| git_dir.to_path_buf(), |c| git_dir.join(c.trim()));
    common.join("objects")
}

/// Trellis's own `git` ([`trellis_process::git`]) without the system's or the user's configuration.
fn isolated() -> Command {
    let mut command = trellis_process::git::command();
    command
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null");
    command
}

/// The run's view of the repository: the store, the working tree and the paths a snapshot covers.
struct View {
    git_dir: PathBuf,
    top: PathBuf,
    /// The working directory relative to the top (`.` at the top).
    pathspec: Vec<String>,
}

impl View {
    /// `--relative` to the working directory: paths in a diff are as the run's stages name them.
    fn relative(&self) -> String {
        match self.pathspec[0].as_str() {
            "." => "--relative".to_owned(),
            dir => format!("--relative={dir}/"),
        }
    }
}

impl View {
    fn git(&self, index: &Path) -> Command {
        let mut command = isolated();
        command
            .arg("--git-dir")
            .arg(&self.git_dir)
            .arg("--work-tree")
            .arg(&self.top)
            .args(["-c", "core.autocrlf=false"])
            .current_dir(&self.top)
            .env("GIT_INDEX_FILE", index)
            .env_remove("GIT_DIR")
            .env_remove("GIT_WORK_TREE")
            .env_remove("GIT_OBJECT_DIRECTORY")
            .env_remove("GIT_ALTERNATE_OBJECT_DIRECTORIES");
        command
    }

    fn run(&self, index: &Path, args: &[&str]) -> Result<Vec<u8>, String> {
        self.reset_config()?;
        let output = self
            .git(index)
            .args(args)
            .output()
            .map_err(|e| format!("cannot run git: {e}"))?;
        if output.status.success() {
            Ok(output.stdout)
        } else {
            Err(format!(
                "git {} failed: {}",
                args.first().unwrap_or(&""),
                String::from_utf8_lossy(&output.stderr).trim()
            ))
        }
    }

    /// Puts the store's configuration back as it was made, and drops any attributes file in it,
    /// before each `git` call: where the runs directory is writable to a stage (the Landlock
    /// sandbox, a runs directory inside the working directory), a filter driver or a monitor
    /// written there would otherwise run outside the sandbox.
    fn reset_config(&self) -> Result<(), String> {
        let config = self.git_dir.join("config");
        std::fs::write(&config, STORE_CONFIG)
            .map_err(|e| format!("cannot write {}: {e}", config.display()))?;
        match std::fs::remove_file(self.git_dir.join("info/attributes")) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                Err(format!("cannot remove the store's attributes: {e}"))
            }
            _ => Ok(()),
        }
    }

    /// The working tree (within the pathspec) as a tree in the store, through `index`. A file git
    /// does not track (nor ignore) is copied into the store, so one over [`MAX_UNTRACKED_BYTES`] is
    /// left out, and a tree with over [`MAX_UNTRACKED_FILES`] such files is not recorded.
    fn snapshot(&self, index: &Path) -> Result<String, String> {
        let mut args = vec!["ls-files", "-z", "--others", "--exclude-standard", "--"];
        args.extend(self.pathspec.iter().map(String::as_str));
        let untracked = self.run(index, &args)?;
        let mut pathspec: Vec<u8> = Vec::new();
        for spec in &self.pathspec {
            pathspec.extend(spec.as_bytes());
            pathspec.push(0);
        }
        let mut total = 0;
        let paths = untracked.split(|b| *b == 0).filter(|p| !p.is_empty());
        for (count, path) in paths.enumerate() {
            let full = self.top.join(std::ffi::OsStr::from_bytes(path));
            let size = std::fs::symlink_metadata(&full).map_or(0, |m| m.len());
            if size > MAX_UNTRACKED_BYTES {
                pathspec.extend(b":(exclude,literal)");
                pathspec.extend(path);
                pathspec.push(0);
            } else {
                total += size;
            }
            if count >= MAX_UNTRACKED_FILES || total > MAX_UNTRACKED_TOTAL {
                return Err(format!(
                    "the working directory has over {MAX_UNTRACKED_FILES} files (or {} MB) git neither tracks nor ignores: add what should not count to .gitignore",
                    MAX_UNTRACKED_TOTAL >> 20
                ));
            }
        }
        let list = index.with_extension("pathspec");
        std::fs::write(&list, &pathspec)
            .map_err(|e| format!("cannot write {}: {e}", list.display()))?;
        let from = format!("--pathspec-from-file={}", list.display());
        let added = self.run(
            index,
            &["add", "-A", "--ignore-errors", &from, "--pathspec-file-nul"],
        );
        let _ = std::fs::remove_file(&list);
        added?;
        let tree = self.run(index, &["write-tree"])?;
        Ok(String::from_utf8_lossy(&tree).trim().to_owned())
    }
}

/// The store's whole configuration: a bare repository, nothing else.
const STORE_CONFIG: &str =
    "[core]\n\trepositoryformatversion = 0\n\tfilemode = true\n\tbare = true\n";

/// A file git does not track over this size is left out of a run's changes (it would be copied
/// into the run's record at every look).
pub const MAX_UNTRACKED_BYTES: u64 = 10 * 1024 * 1024;
/// A working tree with more files git neither tracks nor ignores, or more bytes in them, has its
/// changes not recorded.
pub const MAX_UNTRACKED_FILES: usize = 20_000;
/// See [`MAX_UNTRACKED_FILES`]: the bytes in those files.
pub const MAX_UNTRACKED_TOTAL: u64 = 256 * 1024 * 1024;

/// The view of a run whose record is at `run_root`, as [`create_view`] made it when the run
/// started, whatever the run's stages did to the repository's `.git` since.
fn open_view(run_root: &Path) -> Result<View, String> {
    let top_file = store(run_root).join("top");
    let text = std::fs::read_to_string(&top_file)
        .map_err(|e| format!("cannot read {}: {e}", top_file.display()))?;
    let mut lines = text.lines();
    let top = PathBuf::from(lines.next().unwrap_or_default());
    let relative = lines.next().unwrap_or(".").to_owned();
    Ok(View {
        git_dir: store(run_root).join("git"),
        top,
        pathspec: vec![relative],
    })
}

/// The view of a run starting in `work_dir`, its store made: the repository `work_dir` is in, found
/// now, before any stage could change it.
fn create_view(run_root: &Path, work_dir: &Path) -> Result<View, String> {
    let git_dir = store(run_root).join("git");
    let top_file = store(run_root).join("top");
    let (top, user_git_dir) = repository(work_dir).ok_or(
        "the working directory is not in a git repository: changes are recorded only there",
    )?;
    if !git_dir.join("HEAD").exists() {
        let output = isolated()
            .args(["init", "-q", "--bare"])
            .arg(&git_dir)
            .output()
            .map_err(|e| format!("cannot run git: {e}"))?;
        if !output.status.success() {
            return Err(String::from_utf8_lossy(&output.stderr).trim().to_owned());
        }
        let alternates = objects_of(&user_git_dir);
        let write = |path: PathBuf, text: &[u8]| {
            std::fs::write(&path, text).map_err(|e| format!("cannot write {}: {e}", path.display()))
        };
        write(
            git_dir.join("objects/info/alternates"),
            format!("{}\n", alternates.display()).as_bytes(),
        )?;
        // The user's ignore list, and the runs directory: what they ignore stays out. Their index:
        // only what changed since they last used git is read again.
        let mut exclude = std::fs::read(objects_of(&user_git_dir).with_file_name("info/exclude"))
            .unwrap_or_default();
        if let Some(runs) = runs_dir_in(run_root, &top) {
            exclude.extend(format!("\n/{}/\n", runs.display()).as_bytes());
        }
        std::fs::create_dir_all(git_dir.join("info"))
            .map_err(|e| format!("cannot create {}: {e}", git_dir.display()))?;
        write(git_dir.join("info/exclude"), &exclude)?;
        if std::fs::copy(user_git_dir.join("index"), git_dir.join("index")).is_err() {
            let _ = std::fs::remove_file(git_dir.join("index"));
        }
    }
    let relative = std::fs::canonicalize(work_dir)
        .ok()
        .and_then(|w| w.strip_prefix(&top).ok().map(Path::to_path_buf))
        .filter(|r| !r.as_os_str().is_empty())
        .map_or_else(|| ".".to_owned(), |r| r.display().to_string());
    std::fs::write(&top_file, format!("{}\n{relative}\n", top.display()))
        .map_err(|e| format!("cannot write {}: {e}", top_file.display()))?;
    Ok(View {
        git_dir,
        top,
        pathspec: vec![relative],
    })
}

/// The runs directory of the run at `run_root`, relative to the repository's top, when it is
/// inside it.
fn runs_dir_in(run_root: &Path, top: &Path) -> Option<PathBuf> {
    let runs_dir = std::fs::canonicalize(run_root.parent()?).ok()?;
    runs_dir.strip_prefix(top).ok().map(Path::to_path_buf)
}

/// Records the working tree as the run starts (`start`), or as it ends (`end`). A working
/// directory outside git records why instead, which [`read`] says.
pub fn record(run_root: &Path, work_dir: &Path, which: Moment) {
    if which == Moment::End && !store(run_root).join(Moment::Start.file()).exists() {
        return;
    }
    let view = match which {
        Moment::Start => create_view(run_root, work_dir),
        Moment::End => open_view(run_root),
    };
    let result = view.and_then(|view| {
        let index = view.git_dir.join("index");
        let tree = view.snapshot(&index).or_else(|error| {
            // A copied index git cannot use here (a split index, say): read every file instead.
            if which == Moment::Start && std::fs::remove_file(&index).is_ok() {
                view.snapshot(&index)
            } else {
                Err(error)
            }
        })?;
        let path = store(run_root).join(which.file());
        std::fs::write(&path, tree).map_err(|e| format!("cannot write {}: {e}", path.display()))
    });
    if let Err(why) = result {
        let _ = std::fs::create_dir_all(store(run_root));
        let _ = std::fs::write(store(run_root).join("none"), why);
    }
}

/// The run goes on again (resumed): its changes are live until it ends again.
pub fn reopened(run_root: &Path) {
    let _ = std::fs::remove_file(store(run_root).join(Moment::End.file()));
}

/// When the working tree is recorded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Moment {
    Start,
    End,
}

impl Moment {
    fn file(self) -> &'static str {
        match self {
            Moment::Start => "start",
            Moment::End => "end",
        }
    }
}

/// What the run whose record is at `run_root` changed: from its start to its end, or to now while
/// it goes on. `Err` says why there is nothing to show.
pub fn read(run_root: &Path) -> Result<Changes, String> {
    let dir = store(run_root);
    let tree = |which: Moment| {
        std::fs::read_to_string(dir.join(which.file()))
            .ok()
            .map(|t| t.trim().to_owned())
    };
    let Some(start) = tree(Moment::Start) else {
        return Err(
            std::fs::read_to_string(dir.join("none")).unwrap_or_else(|_| {
                "the run recorded no changes: it started before Trellis recorded them".to_owned()
            }),
        );
    };
    let view = open_view(run_root)?;
    let (end, live) = if let Some(end) = tree(Moment::End) {
        (end, false)
    } else {
        // A copy of the index of its own, so a live look never races the run's record or another.
        static LOOKS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let look = LOOKS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let index = dir.join(format!("live-{}-{look}.index", std::process::id()));
        let _ = std::fs::copy(view.git_dir.join("index"), &index);
        let now = view.snapshot(&index);
        let _ = std::fs::remove_file(&index);
        (now?, true)
    };
    let index = view.git_dir.join("index");
    let relative_to = view.relative();
    let relative = |args: &[&str]| {
        let mut all = args.to_vec();
        all.extend([relative_to.as_str(), start.as_str(), end.as_str(), "--"]);
        all.extend(view.pathspec.iter().map(String::as_str));
        view.run(&index, &all)
    };
    // NUL-terminated: a path is as it is, never quoted.
    let numstat = relative(&["diff-tree", "-r", "-z", "--numstat", "--no-renames"])?;
    let files = String::from_utf8_lossy(&numstat)
        .split_terminator('\0')
        .filter_map(|entry| {
            let mut parts = entry.splitn(3, '\t');
            let (added, removed, path) = (parts.next()?, parts.next()?, parts.next()?);
            Some(ChangedFile {
                path: path.to_owned(),
                added: added.parse().ok(),
                removed: removed.parse().ok(),
            })
        })
        .collect();
    let patch = relative(&[
        "diff-tree",
        "-r",
        "-p",
        "--no-renames",
        "--no-color",
        "--no-ext-diff",
        "--no-textconv",
    ])?;
    let truncated = patch.len() > MAX_DIFF_BYTES;
    let mut diff = String::from_utf8_lossy(&patch[..patch.len().min(MAX_DIFF_BYTES)]).into_owned();
    if truncated {
        // Whole lines only.
        let end = diff.rfind('\n').map_or(0, |at| at + 1);
        diff.truncate(end);
    }
    Ok(Changes {
        files,
        diff: trellis_process::secrets::redact(&diff).into_owned(),
        truncated,
        live,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    use trellis_test::git;

    /// A stage that can write the run record (Landlock, a runs directory inside the working
    /// directory) writes a filter driver and a monitor into the store: neither runs.
    #[test]
    fn a_filter_or_monitor_written_into_the_store_runs_nothing() {
        let project = tempfile::tempdir().unwrap();
        let root = project.path();
        std::fs::write(root.join("a.txt"), "one\n").unwrap();
        git(root, &["init", "-q"]);
        git(root, &["add", "a.txt"]);
        git(root, &["commit", "-qm", "a"]);
        let run_root = root.join("runs/RUN");
        std::fs::create_dir_all(&run_root).unwrap();
        record(&run_root, root, Moment::Start);
        let planted = root.join("planted");
        let store_git = store(&run_root).join("git");
        let config = std::fs::read_to_string(store_git.join("config")).unwrap()
            + &format!(
                "[core]\n\tfsmonitor = touch {0}-monitor\n[filter \"x\"]\n\tclean = touch {0}-filter; cat\n",
                planted.display()
            );
        std::fs::write(store_git.join("config"), config).unwrap();
        std::fs::write(store_git.join("info/attributes"), "* filter=x\n").unwrap();
        std::fs::write(root.join("a.txt"), "two\n").unwrap();
        record(&run_root, root, Moment::End);
        for hook in ["monitor", "filter"] {
            assert!(!root.join(format!("planted-{hook}")).exists(), "{hook} ran");
        }
        let changes = read(&run_root).unwrap();
        assert!(changes.diff.contains("-one\n+two\n"), "{}", changes.diff);
        assert_eq!(changes.files.len(), 1, "{:?}", changes.files);
        assert!(!changes.live);
    }
}
