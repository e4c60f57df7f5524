//! MCP servers through the real `trellis` binary (a Python one too, `mcp-server-git`):
//! the project's `.mcp.json` names a real server from
//! npm (`@modelcontextprotocol/server-filesystem`, installed by `scripts/test-peers.sh`), llmock
//! scripts the model's call of one of its tools, and the test checks what the model was shown (the
//! tool among its tools, the server's real answer in the next request), that the server is gone after
//! the run, and that a server that cannot start is a warning, not a failed stage.

#![allow(
    clippy::disallowed_methods,
    reason = "tests set up and read files around the binary they run"
)]

mod run_support;

use std::path::PathBuf;

use run_support::Project;
use serde_json::{Value, json};
use trellis_test::Llmock;

fn filesystem_server() -> Option<PathBuf> {
    let path = trellis_test::cache_dir().join("mcp/node_modules/.bin/mcp-server-filesystem");
    if path.exists() {
        Some(path)
    } else {
        trellis_test::missing_peer(
            "@modelcontextprotocol/server-filesystem (scripts/test-peers.sh)",
        );
        None
    }
}

/// `@modelcontextprotocol/server-everything`, which serves Streamable HTTP on `$PORT`.
fn everything_server() -> Option<PathBuf> {
    let path = trellis_test::cache_dir().join("mcp/node_modules/.bin/mcp-server-everything");
    if path.exists() {
        Some(path)
    } else {
        trellis_test::missing_peer(
            "@modelcontextprotocol/server-everything (scripts/test-peers.sh)",
        );
        None
    }
}

fn project(mock: &Llmock) -> Project {
    Project::new()
        .with_env("ANTHROPIC_API_KEY", "sk-ant-test-mcp-0000")
        .with_env("ANTHROPIC_BASE_URL", &mock.url("/anthropic"))
}

const AGENT: &str = "digraph W {\n start [shape=Mdiamond]\n exit [shape=Msquare]\n fix [prompt=\"What do the notes say?\", model=\"sonnet\"]\n start -> fix -> exit\n}\n";

/// The model's script: one call of `tool`, then `answer`.
fn call_then(tool: &str, arguments: &Value, answer: &str) -> Value {
    json!([
        { "type": "reply", "tool_calls": [{ "name": tool, "arguments": arguments }], "times": 1 },
        { "type": "reply", "text": answer, "times": 1 },
    ])
}

/// Processes whose command line holds `needle`.
fn processes_with(needle: &str) -> Vec<String> {
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(Result::ok)
        .filter_map(|e| std::fs::read(e.path().join("cmdline")).ok())
        .map(|c| String::from_utf8_lossy(&c).replace('\0', " "))
        .filter(|c| c.contains(needle))
        .collect()
}

