//! The security campaign's probes against the processes a run starts, on both sandbox paths
//! (bubblewrap, and `--sandbox none`): a command or an agent's shell reading Trellis's environment
//! through `/proc/$PPID/environ`, processes that try to outlive their stage (`setsid`, a double fork,
//! `env -i`), writes outside the working directory, and the agent's file tools on a FIFO or a device.

#![allow(
    clippy::disallowed_macros,
    reason = "a test's message, which the test harness captures as it captures eprintln! alone"
)]
#![allow(
    clippy::disallowed_methods,
    reason = "tests and benchmarks set up and read files around the code they run"
)]

mod run_support;

use run_support::{Project, stage_dir};
use serde_json::{Value, json};
use trellis_test::Llmock;

const KEY: &str = "sk-ant-test-security-NEVER-SHOWN-77f1";

/// Whether bubblewrap works here; a missing one skips the sandboxed half (fails under
/// `TRELLIS_REQUIRE_PEERS=1`).
fn bubblewrap() -> bool {
    let works = std::process::Command::new("bwrap")
        .args([
            "--ro-bind",
            "/",
            "/",
            "--unshare-pid",
            "--proc",
            "/proc",
            "true",
        ])
        .output()
        .is_ok_and(|o| o.status.success());
    if !works {
        trellis_test::missing_peer("bubblewrap (bwrap)");
    }
    works
}

fn workflow(body: &str) -> String {
    format!(
        "digraph W {{\n graph [goal=\"probe\"]\n start [shape=Mdiamond]\n exit [shape=Msquare]\n {body}\n}}\n"
    )
}

/// A workflow whose start fans out to one command stage per `(node, script)` (a script may not hold
/// a double quote), joined before the exit.
fn fan_out(branches: &[(&str, &str)]) -> String {
    use std::fmt::Write as _;
    let mut body =
        String::from("fan [shape=component]\n join [shape=tripleoctagon]\n start -> fan\n");
    for (node, script) in branches {
        let _ = writeln!(
            body,
            "{node} [shape=parallelogram, script=\"{script}\"]\n fan -> {node} -> join"
        );
    }
    body.push_str("join -> exit");
    workflow(&body)
}

/// Processes whose command line holds `needle`.
fn running(needle: &str) -> usize {
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().parse::<u32>().is_ok())
        .filter(|e| {
            std::fs::read(e.path().join("cmdline")).is_ok_and(|c| {
                String::from_utf8_lossy(&c)
                    .replace('\0', " ")
                    .contains(needle)
            })
        })
        .count()
}

fn probe_project(sandbox: &str) -> Project {
    Project::new()
        .with_env("TRELLIS_SANDBOX", sandbox)
        .with_env("ANTHROPIC_API_KEY", KEY)
        .with_env("PROBE_SECRET_TOKEN", "probe-token-0123456789-NEVER")
}

#[test]
fn a_sandboxed_command_cannot_read_trellis_environment_write_outside_or_outlive_its_stage() {
    if !bubblewrap() {
        return;
    }
    let p = probe_project("bubblewrap");
    let outside = tempfile::tempdir().unwrap();
    let script = format!(
        "base64 -w0 < /proc/$PPID/environ; echo; cat /proc/$PPID/environ | tr '\\\\0' '\\\\n' | grep -c PROBE_SECRET || true; \
         touch {}/escaped 2>&1 || true; echo inside > mine.txt; \
         setsid sleep 7771 & (setsid env -i sleep 7772 &); echo started",
        outside.path().display()
    );
    p.write(
        "w.fabro",
        &workflow(&format!(
            "probe [shape=parallelogram, script=\"{}\"]\n start -> probe -> exit",
            script.replace('"', "\\\"")
        )),
    );
    let run = p.run("w.fabro", &[]);
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    assert_eq!(run.summary["sandbox"], "bubblewrap");
    let out =
        std::fs::read_to_string(stage_dir(&run.record(), "probe").join("stdout.log")).unwrap();
    assert!(!out.contains("NEVER"), "{out}");
    assert!(!out.contains(KEY));
    assert!(
        out.contains("\n0\n"),
        "the sandbox's init knows no PROBE_SECRET: {out}"
    );
    assert!(!outside.path().join("escaped").exists());
    assert_eq!(p.read("mine.txt"), "inside\n");
    std::thread::sleep(std::time::Duration::from_millis(300));
    assert_eq!(
        running("sleep 7771"),
        0,
        "a setsid child outlived its stage"
    );
    assert_eq!(
        running("sleep 7772"),
        0,
        "an env -i double fork outlived its stage"
    );
}

