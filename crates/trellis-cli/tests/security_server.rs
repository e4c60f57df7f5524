//! The security campaign's probes against `trellis serve`, each a defect it found, reproduced as a
//! user's attacker would: DNS rebinding (a foreign `Host`), weak tokens, slow clients, and files reached
//! through a symbolic or hard link.

#![allow(
    clippy::disallowed_methods,
    reason = "tests and benchmarks set up and read files around the code they run"
)]

mod run_support;
mod serve_support;

use std::io::{Read as _, Write as _};
use std::net::TcpStream;
use std::process::Stdio;
use std::time::{Duration, Instant};

use serde_json::json;
use serve_support::{Serve, free_port, project_with};
use trellis_test::http::Request;

const STEPS: &str = "digraph Steps { start [shape=Mdiamond]\n exit [shape=Msquare]\n a [shape=parallelogram, script=\"echo step\"]\n start -> a -> exit }";

/// The repro of the DNS-rebinding hole: a page on `x.test` (pointed at 127.0.0.1) posting a run.
fn rebinding_post(port: u16, host: &str, marker: &std::path::Path) -> u16 {
    let source = format!(
        "digraph P{{start[shape=Mdiamond];exit[shape=Msquare];a[shape=parallelogram,script=\"id>{}\"];start->a->exit}}",
        marker.display()
    );
    Request::new(port, "POST", "/api/runs")
        .header("Host", format!("{host}:{port}"))
        .header("Origin", format!("http://{host}:{port}"))
        .header("Sec-Fetch-Site", "same-origin")
        .json(&json!({ "source": source, "name": "p.fabro" }))
        .send()
        .status
}

#[test]
fn a_request_naming_another_host_is_refused_on_every_route() {
    let project = project_with(&[("steps.fabro", STEPS)]);
    let serve = Serve::start(&project);
    let marker = project.path().join("PWNED");
    assert_eq!(rebinding_post(serve.port, "x.test", &marker), 403);
    std::thread::sleep(Duration::from_millis(300));
    assert!(!marker.exists(), "the command ran");
    for path in ["/api/runs", "/", "/healthz", "/api/openapi.json"] {
        let answer = Request::new(serve.port, "GET", path)
            .header("Host", format!("x.test:{}", serve.port))
            .send();
        assert_eq!(answer.status, 403, "{path}");
    }
    // Loopback's own names pass.
    for host in ["localhost", "127.0.0.1", "[::1]"] {
        let answer = Request::new(serve.port, "GET", "/api/runs")
            .header("Host", format!("{host}:{}", serve.port))
            .send();
        assert_eq!(answer.status, 200, "{host}");
    }
}

#[test]
fn a_host_the_user_allows_is_answered() {
    let project = project_with(&[("steps.fabro", STEPS)]);
    let serve = Serve::start_with(&project, free_port(), &["--allow-host", "trellis.test"]);
    let answer = Request::new(serve.port, "GET", "/api/runs")
        .header("Host", format!("trellis.test:{}", serve.port))
        .send();
    assert_eq!(answer.status, 200);
    let other = Request::new(serve.port, "GET", "/api/runs")
        .header("Host", "evil.test")
        .send();
    assert_eq!(other.status, 403);
}

fn serve_output(project: &run_support::Project, args: &[&str]) -> std::process::Output {
    let mut all = vec!["serve"];
    all.extend_from_slice(args);
    project.command(&all).output().unwrap()
}

