//! The web app in a real headless Chromium (Debian's `chromium` and `chromium-driver`), driven through
//! WebDriver as a person would use it: open the app, start a workflow with a command, a prompt node and a
//! human gate (models simulated), watch the gate turn to waiting, answer it in the form, watch the graph
//! turn green to the exit, open a stage and read its output. Screenshots go to the tests' output folder
//! (`target/tmp/web-app-*.png`).

#![allow(
    clippy::disallowed_macros,
    reason = "a test's message, which the test harness captures as it captures eprintln! alone"
)]
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
use serve_support::{Serve, project_with};

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
        let (child, port) = trellis_test::http::start_on_free_port(
            "chromedriver",
            Duration::from_secs(20),
            |port| {
                Command::new(CHROMEDRIVER)
                    .arg(format!("--port={port}"))
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .spawn()
                    .expect("chromedriver starts")
            },
            Self::ready,
        );
        Some(Self { child, port })
    }

    /// Whether chromedriver's `/status` on `port` says it is ready (what answers there may be
    /// another test's server); a connection reset while it starts counts as not ready yet.
    fn ready(port: u16) -> bool {
        trellis_test::http::Request::new(port, "GET", "/status")
            .try_send()
            .is_ok_and(|answer| {
                serde_json::from_slice::<serde_json::Value>(&answer.body)
                    .is_ok_and(|status| status["value"]["ready"] == true)
            })
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

/// The id of the run whose page the browser shows.
async fn shown_run(client: &Client) -> String {
    let url = client.current_url().await.unwrap();
    url.fragment()
        .and_then(|f| f.strip_prefix("/runs/"))
        .expect("the run page")
        .to_owned()
}

/// A browser on the "Start a run" page of a server for `project`, with `workflow` chosen: the
/// server, the browser's profile (kept while it runs), the browser, and the app's address.
async fn start_page(
    driver: &Driver,
    project: &Project,
    workflow: &str,
) -> (Serve, tempfile::TempDir, Client, String) {
    let serve = Serve::start(project);
    let profile = tempfile::tempdir().unwrap();
    let client = browser(driver, profile.path()).await;
    let app = format!("http://127.0.0.1:{}", serve.port);
    client.goto(&format!("{app}/#/new")).await.unwrap();
    let select = element(&client, "select#workflow").await;
    element(&client, &format!("option[value='{workflow}']")).await;
    select.select_by_value(workflow).await.unwrap();
    (serve, profile, client, app)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_person_starts_a_run_answers_its_gate_and_reads_a_stage_in_the_browser() {
    let Some(driver) = Driver::start() else {
        return;
    };
    let project: Project = project_with(&[("review.fabro", REVIEW)]);
    // Start a run: pick the workflow, see it validated, simulate models, start.
    let (serve, _profile, client, app) = start_page(&driver, &project, "review.fabro").await;
    let text = text_of(&client, "#verdict").await;
    assert!(text.starts_with("Valid"), "{text}");
    assert!(text.contains("5 nodes"), "{text}");
    screenshot(&client, "start").await;
    click(&client, "#simulate").await;
    click(&client, "#start").await;

    // The run page: the gate node turns to waiting, and the form shows the gate's options.
    element(&client, "g[id='node:approve'][data-state='waiting']").await;
    element(&client, "g[id='node:build'][data-state='succeeded']").await;
    let id = shown_run(&client).await;
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
    assert_eq!(
        text_of(&client, "pre#stage-output").await.trim(),
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

const RELEASE: &str = "digraph release {\n start [shape=Mdiamond]\n exit [shape=Msquare]\n tag [shape=parallelogram, script=\"echo tagging {{ inputs.version }}\"]\n notes [shape=tab, prompt=\"Write the notes for {{ inputs.version }}\"]\n start -> tag -> notes -> exit\n}\n";

/// A workflow whose templates need an input is checked with the inputs typed on the page, and
/// starts with them and with the model and provider chosen there.
#[tokio::test(flavor = "multi_thread")]
async fn a_person_gives_a_run_its_inputs_model_and_provider_in_the_browser() {
    let Some(driver) = Driver::start() else {
        return;
    };
    let project: Project = project_with(&[("release.fabro", RELEASE)]);
    let (serve, _profile, client, _) = start_page(&driver, &project, "release.fabro").await;
    // The list says what the file lacks, and so does the check below it.
    let listed = text_of(&client, "option[value='release.fabro']").await;
    assert!(listed.ends_with("· needs inputs"), "{listed}");
    let text = text_of(&client, "#verdict").await;
    assert!(
        text.starts_with("Needs inputs"),
        "without its input: {text}"
    );
    element(&client, "textarea#inputs")
        .await
        .send_keys("version=2.1")
        .await
        .unwrap();
    for _ in 0..50 {
        if text_of(&client, "#verdict").await.starts_with("Valid") {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    let text = text_of(&client, "#verdict").await;
    assert!(text.starts_with("Valid"), "with its input: {text}");
    element(&client, "input#model")
        .await
        .send_keys("my-finetune")
        .await
        .unwrap();
    element(&client, "select#provider")
        .await
        .select_by_value("openai")
        .await
        .unwrap();
    click(&client, "#simulate").await;
    screenshot(&client, "inputs").await;
    click(&client, "#start").await;
    element(&client, "h1 .badge[data-status='succeeded']").await;
    let id = shown_run(&client).await;
    let run = serve.run(&id);
    assert_eq!(run["settings"]["inputs"]["version"], "2.1", "{run}");
    assert_eq!(run["settings"]["model"], "my-finetune", "{run}");
    assert_eq!(run["settings"]["provider"], "openai", "{run}");
    let printed = trellis_test::http::Request::new(
        serve.port,
        "GET",
        &format!("/api/runs/{id}/stages/002-tag@1/stdout.log"),
    )
    .send();
    assert_eq!(printed.text().trim(), "tagging 2.1");

    client.close().await.unwrap();
}

const CHATTY: &str = r#"digraph chatty {
    start [shape=Mdiamond]
    fetch [shape=parallelogram, script="for i in $(seq 60); do echo line $i; sleep 0.1; done"]
    exit [shape=Msquare]
    start -> fetch -> exit
}
"#;

const AGENT: &str = "digraph agent {\n start [shape=Mdiamond]\n exit [shape=Msquare]\n fix [prompt=\"Tidy up\", model=\"sonnet\"]\n start -> fix -> exit\n}\n";

const GUARDED: &str = "digraph guarded {\n start [shape=Mdiamond]\n exit [shape=Msquare]\n fix [prompt=\"Tidy up\", model=\"sonnet\", permissions=\"read-only\"]\n start -> fix -> exit\n}\n";

const SLOW: &str = "digraph slow {\n start [shape=Mdiamond]\n exit [shape=Msquare]\n nap [shape=parallelogram, script=\"sleep 60\"]\n start -> nap -> exit\n}\n";

/// The stage panel's output, as shown now.
async fn output_lines(client: &Client) -> Vec<String> {
    text_of(client, "pre#stage-output")
        .await
        .lines()
        .map(str::to_owned)
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
#[allow(
    clippy::too_many_lines,
    reason = "one person's session: live output, a live agent steered, a cancel read back after a reload"
)]
async fn a_person_watches_output_live_steers_an_agent_and_cancels_a_run() {
    let Some(driver) = Driver::start() else {
        return;
    };
    let Some(mock) = trellis_test::Llmock::start() else {
        return;
    };
    let project = project_with(&[
        ("chatty.fabro", CHATTY),
        ("agent.fabro", AGENT),
        ("slow.fabro", SLOW),
        ("guarded.fabro", GUARDED),
    ])
    .with_env("ANTHROPIC_API_KEY", "sk-ant-test-web-0000")
    .with_env("ANTHROPIC_BASE_URL", &mock.url("/anthropic"));
    let serve = Serve::start(&project);
    let profile = tempfile::tempdir().unwrap();
    let client = browser(&driver, profile.path()).await;
    let app = format!("http://127.0.0.1:{}", serve.port);

    // A command's lines appear in the stage panel while it runs.
    let chatty = serve.start_run("chatty.fabro");
    let id = chatty.clone();
    client.goto(&format!("{app}/#/runs/{id}")).await.unwrap();
    click(&client, "#timeline li[data-node='fetch']").await;
    element(&client, "#stage-live").await;
    let mut seen_live = Vec::new();
    for _ in 0..100 {
        let lines = output_lines(&client).await;
        let live = text_of(&client, "#stage-live").await;
        if !lines.is_empty() && live.contains("live") {
            seen_live.push(lines.len());
        }
        if lines.len() == 60 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        seen_live.len() >= 3 && seen_live.first() < seen_live.last(),
        "lines grew while the stage ran: {seen_live:?}"
    );
    screenshot(&client, "live-output").await;
    // Once it has ended, the panel shows the final record.
    element(
        &client,
        "#timeline li[data-node='fetch'] .badge[data-status='succeeded']",
    )
    .await;
    element(&client, ".tabs button[data-file='status.json']").await;
    assert_eq!(output_lines(&client).await.len(), 60);
    assert_eq!(output_lines(&client).await[59], "line 60");
    // The picture says how long the node took, and how often it ran.
    let stat = text_of(
        &client,
        "g[id='node:fetch'][data-visits='1'] text.node-stat",
    )
    .await;
    assert!(stat.ends_with(" s"), "{stat}");

    // An agent's tool calls show live, and a message typed in the panel reaches its model.
    mock.scenario(&json!([
        { "type": "reply", "tool_calls": [{ "name": "shell", "arguments": { "command": "sleep 4" } }], "times": 1 },
        { "type": "reply", "text": "Tidied, with tabs.", "times": 1 },
    ]));
    let id = serve.start_run("agent.fabro");
    client.goto(&format!("{app}/#/runs/{id}")).await.unwrap();
    click(&client, "#timeline li[data-node='fix']").await;
    let call = text_of(&client, "details.t-call[data-tool='shell']").await;
    assert!(
        call.contains("sleep 4") && call.contains("running"),
        "{call}"
    );
    element(&client, "textarea#steer-text")
        .await
        .send_keys("Use tabs, not spaces.")
        .await
        .unwrap();
    click(&client, "#steer-send").await;
    let said = text_of(&client, "#steer-result").await;
    assert!(said.starts_with("Sent"), "{said}");
    screenshot(&client, "steer").await;
    let steered = text_of(&client, ".t-steer").await;
    assert!(steered.contains("Use tabs, not spaces."), "{steered}");
    element(&client, "details.t-call[data-done='ok']").await;
    element(&client, "h1 .badge[data-status='succeeded']").await;
    let bodies = mock.bodies();
    assert_eq!(bodies.len(), 2);
    assert!(
        bodies[1]["messages"].to_string().contains(
            "Message from the person running this workflow (take it into account now): Use tabs, not spaces."
        ),
        "{}",
        bodies[1]["messages"]
    );
    screenshot(&client, "transcript").await;

    // A sub-agent's work shows in its parent's transcript, marked and indented under its id.
    mock.scenario(&json!([
        { "type": "reply", "tool_calls": [
            { "name": "spawn_agent", "arguments": { "task": "List the files." } },
            { "name": "wait", "arguments": { "agent_id": "agent-1" } },
        ], "times": 1 },
        { "type": "reply", "tool_calls": [{ "name": "list_dir", "arguments": {} }], "times": 1 },
        { "type": "reply", "text": "Two files.", "times": 1 },
        { "type": "reply", "text": "Done, with help.", "times": 1 },
    ]));
    let id = serve.start_run("agent.fabro");
    client.goto(&format!("{app}/#/runs/{id}")).await.unwrap();
    element(&client, "h1 .badge[data-status='succeeded']").await;
    click(&client, "#timeline li[data-node='fix']").await;
    let started = text_of(&client, ".t-entry[data-subagent='agent-1']").await;
    assert!(started.contains("List the files."), "{started}");
    let child_call = text_of(
        &client,
        "details.t-call.t-sub[data-agent='agent-1'][data-tool='list_dir']",
    )
    .await;
    assert!(child_call.starts_with("agent-1 list_dir"), "{child_call}");
    element(&client, "details.t-call[data-tool='wait'][data-done='ok']").await;
    screenshot(&client, "subagent").await;

    // Cancel asks first; a cancelled run reads "cancelled" everywhere after a reload.
    let slow = serve.start_run("slow.fabro");
    let id = slow.clone();
    client.goto(&format!("{app}/#/runs/{id}")).await.unwrap();
    element(&client, "g[id='node:nap'][data-state='running']").await;
    click(&client, "#cancel").await;
    element(&client, "#cancel-confirm").await;
    screenshot(&client, "cancel-confirm").await;
    assert_eq!(
        serve.run(&id)["status"],
        "running",
        "not cancelled before the confirmation"
    );
    click(&client, "#cancel-yes").await;
    element(&client, "h1 .badge[data-status='cancelled']").await;
    client.refresh().await.unwrap();
    element(&client, "h1 .badge[data-status='cancelled']").await;
    element(&client, "g[id='node:nap'][data-state='cancelled']").await;
    element(
        &client,
        "#timeline li[data-node='nap'] .badge[data-status='cancelled']",
    )
    .await;
    let legend = text_of(&client, ".legend").await;
    assert!(legend.contains("cancelled"), "{legend}");
    let run = serve.run(&id);
    assert!(run["ended_at"].is_string(), "{run}");
    screenshot(&client, "cancelled").await;

    // The board groups runs by state, with counts, and filters by state and by text.
    client.goto(&format!("{app}/#/")).await.unwrap();
    assert_eq!(
        text_of(
            &client,
            "#state-filter button[data-state='succeeded'] .count"
        )
        .await,
        "3"
    );
    assert_eq!(
        text_of(
            &client,
            "#state-filter button[data-state='cancelled'] .count"
        )
        .await,
        "1"
    );
    element(
        &client,
        &format!("section[data-group='cancelled'] tr[data-run='{slow}']"),
    )
    .await;
    element(
        &client,
        &format!("section[data-group='succeeded'] tr[data-run='{chatty}']"),
    )
    .await;
    screenshot(&client, "board").await;
    click(&client, "#state-filter button[data-state='cancelled']").await;
    element(
        &client,
        "#state-filter button.active[data-state='cancelled']",
    )
    .await;
    let rows = client.find_all(Locator::Css("tr.row")).await.unwrap();
    assert_eq!(rows.len(), 1);
    assert_eq!(
        rows[0].attr("data-run").await.unwrap().as_deref(),
        Some(slow.as_str())
    );
    click(&client, "#state-filter button[data-state='']").await;
    element(&client, "#search")
        .await
        .send_keys("chat")
        .await
        .unwrap();
    for _ in 0..50 {
        if client.find_all(Locator::Css("tr.row")).await.unwrap().len() == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let rows = client.find_all(Locator::Css("tr.row")).await.unwrap();
    assert_eq!(rows.len(), 1);
    assert_eq!(
        rows[0].attr("data-run").await.unwrap().as_deref(),
        Some(chatty.as_str())
    );

    // A call beyond an agent's permissions is asked on the page, as a gate is.
    mock.scenario(&json!([
        { "type": "reply", "tool_calls": [{ "name": "write_file", "arguments": { "path": "allowed.txt", "content": "ok" } }], "times": 1 },
        { "type": "reply", "text": "Written.", "times": 1 },
    ]));
    let id = serve.start_run("guarded.fabro");
    client.goto(&format!("{app}/#/runs/{id}")).await.unwrap();
    let form = text_of(&client, "form#gate-fix").await;
    assert!(form.contains("wants to run: write_file"), "{form}");
    element(&client, "h1 .badge[data-status='waiting_for_input']").await;
    screenshot(&client, "permission").await;
    click(&client, "button[data-option='[Y] Yes']").await;
    element(&client, "h1 .badge[data-status='succeeded']").await;
    assert_eq!(project.read("allowed.txt"), "ok");

    client.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_person_reads_what_a_run_changed_on_its_page() {
    let Some(driver) = Driver::start() else {
        return;
    };
    let project: Project = project_with(&[("edits.fabro", serve_support::EDITS)]);
    project.write("notes.txt", "one\ntwo\n");
    for args in [
        &["init", "-q"][..],
        &["add", "notes.txt"],
        &["commit", "-qm", "notes"],
    ] {
        trellis_test::git(project.path(), args);
    }
    let serve = Serve::start(&project);
    let id = serve.start_run("edits.fabro");
    serve.wait_for_status(&id, "succeeded");
    let profile = tempfile::tempdir().unwrap();
    let client = browser(&driver, profile.path()).await;
    let app = format!("http://127.0.0.1:{}", serve.port);
    client.goto(&format!("{app}/#/runs/{id}")).await.unwrap();
    element(&client, "h1 .badge[data-status='succeeded']").await;
    click(&client, "#changes summary").await;
    let summary = text_of(&client, "#changes-summary").await;
    assert_eq!(summary, "2 file(s) changed");
    let files = text_of(&client, ".changed-files").await;
    assert!(
        files.contains("added.txt +1 −0") && files.contains("notes.txt +1 −1"),
        "{files}"
    );
    let diff = text_of(&client, "#changes-diff").await;
    assert!(diff.contains("-two\n+TWO"), "{diff}");
    let added = text_of(&client, "#changes-diff .added").await;
    assert_eq!(added, "+new");
    screenshot(&client, "changes").await;
    client.close().await.unwrap();
}