#[test]
fn an_unconfined_command_reading_trellis_environment_shows_no_secret() {
    // Unconfined, the command's parent is the spawner or a reaper it forked (their environment is
    // empty); Trellis is the spawner's parent, and what its environment holds is redacted from what
    // is recorded. The command climbs to it.
    let p = probe_project("none");
    p.write(
        "w.fabro",
        &workflow(
            "probe [shape=parallelogram, script=\"wc -c < /proc/$PPID/environ; T=$PPID; for i in 1 2 3; do [ $(cat /proc/$T/comm) = trellis ] && break; T=$(cut -d' ' -f4 /proc/$T/stat); done; cat /proc/$T/comm; base64 -w0 < /proc/$T/environ; echo; tr '\\\\0' '\\\\n' < /proc/$T/environ\"]\n start -> probe -> exit",
        ),
    );
    let run = p.run("w.fabro", &[]);
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    assert_eq!(run.summary["sandbox"], "none");
    let out =
        std::fs::read_to_string(stage_dir(&run.record(), "probe").join("stdout.log")).unwrap();
    assert!(!out.contains("NEVER"), "{out}");
    assert!(
        out.starts_with("0\ntrellis\n"),
        "the spawner's environment is empty: {out}"
    );
    assert!(out.contains("[redacted PROBE_SECRET_TOKEN]"), "{out}");
    let events = std::fs::read_to_string(run.record().join("events.jsonl")).unwrap();
    assert!(!events.contains("NEVER"));
}

#[test]
fn nothing_an_unconfined_command_starts_outlives_its_stage() {
    let p = probe_project("none");
    p.write(
        "w.fabro",
        &workflow(
            "spawn [shape=parallelogram, script=\"setsid sleep 7761 & (setsid env -i sleep 7762 &); echo spawned\"]\n \
             odd [shape=parallelogram, script=\"n=$(mktemp -d)/$(printf 'z\\\\377'); cp /bin/sleep $n; (setsid env -i $n 7764 &); sleep 0.3\"]\n \
             slow [shape=parallelogram, timeout=\"500ms\", max_retries=0, script=\"(setsid env -i sleep 7763 &); sleep 30\"]\n \
             start -> spawn -> odd -> slow -> exit\n slow -> exit [condition=\"outcome=fail\"]",
        ),
    );
    let run = p.run("w.fabro", &[]);
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    std::thread::sleep(std::time::Duration::from_millis(500));
    // `odd` left a process named with a byte that is not text.
    for needle in ["sleep 7761", "sleep 7762", "sleep 7763", "z\u{FFFD} 7764"] {
        assert_eq!(running(needle), 0, "`{needle}` outlived its stage");
    }
}

#[test]
fn nothing_an_unconfined_command_starts_outlives_trellis_killed_mid_stage() {
    // Two branches at once: the spawner runs one itself and the other under a reaper of its own
    // when Trellis dies.
    let p = probe_project("none");
    p.write(
        "w.fabro",
        &fan_out(&[
            (
                "a",
                "setsid sleep 7791 & (setsid env -i sleep 7792 &); sleep 7793",
            ),
            ("b", "sleep 7794"),
        ]),
    );
    let trellis = Killed(p.spawn_run("w.fabro"));
    let wait = std::time::Duration::from_secs(20);
    let sleeps = ["sleep 7791", "sleep 7792", "sleep 7793", "sleep 7794"];
    run_support::wait_for("the branches' commands", wait, || {
        sleeps.iter().all(|needle| running(needle) > 0)
    });
    let spawners = trellis_process::reaper::children_of(trellis.0.id());
    assert_eq!(spawners.len(), 1, "one spawner: {spawners:?}");
    let comms: Vec<String> = trellis_process::reaper::children_of(spawners[0])
        .into_iter()
        .filter_map(|pid| std::fs::read_to_string(format!("/proc/{pid}/comm")).ok())
        .map(|comm| comm.trim().to_owned())
        .collect();
    assert_eq!(
        comms.iter().filter(|comm| *comm == "trellis-reap").count(),
        1,
        "one branch under a reaper: {comms:?}"
    );
    assert!(
        comms.iter().any(|comm| comm == "sh" || comm == "sleep"),
        "one run by the spawner: {comms:?}"
    );
    drop(trellis); // SIGKILL: Trellis cleans nothing up itself.
    run_support::wait_for("everything to end", wait, || {
        running("sleep 779") == 0 && !run_support::alive(spawners[0])
    });
}

