//! The web app in a real headless Chromium (Debian's `chromium` and `chromium-driver`), driven through
//! WebDriver as a person would use it: open the app, start a workflow with a command, a prompt node and a
//! human gate (models simulated), watch the gate turn to waiting, answer it in the form, watch the graph
//! turn green to the exit, open a stage and read its output. Screenshots go to the tests' output folder
//! (`target/tmp/web-app-*.png`).

#![allow(
    clippy::disallowed_methods,
    reason = "tests set up and read files around the binary they run"
)]

mod run_support;
mod serve_support;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use fantoccini::{Client, ClientBuilder, Locator};
use run_support::Project;
use serde_json::json;
use serve_support::{Serve, free_port, project_with};

const REVIEW: &str = r#"digraph review {
    goal = "Ship the greeting"
    start [shape=Mdiamond]
    build [shape=parallelogram, script="mkdir -p test-results && echo passed > test-results/report.txt && echo built the greeting"]
    draft [shape=box, prompt="Write release notes for: $goal"]
    approve [shape=hexagon, label="Ship it?"]
    done [shape=Msquare]
    start -> build -> draft -> approve
    approve -> done [label="[A] Approve"]
    approve -> draft [label="[R] Revise"]
}
"#;

const CHROMIUM: &str = "/usr/bin/chromium";
const CHROMEDRIVER: &str = "/usr/bin/chromedriver";

/// A running chromedriver, stopped when dropped.
struct Driver {
    child: Child,
    port: u16,
}

impl Driver {
    fn start() -> Option<Self> {
        if !Path::new(CHROMIUM).exists() || !Path::new(CHROMEDRIVER).exists() {
            trellis_test::missing_peer("chromium and chromium-driver (Debian packages)");
            return None;
        }
        // A free port can be taken by another test's server before chromedriver binds it; then
        // chromedriver exits, and it starts again on another.
        for _ in 0..5 {
            let port = free_port();
            let mut child = Command::new(CHROMEDRIVER)
                .arg(format!("--port={port}"))
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("chromedriver starts");
            if Self::listens(&mut child, port) {
                return Some(Self { child, port });
            }
        }
        panic!("chromedriver did not start on any of five ports");
    }

