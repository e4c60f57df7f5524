//! MCP servers: tools an agent gets from Model Context Protocol servers, through the official Rust
//! SDK (`rmcp`), over stdio or Streamable HTTP. Servers are configured in the project's `.mcp.json`
//! (Claude Code's shape), in the user config file (Fabro's shape: `[mcp_servers.NAME]`), and by the
//! workflow (`mcp_servers="@servers.toml"`, either shape, read when it compiles) and the run file;
//! [`trellis_workflow::mcp_config`] reads both shapes. For a name several give, the workflow's wins,
//! then the project's. Skills bring servers too (see [`crate::skills`]), for the nodes naming them. A
//! server starts (or is connected to) at the run's first agent stage that sees it (`mcp="a,b"` on the
//! node limits which; every configured one otherwise), is shared by the run's later agent stages,
//! and is stopped with its whole process group when the run ends. Its tools are offered as
//! `mcp__{server}__{tool}` with the server's description and JSON Schema; a result's text goes back
//! as a tool result (cut as a shell's is). A server that does not start is a warning and its tools
//! are not offered; a call that fails or outlasts the tool timeout is an error result — never a
//! failed stage.

#![allow(
    clippy::disallowed_methods,
    reason = "the configuration files are read once, on the blocking pool"
)]

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use rmcp::ServiceExt as _;
use rmcp::model::{CallToolRequestParams, ContentBlock};
use rmcp::service::{RoleClient, RunningService};
use serde_json::Value;
use trellis_agent::{ExternalTools, ToolOutput};
use trellis_llm::ToolDef;
use trellis_process::group::{RUN_ID_VAR, kill_group};
use trellis_process::sandbox::{Policy, Sandbox};
use trellis_process::secrets;
use trellis_workflow::mcp_config;

pub use trellis_workflow::mcp_config::{Endpoint, ServerConfig, http};

/// The names of the servers configured for a run in `work_dir` of a workflow configuring
/// `workflow` (those that can be used).
pub fn configured_names(work_dir: &Path, workflow: &[(String, ServerConfig)]) -> Vec<String> {
    load(work_dir, workflow).0.into_keys().collect()
}

