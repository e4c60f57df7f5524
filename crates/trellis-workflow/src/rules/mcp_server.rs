//! `mcp-server` (error): the MCP servers a workflow configures can be used.
//!
//! `mcp_servers="@servers.toml"` (or the text itself) configures MCP servers for the workflow's
//! agents, in Fabro's TOML shape (`[mcp_servers.NAME]`) or `.mcp.json`'s JSON shape. Each server is
//! read when the workflow compiles, so a server with no `command`, an unknown `type`, a `port` that
//! is no port or a misspelt field fails validation, rather than its agent stage starting without
//! the server's tools:
//!
//! ```dot
//! graph [mcp_servers="[mcp_servers.pw]\ntype = \"sandbox\"\ncommand = [\"npx\", \"pw\"]"]
//! // error: ... [mcp_servers.pw]: a sandbox server needs `port`
//! ```

use trellis_syntax::ast::Value;
use trellis_syntax::{Diagnostic, Severity};

use crate::mcp_config::{self, ServerConfig};
use crate::rules::{Rule, file_reference};

pub const RULE: Rule = Rule {
    code: "mcp-server",
    severity: Severity::Error,
    summary: "the MCP servers a workflow configures (mcp_servers) can be used",
};

/// The servers the `mcp_servers` attribute configures, its file read (`@path`) and every entry
/// checked: a problem is an error at the attribute.
pub(crate) fn load(
    value: &Value,
    files: &file_reference::FileScope,
    out: &mut Vec<Diagnostic>,
) -> Vec<(String, ServerConfig)> {
    let Some((path, text)) = file_reference::load("mcp_servers", value, files, out) else {
        return Vec::new();
    };
    let source = path.as_ref().map_or_else(
        || "the workflow's mcp_servers".to_owned(),
        |path| path.display().to_string(),
    );
    let read = mcp_config::read_file(&text, mcp_config::is_json(path.as_deref(), &text), &source);
    for problem in read.problems {
        out.push(
            RULE.diagnostic(problem, value.span)
                .with_label("this server cannot be used")
                .with_help("a server is `type = \"stdio\"` with `command = [...]`, `type = \"http\"` with `url`, or `type = \"sandbox\"` with `command` and `port`"),
        );
    }
    read.servers
}