#[test]
fn a_branch_the_spawner_runs_ends_what_it_left_and_not_the_branches_beside_it() {
    // The spawner runs one branch itself and the others under reapers; whichever ends first, what
    // it left behind ends with it, and the others go on to their own end.
    let p = probe_project("none");
    p.write(
        "w.fabro",
        &fan_out(&[
            ("a", "(setsid env -i sleep 7731 &); sleep 0.2; echo a-done"),
            ("b", "(setsid env -i sleep 7732 &); sleep 1; echo b-done"),
            ("c", "(setsid env -i sleep 7733 &); sleep 1; echo c-done"),
        ]),
    );
    let run = p.run("w.fabro", &[]);
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    for node in ["a", "b", "c"] {
        let out =
            std::fs::read_to_string(stage_dir(&run.record(), node).join("stdout.log")).unwrap();
        assert_eq!(out.trim(), format!("{node}-done"));
    }
    for needle in ["sleep 7731", "sleep 7732", "sleep 7733"] {
        assert_eq!(running(needle), 0, "`{needle}` outlived its stage");
    }
}

#[test]
fn a_finished_command_leaves_no_zombie_while_the_spawner_waits() {
    // After `done`, nothing asks the spawner for minutes in a long wait (or in a server between
    // runs); the command (or the reaper) that ran `done` is cleared away all the same.
    let p = probe_project("none");
    p.write(
        "w.fabro",
        &workflow(
            "done [shape=parallelogram, script=\"true\"]\n \
             pause [shape=insulator, duration=\"6s\"]\n start -> done -> pause -> exit",
        ),
    );
    let trellis = Killed(p.spawn_run("w.fabro"));
    p.wait_for_event("StageStarted", "pause");
    let spawners = trellis_process::reaper::children_of(trellis.0.id());
    assert_eq!(spawners.len(), 1, "one spawner: {spawners:?}");
    run_support::wait_for(
        "the finished command to be cleared away",
        std::time::Duration::from_secs(3),
        || trellis_process::reaper::children_of(spawners[0]).is_empty(),
    );
}

#[test]
fn a_command_too_large_for_the_spawner_starts_the_reaper_program_instead() {
    // 100 KB of script (an argument may hold up to 128 KB) and 60 KB of environment: more than
    // one message to the spawner takes.
    let p = probe_project("none").with_env("PROBE_LARGE", &"y".repeat(60 * 1024));
    let padding = "x".repeat(100 * 1024);
    p.write(
        "w.fabro",
        &workflow(&format!(
            "big [shape=parallelogram, script=\"cat /proc/$PPID/cmdline | tr '\\\\0' ' '; echo; : {padding}\"]\n start -> big -> exit"
        )),
    );
    let run = p.run("w.fabro", &[]);
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    let out = std::fs::read_to_string(stage_dir(&run.record(), "big").join("stdout.log")).unwrap();
    assert!(
        out.contains("trellis-reap -- "),
        "{}",
        &out[..out.len().min(200)]
    );
}

/// A child killed (`SIGKILL`) and waited for when dropped, also when a test fails first.
struct Killed(std::process::Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn unconfined_commands_run_under_the_small_reaper_beside_trellis() {
    let p = probe_project("none");
    p.write(
        "w.fabro",
        &workflow(
            "who [shape=parallelogram, script=\"cat /proc/$PPID/comm\"]\n start -> who -> exit",
        ),
    );
    let run = p.run("w.fabro", &[]);
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    // `$PPID` is the parent of the shell the script runs in: the spawner (the small reaper's
    // program), which runs a command alone at a time itself.
    let out = std::fs::read_to_string(stage_dir(&run.record(), "who").join("stdout.log")).unwrap();
    assert_eq!(out.trim(), "trellis-reap", "{out}");
}

/// Whether this kernel offers Landlock (the fallback sandbox); one without skips that half.
fn landlock() -> bool {
    let works = trellis_process::reaper::landlock_supported();
    if !works {
        eprintln!("skipping: this kernel does not offer Landlock");
    }
    works
}

/// The sandboxes under which a command may write the run's record (the runs directory inside the
/// working tree): Landlock, when the kernel has it, and none.
fn writing_the_record() -> &'static [&'static str] {
    if landlock() {
        &["landlock", "none"]
    } else {
        &["none"]
    }
}