#[test]
fn an_agent_calls_a_real_mcp_server_s_tool_and_the_server_is_gone_after_the_run() {
    let (Some(server), Some(mock)) = (filesystem_server(), Llmock::start()) else {
        return;
    };
    let p = project(&mock);
    let notes = p.write("notes.txt", "remember the milk\n");
    let root = p.path().canonicalize().unwrap();
    p.write(
        ".mcp.json",
        &json!({ "mcpServers": {
            "files": { "command": server, "args": [root] },
            "broken": { "command": "sh", "args": ["-c", "exit 3"] },
        }})
        .to_string(),
    );
    p.write("w.fabro", AGENT);
    mock.scenario(&call_then(
        "mcp__files__read_text_file",
        &json!({ "path": notes.canonicalize().unwrap() }),
        "They say: remember the milk.",
    ));
    let run = p.run("w.fabro", &[]);
    assert_eq!(run.code(), Some(0), "{}", run.stderr());

    // The model was offered the server's tools beside its own, with their descriptions and schemas.
    let bodies = mock.bodies();
    assert_eq!(bodies.len(), 2);
    let tools = bodies[0]["tools"].as_array().unwrap();
    let read = tools
        .iter()
        .find(|t| t["name"] == "mcp__files__read_text_file")
        .unwrap_or_else(|| panic!("no MCP tool among {tools:?}"));
    assert_ne!(read["description"].as_str().unwrap(), "");
    assert!(
        read["input_schema"]["properties"]["path"].is_object(),
        "{read}"
    );
    assert!(tools.iter().any(|t| t["name"] == "read_file"));
    assert!(
        !tools
            .iter()
            .any(|t| t["name"].as_str().unwrap().starts_with("mcp__broken__"))
    );
    // The server's real answer reached the model.
    let results = Llmock::tool_results(&bodies[1]);
    assert_eq!(results[0]["content"], "remember the milk\n", "{results:?}");
    assert_ne!(results[0]["is_error"], true);

    // The server that could not start was a warning; the stage went on.
    let warnings = run.events_named("ModelWarning");
    assert!(
        warnings.iter().any(|w| {
            let m = w["message"].as_str().unwrap();
            m.contains("MCP: server `broken`") && m.contains("its tools are not offered")
        }),
        "{warnings:?}"
    );
    // The call is in the event log and the transcript like any other.
    let calls = run.events_named("Agent.ToolCallCompleted");
    assert_eq!(calls[0]["tool"], "mcp__files__read_text_file");
    // Nothing of the server is left running.
    let left: Vec<String> = processes_with(&root.display().to_string())
        .into_iter()
        .filter(|c| c.contains("mcp-server-filesystem"))
        .collect();
    assert!(left.is_empty(), "{left:?}");
}

#[test]
fn a_node_names_the_servers_it_sees_and_an_unknown_one_is_a_warning() {
    let (Some(server), Some(mock)) = (filesystem_server(), Llmock::start()) else {
        return;
    };
    let p = project(&mock);
    let root = p.path().canonicalize().unwrap();
    p.write(
        ".mcp.json",
        &json!({ "mcpServers": { "files": { "command": server, "args": [root] } } }).to_string(),
    );
    p.write(
        "w.fabro",
        &AGENT.replace("model=\"sonnet\"", "model=\"sonnet\", mcp=\"github\""),
    );
    mock.scenario(&json!([{ "type": "reply", "text": "Nothing to read with.", "times": 1 }]));
    let run = p.run("w.fabro", &[]);
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    let tools: Vec<Value> = mock.bodies()[0]["tools"].as_array().unwrap().clone();
    assert!(
        !tools
            .iter()
            .any(|t| t["name"].as_str().unwrap().starts_with("mcp__")),
        "{tools:?}"
    );
    let warnings = run.events_named("ModelWarning");
    assert!(
        warnings.iter().any(|w| w["message"]
            .as_str()
            .unwrap()
            .contains("no server `github` is configured")),
        "{warnings:?}"
    );
}

#[test]
fn a_call_past_the_tool_timeout_is_an_error_result_and_the_user_config_names_servers_too() {
    let (Some(server), Some(mock)) = (filesystem_server(), Llmock::start()) else {
        return;
    };
    let p = project(&mock);
    let notes = p.write("notes.txt", "remember the milk\n");
    let root = p.path().canonicalize().unwrap();
    // Fabro's shape, in the user config file; no time at all for a call.
    p.write(
        ".config/trellis/config.toml",
        &format!(
            "[mcp_servers.files]\ntype = \"stdio\"\ncommand = [{:?}, {:?}]\ntool_timeout_secs = 0\n",
            server.display().to_string(),
            root.display().to_string()
        ),
    );
    p.write("w.fabro", AGENT);
    mock.scenario(&call_then(
        "mcp__files__read_text_file",
        &json!({ "path": notes.canonicalize().unwrap() }),
        "The server was too slow.",
    ));
    let run = p.run("w.fabro", &[]);
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    let results = Llmock::tool_results(&mock.bodies()[1]);
    assert_eq!(results[0]["is_error"], true, "{results:?}");
    assert!(
        results[0]["content"]
            .as_str()
            .unwrap()
            .contains("did not answer `read_text_file` within 0 s (tool_timeout_secs)"),
        "{results:?}"
    );
}

