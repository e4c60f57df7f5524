//! MCP servers as configured: what a servers file, the user config file's `[mcp_servers.NAME]` and
//! the project's `.mcp.json` say, read into [`ServerConfig`]s. One reading serves the workflow's own
//! `mcp_servers` file (checked when the workflow compiles, rule `mcp-server`), a run file's
//! `[run.agent.mcps.NAME]`, and the files an agent stage reads when it starts (`trellis-handlers`).
//!
//! Two shapes: Fabro's (TOML, `[mcp_servers.NAME]` with `type = "stdio"` and `command = [...]`,
//! `env`; `type = "http"`, `url`, `headers`; or `type = "sandbox"`, a `command` that listens on
//! `port`; `startup_timeout_secs`, `tool_timeout_secs`) and Claude Code's (JSON,
//! `{"mcpServers": {"NAME": {"command": ..., "args": [...], "env": {...}}}}` or `{"type": "http",
//! "url": ..., "headers": {...}}`).

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use serde::Deserialize;

/// How long a server has to start and list its tools, unless its configuration says.
pub const STARTUP_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a call may take, unless the server's configuration says.
pub const TOOL_TIMEOUT: Duration = Duration::from_mins(2);

/// One configured server.
#[derive(Debug, Clone, PartialEq)]
pub struct ServerConfig {
    pub endpoint: Endpoint,
    pub startup_timeout: Duration,
    pub tool_timeout: Duration,
    /// Where it was configured, for messages.
    pub source: String,
}

/// How a server is reached.
#[derive(Debug, Clone, PartialEq)]
pub enum Endpoint {
    /// A program (with its arguments and added variables) speaking over its standard input and
    /// output.
    Stdio {
        command: Vec<String>,
        env: BTreeMap<String, String>,
    },
    /// A Streamable HTTP URL, with headers sent on every request.
    Http {
        url: String,
        headers: BTreeMap<String, String>,
    },
    /// A program started in the run's sandbox that serves Streamable HTTP on `port` of the
    /// loopback, at `/mcp` (Fabro's `type = "sandbox"`).
    Sandboxed {
        command: Vec<String>,
        env: BTreeMap<String, String>,
        port: u16,
    },
}

impl ServerConfig {
    /// A server with the default timeouts (a skill's, a `.mcp.json` entry).
    pub fn for_skill(endpoint: Endpoint, source: String) -> Self {
        Self {
            endpoint,
            startup_timeout: STARTUP_TIMEOUT,
            tool_timeout: TOOL_TIMEOUT,
            source,
        }
    }
}

/// Servers read from one file, in its order, and the problems of the entries that cannot be used
/// (each naming the file and the entry).
#[derive(Debug, Default)]
pub struct ServersRead {
    pub servers: Vec<(String, ServerConfig)>,
    pub problems: Vec<String>,
}

/// Whether a servers file is `.mcp.json`'s shape: a `.json` file, or text that starts as an object.
pub fn is_json(path: Option<&Path>, text: &str) -> bool {
    path.is_some_and(|p| p.extension().is_some_and(|e| e == "json"))
        || text.trim_start().starts_with('{')
}

/// Reads a servers file's text in either shape ([`is_json`]); `source` names it in messages.
pub fn read_file(text: &str, json: bool, source: &str) -> ServersRead {
    let mut read = ServersRead::default();
    if json {
        match serde_json::from_str::<ProjectFile>(text) {
            Ok(parsed) => {
                for (name, server) in parsed.mcp_servers {
                    let at = format!("{source} (`{name}`)");
                    read.push(name, project_server(server, at.clone()), &at);
                }
            }
            Err(e) => read.problems.push(format!("{source} is not valid: {e}")),
        }
        return read;
    }
    match toml::from_str::<TomlFile>(text) {
        Ok(parsed) => {
            for (name, table) in parsed.mcp_servers {
                let at = format!("{source} [mcp_servers.{name}]");
                let server = serde_json::to_value(table)
                    .map_err(|e| e.to_string())
                    .and_then(|value| user_server(value, at.clone()));
                read.push(name, server, &at);
            }
        }
        Err(e) => read.problems.push(format!("{source} is not valid: {e}")),
    }
    read
}

impl ServersRead {
    fn push(&mut self, name: String, server: Result<ServerConfig, String>, at: &str) {
        match server {
            Ok(config) => self.servers.push((name, config)),
            Err(problem) => self.problems.push(format!("{at}: {problem}")),
        }
    }
}

/// `.mcp.json`: Claude Code's project file.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ProjectFile {
    #[serde(default)]
    mcp_servers: BTreeMap<String, ProjectServer>,
}

#[derive(Deserialize)]
struct ProjectServer {
    #[serde(rename = "type")]
    kind: Option<String>,
    command: Option<String>,
    #[serde(default)]
    args: Vec<String>,
    #[serde(default)]
    env: BTreeMap<String, String>,
    url: Option<String>,
    #[serde(default)]
    headers: BTreeMap<String, String>,
}

/// A TOML servers file: the user config file's `[mcp_servers.NAME]` tables.
#[derive(Deserialize)]
struct TomlFile {
    #[serde(default)]
    mcp_servers: BTreeMap<String, toml::Value>,
}