/// Under Landlock (and unconfined) a command may write the run's record when the runs directory is
/// inside the working tree: links it plants where Trellis is about to create its output logs, or
/// its artifacts' folder, are not written through, so its output and files cannot land where it
/// may not write itself.
#[test]
fn links_planted_in_the_run_s_record_are_not_written_through() {
    let sandboxes = writing_the_record();
    for sandbox in sandboxes {
        let p = probe_project(sandbox);
        // Outside the working directory and /tmp, which Landlock leaves writable.
        let outside = tempfile::tempdir_in("/var/tmp").unwrap();
        let target = outside.path().join("target.txt");
        std::fs::write(&target, "untouched\n").unwrap();
        let folder = outside.path().join("folder");
        std::fs::create_dir(&folder).unwrap();
        p.write(
            "w.fabro",
            &workflow(&format!(
                "plant [shape=parallelogram, script=\"ln -s {t} $TRELLIS_STAGE_DIR/stdout.log && ln -s {t} $TRELLIS_STAGE_DIR/stderr.log && echo through-the-link && echo also-through >&2\"]\n \
                 art [shape=parallelogram, capture_artifacts=true, script=\"a=$TRELLIS_STAGE_DIR/../../artifacts/art; mkdir -p $a test-results && ln -s {f} $a/attempt-1 && echo planted > test-results/report.txt\"]\n \
                 start -> plant -> art -> exit",
                t = target.display(),
                f = folder.display()
            )),
        );
        let run = p.run("w.fabro", &[]);
        assert_eq!(run.code(), Some(0), "{sandbox}: {}", run.stderr());
        assert_eq!(
            run.stage_status("plant"),
            "succeeded",
            "{sandbox}: {}",
            run.stderr()
        );
        assert_eq!(
            std::fs::read_to_string(&target).unwrap(),
            "untouched\n",
            "{sandbox}"
        );
        let dir = stage_dir(&run.record(), "plant");
        for log in ["stdout.log", "stderr.log"] {
            let kind = std::fs::symlink_metadata(dir.join(log))
                .unwrap()
                .file_type();
            assert!(
                kind.is_symlink(),
                "{sandbox}: {log} is still the command's link"
            );
        }
        assert_eq!(
            run.stage_status("art"),
            "succeeded",
            "{sandbox}: {}",
            run.stderr()
        );
        let written: Vec<_> = std::fs::read_dir(&folder).unwrap().collect();
        assert!(
            written.is_empty(),
            "{sandbox}: artifacts written through the link: {written:?}"
        );
    }
}

/// The same, with links put in place of the record's folders rather than at a file's name: a
/// command that swaps its own stage's folder for a link (while it runs), or the run's `stages`
/// folder (for the stages after it), does not have Trellis write its output, its status or the
/// next stage's files into the folder the link leads to. The run stops, saying which file of its
/// record it could not write.
#[test]
fn folders_of_the_run_s_record_swapped_for_links_are_not_written_through() {
    let sandboxes = writing_the_record();
    let swaps = [
        // Its own folder, before it prints anything (its logs are made at its first output).
        (
            "own",
            "d=$TRELLIS_STAGE_DIR; mv $d $d.moved && ln -s {f} $d && echo through-the-link",
        ),
        // The stages' folder, for the stages after it.
        (
            "stages",
            "r=$(dirname $(dirname $TRELLIS_STAGE_DIR)); mv $r/stages $r/stages.moved && ln -s {f} $r/stages && echo planted",
        ),
    ];
    for sandbox in sandboxes {
        for (what, script) in swaps {
            let p = probe_project(sandbox);
            // Outside the working directory and /tmp, which Landlock leaves writable.
            let outside = tempfile::tempdir_in("/var/tmp").unwrap();
            let folder = outside.path().join("folder");
            std::fs::create_dir(&folder).unwrap();
            let script = script.replace("{f}", &folder.display().to_string());
            p.write(
                "w.fabro",
                &workflow(&format!(
                    "swap [shape=parallelogram, script=\"{script}\"]\n \
                     after [shape=parallelogram, script=\"echo after\"]\n \
                     start -> swap -> after -> exit"
                )),
            );
            let run = p.run("w.fabro", &[]);
            let written: Vec<_> = std::fs::read_dir(&folder).unwrap().collect();
            assert!(
                written.is_empty(),
                "{sandbox}, {what}: written through the link: {written:?}\n{}",
                run.stderr()
            );
            assert_ne!(run.code(), Some(0), "{sandbox}, {what}: {}", run.stderr());
            let error = run.summary["error"].as_str().unwrap_or_default();
            assert!(
                error.contains("status.json` was not opened: a link is in its way"),
                "{sandbox}, {what}: {error}"
            );
        }
    }
}