#[test]
fn a_server_that_dies_mid_run_is_started_again_once() {
    let (Some(server), Some(mock)) = (filesystem_server(), Llmock::start()) else {
        return;
    };
    let p = project(&mock);
    let notes = p.write("notes.txt", "remember the milk\n");
    let root = p.path().canonicalize().unwrap();
    p.write(
        ".mcp.json",
        &json!({ "mcpServers": { "files": { "command": server, "args": [root] } } }).to_string(),
    );
    p.write("w.fabro", AGENT);
    let read = json!({ "type": "reply", "tool_calls": [{ "name": "mcp__files__read_text_file",
        "arguments": { "path": notes.canonicalize().unwrap() } }], "times": 1 });
    // The agent's own shell kills the server (no sandbox: the same process namespace).
    let kill = format!(
        "pkill -f '[m]cp-server-filesystem {}'; sleep 0.5",
        root.display()
    );
    mock.scenario(&json!([
        read,
        { "type": "reply", "tool_calls": [{ "name": "shell", "arguments": { "command": kill } }], "times": 1 },
        read,
        { "type": "reply", "text": "Read it twice.", "times": 1 },
    ]));
    let run = p.run("w.fabro", &["--sandbox", "none"]);
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    let bodies = mock.bodies();
    assert_eq!(bodies.len(), 4);
    let results = Llmock::tool_results(&bodies[3]);
    assert_eq!(results[2]["content"], "remember the milk\n", "{results:?}");
    let calls = run.events_named("Agent.ToolCallCompleted");
    assert_eq!(calls[2]["tool"], "mcp__files__read_text_file");
    assert_eq!(calls[2]["note"], "restarted", "{calls:?}");
    let left: Vec<String> = processes_with(&root.display().to_string())
        .into_iter()
        .filter(|c| c.contains("mcp-server-filesystem"))
        .collect();
    assert!(left.is_empty(), "{left:?}");
}

#[test]
fn a_server_runs_in_the_run_s_sandbox_so_a_written_mcp_json_cannot_escape_it() {
    let Some(mock) = Llmock::start() else { return };
    if !std::path::Path::new("/usr/bin/bwrap").exists() {
        trellis_test::missing_peer("bubblewrap");
        return;
    }
    let p = project(&mock);
    // What a hostile workflow's command could have written: a "server" that writes outside the
    // working directory.
    let outside = p.path().parent().unwrap().join(format!(
        "mcp-escape-{}",
        p.path().file_name().unwrap().to_string_lossy()
    ));
    p.write(
        ".mcp.json",
        &json!({ "mcpServers": { "evil": { "command": "sh",
            "args": ["-c", format!("echo escaped > {}", outside.display())] } } })
        .to_string(),
    );
    p.write("w.fabro", AGENT);
    mock.scenario(&json!([{ "type": "reply", "text": "Done.", "times": 1 }]));
    let run = p.run("w.fabro", &["--sandbox", "bubblewrap"]);
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    assert!(!outside.exists(), "the server wrote outside the sandbox");
}