#[test]
fn weak_tokens_are_refused() {
    let project = project_with(&[("steps.fabro", STEPS)]);
    let listen = format!("0.0.0.0:{}", free_port());
    for (token, why) in [
        (" ", "whitespace"),
        ("x", "at least 16 characters"),
        ("a token with spaces in it", "whitespace"),
        ("fifteen-chars-1", "at least 16 characters"),
    ] {
        let out = serve_output(&project, &["--listen", &listen, "--token", token]);
        assert_eq!(out.status.code(), Some(2), "{token:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(why), "{token:?}: {stderr}");
    }
    // On loopback too: a weak token protects nothing.
    let out = serve_output(
        &project,
        &[
            "--listen",
            &format!("127.0.0.1:{}", free_port()),
            "--token",
            "abc",
        ],
    );
    assert_eq!(out.status.code(), Some(2));
}

/// Reads standard error until the end of the line holding `needle` (or the deadline).
fn read_until(stderr: &mut impl std::io::Read, needle: &str) -> String {
    let mut text = String::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut buffer = [0u8; 1024];
    let complete = |text: &str| {
        text.split_once(needle)
            .is_some_and(|(_, rest)| rest.contains('\n'))
    };
    while Instant::now() < deadline && !complete(&text) {
        match stderr.read(&mut buffer) {
            Ok(0) | Err(_) => break,
            Ok(n) => text.push_str(&String::from_utf8_lossy(&buffer[..n])),
        }
    }
    text
}

#[test]
fn a_server_beyond_loopback_without_a_token_generates_one_and_shows_it_once() {
    let project = project_with(&[("steps.fabro", STEPS)]);
    let port = free_port();
    let mut child = project
        .command(&["serve", "--listen", &format!("0.0.0.0:{port}")])
        .stderr(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let text = read_until(&mut stderr, "?token=");
    let serve = Serve { child, port };
    trellis_test::http::wait_for_port(port, "trellis serve");
    let token = text
        .split("?token=")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .unwrap_or_else(|| panic!("no generated token in: {text}"))
        .to_owned();
    assert_eq!(token.len(), 32, "{token}");
    assert_eq!(serve.get("/api/runs").status, 401);
    let with = Request::new(port, "GET", "/api/runs")
        .header("Authorization", format!("Bearer {token}"))
        .send();
    assert_eq!(with.status, 200);
    assert!(!with.text().contains(&token));
}

#[test]
fn a_token_file_is_read() {
    let project = project_with(&[("steps.fabro", STEPS)]);
    // Saved as a Windows editor saves it: a byte order mark and a CRLF, neither part of the token.
    project.write("token.txt", "\u{feff}0123456789abcdef-from-a-file\r\n");
    let port = free_port();
    let child = project
        .command(&[
            "serve",
            "--listen",
            &format!("0.0.0.0:{port}"),
            "--token-file",
            "token.txt",
        ])
        .stderr(Stdio::null())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let serve = Serve { child, port };
    trellis_test::http::wait_for_port(port, "trellis serve");
    assert_eq!(serve.get("/api/runs").status, 401);
    let with = Request::new(port, "GET", "/api/runs")
        .header("Authorization", "Bearer 0123456789abcdef-from-a-file")
        .send();
    assert_eq!(with.status, 200);
    // `?token=%20` is no way in.
    assert_eq!(serve.get("/api/runs?token=%20").status, 401);
}

#[test]
fn slow_clients_are_cut_off_and_cannot_take_every_connection() {
    let project = project_with(&[("steps.fabro", STEPS)]);
    let serve = Serve::start(&project);
    let half_header = |stream: &mut TcpStream| {
        let _ = stream.write_all(b"GET /api/runs HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ");
    };
    let mut slow: Vec<TcpStream> = (0..trellis_server::connections::MAX_PER_CLIENT)
        .map(|_| {
            let mut stream = TcpStream::connect(("127.0.0.1", serve.port)).unwrap();
            half_header(&mut stream);
            stream
        })
        .collect();
    // One more from the same address is closed at once.
    let mut extra = TcpStream::connect(("127.0.0.1", serve.port)).unwrap();
    extra
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    half_header(&mut extra);
    let mut buffer = [0u8; 64];
    let started = Instant::now();
    assert!(
        matches!(extra.read(&mut buffer), Ok(0) | Err(_)),
        "the connection over the cap was served"
    );
    assert!(started.elapsed() < Duration::from_secs(4));
    // The slow ones are cut off once their headers are overdue.
    let first = &mut slow[0];
    first
        .set_read_timeout(Some(
            trellis_server::connections::HEADER_TIMEOUT + Duration::from_secs(10),
        ))
        .unwrap();
    let started = Instant::now();
    let mut answer = Vec::new();
    let _ = first.read_to_end(&mut answer);
    let waited = started.elapsed();
    assert!(
        waited <= trellis_server::connections::HEADER_TIMEOUT + Duration::from_secs(5),
        "kept open {waited:?}"
    );
    drop(slow);
    // And the server still answers.
    let mut answered = false;
    for _ in 0..50 {
        if serve.get("/healthz").status == 200 {
            answered = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(answered);
}

#[test]
fn a_body_sent_too_slowly_or_too_large_is_refused() {
    let project = project_with(&[("steps.fabro", STEPS)]);
    let serve = Serve::start(&project);
    let big = Request::new(serve.port, "POST", "/api/validate")
        .header("Content-Type", "application/json")
        .body(vec![b' '; trellis_server::guard::MAX_BODY + 10])
        .send();
    assert_eq!(big.status, 413);
}

#[test]
fn files_reached_through_a_linked_run_directory_or_a_hard_link_are_not_served() {
    let project = project_with(&[("steps.fabro", STEPS)]);
    // A run directory elsewhere, linked into the runs directory.
    let elsewhere = tempfile::tempdir().unwrap();
    let evil = elsewhere.path().join("EVILRUN01");
    std::fs::create_dir_all(evil.join("stages/001-x@1")).unwrap();
    std::fs::write(evil.join("stages/001-x@1/secret.log"), "outside\n").unwrap();
    std::fs::write(
        evil.join("run.json"),
        json!({"run_id": "EVILRUN01", "workflow": "W", "goal": null, "source_path": "w.fabro",
               "status": "succeeded", "started_at": "2026-01-01T00:00:00Z", "settings": {}})
        .to_string(),
    )
    .unwrap();
    std::fs::create_dir_all(project.path().join("runs")).unwrap();
    std::os::unix::fs::symlink(&evil, project.path().join("runs/EVILRUN01")).unwrap();
    let serve = Serve::start(&project);
    assert_eq!(
        serve
            .get("/api/runs/EVILRUN01/stages/001-x@1/secret.log")
            .status,
        404
    );
    assert_eq!(serve.get("/api/runs/EVILRUN01").status, 404);

    // A real run whose stage directory gains a hard link to a file outside.
    let id = serve.start_run("steps.fabro");
    serve.wait_for_status(&id, "succeeded");
    let stage = run_support::stage_dir(&project.path().join("runs").join(&id), "a");
    let secret = elsewhere.path().join("secret.txt");
    std::fs::write(&secret, "hard-linked secret\n").unwrap();
    std::fs::hard_link(&secret, stage.join("secret.log")).unwrap();
    let dir = stage.file_name().unwrap().to_string_lossy().into_owned();
    let linked = serve.get(&format!("/api/runs/{id}/stages/{dir}/secret.log"));
    assert_eq!(linked.status, 404);
    assert!(!linked.text().contains("hard-linked secret"));
    // The stage's own files are still served.
    let own = serve.get(&format!("/api/runs/{id}/stages/{dir}/stdout.log"));
    assert_eq!(own.status, 200);
    assert_eq!(own.text(), "step\n");
}