#[test]
fn the_landlock_sandbox_confines_writes_and_the_network_and_leaves_nothing_behind() {
    if !landlock() {
        return;
    }
    let p = probe_project("landlock");
    // Writable by anyone, and outside the working directory and /tmp.
    let outside = tempfile::tempdir_in("/var/tmp").unwrap();
    p.write(
        "w.fabro",
        &workflow(&format!(
            "probe [shape=parallelogram, script=\"touch {}/escaped 2>/dev/null || echo refused; echo inside > mine.txt; setsid sleep 7751 & (setsid env -i sleep 7752 &); echo started\"]\n \
             net [shape=parallelogram, sandbox=\"network=off\", script=\"python3 -c 'import socket; s=socket.socket(); s.bind((\\\"127.0.0.1\\\", 0)); s.listen()' 2>&1 | tail -1; python3 -c 'import socket; socket.socket(socket.AF_INET, socket.SOCK_DGRAM)' 2>&1 | tail -1\"]\n \
             start -> probe -> net -> exit",
            outside.path().display()
        )),
    );
    let run = p.run("w.fabro", &[]);
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    assert_eq!(run.summary["sandbox"], "landlock");
    let read = |node: &str| {
        std::fs::read_to_string(stage_dir(&run.record(), node).join("stdout.log")).unwrap()
    };
    assert!(read("probe").starts_with("refused\n"), "{}", read("probe"));
    assert!(!outside.path().join("escaped").exists());
    assert_eq!(p.read("mine.txt"), "inside\n");
    // TCP (Landlock) and UDP (the seccomp filter) alike.
    assert_eq!(
        read("net").matches("Permission denied").count(),
        2,
        "{}",
        read("net")
    );
    std::thread::sleep(std::time::Duration::from_millis(300));
    assert_eq!(running("sleep 7751"), 0);
    assert_eq!(running("sleep 7752"), 0);
}

#[test]
fn the_sandbox_lets_real_work_run() {
    if !bubblewrap() {
        return;
    }
    let python = trellis_test::cache_dir().join("peers/bin/python");
    if !python.is_file() {
        trellis_test::missing_peer("pytest (in the test peers' Python environment)");
        return;
    }
    let p = Project::new().with_env("TRELLIS_SANDBOX", "bubblewrap");
    p.write("test_calc.py", "def test_add():\n    assert 1 + 1 == 2\n");
    p.write(
        "crate/Cargo.toml",
        "[package]\nname = \"probe\"\nversion = \"0.1.0\"\nedition = \"2021\"\n[workspace]\n",
    );
    p.write(
        "crate/src/lib.rs",
        "#[test]\nfn adds() { assert_eq!(1 + 1, 2); }\n",
    );
    p.write(
        "pkg/package.json",
        "{\"name\": \"probe\", \"version\": \"1.0.0\", \"scripts\": {\"test\": \"node -e \\\"console.log('npm-ok')\\\"\"}}",
    );
    p.write(
        "w.fabro",
        &workflow(&format!(
            "git [shape=parallelogram, script=\"git init -q . && git add test_calc.py && git -c user.email=t@t -c user.name=t commit -qm one && git log --oneline | wc -l\"]\n \
             py [shape=parallelogram, script=\"{} -m pytest -q 2>&1 | tail -1\"]\n \
             tmp [shape=parallelogram, script=\"mktemp -d >/dev/null && echo ok > $(mktemp) && echo tmp-ok\"]\n \
             cargo [shape=parallelogram, script=\"cd crate && cargo test --offline -q --lib 2>&1 | tail -3\"]\n \
             npm [shape=parallelogram, script=\"cd pkg && (command -v npm >/dev/null || echo npm-ok) && (command -v npm >/dev/null && npm test --silent || true)\"]\n \
             start -> git -> py -> tmp -> cargo -> npm -> exit",
            python.display()
        )),
    );
    let run = p.run("w.fabro", &[]);
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    let read = |node: &str| {
        std::fs::read_to_string(stage_dir(&run.record(), node).join("stdout.log")).unwrap()
    };
    assert_eq!(read("git").trim(), "1");
    assert!(read("py").contains("1 passed"), "{}", read("py"));
    assert_eq!(read("tmp").trim(), "tmp-ok");
    assert!(
        read("cargo").contains("test result: ok. 1 passed"),
        "{}",
        read("cargo")
    );
    assert!(read("npm").contains("npm-ok"), "{}", read("npm"));
    assert!(p.path().join(".git").is_dir());
}