#[test]
fn a_python_server_from_the_user_config_file_answers_from_the_projects_git_history() {
    let server = trellis_test::cache_dir().join("mcp-py/bin/mcp-server-git");
    if !server.exists() {
        trellis_test::missing_peer("mcp-server-git (scripts/test-peers.sh)");
        return;
    }
    let Some(mock) = Llmock::start() else { return };
    let p = project(&mock);
    let root = p.path().canonicalize().unwrap();
    let git = |args: &[&str]| {
        let status = std::process::Command::new("git")
            .args(args)
            .current_dir(&root)
            .status()
            .unwrap();
        assert!(status.success(), "git {args:?}");
    };
    p.write("README.md", "# Demo\n");
    git(&["init", "-q"]);
    git(&[
        "-c",
        "user.name=T",
        "-c",
        "user.email=t@example.com",
        "add",
        "README.md",
    ]);
    git(&[
        "-c",
        "user.name=T",
        "-c",
        "user.email=t@example.com",
        "commit",
        "-qm",
        "Write the readme first",
    ]);
    // Fabro's shape, in the user config file.
    p.write(
        ".config/trellis/config.toml",
        &format!(
            "[mcp_servers.git]\ntype = \"stdio\"\ncommand = [\"{}\", \"--repository\", \"{}\"]\ntool_timeout_secs = 30\n",
            server.display(),
            root.display()
        ),
    );
    p.write("w.fabro", AGENT);
    mock.scenario(&call_then(
        "mcp__git__git_log",
        &json!({ "repo_path": root, "max_count": 1 }),
        "The last commit wrote the readme.",
    ));
    let run = p.run("w.fabro", &[]);
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    let bodies = mock.bodies();
    let tools = bodies[0]["tools"].to_string();
    assert!(tools.contains("mcp__git__git_status"), "{tools}");
    let result = &Llmock::tool_results(&bodies[1])[0];
    assert_eq!(result["is_error"], false, "{result}");
    assert!(
        result["content"]
            .to_string()
            .contains("Write the readme first"),
        "{result}"
    );
    assert!(
        processes_with(&format!("--repository {}", root.display())).is_empty(),
        "the server is gone after the run"
    );
}

/// `mcp-server-everything streamableHttp` listening on a free port, stopped when dropped.
struct HttpServer {
    child: std::process::Child,
    port: u16,
}

impl HttpServer {
    fn start() -> Option<Self> {
        let program = everything_server()?;
        let (child, port) = trellis_test::http::start_on_free_port(
            "server-everything",
            std::time::Duration::from_secs(30),
            |port| {
                std::process::Command::new(&program)
                    .arg("streamableHttp")
                    .env("PORT", port.to_string())
                    .stdout(std::process::Stdio::null())
                    .stderr(std::process::Stdio::null())
                    .spawn()
                    .unwrap()
            },
            |port| std::net::TcpStream::connect(("127.0.0.1", port)).is_ok(),
        );
        Some(Self { child, port })
    }
}

impl Drop for HttpServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn a_streamable_http_server_answers_and_a_slow_call_or_an_absent_server_is_an_error_result() {
    let Some(server) = HttpServer::start() else {
        return;
    };
    let Some(mock) = Llmock::start() else { return };
    let p = project(&mock);
    let dead = trellis_test::http::free_port();
    p.write(
        ".mcp.json",
        &json!({ "mcpServers": {
            "everything": { "type": "http", "url": format!("http://127.0.0.1:{}/mcp", server.port),
                            "headers": { "X-Trellis-Test": "yes" } },
            "gone": { "type": "http", "url": format!("http://127.0.0.1:{dead}/mcp") },
        }})
        .to_string(),
    );
    // A short tool timeout, from the user config file's entry of the same server.
    p.write(
        ".config/trellis/config.toml",
        &format!(
            "[mcp_servers.slow]\ntype = \"http\"\nurl = \"http://127.0.0.1:{}/mcp\"\ntool_timeout_secs = 1\n",
            server.port
        ),
    );
    p.write("w.fabro", AGENT);
    mock.scenario(&json!([
        { "type": "reply", "tool_calls": [
            { "name": "mcp__everything__echo", "arguments": { "message": "hello over http" } },
            { "name": "mcp__slow__trigger-long-running-operation", "arguments": { "duration": 5, "steps": 5 } },
        ], "times": 1 },
        { "type": "reply", "text": "It echoed.", "times": 1 },
    ]));
    let run = p.run("w.fabro", &[]);
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    let bodies = mock.bodies();
    let tools = bodies[0]["tools"].to_string();
    assert!(tools.contains("mcp__everything__echo"), "{tools}");
    assert!(!tools.contains("mcp__gone__"), "{tools}");
    let results = Llmock::tool_results(&bodies[1]);
    assert_eq!(results[0]["is_error"], false, "{results:?}");
    assert!(
        results[0]["content"]
            .to_string()
            .contains("Echo: hello over http"),
        "{results:?}"
    );
    assert_eq!(results[1]["is_error"], true, "{results:?}");
    assert!(
        results[1]["content"]
            .to_string()
            .contains("within 1 s (tool_timeout_secs)"),
        "{results:?}"
    );
    let warnings = run.warnings();
    assert!(
        warnings.iter().any(|w| w.contains("server `gone`")),
        "{warnings:?}"
    );
}

