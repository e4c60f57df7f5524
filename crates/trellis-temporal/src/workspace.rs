//! A run's working tree kept on a git remote (`trellis run --temporal --workspace git`), for
//! workers that share no file system besides the runs directory.
//!
//! Submitting pushes the repository's `HEAD` to the run's own ref on its `origin`,
//! `refs/trellis/runs/<run id>` ([`Origin::publish`]). A worker that opens the run — for its first
//! stage, or taking it over from a lost worker — fetches that ref into a repository of its own and
//! makes its checkout of the run exactly that commit ([`Checkout::open`]); before each step of the
//! run is saved, it commits the tree and pushes it back to the ref ([`Checkout::save`]). So
//! whichever step the run is opened from, the tree it finds is the one that step left (or a later
//! one: an interrupted stage runs again over what it had done, as after a local resume). When the
//! run ends, the ref holds its result and the worker's checkout is removed.
//!
//! The worker's repository lives beside the checkout, not in it: nothing a stage writes (its
//! sandbox lets it write the checkout) can add hooks or configuration that the worker's own `git`
//! would run. The workspaces directory must therefore lie outside the paths the sandbox lets every
//! command write (the home directory's tool caches; `trellis worker` refuses one there); the
//! default, `~/.trellis/workspaces`, does.
//!
//! Every function here waits for `git` and the file system: callers on the runtime run them on the
//! blocking pool.

#![allow(
    clippy::disallowed_methods,
    reason = "blocking throughout, and called on the blocking pool (see above)"
)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use parking_lot::Mutex;
use trellis_store::GitWorkspace;

/// The ref the run `run_id`'s tree is kept at on the remote.
pub fn run_ref(run_id: &str) -> String {
    format!("refs/trellis/runs/{run_id}")
}

/// The workers' default workspaces directory: `~/.trellis/workspaces`.
pub fn default_dir() -> PathBuf {
    std::env::var_os("HOME")
        .map_or_else(|| PathBuf::from("."), PathBuf::from)
        .join(".trellis/workspaces")
}

/// `git` with the settings every call here shares: Trellis's own ([`trellis_process::git`]: never a
/// prompt for credentials — a worker has nobody to answer it —, no hooks, no file-system monitor),
/// no signing, and only the transports that move data (local paths, `file`, `http(s)`, `ssh`,
/// `git`): no remote helper runs a program of the remote's choosing.
fn git() -> Command {
    let mut command = trellis_process::git::command();
    command
        .args(["-c", "commit.gpgsign=false"])
        .args(["-c", "protocol.allow=never"]);
    for transport in ["file", "http", "https", "ssh", "git"] {
        command
            .arg("-c")
            .arg(format!("protocol.{transport}.allow=always"));
    }
    command
}

/// Runs `command`, its standard output on success, else what `git` said.
fn run(mut command: Command, what: &str) -> Result<String, String> {
    let output: Output = command
        .output()
        .map_err(|e| format!("cannot run `git` to {what}: {e}"))?;
    if output.status.success() {
        return Ok(String::from_utf8_lossy(&output.stdout).trim().to_owned());
    }
    let said = String::from_utf8_lossy(&output.stderr);
    let said = said.trim();
    Err(if said.is_empty() {
        format!("`git` could not {what} ({})", output.status)
    } else {
        format!("`git` could not {what}: {said}")
    })
}

/// A remote `git` may fetch from and push to without being told to run a program of the remote's
/// choosing (an option in its place, the `ext::` transport).
fn checked_remote(remote: &str) -> Result<&str, String> {
    if remote.is_empty()
        || remote.starts_with('-')
        || remote.to_ascii_lowercase().starts_with("ext::")
    {
        return Err(format!("`{remote}` is not a git remote a worker may use"));
    }
    Ok(remote)
}

/// The repository a run on git starts from: its remote and commit.
#[derive(Debug)]
pub struct Origin {
    dir: PathBuf,
    remote: String,
    commit: String,
    /// The repository has uncommitted changes: the run starts from its last commit without them.
    pub uncommitted: bool,
}

/// The repository at `work_dir` (its top directory), as a run on git would start from it: it must
/// have a commit and a remote `origin` the workers can reach.
pub fn origin(work_dir: &Path) -> Result<Origin, String> {
    let in_repo = |args: &[&str], what: &str| {
        let mut command = git();
        command.arg("-C").arg(work_dir).args(args);
        run(command, what)
    };
    let top = in_repo(&["rev-parse", "--show-toplevel"], "find the repository")
        .map_err(|_| format!("{} is not in a git repository", work_dir.display()))?;
    let same = |a: &Path, b: &Path| std::fs::canonicalize(a).ok() == std::fs::canonicalize(b).ok();
    if !same(Path::new(&top), work_dir) {
        return Err(format!(
            "a run whose workspace is on git starts from the repository's top directory ({top}), not {}",
            work_dir.display()
        ));
    }
    let remote = in_repo(&["remote", "get-url", "origin"], "read the remote")
        .map_err(|_| format!("the repository at {top} has no remote `origin`"))?;
    checked_remote(&remote)?;
    let commit = in_repo(&["rev-parse", "--verify", "HEAD^{commit}"], "read HEAD")
        .map_err(|_| format!("the repository at {top} has no commit yet"))?;
    let uncommitted = !in_repo(&["status", "--porcelain"], "read the status")?.is_empty();
    Ok(Origin {
        dir: work_dir.to_path_buf(),
        remote,
        commit,
        uncommitted,
    })
}