#[test]
fn a_node_can_turn_the_network_off_but_not_the_sandbox() {
    if !bubblewrap() {
        return;
    }
    let p = Project::new().with_env("TRELLIS_SANDBOX", "bubblewrap");
    p.write(
        "w.fabro",
        &workflow(
            "net [shape=parallelogram, sandbox=\"network=off\", script=\"ls /sys/class/net | tr '\\\\n' ' '; cat /proc/net/dev | wc -l\"]\n start -> net -> exit",
        ),
    );
    let run = p.run("w.fabro", &[]);
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    let out = std::fs::read_to_string(stage_dir(&run.record(), "net").join("stdout.log")).unwrap();
    // Only a loopback: /proc/net/dev has its two header lines and `lo`.
    assert!(out.trim_end().ends_with('3'), "{out}");
    p.write(
        "off.fabro",
        &workflow(
            "x [shape=parallelogram, sandbox=\"none\", script=\"true\"]\n start -> x -> exit",
        ),
    );
    let out = p.command(&["validate", "off.fabro"]).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("a workflow cannot turn the sandbox off")
    );
}

/// A run file that cuts the network (Docker's `network_mode = "none"`, Fabro's default provider)
/// cuts it for every stage, a node that asks for the network included, and for its prepare steps;
/// without it the same stage has the machine's network.
#[test]
fn a_run_file_can_cut_every_stages_network() {
    if !bubblewrap() {
        return;
    }
    let p = Project::new().with_env("TRELLIS_SANDBOX", "bubblewrap");
    let count = "cat /proc/net/dev | wc -l";
    p.write(
        "w.fabro",
        &workflow(&format!(
            "net [shape=parallelogram, script=\"{count}\"]\n open [shape=parallelogram, sandbox=\"network=on\", script=\"{count}\"]\n start -> net -> open -> exit"
        )),
    );
    p.write(
        "run.toml",
        &format!("_version = 1\n[workflow]\ngraph = \"w.fabro\"\n[[run.prepare.steps]]\nscript = \"{count} > prepared\"\n[run.sandbox.docker]\nnetwork_mode = \"none\"\n"),
    );
    let run = p.run("run.toml", &[]);
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    let lines = |node: &str| {
        std::fs::read_to_string(stage_dir(&run.record(), node).join("stdout.log"))
            .unwrap()
            .trim()
            .to_owned()
    };
    // Only a loopback: /proc/net/dev has its two header lines and `lo`.
    assert_eq!((lines("net").as_str(), lines("open").as_str()), ("3", "3"));
    assert_eq!(p.read("prepared").trim(), "3");
    // The machine's own network has more than a loopback; the workflow alone gets it.
    let open = p.run("w.fabro", &[]);
    assert_eq!(open.code(), Some(0), "{}", open.stderr());
    let machine =
        std::fs::read_to_string(stage_dir(&open.record(), "net").join("stdout.log")).unwrap();
    assert_ne!(
        machine.trim(),
        "3",
        "this machine has a network besides its loopback"
    );
}

fn call(name: &str, arguments: &Value) -> Value {
    json!({ "type": "reply", "tool_calls": [{ "name": name, "arguments": arguments }], "times": 1 })
}

fn answer(text: &str) -> Value {
    json!({ "type": "reply", "text": text, "times": 1 })
}

/// The `tool_result` contents of the last request llmock received.
fn last_results(mock: &Llmock) -> Vec<String> {
    let bodies = mock.bodies();
    Llmock::tool_results(bodies.last().unwrap())
        .iter()
        .map(|b| b["content"].to_string())
        .collect()
}