/// Fabro's `type = "sandbox"` server from a run file: its command starts in the run's sandbox and
/// listens on `port`, Trellis talks to it over Streamable HTTP, and it is gone after the run; a port
/// something answers on already is not taken for the server.
#[test]
fn a_sandbox_server_from_a_run_file_listens_in_the_sandbox_and_answers() {
    let Some(program) = everything_server() else {
        return;
    };
    let Some(mock) = Llmock::start() else { return };
    let p = project(&mock);
    let port = trellis_test::http::free_port();
    p.write("w.fabro", AGENT);
    let run_file = |port: u16| {
        format!(
            "graph = \"w.fabro\"\n[run.agent.mcps.everything]\ntype = \"sandbox\"\ncommand = [\"{}\", \"streamableHttp\"]\nport = {port}\nstartup_timeout = \"30s\"\n[run.agent.mcps.everything.env]\nPORT = \"{port}\"\n",
            program.display()
        )
    };
    p.write("run.toml", &run_file(port));
    mock.scenario(&call_then(
        "mcp__everything__echo",
        &json!({ "message": "hello from the sandbox" }),
        "It echoed.",
    ));
    let run = p.run("run.toml", &[]);
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    assert!(run.warnings().is_empty(), "{:?}", run.warnings());
    let results = Llmock::tool_results(&mock.bodies()[1]);
    assert!(
        results[0]["content"]
            .to_string()
            .contains("Echo: hello from the sandbox"),
        "{results:?}"
    );
    run_support::wait_for(
        "the server to be gone after the run",
        std::time::Duration::from_secs(5),
        || std::net::TcpStream::connect(("127.0.0.1", port)).is_err(),
    );

    // Something else answers on the port: the server is not started, and its tools not offered.
    let other = std::net::TcpListener::bind(("127.0.0.1", 0)).unwrap();
    let taken = other.local_addr().unwrap().port();
    p.write("run.toml", &run_file(taken));
    mock.reset();
    mock.scenario(&json!([{ "type": "reply", "text": "No tools.", "times": 1 }]));
    let run = p.run("run.toml", &[]);
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    assert!(
        !mock.bodies()[0]["tools"]
            .to_string()
            .contains("mcp__everything__"),
        "{}",
        mock.bodies()[0]["tools"]
    );
    assert!(
        run.warnings()
            .iter()
            .any(|w| w.contains(&format!("port {taken} answers already"))),
        "{:?}",
        run.warnings()
    );
}