impl Origin {
    /// Makes its commit the starting tree of run `run_id` (pushed to the run's ref on `origin`),
    /// and says so for the run's record.
    pub fn publish(&self, run_id: &str) -> Result<GitWorkspace, String> {
        let mut push = git();
        push.arg("-C")
            .arg(&self.dir)
            .args(["push", "-q", "origin"])
            .arg(format!("{}:{}", self.commit, run_ref(run_id)));
        run(
            push,
            &format!("push the run's starting commit to {}", self.remote),
        )?;
        Ok(GitWorkspace {
            remote: self.remote.clone(),
            commit: self.commit.clone(),
        })
    }
}

/// A worker's checkout of a run's tree, and the repository beside it that carries the tree to and
/// from the remote.
pub struct Checkout {
    run_id: String,
    remote: String,
    git_dir: PathBuf,
    tree: PathBuf,
    /// The commit last fetched or pushed: a save that finds the tree unchanged pushes nothing. Held
    /// while saving, so saves of concurrent branches take turns.
    pushed: Mutex<String>,
}

impl Checkout {
    /// Makes `workspaces/<run id>` exactly the commit at the run's ref on its remote (files the
    /// commit does not have are removed, except those the tree's `.gitignore` ignores).
    pub fn open(workspaces: &Path, run_id: &str, workspace: &GitWorkspace) -> Result<Self, String> {
        if !crate::is_run_id(run_id) {
            return Err(format!("`{run_id}` is not a run id"));
        }
        let remote = checked_remote(&workspace.remote)?.to_owned();
        let (git_dir, tree) = (
            workspaces.join(format!("{run_id}.git")),
            workspaces.join(run_id),
        );
        std::fs::create_dir_all(&tree)
            .map_err(|e| format!("cannot create {}: {e}", tree.display()))?;
        if !git_dir.join("HEAD").exists() {
            let mut init = git();
            init.args(["init", "-q", "--bare"]).arg(&git_dir);
            run(init, "create the worker's repository")?;
        }
        let checkout = Self {
            run_id: run_id.to_owned(),
            remote,
            git_dir,
            tree,
            pushed: Mutex::new(String::new()),
        };
        let refspec = format!("+{}:refs/trellis/run", run_ref(run_id));
        checkout.run(
            &["fetch", "-q", "--no-tags", "--", &checkout.remote, &refspec],
            &format!("fetch the run's tree from {}", checkout.remote),
        )?;
        checkout.run(
            &["reset", "-q", "--hard", "refs/trellis/run"],
            "check out the run's tree",
        )?;
        checkout.run(&["clean", "-q", "-ffd"], "clean the run's tree")?;
        *checkout.pushed.lock() = checkout.run(&["rev-parse", "HEAD"], "read the tree's commit")?;
        Ok(checkout)
    }

    /// Where the run's stages work.
    pub fn tree(&self) -> &Path {
        &self.tree
    }

    /// Commits the tree as it is and pushes it to the run's ref; pushes nothing when the remote has
    /// the tree already. The push only moves the ref forward: a worker whose run was taken over
    /// meanwhile (it stalled, and another worker pushed since) is refused rather than undoing the
    /// other's work.
    pub fn save(&self) -> Result<(), String> {
        let mut pushed = self.pushed.lock();
        self.run(&["add", "-A"], "record the run's tree")?;
        let changed = self
            .run(&["diff", "--cached", "--quiet"], "compare the run's tree")
            .is_err();
        if changed {
            let message = format!("trellis run {}", self.run_id);
            self.run(
                &[
                    "-c",
                    "user.name=Trellis",
                    "-c",
                    "user.email=trellis@localhost",
                    "commit",
                    "-q",
                    "--no-verify",
                    "-m",
                    &message,
                ],
                "commit the run's tree",
            )?;
        }
        let commit = self.run(&["rev-parse", "HEAD"], "read the tree's commit")?;
        if *pushed == commit {
            return Ok(());
        }
        let refspec = format!("{commit}:{}", run_ref(&self.run_id));
        self.run(
            &["push", "-q", "--", &self.remote, &refspec],
            &format!("push the run's tree to {}", self.remote),
        )?;
        *pushed = commit;
        Ok(())
    }

    /// Removes the checkout and its repository (the run ended: its tree is on the remote).
    pub fn remove(&self) {
        let _ = std::fs::remove_dir_all(&self.tree);
        let _ = std::fs::remove_dir_all(&self.git_dir);
    }

    /// `git` on the worker's repository and the checkout.
    fn run(&self, args: &[&str], what: &str) -> Result<String, String> {
        let mut command = git();
        command
            .arg("--git-dir")
            .arg(&self.git_dir)
            .arg("--work-tree")
            .arg(&self.tree)
            .args(args);
        run(command, what)
    }
}