/// `[mcp_servers.NAME]` of the user config file (Fabro's shape).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct UserServer {
    #[serde(rename = "type")]
    kind: Option<String>,
    #[serde(default)]
    command: Vec<String>,
    #[serde(default)]
    env: BTreeMap<String, String>,
    #[serde(default)]
    url: Option<String>,
    #[serde(default)]
    headers: BTreeMap<String, String>,
    /// Read wide, to say what is wrong with a number that is no port.
    port: Option<i64>,
    startup_timeout_secs: Option<u64>,
    tool_timeout_secs: Option<u64>,
}

/// One `[mcp_servers.NAME]` entry in Fabro's shape (as JSON: the user config file is read as such).
pub fn user_server(value: serde_json::Value, source: String) -> Result<ServerConfig, String> {
    let server: UserServer = serde_json::from_value(value).map_err(|e| e.to_string())?;
    let endpoint = match server.kind.as_deref().unwrap_or("stdio") {
        "stdio" if !server.command.is_empty() => Endpoint::Stdio {
            command: server.command,
            env: server.env,
        },
        "stdio" => {
            return Err("a stdio server needs `command` (the program and its arguments)".into());
        }
        "http" => http(server.url, server.headers)?,
        "sandbox" => match (server.command.is_empty(), server.port) {
            (true, _) => {
                return Err(
                    "a sandbox server needs `command` (the program and its arguments)".into(),
                );
            }
            (false, None) => {
                return Err(
                    "a sandbox server needs `port`: the port its command makes it listen on".into(),
                );
            }
            (false, Some(port)) => Endpoint::Sandboxed {
                command: server.command,
                env: server.env,
                port: u16::try_from(port)
                    .ok()
                    .filter(|&port| port > 0)
                    .ok_or_else(|| format!("`port = {port}` is not a port (1 to 65535)"))?,
            },
        },
        other => {
            return Err(format!(
                "unknown server type `{other}`: use `stdio`, `http` or `sandbox`"
            ));
        }
    };
    Ok(ServerConfig {
        endpoint,
        startup_timeout: server
            .startup_timeout_secs
            .map_or(STARTUP_TIMEOUT, Duration::from_secs),
        tool_timeout: server
            .tool_timeout_secs
            .map_or(TOOL_TIMEOUT, Duration::from_secs),
        source,
    })
}

fn project_server(server: ProjectServer, source: String) -> Result<ServerConfig, String> {
    let endpoint = match (server.kind.as_deref(), server.command) {
        (None | Some("stdio"), Some(command)) => Endpoint::Stdio {
            command: std::iter::once(command).chain(server.args).collect(),
            env: server.env,
        },
        // Claude Code writes `"type": "http"`; a URL alone says the same.
        (Some("http") | None, None) if server.url.is_some() => http(server.url, server.headers)?,
        (None | Some("stdio"), None) => return Err("a stdio server needs `command`".into()),
        (Some("http"), Some(_)) => return Err("an http server needs `url`, not `command`".into()),
        (Some(other), _) => {
            return Err(format!(
                "`{other}` servers are not supported: use stdio or http"
            ));
        }
    };
    Ok(ServerConfig::for_skill(endpoint, source))
}

/// A Streamable HTTP endpoint: an `http` or `https` URL, and headers that are valid as such.
pub fn http(url: Option<String>, headers: BTreeMap<String, String>) -> Result<Endpoint, String> {
    let url = url.ok_or("an http server needs `url`")?;
    if !(url.starts_with("http://") || url.starts_with("https://")) {
        return Err(format!("`{url}` is not an http:// or https:// URL"));
    }
    for (name, value) in &headers {
        http::HeaderName::from_bytes(name.as_bytes())
            .map_err(|_| format!("`{name}` is not a valid header name"))?;
        http::HeaderValue::from_str(value)
            .map_err(|_| format!("the value of header `{name}` is not a valid header value"))?;
    }
    Ok(Endpoint::Http { url, headers })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_reads_its_servers_and_says_what_is_wrong_with_the_others() {
        let read = read_file(
            "[mcp_servers.pw]\ntype = \"sandbox\"\ncommand = [\"npx\", \"pw\"]\nport = 3100\n\
             [mcp_servers.big]\ntype = \"sandbox\"\ncommand = [\"x\"]\nport = 99999\n\
             [mcp_servers.zero]\ntype = \"sandbox\"\ncommand = [\"x\"]\nport = 0\n\
             [mcp_servers.typo]\ncomand = [\"x\"]\n",
            false,
            "servers.toml",
        );
        let names: Vec<&str> = read.servers.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["pw"]);
        assert_eq!(read.problems.len(), 3, "{:?}", read.problems);
        assert_eq!(
            read.problems[0],
            "servers.toml [mcp_servers.big]: `port = 99999` is not a port (1 to 65535)"
        );
        assert!(read.problems[1].contains("[mcp_servers.typo]: unknown field `comand`"));
        assert!(read.problems[2].contains("[mcp_servers.zero]: `port = 0` is not a port"));
        let json = read_file(
            r#"{"mcpServers": {"a": {"type": "sse"}}}"#,
            true,
            ".mcp.json",
        );
        assert_eq!(
            json.problems,
            [".mcp.json (`a`): `sse` servers are not supported: use stdio or http"]
        );
        assert!(read_file("{", true, "x").problems[0].starts_with("x is not valid: "));
        assert!(is_json(None, " {}") && is_json(Some(Path::new("a.json")), ""));
    }
}
