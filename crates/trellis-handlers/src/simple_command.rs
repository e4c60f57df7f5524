//! Scripts that are one simple command (`make test`, `sleep 0.2`, `./build.sh --fast`) are started
//! directly instead of through `sh -c`: the shell would only exec the program itself (as `sh -c`
//! does with a lone command), so running it directly gives the same process, arguments, environment
//! and exit status, with one program start fewer — which is most of a short stage's cost and what a
//! wide fan-out waits on. The test is deliberately narrow, like `make`'s: plain words only (no
//! quotes, variables, globs, redirections, separators or comments), a first word that is no shell
//! builtin or keyword and no assignment, and a program found as an executable file. Anything else,
//! and a program the kernel will not start (a script without `#!`, which the shell would run
//! itself), goes to `sh -c` as before. Inside the sandbox or under the reaper, where a failed start
//! could not fall back, a program starts directly only when it is a binary or a `#!` script.

use std::path::{Path, PathBuf};

/// Words the shell gives a meaning of its own in first position: its keywords and builtins (even
/// those with a program of the same name, like `echo` and `test`, whose behaviour differs).
const SHELL_WORDS: &[&str] = &[
    "!", ".", ":", "[", "[[", "]]", "{", "}", "alias", "bg", "break", "case", "cd", "chdir",
    "command", "continue", "do", "done", "echo", "elif", "else", "esac", "eval", "exec", "exit",
    "export", "false", "fc", "fg", "fi", "for", "function", "getopts", "hash", "if", "in", "jobs",
    "kill", "local", "printf", "pwd", "read", "readonly", "return", "select", "set", "shift",
    "source", "test", "then", "time", "times", "trap", "true", "type", "typeset", "ulimit",
    "umask", "unalias", "unset", "until", "wait", "while",
];

/// Whether every character of `word` means itself to the shell.
fn plain(word: &str) -> bool {
    word.bytes()
        .all(|b| b.is_ascii_alphanumeric() || b"_-./,:+@%=".contains(&b))
}

/// A script that is one simple command: the program it names and the arguments it gives.
#[derive(Debug, PartialEq)]
pub(crate) struct SimpleCommand {
    pub program: PathBuf,
    pub args: Vec<String>,
}

/// `script` as a simple command, when it is one whose program is found (see [`program`]).
pub(crate) fn parse(script: &str, work_dir: &Path) -> Option<SimpleCommand> {
    let words = words(script)?;
    let (first, args) = words.split_first()?;
    Some(SimpleCommand {
        program: program(first, work_dir)?,
        args: args.iter().map(|&arg| arg.to_owned()).collect(),
    })
}

/// The words of `script` when it is one simple command the shell would exec unchanged.
fn words(script: &str) -> Option<Vec<&str>> {
    let script = script.trim();
    if script.contains(['\n', '\r']) {
        return None;
    }
    let words: Vec<&str> = script.split_ascii_whitespace().collect();
    let first = words.first()?;
    let ok = !first.contains('=')
        && !SHELL_WORDS.contains(first)
        && words.iter().all(|word| plain(word));
    ok.then_some(words)
}

/// The executable a simple command's first word names: a path (relative to `work_dir`, which must
/// be absolute) or a name searched on `PATH` as the shell would.
fn program(first: &str, work_dir: &Path) -> Option<PathBuf> {
    if !work_dir.is_absolute() {
        return None;
    }
    if first.contains('/') {
        let path = work_dir.join(first);
        return crate::command::is_executable(&path).then_some(path);
    }
    crate::command::found_on_path(first).filter(|path| path.is_absolute())
}

/// Whether the kernel starts `program` itself: an ELF binary or a `#!` script (a file without either
/// is run by the shell, not by `exec`). Reads its first four bytes.
#[allow(
    clippy::disallowed_methods,
    reason = "called on the blocking pool, where a command starts"
)]
pub(crate) fn kernel_starts(program: &Path) -> bool {
    use std::io::Read as _;
    let mut head = [0u8; 4];
    std::fs::File::open(program)
        .and_then(|mut file| file.read_exact(&mut head))
        .is_ok_and(|()| head == *b"\x7fELF" || head.starts_with(b"#!"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_one_plain_command_is_simple() {
        assert_eq!(words("sleep 0.2"), Some(vec!["sleep", "0.2"]));
        assert_eq!(
            words("  cargo test --release -p x:y@1 a=b\n"),
            Some(vec!["cargo", "test", "--release", "-p", "x:y@1", "a=b"])
        );
        assert_eq!(words("./build.sh"), Some(vec!["./build.sh"]));
        let sleep = parse("sleep 0.2", Path::new("/")).expect("sleep is on PATH");
        assert!(sleep.program.ends_with("sleep"));
        assert_eq!(sleep.args, ["0.2"]);
        for script in [
            "",
            "true",
            "echo hi",
            "cd sub",
            "test -f x",
            "A=1 make",
            "make && make test",
            "make; make test",
            "make\nmake test",
            "make > log",
            "echo $HOME",
            "ls *.rs",
            "ls ~",
            "grep 'a b' x",
            "make # comment",
            "sleep 1 &",
            "ls {a,b}",
            "cat <(ls)",
            "ls `pwd`",
        ] {
            assert_eq!(words(script), None, "{script:?}");
        }
    }

    #[test]
    fn the_program_is_found_as_the_shell_would() {
        let work = tempfile::tempdir().unwrap();
        let sh = program("sh", work.path()).expect("sh is on PATH");
        assert!(sh.is_absolute() && sh.ends_with("sh"));
        assert_eq!(program("no-such-program-here", work.path()), None);
        assert_eq!(program("sh", Path::new("relative")), None);
        #[allow(clippy::disallowed_methods, reason = "the test sets up files")]
        {
            use std::os::unix::fs::PermissionsExt as _;
            let script = work.path().join("run.sh");
            std::fs::write(&script, "#!/bin/sh\n").unwrap();
            assert_eq!(program("./run.sh", work.path()), None, "not executable");
            std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
            assert_eq!(
                program("./run.sh", work.path()),
                Some(work.path().join("./run.sh"))
            );
        }
    }

    #[test]
    #[allow(clippy::disallowed_methods, reason = "a test sets up its files")]
    fn the_kernel_starts_binaries_and_hashbang_scripts_only() {
        let dir = tempfile::tempdir().unwrap();
        let (script, bare) = (dir.path().join("a.sh"), dir.path().join("b.sh"));
        std::fs::write(&script, "#!/bin/sh\necho hi\n").unwrap();
        std::fs::write(&bare, "echo hi\n").unwrap();
        assert!(kernel_starts(Path::new("/bin/sh")));
        assert!(kernel_starts(&script));
        assert!(!kernel_starts(&bare));
        assert!(!kernel_starts(&dir.path().join("missing")));
    }
}