#[test]
fn a_secret_only_the_server_configuration_holds_is_redacted_from_what_the_model_sees() {
    let program = trellis_test::cache_dir().join("mcp/node_modules/.bin/mcp-server-everything");
    if !program.exists() {
        trellis_test::missing_peer(
            "@modelcontextprotocol/server-everything (scripts/test-peers.sh)",
        );
        return;
    }
    let Some(mock) = Llmock::start() else { return };
    let p = project(&mock);
    let secret = "sk-config-only-5f2a9c7e1b";
    p.write(
        ".mcp.json",
        &json!({ "mcpServers": { "everything": {
            "command": program, "args": ["stdio"],
            "env": { "SERVICE_API_KEY": secret, "LOG_LEVEL": "warn" },
        }}})
        .to_string(),
    );
    p.write("w.fabro", AGENT);
    mock.scenario(&call_then("mcp__everything__get-env", &json!({}), "Seen."));
    let run = p.run("w.fabro", &[]);
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    let result = Llmock::tool_results(&mock.bodies()[1])[0]["content"].to_string();
    // The server had it (it printed its environment), but the model was shown it redacted.
    assert!(result.contains("[redacted SERVICE_API_KEY]"), "{result}");
    assert!(
        result.contains("\\\"LOG_LEVEL\\\": \\\"warn\\\""),
        "{result}"
    );
    assert!(!result.contains(secret), "{result}");
    let record = std::fs::read_to_string(
        run_support::stage_dir(&p.only_run(), "fix").join("transcript.jsonl"),
    )
    .unwrap();
    assert!(!record.contains(secret));
}

#[test]
fn a_workflow_names_its_own_servers_file() {
    let (Some(server), Some(mock)) = (filesystem_server(), Llmock::start()) else {
        return;
    };
    let p = project(&mock);
    let notes = p.write("notes.txt", "water the plants\n");
    let root = p.path().canonicalize().unwrap();
    p.write(
        "servers.toml",
        &format!(
            "[mcp_servers.files]\ncommand = [\"{}\", \"{}\"]\n",
            server.display(),
            root.display()
        ),
    );
    p.write(
        "w.fabro",
        &AGENT.replace(
            " start [shape=Mdiamond]",
            " graph [mcp_servers=\"@servers.toml\"]\n start [shape=Mdiamond]",
        ),
    );
    mock.scenario(&call_then(
        "mcp__files__read_text_file",
        &json!({ "path": notes.canonicalize().unwrap() }),
        "Water the plants.",
    ));
    let run = p.run("w.fabro", &[]);
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    let result = &Llmock::tool_results(&mock.bodies()[1])[0];
    assert!(
        result["content"].to_string().contains("water the plants"),
        "{result}"
    );

    // A file that is not there fails validation, before anything runs.
    p.write(
        "missing.fabro",
        &AGENT.replace(
            " start [shape=Mdiamond]",
            " graph [mcp_servers=\"@nowhere.toml\"]\n start [shape=Mdiamond]",
        ),
    );
    let out = p.command(&["validate", "missing.fabro"]).output().unwrap();
    assert!(!out.status.success());
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(
        text.contains("file-reference") && text.contains("nowhere.toml"),
        "{text}"
    );

    // So does a server that cannot be used, in the workflow's file or in a run file: the run does
    // not start, rather than its agent starting without the server's tools.
    p.write(
        "servers.toml",
        "[mcp_servers.files]\ntype = \"sandbox\"\ncommand = [\"serve\"]\n",
    );
    let out = p.command(&["run", "w.fabro"]).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    let text = String::from_utf8_lossy(&out.stderr);
    assert!(
        text.contains("error[mcp-server]")
            && text.contains("servers.toml [mcp_servers.files]: a sandbox server needs `port`"),
        "{text}"
    );
    p.write(
        "run.toml",
        "graph = \"missing.fabro\"\n[run.agent.mcps.web]\ntype = \"sandbox\"\ncommand = [\"serve\"]\nport = 70000\n",
    );
    let out = p.command(&["validate", "run.toml"]).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    let text = String::from_utf8_lossy(&out.stderr);
    assert!(
        text.contains("run.toml: MCP server [run.agent.mcps.web]: `port = 70000` is not a port"),
        "{text}"
    );
    assert_eq!(
        mock.bodies().len(),
        2,
        "no model was asked after the first run"
    );
}
