//! `trellis completions SHELL`: scripts the shells accept, naming every subcommand.

mod run_support;

use run_support::Project;

#[test]
fn the_bash_script_parses_and_names_every_subcommand() {
    let p = Project::new();
    let out = p.command(&["completions", "bash"]).output().unwrap();
    assert!(out.status.success());
    let script = String::from_utf8(out.stdout).unwrap();
    for command in [
        "run",
        "resume",
        "logs",
        "steer",
        "serve",
        "validate",
        "completions",
    ] {
        assert!(script.contains(command), "{command} missing");
    }
    let path = p.write("trellis.bash", &script);
    let check = std::process::Command::new("bash")
        .arg("-n")
        .arg(&path)
        .output()
        .unwrap();
    assert!(
        check.status.success(),
        "{}",
        String::from_utf8_lossy(&check.stderr)
    );
    for shell in ["zsh", "fish", "elvish", "powershell"] {
        let out = p.command(&["completions", shell]).output().unwrap();
        assert!(out.status.success() && !out.stdout.is_empty(), "{shell}");
    }
    let unknown = p.command(&["completions", "tcsh"]).output().unwrap();
    assert_eq!(unknown.status.code(), Some(2));
}

/// Regression: `trellis completions fish | head -3` panicked with a backtrace when the reader had
/// gone; it ends quietly, with the status a SIGPIPE gives, as every other command does.
#[test]
fn a_reader_that_has_gone_ends_the_script_quietly() {
    let p = Project::new();
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let out = p
        .command(&["completions", "fish"])
        .stdout(writer)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(141));
    assert_eq!(String::from_utf8_lossy(&out.stderr), "");
}