fn agent_probe(sandbox: &str, command: &str) -> (Project, Vec<String>) {
    let mock = Llmock::start().expect("llmock");
    let p = probe_project(sandbox).with_env("ANTHROPIC_BASE_URL", &mock.url("/anthropic"));
    p.write(
        "w.fabro",
        &workflow("probe [prompt=\"Probe\", model=\"sonnet\"]\n start -> probe -> exit"),
    );
    mock.scenario(&json!([
        call("shell", &json!({ "command": command })),
        answer("done"),
    ]));
    let run = p.run("w.fabro", &[]);
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    (p, last_results(&mock))
}

#[test]
fn an_agent_shell_cannot_read_trellis_environment_or_leave_processes_behind() {
    if Llmock::start().is_none() {
        return;
    }
    let probe = "base64 -w0 < /proc/$PPID/environ; echo; setsid sleep 7781 & (setsid env -i sleep 7782 &); echo probed";
    let mut paths = vec!["none"];
    if bubblewrap() {
        paths.push("bubblewrap");
    }
    for sandbox in paths {
        let (_p, results) = agent_probe(sandbox, probe);
        let shown = results.join("\n");
        assert!(shown.contains("probed"), "{sandbox}: {shown}");
        assert!(
            !shown.contains("NEVER"),
            "{sandbox}: the model was shown a secret: {shown}"
        );
        assert!(!shown.contains(KEY), "{sandbox}: {shown}");
        std::thread::sleep(std::time::Duration::from_millis(300));
        assert_eq!(running("sleep 7781"), 0, "{sandbox}: setsid survivor");
        assert_eq!(running("sleep 7782"), 0, "{sandbox}: env -i survivor");
    }
}

#[test]
fn the_agent_file_tools_refuse_a_fifo_and_a_device_at_once() {
    let Some(mock) = Llmock::start() else { return };
    let p = probe_project("none").with_env("ANTHROPIC_BASE_URL", &mock.url("/anthropic"));
    nix::unistd::mkfifo(&p.path().join("pipe"), nix::sys::stat::Mode::S_IRWXU).unwrap();
    p.write(
        "w.fabro",
        &workflow("probe [prompt=\"Probe\", model=\"sonnet\"]\n start -> probe -> exit"),
    );
    mock.scenario(&json!([
        { "type": "reply", "times": 1, "tool_calls": [
            // Four reads of the FIFO at once (different calls: a third identical one is not run).
            { "name": "read_file", "arguments": { "path": "pipe" } },
            { "name": "read_file", "arguments": { "path": "./pipe" } },
            { "name": "read_file", "arguments": { "path": "pipe", "limit": 10 } },
            { "name": "read_file", "arguments": { "path": "./pipe", "limit": 10 } },
            { "name": "read_file", "arguments": { "path": "/dev/zero" } }
        ] },
        answer("done"),
    ]));
    let started = std::time::Instant::now();
    let run = p.run("w.fabro", &[]);
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    assert!(started.elapsed() < std::time::Duration::from_secs(20));
    let results = last_results(&mock);
    assert_eq!(results.len(), 5);
    for result in &results[..4] {
        assert!(result.contains("not a regular file"), "{result}");
    }
    assert!(
        results[4].contains("outside the working directory"),
        "{}",
        results[4]
    );
}

/// A sandboxed stage may run longer than the runtime's blocking threads idle (ten seconds): the
/// thread that starts its command ends meanwhile, and `bwrap --die-with-parent` must not take the
/// command with it (a `sleep 14` was killed at ten seconds and the stage failed).
#[test]
fn a_sandboxed_stage_outlives_the_thread_that_started_its_command() {
    if !bubblewrap() {
        return;
    }
    let p = Project::new();
    p.write(
        "long.fabro",
        &workflow(
            "long [shape=parallelogram, script=\"sleep 12; echo slept\"]\n start -> long -> exit",
        ),
    );
    let run = p.run("long.fabro", &["--sandbox", "bubblewrap"]);
    assert_eq!(run.summary["status"], "succeeded", "{}", run.stderr());
    let status = run_support::read_json(&stage_dir(&run.record(), "long").join("status.json"));
    assert_eq!(status["status"], "succeeded", "{status}");
}