/// Removes the checkouts in `workspaces` of runs that are over (`over` says which, by run id):
/// those a worker stopped or killed before their runs ended elsewhere left behind.
pub fn tidy(workspaces: &Path, over: impl Fn(&str) -> bool) {
    let Ok(entries) = std::fs::read_dir(workspaces) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(run_id) = name.to_str().map(|n| n.trim_end_matches(".git")) else {
            continue;
        };
        if crate::is_run_id(run_id) && over(run_id) {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use trellis_test::git as git_in;

    #[test]
    fn a_tree_goes_to_the_runs_ref_and_back_and_what_a_stage_plants_there_runs_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let (remote, repo) = (dir.path().join("remote.git"), dir.path().join("repo"));
        std::fs::create_dir_all(&repo).unwrap();
        git_in(dir.path(), &["init", "-q", "--bare", "remote.git"]);
        git_in(&repo, &["init", "-q"]);
        std::fs::write(repo.join("a.txt"), "a\n").unwrap();
        git_in(&repo, &["add", "-A"]);
        git_in(&repo, &["commit", "-q", "-m", "start"]);
        git_in(
            &repo,
            &["remote", "add", "origin", remote.to_str().unwrap()],
        );
        let workspace = origin(&repo).unwrap().publish("R1").unwrap();
        let at_ref = || git_in(&remote, &["rev-parse", "refs/trellis/runs/R1"]);
        assert_eq!(at_ref().trim(), workspace.commit);

        let first = Checkout::open(&dir.path().join("w1"), "R1", &workspace).unwrap();
        assert_eq!(
            std::fs::read_to_string(first.tree().join("a.txt")).unwrap(),
            "a\n"
        );
        assert!(!first.tree().join(".git").exists());
        // Unchanged, nothing is pushed.
        first.save().unwrap();
        assert_eq!(at_ref().trim(), workspace.commit);
        // A stage's work, and what a hostile one plants for the worker's `git` to run.
        let pwned = dir.path().join("pwned");
        std::fs::write(first.tree().join("b.txt"), "b\n").unwrap();
        std::fs::create_dir_all(first.tree().join(".git/hooks")).unwrap();
        let run_it = format!("#!/bin/sh\ntouch {}\n", pwned.display());
        std::fs::write(first.tree().join(".git/hooks/pre-commit"), &run_it).unwrap();
        std::fs::write(
            first.tree().join(".git/config"),
            format!("[core]\n\tfsmonitor = touch {}\n", pwned.display()),
        )
        .unwrap();
        std::fs::write(first.tree().join(".gitattributes"), "* filter=x\n").unwrap();
        first.save().unwrap();
        assert_ne!(at_ref().trim(), workspace.commit);
        assert!(!pwned.exists());
        let files = git_in(
            &remote,
            &["ls-tree", "-r", "--name-only", "refs/trellis/runs/R1"],
        );
        assert_eq!(files, ".gitattributes\na.txt\nb.txt\n");

        // Another worker's checkout is the pushed tree; the first's is gone once removed.
        let second = Checkout::open(&dir.path().join("w2"), "R1", &workspace).unwrap();
        assert_eq!(
            std::fs::read_to_string(second.tree().join("b.txt")).unwrap(),
            "b\n"
        );
        first.remove();
        assert!(!dir.path().join("w1/R1").exists() && !dir.path().join("w1/R1.git").exists());
        assert!(Checkout::open(&dir.path().join("w3"), "../R1", &workspace).is_err());

        // A worker that lost the run (the second pushed since it last did) cannot undo the other's
        // work: its push is refused and the ref keeps the second's.
        std::fs::write(second.tree().join("c.txt"), "c\n").unwrap();
        second.save().unwrap();
        let kept = at_ref();
        let stale = Checkout::open(&dir.path().join("w4"), "R1", &workspace).unwrap();
        std::fs::write(second.tree().join("d.txt"), "d\n").unwrap();
        second.save().unwrap();
        std::fs::write(stale.tree().join("e.txt"), "e\n").unwrap();
        let refused = stale.save().unwrap_err();
        assert!(refused.contains("push the run's tree"), "{refused}");
        assert_ne!(at_ref(), kept);
        let files = git_in(
            &remote,
            &["ls-tree", "-r", "--name-only", "refs/trellis/runs/R1"],
        );
        assert!(
            files.contains("d.txt") && !files.contains("e.txt"),
            "{files}"
        );
    }

    #[test]
    fn remotes_that_would_run_a_program_are_refused() {
        assert!(checked_remote("--upload-pack=touch /tmp/x").is_err());
        assert!(checked_remote("ext::sh -c touch% /tmp/x").is_err());
        assert!(checked_remote("EXT::sh").is_err());
        assert!(checked_remote("").is_err());
        assert!(checked_remote("https://github.com/acme/api.git").is_ok());
        assert!(checked_remote("/srv/git/api.git").is_ok());
    }
}