    /// Waits until chromedriver answers on `port`: true, or false if it exited first.
    fn listens(child: &mut Child, port: u16) -> bool {
        let started = std::time::Instant::now();
        while started.elapsed() < Duration::from_secs(20) {
            if child.try_wait().ok().flatten().is_some() {
                return false;
            }
            // Ready, and ours: another test's chromedriver may be the one answering.
            if Self::ready(port) {
                return child.try_wait().ok().flatten().is_none();
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!("chromedriver did not start within 20 s");
    }

    /// Whether chromedriver's `/status` on `port` says it is ready (what answers there may be
    /// another test's server).
    fn ready(port: u16) -> bool {
        std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
            && serde_json::from_slice::<serde_json::Value>(
                &trellis_test::http::Request::new(port, "GET", "/status")
                    .send()
                    .body,
            )
            .is_ok_and(|status| status["value"]["ready"] == true)
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn browser(driver: &Driver, profile: &Path) -> Client {
    let mut capabilities = serde_json::Map::new();
    capabilities.insert(
        "goog:chromeOptions".into(),
        json!({
            "binary": CHROMIUM,
            "args": [
                "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                "--disable-background-networking", "--disable-component-update", "--disable-sync",
                "--disable-dev-shm-usage", "--window-size=1440,1000",
                format!("--user-data-dir={}", profile.display()),
            ],
        }),
    );
    ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
        .capabilities(capabilities)
        .connect(&format!("http://127.0.0.1:{}", driver.port))
        .await
        .expect("a browser session")
}

fn screenshots() -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
}

async fn screenshot(client: &Client, name: &str) {
    let png = client.screenshot().await.expect("a screenshot");
    let path = screenshots().join(format!("web-app-{name}.png"));
    std::fs::write(&path, png).unwrap();
    eprintln!("screenshot: {}", path.display());
}

/// Whether a WebDriver error says the element was drawn again since it was found.
fn stale(error: &fantoccini::error::CmdError) -> bool {
    error.to_string().contains("stale element")
}

/// Waits for an element matching `css` and clicks it (found again if the page redrew it meanwhile).
async fn click(client: &Client, css: &str) {
    for _ in 0..5 {
        match element(client, css).await.click().await {
            Err(error) if stale(&error) => {}
            done => return done.unwrap(),
        }
    }
    panic!("`{css}` kept being redrawn");
}

/// The text of the element matching `css` (found again if the page redrew it meanwhile).
async fn text_of(client: &Client, css: &str) -> String {
    for _ in 0..5 {
        match element(client, css).await.text().await {
            Err(error) if stale(&error) => {}
            done => return done.unwrap(),
        }
    }
    panic!("`{css}` kept being redrawn");
}

/// Waits for an element matching `css`.
async fn element(client: &Client, css: &str) -> fantoccini::elements::Element {
    client
        .wait()
        .at_most(Duration::from_secs(30))
        .for_element(Locator::Css(css))
        .await
        .unwrap_or_else(|e| panic!("no element `{css}`: {e}"))
}

#[tokio::test(flavor = "multi_thread")]
async fn a_person_starts_a_run_answers_its_gate_and_reads_a_stage_in_the_browser() {
    let Some(driver) = Driver::start() else {
        return;
    };
    let project: Project = project_with(&[("review.fabro", REVIEW)]);
    let serve = Serve::start(&project);
    let profile = tempfile::tempdir().unwrap();
    let client = browser(&driver, profile.path()).await;
    let app = format!("http://127.0.0.1:{}", serve.port);

    // Start a run: pick the workflow, see it validated, simulate models, start.
    client.goto(&format!("{app}/#/new")).await.unwrap();
    let select = element(&client, "select#workflow").await;
    element(&client, "option[value='review.fabro']").await;
    select.select_by_value("review.fabro").await.unwrap();
    let text = text_of(&client, "#verdict").await;
    assert!(text.starts_with("Valid"), "{text}");
    assert!(text.contains("5 nodes"), "{text}");
    screenshot(&client, "start").await;
    click(&client, "#simulate").await;
    click(&client, "#start").await;

    // The run page: the gate node turns to waiting, and the form shows the gate's options.
    element(&client, "g[id='node:approve'][data-state='waiting']").await;
    element(&client, "g[id='node:build'][data-state='succeeded']").await;
    let url = client.current_url().await.unwrap();
    let id = url
        .fragment()
        .and_then(|f| f.strip_prefix("/runs/"))
        .expect("the run page")
        .to_owned();
    let form_text = text_of(&client, "form#gate-approve").await;
    assert!(form_text.contains("Ship it?"), "{form_text}");
    assert!(
        form_text.contains("Approve") && form_text.contains("Revise"),
        "{form_text}"
    );
    screenshot(&client, "waiting").await;

    // Answer it: the graph turns green to the exit node, along the edges taken.
    click(&client, "button[data-option='[A] Approve']").await;
    element(&client, "g[id='node:done'][data-state='succeeded']").await;
    element(&client, "h1 .badge[data-status='succeeded']").await;
    for node in ["start", "build", "draft", "approve", "done"] {
        element(
            &client,
            &format!("g[id='node:{node}'][data-state='succeeded']"),
        )
        .await;
    }
    let taken = client
        .find_all(Locator::Css("g.edge.taken"))
        .await
        .unwrap()
        .len();
    assert_eq!(taken, 4, "start→build→draft→approve→done");
    screenshot(&client, "succeeded").await;

    // Open the command's stage and read its output.
    click(&client, "#timeline li[data-node='build']").await;
    click(&client, ".tabs button[data-file='stdout.log']").await;
    assert_eq!(
        text_of(&client, "pre#stage-file[data-file='stdout.log']")
            .await
            .trim(),
        "built the greeting"
    );
    // Its artifact is linked, and the link serves the file.
    let link = element(
        &client,
        "a[href$='/artifacts/build/attempt-1/test-results/report.txt']",
    )
    .await;
    let href = link.attr("href").await.unwrap().unwrap();
    let artifact = trellis_test::http::Request::new(serve.port, "GET", &href).send();
    assert_eq!(artifact.status, 200, "{href}");
    assert_eq!(artifact.text(), "passed\n");
    // And the prompt node's, by clicking it in the graph.
    click(&client, "g[id='node:draft']").await;
    click(&client, ".tabs button[data-file='prompt.md']").await;
    assert!(
        text_of(&client, "pre#stage-file[data-file='prompt.md']")
            .await
            .contains("Ship the greeting"),
        "the prompt shows the goal"
    );
    screenshot(&client, "stage").await;

    // The runs list shows it.
    client.goto(&format!("{app}/#/")).await.unwrap();
    assert_eq!(
        text_of(
            &client,
            &format!("tr[data-run='{id}'] .badge[data-status='succeeded']"),
        )
        .await,
        "succeeded"
    );
    screenshot(&client, "runs").await;

    client.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_pasted_workflow_with_a_mistake_shows_its_diagnostic_before_anything_starts() {
    let Some(driver) = Driver::start() else {
        return;
    };
    let project: Project = project_with(&[]);
    let serve = Serve::start(&project);
    let profile = tempfile::tempdir().unwrap();
    let client = browser(&driver, profile.path()).await;
    let app = format!("http://127.0.0.1:{}", serve.port);
    // A pasted workflow with a mistake shows where it is before anything starts.
    client.goto(&format!("{app}/#/new")).await.unwrap();
    element(&client, "textarea#source")
        .await
        .send_keys("digraph broken {\n  start [shape=Mdiamond]\n  a [shape=parallelogram]\n  exit [shape=Msquare]\n  start -> a -> exit\n}\n")
        .await
        .unwrap();
    click(&client, "#start").await;
    let text = text_of(&client, ".diagnostics li.error").await;
    assert!(text.contains("workflow.fabro:3:3"), "{text}");
    assert!(text.contains("has no script"), "{text}");
    screenshot(&client, "invalid").await;
    assert!(!project.path().join("runs").exists(), "no run was started");

    client.close().await.unwrap();
}