/// The servers configured for a run in `work_dir`, and the problems of those that cannot be used.
pub fn configured(
    work_dir: &Path,
    user: &BTreeMap<String, Value>,
    user_file: Option<&Path>,
    workflow: &[(String, ServerConfig)],
) -> (BTreeMap<String, ServerConfig>, Vec<String>) {
    let mut servers = BTreeMap::new();
    let mut problems = Vec::new();
    let user_source =
        user_file.map_or_else(|| "the config file".to_owned(), |f| f.display().to_string());
    for (name, value) in user {
        let source = format!("{user_source} [mcp_servers.{name}]");
        match mcp_config::user_server(value.clone(), source.clone()) {
            Ok(config) => {
                servers.insert(name.clone(), config);
            }
            Err(problem) => problems.push(format!("{source}: {problem}")),
        }
    }
    let project = work_dir.join(".mcp.json");
    match trellis_syntax::read_found_text(&project, work_dir) {
        Ok(text) => {
            let read = mcp_config::read_file(&text, true, &project.display().to_string());
            servers.extend(read.servers);
            problems.extend(read.problems);
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => {
            // A link out of the project may be the user's own: say where such servers go.
            let hint = if e.kind() == std::io::ErrorKind::PermissionDenied {
                "; servers of your own go in your config file's [mcp_servers]"
            } else {
                ""
            };
            problems.push(format!("cannot read {}: {e}{hint}", project.display()));
        }
    }
    // The workflow's servers (checked when it compiled), then the run file's: a later one wins a
    // name.
    servers.extend(workflow.iter().cloned());
    (servers, problems)
}

/// A tool's name as the model sees it: `mcp__{server}__{tool}`, each part [`plain_name`].
pub fn exposed_name(server: &str, tool: &str) -> String {
    format!("mcp__{}__{}", plain_name(server), plain_name(tool))
}

/// `name` with anything but ASCII letters, digits, `_` and `-` made `_`: fit for a tool's or a
/// file's name.
pub fn plain_name(name: &str) -> String {
    name.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// A running server.
struct Server {
    name: String,
    client: RunningService<RoleClient, ()>,
    tools: Vec<rmcp::model::Tool>,
    tool_timeout: Duration,
    /// Its process group, killed when the server is dropped.
    pid: Option<u32>,
}

impl Server {
    /// Whether its process is still there (the transport's task reaps it when it exits).
    fn alive(&self) -> bool {
        self.pid.map_or_else(
            || !self.client.is_closed(),
            |pid| Path::new(&format!("/proc/{pid}")).exists(),
        )
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(pid) = self.pid {
            kill_group(pid);
        }
    }
}

/// Starts `config` (or connects to it) and lists its tools.
async fn start(
    name: &str,
    config: &ServerConfig,
    place: (&Path, &str),
    sandbox: &Sandbox,
) -> Result<Server, String> {
    register_secrets(&config.endpoint);
    let (client, tools, pid) = match &config.endpoint {
        Endpoint::Stdio { command, env } => {
            let (stdio, pid) = spawn(command, env, place, sandbox)?;
            let guard = KillOnFailure(pid);
            let (client, tools) = handshake(stdio, config.startup_timeout).await?;
            std::mem::forget(guard);
            (client, tools, pid)
        }
        Endpoint::Http { url, headers } => {
            let (client, tools) =
                handshake(http_transport(url, headers), config.startup_timeout).await?;
            (client, tools, None)
        }
        Endpoint::Sandboxed { command, env, port } => {
            let started = tokio::time::Instant::now();
            // Whatever answers on the port is taken for the server: not one that was there first.
            if listening(*port).await {
                return Err(format!(
                    "port {port} answers already, before its command started: another program \
                     listens there"
                ));
            }
            let pid = spawn_listening(command, env, place, sandbox)?;
            let guard = KillOnFailure(pid);
            while !listening(*port).await {
                if started.elapsed() >= config.startup_timeout {
                    return Err(format!(
                        "it did not listen on port {port} within {} s (startup_timeout_secs)",
                        config.startup_timeout.as_secs()
                    ));
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            let url = format!("http://127.0.0.1:{port}/mcp");
            let left = config.startup_timeout.saturating_sub(started.elapsed());
            let (client, tools) = handshake(
                http_transport(&url, &BTreeMap::new()),
                left.max(Duration::from_secs(1)),
            )
            .await?;
            std::mem::forget(guard);
            (client, tools, pid)
        }
    };
    Ok(Server {
        name: name.to_owned(),
        client,
        tools,
        tool_timeout: config.tool_timeout,
        pid,
    })
}

/// Whether something accepts connections on `port` of the loopback.
async fn listening(port: u16) -> bool {
    tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .is_ok()
}

/// The Streamable HTTP transport to `url`, with `headers` on every request.
fn http_transport(
    url: &str,
    headers: &BTreeMap<String, String>,
) -> rmcp::transport::StreamableHttpClientTransport<reqwest::Client> {
    let headers = headers
        .iter()
        .filter_map(|(name, value)| {
            Some((
                reqwest::header::HeaderName::from_bytes(name.as_bytes()).ok()?,
                reqwest::header::HeaderValue::from_str(value).ok()?,
            ))
        })
        .collect();
    rmcp::transport::StreamableHttpClientTransport::with_client(
        trellis_llm::http_client(),
        rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig::with_uri(url)
            .custom_headers(headers),
    )
}

/// Makes the secrets a server's configuration holds — variables named as secrets, credential
/// headers — redacted wherever output is, as those of the environment are.
fn register_secrets(endpoint: &Endpoint) {
    let (values, credential) = match endpoint {
        Endpoint::Stdio { env, .. } | Endpoint::Sandboxed { env, .. } => (env, false),
        Endpoint::Http { headers, .. } => (headers, true),
    };
    for (name, value) in values {
        let header = credential
            && ["authorization", "proxy-authorization", "cookie"]
                .contains(&name.to_ascii_lowercase().as_str());
        if header || secrets::is_secret(name) {
            secrets::register(name, value);
        }
    }
}

/// The MCP handshake over `transport` and the server's tools, within `timeout`.
async fn handshake<T, E, A>(
    transport: T,
    timeout: Duration,
) -> Result<(RunningService<RoleClient, ()>, Vec<rmcp::model::Tool>), String>
where
    T: rmcp::transport::IntoTransport<RoleClient, E, A>,
    E: std::error::Error + Send + Sync + 'static,
{
    tokio::time::timeout(timeout, async {
        let client = ()
            .serve(transport)
            .await
            .map_err(|e| format!("it did not answer the MCP handshake: {e}"))?;
        let tools = client
            .list_all_tools()
            .await
            .map_err(|e| format!("it did not list its tools: {e}"))?;
        Ok::<_, String>((client, tools))
    })
    .await
    .map_err(|_| {
        format!(
            "it did not start within {} s (startup_timeout_secs)",
            timeout.as_secs()
        )
    })?
}

/// Starts a stdio server's program: its output and input, and its process id.
fn spawn(
    command: &[String],
    env: &BTreeMap<String, String>,
    place: (&Path, &str),
    sandbox: &Sandbox,
) -> Result<
    (
        (tokio::process::ChildStdout, tokio::process::ChildStdin),
        Option<u32>,
    ),
    String,
> {
    let (mut child, program) = start_program(command, env, place, sandbox, true)?;
    let pid = child.id();
    let (Some(stdout), Some(stdin)) = (child.stdout.take(), child.stdin.take()) else {
        return Err(format!(
            "the standard input and output of `{program}` could not be opened"
        ));
    };
    // The child is waited for by the transport's end; dropping it kills it (and `Server` its group).
    tokio::spawn(async move {
        let _ = child.wait().await;
    });
    Ok(((stdout, stdin), pid))
}

/// Starts a sandbox server's program, which listens on a port: its process id.
fn spawn_listening(
    command: &[String],
    env: &BTreeMap<String, String>,
    place: (&Path, &str),
    sandbox: &Sandbox,
) -> Result<Option<u32>, String> {
    let (mut child, _) = start_program(command, env, place, sandbox, false)?;
    let pid = child.id();
    tokio::spawn(async move {
        let _ = child.wait().await;
    });
    Ok(pid)
}

/// Starts a server's program in its own process group, with the environment of a command stage
/// and the server's `env`; its standard input and output piped when it speaks over them.
fn start_program<'a>(
    command: &'a [String],
    env: &BTreeMap<String, String>,
    (work_dir, run_id): (&Path, &str),
    sandbox: &Sandbox,
    stdio: bool,
) -> Result<(tokio::process::Child, &'a str), String> {
    let Some((program, args)) = command.split_first() else {
        return Err("no command".into());
    };
    // In bubblewrap, as a command stage is (a workflow's commands could write `.mcp.json`): the
    // server speaks over its standard input, which the reaper of the other sandboxes holds for
    // itself, so there it starts as the user's own program.
    let mut command = if sandbox.name() == "bubblewrap" {
        let args: Vec<&std::ffi::OsStr> = args.iter().map(std::ffi::OsStr::new).collect();
        sandbox.command(
            std::ffi::OsStr::new(program),
            &args,
            work_dir,
            &Policy::default(),
        )
    } else {
        let mut command = tokio::process::Command::new(program);
        command.args(args).current_dir(work_dir);
        command
    };
    let piped = || {
        if stdio {
            std::process::Stdio::piped()
        } else {
            std::process::Stdio::null()
        }
    };
    command
        .env_clear()
        .envs(secrets::child_env(&[]))
        .envs(sandbox.env())
        .envs(env)
        // A server a killed run left behind is found by this, as its commands are.
        .env(RUN_ID_VAR, run_id)
        .stdin(piped())
        .stdout(piped())
        .stderr(std::process::Stdio::null())
        .process_group(0)
        .kill_on_drop(true);
    let child = command
        .spawn()
        .map_err(|e| format!("cannot start `{program}`: {e}"))?;
    Ok((child, program))
}

/// Kills a server's group when its start fails half way.
struct KillOnFailure(Option<u32>);

impl Drop for KillOnFailure {
    fn drop(&mut self) {
        if let Some(pid) = self.0 {
            kill_group(pid);
        }
    }
}

/// A run's MCP servers: configured on first use, started on first use each (in the run's sandbox),
/// restarted once if one dies, stopped with the run.
pub struct Hub {
    state: tokio::sync::Mutex<Option<State>>,
    sandbox: Arc<Sandbox>,
}

struct State {
    configs: BTreeMap<String, ServerConfig>,
    /// Servers skills brought, for the nodes naming those skills.
    skill_configs: BTreeMap<String, ServerConfig>,
    /// Started servers, and the reason of those that did not start (not tried again).
    running: BTreeMap<String, Result<Arc<Server>, String>>,
    /// Servers started again after they died (once each).
    restarted: std::collections::BTreeSet<String>,
}

impl Hub {
    pub fn new(sandbox: Arc<Sandbox>) -> Self {
        Self {
            state: tokio::sync::Mutex::default(),
            sandbox,
        }
    }

    /// The tools of the servers `selection` names (every configured one when `None`) and of
    /// `skill_servers` (those the node's skills bring, each under its skill's name, for this node
    /// only), starting those not running yet; each problem (a server that does not start, one not
    /// configured) is passed to `warn`. `None` when no server is to be used.
    pub async fn tools(
        self: &Arc<Self>,
        (work_dir, run_id, workflow): (&Path, &str, &[(String, ServerConfig)]),
        selection: Option<&[String]>,
        skill_servers: &[(String, ServerConfig)],
        warn: &(dyn Fn(String) + Sync),
    ) -> Option<Arc<dyn ExternalTools>> {
        let mut state = self.state.lock().await;
        if state.is_none() {
            let dir = work_dir.to_path_buf();
            let workflow = workflow.to_vec();
            let (configs, problems) =
                trellis_process::task::blocking(move || load(&dir, &workflow)).await;
            for problem in problems {
                warn(format!("MCP: {problem}"));
            }
            *state = Some(State {
                configs,
                skill_configs: BTreeMap::new(),
                running: BTreeMap::new(),
                restarted: std::collections::BTreeSet::new(),
            });
        }
        let state = state.as_mut()?;
        let mut names: Vec<String> = match selection {
            Some(names) => names.to_vec(),
            None => state.configs.keys().cloned().collect(),
        };
        for (name, config) in skill_servers {
            state
                .skill_configs
                .entry(name.clone())
                .or_insert_with(|| config.clone());
            if !names.contains(name) {
                names.push(name.clone());
            }
        }
        let mut servers = Vec::new();
        for name in names {
            let config = state
                .configs
                .get(&name)
                .or_else(|| state.skill_configs.get(&name));
            let Some(config) = config.cloned() else {
                warn(format!(
                    "MCP: no server `{name}` is configured (in .mcp.json or [mcp_servers] of the config file)"
                ));
                continue;
            };
            if !state.running.contains_key(&name) {
                let started = start(&name, &config, (work_dir, run_id), &self.sandbox)
                    .await
                    .map(Arc::new)
                    .map_err(|problem| format!("server `{name}` ({}): {problem}", config.source));
                state.running.insert(name.clone(), started);
            }
            match &state.running[&name] {
                Ok(server) => servers.push(server.clone()),
                Err(problem) => warn(format!("MCP: {problem}; its tools are not offered")),
            }
        }
        (!servers.is_empty()).then(|| {
            Arc::new(Tools::of(
                self.clone(),
                servers,
                (work_dir.to_path_buf(), run_id.to_owned()),
            )) as Arc<dyn ExternalTools>
        })
    }

    /// The server `name` as it runs now.
    async fn server(&self, name: &str) -> Option<Arc<Server>> {
        let state = self.state.lock().await;
        state.as_ref()?.running.get(name)?.as_ref().ok().cloned()
    }

    /// Starts `name` again after it died, once per run.
    async fn restart(
        &self,
        name: &str,
        work_dir: &Path,
        run_id: &str,
    ) -> Result<Arc<Server>, String> {
        let mut state = self.state.lock().await;
        let state = state.as_mut().ok_or("no servers are configured")?;
        if let Some(Ok(server)) = state.running.get(name)
            && server.alive()
        {
            // Another stage's call restarted it meanwhile.
            return Ok(server.clone());
        }
        if !state.restarted.insert(name.to_owned()) {
            return Err("it had been started again once already".into());
        }
        let config = state
            .configs
            .get(name)
            .or_else(|| state.skill_configs.get(name))
            .cloned()
            .ok_or("it is not configured")?;
        let started = start(name, &config, (work_dir, run_id), &self.sandbox)
            .await
            .map(Arc::new);
        state.running.insert(name.to_owned(), started.clone());
        started
    }
}

/// The servers configured for a run in `work_dir`, with the workflow's and the run file's, and the
/// problems of those that cannot be used (an ACP agent is handed them).
pub(crate) fn configured_for(
    work_dir: &Path,
    workflow: &[(String, ServerConfig)],
) -> (BTreeMap<String, ServerConfig>, Vec<String>) {
    load(work_dir, workflow)
}

/// The servers configured for `work_dir` (the user config file's, the project's, the workflow's).
fn load(
    work_dir: &Path,
    workflow: &[(String, ServerConfig)],
) -> (BTreeMap<String, ServerConfig>, Vec<String>) {
    match trellis_llm::Config::load() {
        Ok(config) => configured(
            work_dir,
            &config.mcp_servers,
            config.file.as_deref(),
            workflow,
        ),
        Err(e) => {
            let (servers, mut problems) = configured(work_dir, &BTreeMap::new(), None, workflow);
            problems.push(format!("the config file's servers are not used: {e}"));
            (servers, problems)
        }
    }
}

/// The tools of the servers an agent stage sees.
struct Tools {
    hub: Arc<Hub>,
    /// Where and for which run a server is started again.
    place: (std::path::PathBuf, String),
    definitions: Vec<ToolDef>,
    /// Exposed name → the server's name and the tool's own name.
    by_name: BTreeMap<String, (String, String)>,
}

impl Tools {
    fn of(hub: Arc<Hub>, servers: Vec<Arc<Server>>, place: (std::path::PathBuf, String)) -> Self {
        let mut definitions = Vec::new();
        let mut by_name = BTreeMap::new();
        for server in servers {
            for tool in &server.tools {
                let name = exposed_name(&server.name, &tool.name);
                definitions.push(ToolDef {
                    name: name.clone(),
                    description: tool
                        .description
                        .as_deref()
                        .unwrap_or("(no description)")
                        .to_owned(),
                    parameters: Value::Object((*tool.input_schema).clone()),
                });
                by_name.insert(name, (server.name.clone(), tool.name.to_string()));
            }
        }
        Self {
            hub,
            place,
            definitions,
            by_name,
        }
    }
}

/// One call's answer, or why there is none.
enum Called {
    Answered(rmcp::model::CallToolResult),
    TimedOut,
    Failed(String),
}

async fn call_on(
    server: &Server,
    tool: &str,
    arguments: &serde_json::Map<String, Value>,
) -> Called {
    let request = CallToolRequestParams::new(tool.to_owned()).with_arguments(arguments.clone());
    match tokio::time::timeout(server.tool_timeout, server.client.call_tool(request)).await {
        Err(_) => Called::TimedOut,
        Ok(Err(e)) => Called::Failed(e.to_string()),
        Ok(Ok(result)) => Called::Answered(result),
    }
}

#[async_trait]
impl ExternalTools for Tools {
    fn definitions(&self) -> Vec<ToolDef> {
        self.definitions.clone()
    }

    async fn call(&self, name: &str, arguments: &Value) -> Option<ToolOutput> {
        let (server_name, tool) = self.by_name.get(name)?;
        let Some(arguments) = arguments.as_object() else {
            return Some(ToolOutput::error(format!(
                "the arguments of `{name}` must be a JSON object"
            )));
        };
        let Some(mut server) = self.hub.server(server_name).await else {
            return Some(ToolOutput::error(format!(
                "the MCP server `{server_name}` is not running"
            )));
        };
        let mut called = call_on(&server, tool, arguments).await;
        let mut note = None;
        // A server that died is started again once, and the call made again.
        if matches!(called, Called::Failed(_)) && !server.alive() {
            let (work_dir, run_id) = &self.place;
            match self.hub.restart(server_name, work_dir, run_id).await {
                Ok(again) => {
                    server = again;
                    called = call_on(&server, tool, arguments).await;
                    note = Some("restarted".to_owned());
                }
                Err(problem) => {
                    return Some(ToolOutput::error(format!(
                        "the MCP server `{server_name}` exited, and could not be started again: {problem}"
                    )));
                }
            }
        }
        let mut output = match called {
            Called::TimedOut => ToolOutput::error(format!(
                "the MCP server `{server_name}` did not answer `{tool}` within {} s (tool_timeout_secs)",
                server.tool_timeout.as_secs()
            )),
            Called::Failed(e) => ToolOutput::error(format!(
                "the MCP server `{server_name}` failed on `{tool}`: {e}"
            )),
            Called::Answered(result) => {
                let text = result_text(&result.content, result.structured_content.as_ref());
                let output = secrets::redact(&text).into_owned();
                if result.is_error == Some(true) {
                    ToolOutput::error(output)
                } else {
                    ToolOutput::ok(output)
                }
            }
        };
        if note.is_some() {
            output.note = note;
        }
        Some(output)
    }
}

/// A result's content as text: text blocks as they are, other blocks as a note of what they were.
fn result_text(content: &[ContentBlock], structured: Option<&Value>) -> String {
    let mut parts: Vec<String> = content
        .iter()
        .map(|block| match block {
            ContentBlock::Text(text) => text.text.clone(),
            ContentBlock::Image(image) => format!("[an image, {}]", image.mime_type),
            ContentBlock::Audio(audio) => format!("[audio, {}]", audio.mime_type),
            ContentBlock::Resource(_) => "[an embedded resource]".to_owned(),
            ContentBlock::ResourceLink(link) => format!("[a resource: {}]", link.uri),
            _ => "[content of a kind Trellis does not show]".to_owned(),
        })
        .collect();
    if parts.is_empty()
        && let Some(structured) = structured
    {
        parts.push(structured.to_string());
    }
    parts.join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_prefixed_and_cleaned() {
        assert_eq!(exposed_name("git", "status"), "mcp__git__status");
        assert_eq!(
            exposed_name("my.server", "read file"),
            "mcp__my_server__read_file"
        );
    }

    #[test]
    fn a_project_file_linking_out_of_the_project_is_a_problem_not_read() {
        let elsewhere = tempfile::tempdir().unwrap();
        let target = elsewhere.path().join("mcp.json");
        std::fs::write(
            &target,
            r#"{"mcpServers": {"fs": {"command": "npx", "args": ["server"]}}}"#,
        )
        .unwrap();
        let dir = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink(&target, dir.path().join(".mcp.json")).unwrap();
        let (servers, problems) = configured(dir.path(), &BTreeMap::new(), None, &[]);
        assert!(servers.is_empty());
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(
            problems[0].contains("it leads outside")
                && problems[0]
                    .ends_with("servers of your own go in your config file's [mcp_servers]"),
            "{problems:?}"
        );
    }

    #[test]
    fn both_files_configure_servers_and_the_project_wins() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join(".mcp.json"),
            r#"{"mcpServers": {"fs": {"command": "npx", "args": ["server", "."], "env": {"A": "1"}},
                "web": {"type": "http", "url": "http://127.0.0.1:1/mcp"}}}"#,
        )
        .unwrap();
        let user: BTreeMap<String, Value> = serde_json::from_value(serde_json::json!({
            "fs": {"type": "stdio", "command": ["other"]},
            "git": {"type": "stdio", "command": ["uvx", "mcp-server-git"], "tool_timeout_secs": 5},
            "bad": {"type": "stdio"},
            "remote": {"type": "http", "url": "https://mcp.example.com/mcp",
                       "headers": {"Authorization": "Bearer x"}},
            "ftp": {"type": "http", "url": "ftp://example.com/"},
            "pw": {"type": "sandbox", "command": ["npx", "@playwright/mcp", "--port", "3100"], "port": 3100},
            "portless": {"type": "sandbox", "command": ["npx", "x"]},
        }))
        .unwrap();
        let (servers, problems) = configured(dir.path(), &user, None, &[]);
        // The workflow's own file wins over both, in either shape.
        for (text, json) in [
            ("[mcp_servers.fs]\ncommand = [\"wf\"]\n", false),
            (r#"{"mcpServers": {"fs": {"command": "wf"}}}"#, true),
        ] {
            let file = mcp_config::read_file(text, json, "servers");
            assert!(file.problems.is_empty(), "{:?}", file.problems);
            let (again, _) = configured(dir.path(), &user, None, &file.servers);
            assert!(
                matches!(&again["fs"].endpoint, Endpoint::Stdio { command, .. } if command == &["wf"]),
                "{text}"
            );
        }
        assert_eq!(
            servers["fs"].endpoint,
            Endpoint::Stdio {
                command: vec!["npx".into(), "server".into(), ".".into()],
                env: BTreeMap::from([("A".into(), "1".into())]),
            }
        );
        assert_eq!(servers["git"].tool_timeout, Duration::from_secs(5));
        assert_eq!(
            servers["web"].endpoint,
            Endpoint::Http {
                url: "http://127.0.0.1:1/mcp".into(),
                headers: BTreeMap::new()
            }
        );
        assert!(
            matches!(&servers["remote"].endpoint, Endpoint::Http { headers, .. } if headers["Authorization"] == "Bearer x")
        );
        assert!(matches!(
            &servers["pw"].endpoint,
            Endpoint::Sandboxed { port: 3100, .. }
        ));
        assert_eq!(problems.len(), 3, "{problems:?}");
        assert!(problems.iter().any(|p| p.contains("needs `command`")));
        assert!(
            problems
                .iter()
                .any(|p| p.contains("a sandbox server needs `port`"))
        );
        assert!(
            problems
                .iter()
                .any(|p| p.contains("`ftp://example.com/` is not an http:// or https:// URL"))
        );
    }
}
