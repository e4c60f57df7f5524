//! `git` as a test runs it to set up a repository: as a user with a name and an address, failing
//! the test with what git said.

use std::path::Path;
use std::process::Command;

/// `git ARGS` in `dir`, its standard output; panics with git's message when it fails.
pub fn git(dir: &Path, args: &[&str]) -> String {
    let output = Command::new("git")
        .args(["-c", "user.name=Test", "-c", "user.email=test@localhost"])
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}
