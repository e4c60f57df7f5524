//! The agent's tools: their definitions as the model sees them, which of them a node may use
//! (`allowed_tools`/`disallowed_tools`), and running one call. A call never fails the session: a
//! malformed call, an unknown tool, invalid arguments, a refused path or a tool's own error all come
//! back as an error result the model reads.

use std::fmt::Write as _;
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use trellis_llm::{ToolCall, ToolDef};

use trellis_process::sandbox::{Policy, Sandbox};
use trellis_process::task::blocking;

use crate::file_tools;
use crate::shell::{self, ShellCommand};
use crate::truncate::{Keep, Limit};
use crate::work_dir::WorkDir;

/// One of the agent's tools.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Tool {
    ReadFile,
    WriteFile,
    EditFile,
    Shell,
    Grep,
    Glob,
    ListDir,
    /// Offered only when `allowed_tools` names it (Fabro's Gemini agents have it).
    ReadManyFiles,
    /// Offered only when `allowed_tools` names it: it reaches the network from Trellis itself.
    WebFetch,
    /// Offered only when `allowed_tools` names it: a Brave Search query, made by Trellis itself.
    WebSearch,
    /// Offered only when `allowed_tools` names it (Fabro's OpenAI agents have it).
    ApplyPatch,
}

/// What a tool can do, for permissions (Fabro's categories): reading (and starting sub-agents) is
/// always allowed, writing needs `read-write`, and a shell — or any tool the agent does not know —
/// needs `full`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Category {
    Read,
    Write,
    Shell,
}

impl Category {
    /// The category of the tool named `name`.
    pub fn of(name: &str) -> Self {
        match Tool::from_name(name) {
            Some(
                Tool::ReadFile | Tool::Grep | Tool::Glob | Tool::ListDir | Tool::ReadManyFiles,
            ) => Category::Read,
            // Sub-agents use these same tools, under the same permissions.
            None if crate::subagents::TOOL_NAMES.contains(&name) => Category::Read,
            Some(Tool::WriteFile | Tool::EditFile | Tool::ApplyPatch) => Category::Write,
            // Fabro's category for the web tools: what reaches outside needs `full`.
            Some(Tool::Shell | Tool::WebFetch | Tool::WebSearch) | None => Category::Shell,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Category::Read => "read",
            Category::Write => "write",
            Category::Shell => "shell",
        }
    }
}

/// What a tool call produced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolOutput {
    /// The whole output; the model is shown it cut to the tool's `Limit`.
    pub content: String,
    pub is_error: bool,
    /// A short word on the result for one-line displays (`exit 101`, `timed out`).
    pub note: Option<String>,
    /// The files written, edited or deleted, relative to the working directory.
    pub touched: Vec<String>,
    /// The files whose content the call showed (read, or lines found by `grep`), relative to the
    /// working directory: the session may write them (see [`Toolbox::run`]).
    pub seen: Vec<String>,
}

impl ToolOutput {
    pub fn ok(content: impl Into<String>) -> Self {
        Self {
            content: content.into(),
            is_error: false,
            note: None,
            touched: Vec::new(),
            seen: Vec::new(),
        }
    }

    pub fn error(content: impl Into<String>) -> Self {
        Self {
            content: content.into(),
            is_error: true,
            note: None,
            touched: Vec::new(),
            seen: Vec::new(),
        }
    }
}

/// The longest a `shell` call may run, and how long it runs unless the model says otherwise.
const SHELL_DEFAULT_TIMEOUT: Duration = Duration::from_mins(2);
const SHELL_MAX_TIMEOUT: Duration = Duration::from_mins(10);
/// The files a task names that are shown with it: at most this many, each at most this many bytes,
/// and this many bytes in all.
const NAMED_FILES_LIMITS: (usize, u64, usize) = (4, 8 * 1024, 16 * 1024);
/// How many files [`Toolbox::narrowed`] lists at most, the largest whose lines it lists as the
/// `old_string`s an edit may name, and how many lines it looks for in their files in all.
const EDIT_TARGET_LIMITS: (usize, u64, usize) = (200, 32 * 1024, 2_000);

impl Tool {
    pub const ALL: [Tool; 11] = [
        Tool::ReadFile,
        Tool::WriteFile,
        Tool::EditFile,
        Tool::Shell,
        Tool::Grep,
        Tool::Glob,
        Tool::ListDir,
        Tool::ReadManyFiles,
        Tool::WebFetch,
        Tool::WebSearch,
        Tool::ApplyPatch,
    ];

    /// The tools an agent is offered when its node names none (`allowed_tools`): every tool but
    /// those it must ask for by name.
    pub const DEFAULT: [Tool; 7] = [
        Tool::ReadFile,
        Tool::WriteFile,
        Tool::EditFile,
        Tool::Shell,
        Tool::Grep,
        Tool::Glob,
        Tool::ListDir,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Tool::ReadFile => "read_file",
            Tool::WriteFile => "write_file",
            Tool::EditFile => "edit_file",
            Tool::Shell => "shell",
            Tool::Grep => "grep",
            Tool::Glob => "glob",
            Tool::ListDir => "list_dir",
            Tool::ReadManyFiles => "read_many_files",
            Tool::WebFetch => "web_fetch",
            Tool::WebSearch => "web_search",
            Tool::ApplyPatch => "apply_patch",
        }
    }

    pub fn from_name(name: &str) -> Option<Tool> {
        Tool::ALL.into_iter().find(|t| t.name() == name.trim())
    }

    /// Tools that only read may run concurrently with each other.
    pub fn read_only(self) -> bool {
        matches!(
            self,
            Tool::ReadFile
                | Tool::Grep
                | Tool::Glob
                | Tool::ListDir
                | Tool::ReadManyFiles
                | Tool::WebFetch
                | Tool::WebSearch
        )
    }

    /// How much of the output the model is shown.
    pub fn limit(self) -> Limit {
        let (chars, lines, keep) = match self {
            Tool::ReadFile => (50_000, 2_000, Keep::Head),
            Tool::ReadManyFiles => (50_000, 4_000, Keep::Head),
            Tool::WebFetch => (30_000, 1_000, Keep::Head),
            Tool::Shell => (30_000, 400, Keep::HeadAndTail),
            Tool::Grep | Tool::WebSearch => (20_000, 400, Keep::Head),
            Tool::Glob | Tool::ListDir => (20_000, 500, Keep::Head),
            Tool::WriteFile | Tool::EditFile | Tool::ApplyPatch => (5_000, 100, Keep::Head),
        };
        Limit { chars, lines, keep }
    }

    /// The argument a one-line display shows (the path, the command or the pattern).
    pub fn target(self, arguments: &Value) -> String {
        let key = match self {
            Tool::Shell => "command",
            Tool::Grep | Tool::Glob => "pattern",
            Tool::WebFetch => "url",
            Tool::WebSearch => "query",
            Tool::ApplyPatch => {
                let patch = arguments.get("patch").and_then(Value::as_str);
                return patch
                    .into_iter()
                    .flat_map(str::lines)
                    .filter_map(|l| l.strip_prefix("*** ")?.split_once(" File: "))
                    .map(|(_, path)| path.trim())
                    .collect::<Vec<_>>()
                    .join(", ");
            }
            Tool::ReadManyFiles => {
                let paths = arguments.get("paths").and_then(Value::as_array);
                return paths
                    .into_iter()
                    .flatten()
                    .filter_map(Value::as_str)
                    .collect::<Vec<_>>()
                    .join(", ");
            }
            _ => "path",
        };
        arguments
            .get(key)
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned()
    }

    pub fn definition(self) -> ToolDef {
        let (description, parameters) = match self {
            Tool::ReadFile => (
                "Read a text file. Lines come numbered; by default the first 2000 lines. Use offset (1-based line) and limit to read on.",
                json!({
                    "type": "object",
                    "properties": {
                        "path": { "type": "string", "description": "File path, relative to the working directory" },
                        "offset": { "type": "integer", "description": "First line to read (1-based)" },
                        "limit": { "type": "integer", "description": "How many lines to read" }
                    },
                    "required": ["path"]
                }),
            ),
            Tool::WriteFile => (
                "Write a file with the given content, replacing it if it exists. Parent folders are created.",
                json!({
                    "type": "object",
                    "properties": {
                        "path": { "type": "string", "description": "File path, relative to the working directory" },
                        "content": { "type": "string", "description": "The whole new content of the file" }
                    },
                    "required": ["path", "content"]
                }),
            ),
            Tool::EditFile => (
                "Replace an exact string in a file. old_string must occur exactly once unless replace_all is true.",
                json!({
                    "type": "object",
                    "properties": {
                        "path": { "type": "string" },
                        "old_string": { "type": "string", "description": "The exact text to replace" },
                        "new_string": { "type": "string", "description": "The text to put in its place" },
                        "replace_all": { "type": "boolean", "description": "Replace every occurrence" }
                    },
                    "required": ["path", "old_string", "new_string"]
                }),
            ),
            Tool::Shell => (
                "Run a shell command (sh -c) in the working directory. Returns its output and exit code. Default timeout 120000 ms, at most 600000.",
                json!({
                    "type": "object",
                    "properties": {
                        "command": { "type": "string" },
                        "timeout_ms": { "type": "integer", "description": "Timeout in milliseconds" }
                    },
                    "required": ["command"]
                }),
            ),
            Tool::Grep => (
                "Search file contents with a regular expression, honouring .gitignore. Returns path:line:text.",
                json!({
                    "type": "object",
                    "properties": {
                        "pattern": { "type": "string", "description": "A regular expression" },
                        "path": { "type": "string", "description": "File or folder to search (default: the working directory)" },
                        "glob": { "type": "string", "description": "Only files matching this glob, e.g. *.rs" },
                        "case_insensitive": { "type": "boolean" }
                    },
                    "required": ["pattern"]
                }),
            ),
            Tool::Glob => (
                "List files matching a glob pattern (e.g. **/*.rs), newest first.",
                json!({
                    "type": "object",
                    "properties": {
                        "pattern": { "type": "string" },
                        "path": { "type": "string", "description": "Folder to search (default: the working directory)" }
                    },
                    "required": ["pattern"]
                }),
            ),
            Tool::ListDir => (
                "List a folder's entries with their type and size.",
                json!({
                    "type": "object",
                    "properties": {
                        "path": { "type": "string", "description": "Folder (default: the working directory)" }
                    }
                }),
            ),
            Tool::ReadManyFiles => (
                "Read several text files at once (at most 20). Each comes under a === path === line, numbered as read_file numbers lines.",
                json!({
                    "type": "object",
                    "properties": {
                        "paths": { "type": "array", "items": { "type": "string" }, "description": "File paths, relative to the working directory" }
                    },
                    "required": ["paths"]
                }),
            ),
            Tool::ApplyPatch => (
                "Change files with a patch: `*** Begin Patch`, then per file `*** Add File: PATH` (each line +text), `*** Delete File: PATH`, or `*** Update File: PATH` (optionally `*** Move to: NEW`) followed by chunks, each `@@` (optionally with a line the chunk comes after) then lines starting with a space (unchanged context, about 3 lines around a change), - (removed) or + (added); then `*** End Patch`. The patch applies whole or not at all.",
                json!({
                    "type": "object",
                    "properties": {
                        "patch": { "type": "string", "description": "The whole patch, from *** Begin Patch to *** End Patch" }
                    },
                    "required": ["patch"]
                }),
            ),
            Tool::WebFetch => (
                "Fetch a web page (http:// or https://) and return its text, HTML turned into Markdown, at most 100 KB. Default timeout 30000 ms, at most 60000.",
                json!({
                    "type": "object",
                    "properties": {
                        "url": { "type": "string" },
                        "timeout_ms": { "type": "integer", "description": "Timeout in milliseconds" }
                    },
                    "required": ["url"]
                }),
            ),
            Tool::WebSearch => (
                "Search the web (Brave Search). Returns numbered results, each with its title, URL and description; fetch a page with web_fetch to read it.",
                json!({
                    "type": "object",
                    "properties": {
                        "query": { "type": "string", "description": "What to search for" },
                        "max_results": { "type": "integer", "description": "How many results (default 5, at most 20)" }
                    },
                    "required": ["query"]
                }),
            ),
        };
        ToolDef {
            name: self.name().to_owned(),
            description: description.to_owned(),
            parameters,
        }
    }
}

/// Tools from outside the agent's own (an MCP server's): offered beside the built-in ones, called by
/// name. A call never fails: every problem is an error result.
#[async_trait::async_trait]
pub trait ExternalTools: Send + Sync {
    /// The definitions the model is shown.
    fn definitions(&self) -> Vec<ToolDef>;
    /// Runs `name` with `arguments`; `None` when the name is not one of these tools.
    async fn call(&self, name: &str, arguments: &Value) -> Option<ToolOutput>;
}

impl std::fmt::Debug for dyn ExternalTools {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ExternalTools({} tools)", self.definitions().len())
    }
}

/// Several sets of external tools offered as one (MCP servers', `use_skill`, sub-agents): `None`
/// when there are none.
pub fn combined(
    mut sets: Vec<std::sync::Arc<dyn ExternalTools>>,
) -> Option<std::sync::Arc<dyn ExternalTools>> {
    match sets.len() {
        0 => None,
        1 => sets.pop(),
        _ => Some(std::sync::Arc::new(Combined(sets))),
    }
}

struct Combined(Vec<std::sync::Arc<dyn ExternalTools>>);

/// `tools` less those `keep` refuses: not offered, and a call of one is answered as a call of an
/// unknown tool.
pub fn filtered(
    tools: std::sync::Arc<dyn ExternalTools>,
    keep: impl Fn(&str) -> bool + Send + Sync + 'static,
) -> std::sync::Arc<dyn ExternalTools> {
    std::sync::Arc::new(Filtered {
        tools,
        keep: Box::new(keep),
    })
}

struct Filtered {
    tools: std::sync::Arc<dyn ExternalTools>,
    keep: Box<dyn Fn(&str) -> bool + Send + Sync>,
}

#[async_trait::async_trait]
impl ExternalTools for Filtered {
    fn definitions(&self) -> Vec<ToolDef> {
        let mut definitions = self.tools.definitions();
        definitions.retain(|tool| (self.keep)(&tool.name));
        definitions
    }

    async fn call(&self, name: &str, arguments: &Value) -> Option<ToolOutput> {
        if (self.keep)(name) {
            self.tools.call(name, arguments).await
        } else {
            None
        }
    }
}

#[async_trait::async_trait]
impl ExternalTools for Combined {
    fn definitions(&self) -> Vec<ToolDef> {
        self.0
            .iter()
            .flat_map(|tools| tools.definitions())
            .collect()
    }

    async fn call(&self, name: &str, arguments: &Value) -> Option<ToolOutput> {
        for tools in &self.0 {
            if let Some(output) = tools.call(name, arguments).await {
                return Some(output);
            }
        }
        None
    }
}

/// How much of an external tool's result the model is shown (as much as of a shell's).
pub const EXTERNAL_LIMIT: Limit = Limit {
    chars: 30_000,
    lines: 400,
    keep: Keep::HeadAndTail,
};

/// The tools one session may use, confined to its working directory.
#[derive(Debug, Clone)]
pub struct Toolbox {
    work_dir: WorkDir,
    tools: Vec<Tool>,
    /// Tools from MCP servers, offered after the built-in ones.
    pub external: Option<std::sync::Arc<dyn ExternalTools>>,
    /// Variables added to every `shell` call's environment (the run's identity).
    pub shell_env: Vec<(String, String)>,
    /// Secret variables the node passes on to the shell (`env`).
    pub pass_env: Vec<String>,
    /// The sandbox `shell` calls run in, with the node's policy.
    pub sandbox: (std::sync::Arc<Sandbox>, Policy),
    /// The files the session has read (or found lines of with `grep`), written or edited: those it
    /// may write over.
    known: std::sync::Arc<parking_lot::Mutex<std::collections::HashSet<String>>>,
    /// What the writing tools must keep for the task ([`Toolbox::keep_for`]).
    kept: std::sync::Arc<parking_lot::Mutex<file_tools::Kept>>,
}

impl Toolbox {
    /// The tools `allowed` names (when given; else [`Tool::DEFAULT`]), less those in `disallowed`.
    pub fn new(work_dir: WorkDir, allowed: Option<&[String]>, disallowed: &[String]) -> Self {
        let tools = match allowed {
            Some(allowed) => Tool::ALL
                .into_iter()
                .filter(|t| allowed.iter().any(|n| n == t.name()))
                .collect::<Vec<_>>(),
            None => Tool::DEFAULT.to_vec(),
        }
        .into_iter()
        .filter(|t| !disallowed.iter().any(|n| n == t.name()))
        .collect();
        Self {
            work_dir,
            tools,
            external: None,
            shell_env: Vec::new(),
            pass_env: Vec::new(),
            // The agent handler puts the run's sandbox here; a bare toolbox (tests) has none.
            sandbox: (std::sync::Arc::new(Sandbox::none()), Policy::default()),
            known: std::sync::Arc::default(),
            kept: std::sync::Arc::default(),
        }
    }

    /// Whether `tool` is one of the agent's.
    pub fn offers(&self, tool: Tool) -> bool {
        self.tools.contains(&tool)
    }

    pub fn work_dir(&self) -> &WorkDir {
        &self.work_dir
    }

    pub fn definitions(&self) -> Vec<ToolDef> {
        let external = self.external.iter().flat_map(|e| e.definitions());
        self.tools
            .iter()
            .map(|t| t.definition())
            .chain(external)
            .collect()
    }

    /// The working directory's files two levels deep, at most `limit` of them.
    pub async fn overview(&self, limit: usize) -> String {
        let work_dir = self.work_dir.clone();
        blocking(move || file_tools::overview(&work_dir, limit)).await
    }

    /// The small text files of the working directory that `task` names, as they are now, to put
    /// after the task (a step fewer, and a small model copies from what it was shown rather than
    /// guessing) — or, `whole_project`, every file of a project this small (at most 4 files: a
    /// task that names one file may need the others, the module it imports, every use of a name
    /// it renames): counted as seen, as if read. None when it names none (in a larger project),
    /// or `read_file` is not offered.
    pub async fn named_files(&self, task: &str, whole_project: bool) -> Option<String> {
        if !self.offers(Tool::ReadFile) {
            return None;
        }
        let (work_dir, task) = (self.work_dir.clone(), task.to_owned());
        let (whole, files) = blocking(move || {
            let project = if whole_project {
                file_tools::project_files(&work_dir, NAMED_FILES_LIMITS)
            } else {
                Vec::new()
            };
            if project.is_empty() {
                (
                    false,
                    file_tools::named_files(&work_dir, &task, NAMED_FILES_LIMITS),
                )
            } else {
                (true, project)
            }
        })
        .await;
        if files.is_empty() {
            return None;
        }
        let mut known = self.known.lock();
        let mut out = String::from(if whole {
            "The project's files, as they are now:"
        } else {
            "The files the task names, as they are now:"
        });
        for (path, content) in files {
            let fence = fence_for(&content);
            let end = if content.ends_with('\n') || content.is_empty() {
                ""
            } else {
                "\n"
            };
            let _ = write!(out, "\n\n{path}\n{fence}\n{content}{end}{fence}");
            known.insert(path);
        }
        Some(out)
    }

    /// The import a failed command's `output` shows missing: a Python `NameError` raised in a file
    /// that does not import a name another file of the working directory defines.
    pub async fn missing_import(&self, output: &str) -> Option<String> {
        let (work_dir, output) = (self.work_dir.clone(), output.to_owned());
        blocking(move || file_tools::missing_import(&work_dir, &output)).await
    }

    /// For each of `codes`, the one source file of the working directory (not prose: `.md`,
    /// `.txt`, `.rst`) that defines at its top level every name that code defines there, when it
    /// defines any: where a block of code a model wrote without naming its file goes.
    pub async fn defining_files(&self, codes: Vec<String>) -> Vec<Option<String>> {
        let work_dir = self.work_dir.clone();
        blocking(move || file_tools::defining_files(&work_dir, &codes)).await
    }

    /// The numbers of three digits or more that `task` names (a port, a limit, a year) and that
    /// none of the files it names holds: what the task wants written into them. Empty when it names
    /// no file that exists, or no such number.
    pub async fn missing_values(&self, task: &str) -> Vec<String> {
        let values = values_named(task);
        if values.is_empty() {
            return Vec::new();
        }
        let (work_dir, task) = (self.work_dir.clone(), task.to_owned());
        let files =
            blocking(move || file_tools::named_files(&work_dir, &task, NAMED_FILES_LIMITS)).await;
        if files.is_empty() {
            return Vec::new();
        }
        values
            .into_iter()
            .filter(|value| !files.iter().any(|(_, content)| holds(content, value)))
            .collect()
    }

    /// Holds the writing tools to a coached model's `task` from now on: when it says not to change
    /// the tests (`without changing the tests`, `Do not change test_calc.py`), a `write_file` or
    /// `edit_file` that would take out a test line or turn a test off is refused, and a file a
    /// `shell` command so changed is put back; a `write_file` over a file that leaves out a
    /// top-level definition the task does not name keeps it; and one that would take out another
    /// name the file defines, which the task does not name and another file still uses, is refused.
    pub fn keep_for(&self, task: &str) {
        *self.kept.lock() = file_tools::Kept {
            tests: forbids_test_changes(task),
            used_names_but: Some(task.into()),
        };
    }

    /// Counts as seen the files a conversation being continued read, wrote or edited without error
    /// (a thread's earlier stages), as if this toolbox had done it.
    pub fn remember(&self, history: &[trellis_llm::Message]) {
        use trellis_llm::Part;
        let mut paths = std::collections::HashMap::new();
        let mut known = self.known.lock();
        for part in history.iter().flat_map(|message| &message.parts) {
            match part {
                Part::ToolCall(call)
                    if matches!(
                        Tool::from_name(&call.name),
                        Some(Tool::ReadFile | Tool::WriteFile | Tool::EditFile)
                    ) =>
                {
                    if let Some(path) = call.arguments.get("path").and_then(Value::as_str) {
                        paths.insert(call.id.as_str(), path);
                    }
                }
                Part::ToolResult(result) if !result.is_error => {
                    if let Some(given) = paths.get(result.call_id.as_str())
                        && let Ok(path) = self.work_dir.resolve_readable(given)
                    {
                        known.insert(self.work_dir.relative(&path));
                    }
                }
                _ => {}
            }
        }
    }

    /// The files `text` names that are not in the working directory: each word that looks like a
    /// relative path (no glob) to a file with a usual extension (`.py`, `.sh`, `.md`, …), which
    /// nothing is at, in the order named.
    pub async fn missing_files(&self, text: &str) -> Vec<String> {
        let (work_dir, text) = (self.work_dir.clone(), text.to_owned());
        blocking(move || file_tools::missing_files(&work_dir, &text)).await
    }

    /// Argument schemas narrower than the tools' own for the next call, by tool name
    /// ([`trellis_llm::Request::narrowed`]): `edit_file` may name only a text file of the working
    /// directory (`.gitignore` honoured), and as its `old_string` only a line of it (whitespace
    /// around it aside) that occurs once in it, so the edit applies; a file over 32 KB, or past the
    /// first 2,000 lines looked for, takes any text. A working directory of more than 200 files is not
    /// narrowed; one with no text file has no edit to make (`false`).
    pub async fn narrowed(&self) -> std::collections::BTreeMap<String, Value> {
        if !self.offers(Tool::EditFile) {
            return std::collections::BTreeMap::new();
        }
        let work_dir = self.work_dir.clone();
        let Some(targets) =
            blocking(move || file_tools::edit_targets(&work_dir, EDIT_TARGET_LIMITS)).await
        else {
            return std::collections::BTreeMap::new();
        };
        let edits: Vec<Value> = targets
            .into_iter()
            .map(|(path, anchors)| {
                let old_string = match anchors {
                    file_tools::Anchors::Lines(lines) => json!({ "enum": lines }),
                    file_tools::Anchors::Any => json!({ "type": "string" }),
                };
                json!({
                    "type": "object",
                    "properties": {
                        "path": { "const": path },
                        "old_string": old_string,
                        "new_string": { "type": "string" },
                        "replace_all": { "type": "boolean" },
                    },
                    "required": ["path", "old_string", "new_string"],
                    "additionalProperties": false,
                })
            })
            .collect();
        let edit = if edits.is_empty() {
            Value::Bool(false)
        } else {
            json!({ "oneOf": edits })
        };
        [(Tool::EditFile.name().to_owned(), edit)].into()
    }

    /// For an `edit_file` call, a fingerprint of its file's content as it is now (none for other
    /// calls, or a file the file tools would not read): the loop detector's key for edits that
    /// failed.
    pub async fn edit_fingerprint(&self, call: &ToolCall) -> Option<u64> {
        if self.find(call) != Some(Tool::EditFile) {
            return None;
        }
        self.written_fingerprint(call)
            .await
            .map(|(_, content)| content)
    }

    /// For a `write_file` or `edit_file` call: the file it names and a fingerprint of what the
    /// file holds now (none when it does not exist).
    pub async fn written_fingerprint(&self, call: &ToolCall) -> Option<(String, u64)> {
        if !matches!(self.find(call), Some(Tool::EditFile | Tool::WriteFile)) {
            return None;
        }
        let path = call
            .arguments
            .get("path")
            .and_then(Value::as_str)?
            .to_owned();
        let work_dir = self.work_dir.clone();
        blocking(move || {
            let content = file_tools::fingerprint(&work_dir, &path)?;
            Some((path, content))
        })
        .await
    }

    /// Whether `call` is a `write_file` of what its file holds already (with the definitions it
    /// leaves out kept): it changes nothing.
    pub async fn writes_nothing_new(&self, call: &ToolCall) -> bool {
        if self.find(call) != Some(Tool::WriteFile) {
            return false;
        }
        let (Some(path), Some(content)) = (
            call.arguments.get("path").and_then(Value::as_str),
            call.arguments.get("content").and_then(Value::as_str),
        ) else {
            return false;
        };
        let (work_dir, path, content) =
            (self.work_dir.clone(), path.to_owned(), content.to_owned());
        let kept = self.kept.lock().clone();
        blocking(move || file_tools::writes_nothing_new(&work_dir, &path, &content, &kept)).await
    }

    /// Whether `call` names an offered tool that only reads.
    pub fn read_only(&self, call: &ToolCall) -> bool {
        self.find(call).is_some_and(Tool::read_only)
    }

    /// Whether `call` may change anything when it runs: it names an offered tool that writes or
    /// runs commands, or an external one. A call of a tool there is not is answered with an error
    /// without running, and changes nothing.
    pub fn may_change(&self, call: &ToolCall) -> bool {
        match self.find(call) {
            Some(tool) => !tool.read_only(),
            None => self
                .external
                .as_ref()
                .is_some_and(|external| external.definitions().iter().any(|d| d.name == call.name)),
        }
    }

    /// The offered tool `call` names.
    pub fn find(&self, call: &ToolCall) -> Option<Tool> {
        Tool::from_name(&call.name).filter(|t| self.tools.contains(t))
    }

    /// Runs one call. Never fails: every problem is an error result.
    ///
    /// `write_file` over a file that exists is refused unless the session has seen the file first
    /// (read it, found lines of it with `grep`, or written or edited it itself): a model must not
    /// overwrite what it has not looked at. `edit_file` reads the file it edits, and new files are
    /// always written.
    pub async fn run(&self, call: &ToolCall) -> ToolOutput {
        let Some(tool) = self.find(call) else {
            if let Some(external) = &self.external
                && let Some(output) = external.call(&call.name, &call.arguments).await
            {
                return output;
            }
            // Each with what it does: a model that made up a tool for its step (`add_function`)
            // finds the one that does it.
            let mut message = format!("unknown tool `{}`; the tools you can call are:", call.name);
            for tool in self.definitions() {
                let _ = write!(
                    message,
                    "\n- {}: {}",
                    tool.name,
                    first_sentence(&tool.description)
                );
            }
            return ToolOutput::error(message);
        };
        if !call.arguments.is_object() {
            return ToolOutput::error(format!(
                "the arguments of `{}` must be a JSON object, got: {}",
                tool.name(),
                clip_for_message(&call.arguments.to_string())
            ));
        }
        if tool == Tool::Shell {
            return self.shell(&call.arguments).await;
        }
        if matches!(tool, Tool::WebFetch | Tool::WebSearch) {
            // The node's policy, its network cut where the run cuts every stage's.
            let (sandbox, policy) = &self.sandbox;
            let policy = Policy {
                network_off: sandbox.cuts_network(policy),
                ..policy.clone()
            };
            return if tool == Tool::WebFetch {
                crate::web::fetch(&call.arguments, &policy).await
            } else {
                crate::web::search(&call.arguments, &policy).await
            };
        }
        let (work_dir, known) = (self.work_dir.clone(), self.known.clone());
        let arguments = call.arguments.clone();
        let kept = self.kept.lock().clone();
        blocking(move || {
            if tool == Tool::WriteFile
                && let Some(refusal) = unseen_file(&work_dir, &known.lock(), &arguments)
            {
                return ToolOutput::error(refusal);
            }
            if tool == Tool::ApplyPatch
                && let Some(refusal) = unseen_deletion(&work_dir, &known.lock(), &arguments)
            {
                return ToolOutput::error(refusal);
            }
            let output = file_tools::run(tool, &work_dir, &arguments, &kept)
                .unwrap_or_else(ToolOutput::error);
            if !output.is_error {
                let mut known = known.lock();
                known.extend(output.seen.iter().cloned());
                known.extend(output.touched.iter().cloned());
            }
            output
        })
        .await
    }

    async fn shell(&self, arguments: &Value) -> ToolOutput {
        #[derive(serde::Deserialize)]
        struct Args {
            command: String,
            timeout_ms: Option<u64>,
        }
        let args: Args = match parse_args(Tool::Shell, arguments) {
            Ok(args) => args,
            Err(message) => return ToolOutput::error(message),
        };
        let timeout = args
            .timeout_ms
            .map_or(SHELL_DEFAULT_TIMEOUT, Duration::from_millis)
            .min(SHELL_MAX_TIMEOUT);
        // When the task says not to change the tests, a command may not either (`sed -i`, `rm`):
        // the files holding tests are kept first, and put back if it took test lines out.
        let tests = if self.kept.lock().tests {
            let work_dir = self.work_dir.clone();
            blocking(move || file_tools::test_files(&work_dir)).await
        } else {
            Vec::new()
        };
        let mut output = shell::run(&ShellCommand {
            dir: self.work_dir.root(),
            command: &args.command,
            timeout,
            env: &self.shell_env,
            pass_env: &self.pass_env,
            sandbox: &self.sandbox.0,
            policy: &self.sandbox.1,
        })
        .await;
        if !tests.is_empty() {
            let work_dir = self.work_dir.clone();
            if let Some(told) = blocking(move || file_tools::put_back_tests(&work_dir, tests)).await
            {
                output.content.push_str(&told);
                output.is_error = true;
                output.note = Some("tests put back".to_owned());
            }
        }
        output
    }
}

/// The first sentence of a tool's description, at most 120 characters.
fn first_sentence(description: &str) -> String {
    // A full stop, then a capital: "e.g. **/*.rs" does not end one.
    let end = description
        .match_indices(". ")
        .find(|(i, _)| description[i + 2..].starts_with(char::is_uppercase))
        .map_or(description.len(), |(i, _)| i + 1);
    let sentence = description[..end].trim();
    if sentence.chars().count() > 120 {
        sentence.chars().take(119).chain(['…']).collect()
    } else {
        sentence.to_owned()
    }
}

/// A code fence longer than any run of backticks in `content`, so the content cannot close it.
fn fence_for(content: &str) -> String {
    let longest = content.split(|c| c != '`').map(str::len).max().unwrap_or(0);
    "`".repeat(longest.max(2) + 1)
}

/// Why `write_file` may not write the file its `arguments` name: it exists and is not among the
/// `known` files. (Arguments the tool cannot use are left to it to report.)
fn unseen_file(
    work_dir: &WorkDir,
    known: &std::collections::HashSet<String>,
    arguments: &Value,
) -> Option<String> {
    let given = arguments.get("path")?.as_str()?;
    let path = work_dir.resolve(given).ok()?;
    let exists = path.symlink_metadata().is_ok_and(|m| m.is_file());
    (exists && !known.contains(&work_dir.relative(&path))).then(|| {
        format!(
            "Cannot write to `{given}`: the file exists, and you have not read it. Read it with \
             read_file first, then write it."
        )
    })
}

/// Why `apply_patch` may not delete a file its patch deletes: it exists and is not among the
/// `known` files, as `write_file` may not write over one (an update shows the lines it changes, so
/// it may).
fn unseen_deletion(
    work_dir: &WorkDir,
    known: &std::collections::HashSet<String>,
    arguments: &Value,
) -> Option<String> {
    let patch = arguments.get("patch")?.as_str()?;
    let ops = crate::patch::parse(patch).ok()?;
    ops.iter()
        .filter(|op| matches!(op, crate::patch::FileOp::Delete { .. }))
        .find_map(|op| {
            let file = work_dir.resolve(op.path()).ok()?;
            let exists = file.symlink_metadata().is_ok_and(|m| m.is_file());
            (exists && !known.contains(&work_dir.relative(&file))).then(|| {
                format!(
                    "Cannot delete `{}`: you have not read it. Read it with read_file first;                      nothing in the patch was applied.",
                    op.path()
                )
            })
        })
}

/// A call's arguments as the tool's argument type, or the message saying what is wrong.
pub(crate) fn parse_args<T: DeserializeOwned>(tool: Tool, arguments: &Value) -> Result<T, String> {
    serde_json::from_value(arguments.clone())
        .map_err(|e| format!("invalid arguments for `{}`: {e}", tool.name()))
}

fn clip_for_message(text: &str) -> String {
    Limit {
        chars: 200,
        lines: 5,
        keep: Keep::Head,
    }
    .apply(text)
}

/// The numbers of three digits or more in `text`, standing alone (not part of a word, a name or a
/// decimal), each once, in order.
fn values_named(text: &str) -> Vec<String> {
    let mut values: Vec<String> = Vec::new();
    for (start, run) in digit_runs(text) {
        let before = text[..start].chars().next_back();
        let after = text[start + run.len()..].chars().next();
        let part_of_more = |c: Option<char>| c.is_some_and(|c| c.is_alphanumeric() || c == '_');
        let decimal = |c: Option<char>, next: Option<char>| {
            c == Some('.') && next.is_some_and(|n| n.is_ascii_digit())
        };
        let before_dot = text[..start].chars().rev().nth(1);
        let after_dot = text[start + run.len()..].chars().nth(1);
        if run.len() >= 3
            && !part_of_more(before)
            && !part_of_more(after)
            && !decimal(before, before_dot)
            && !decimal(after, after_dot)
            && !values.iter().any(|v| v == run)
        {
            values.push(run.to_owned());
        }
    }
    values
}

/// Whether `text` says not to change the tests: a sentence in which a negation (`not`, `never`,
/// `without`, `n't`) is followed, within three words, by a verb of change (`change`, `modify`,
/// `touch`, `edit`, `delete`, `remove`, `weaken`, `alter`, `rewrite`, in any form) and then by a
/// word naming tests (`test`, `tests`, `test_calc`, `unittest`).
fn forbids_test_changes(text: &str) -> bool {
    const NEGATIONS: [&str; 4] = ["not", "never", "without", "t"];
    const CHANGES: [&str; 9] = [
        "chang", "modif", "touch", "edit", "delet", "remov", "weaken", "alter", "rewrit",
    ];
    const WITHIN: usize = 3;
    let lower = text.to_lowercase();
    lower.split(['.', '!', '?', ';', '\n']).any(|sentence| {
        let words: Vec<&str> = sentence
            .split(|c: char| !(c.is_alphanumeric() || c == '_'))
            .filter(|w| !w.is_empty())
            .collect();
        words.iter().enumerate().any(|(at, word)| {
            NEGATIONS.contains(word)
                && words
                    .iter()
                    .enumerate()
                    .skip(at + 1)
                    .take(WITHIN)
                    .find(|(_, w)| CHANGES.iter().any(|stem| w.starts_with(stem)))
                    .is_some_and(|(verb, _)| words[verb + 1..].iter().any(|w| w.contains("test")))
        })
    })
}

/// Each maximal run of ASCII digits in `text`, with where it starts.
fn digit_runs(text: &str) -> impl Iterator<Item = (usize, &str)> {
    let mut rest = 0;
    std::iter::from_fn(move || {
        let start = rest + text[rest..].find(|c: char| c.is_ascii_digit())?;
        let end = text[start..]
            .find(|c: char| !c.is_ascii_digit())
            .map_or(text.len(), |n| start + n);
        rest = end;
        Some((start, &text[start..end]))
    })
}

/// Whether `content` holds `value` as a number of its own (`9090`, not `19090`).
fn holds(content: &str, value: &str) -> bool {
    digit_runs(content).any(|(_, run)| run == value)
}

#[cfg(test)]
#[allow(
    clippy::disallowed_methods,
    reason = "the test sets up a working directory"
)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn a_task_forbids_changing_the_tests_in_so_many_words() {
        for task in [
            "`cargo test` fails in this Rust crate. Fix the code in src/lib.rs so that `cargo test` \
             passes, without changing the tests.",
            "The test in test_calc.py fails. Fix the bug in calc.py. Do not change test_calc.py.",
            "Fix the root cause you found. Do not change or delete tests.",
            "Make the test suite pass without weakening any test",
            "Don't touch the unit tests!",
        ] {
            assert!(forbids_test_changes(task), "{task}");
        }
        for task in [
            "Add a function to words.py and a unittest test for it, and run the tests.",
            "Fix the test without changing the code.",
            "Do not change the output; run the tests after.",
            "Rename get_total everywhere, so that the tests still pass.",
        ] {
            assert!(!forbids_test_changes(task), "{task}");
        }
    }

    #[tokio::test]
    async fn a_task_that_keeps_the_tests_has_a_change_taking_one_out_refused() {
        let dir = tempfile::tempdir().unwrap();
        let test = "import unittest\nfrom calc import add\n\nclass T(unittest.TestCase):\n    def test_add(self):\n        self.assertEqual(add(2, 3), 5)\n";
        std::fs::write(dir.path().join("test_calc.py"), test).unwrap();
        let toolbox = Toolbox::new(WorkDir::new(dir.path()).unwrap(), None, &[]);
        let edit = ToolCall {
            id: "1".into(),
            name: "edit_file".into(),
            arguments: json!({"path": "test_calc.py", "old_string": "5)", "new_string": "6)"}),
        };
        toolbox.keep_for("Fix calc.py. Do not change test_calc.py.");
        let out = toolbox.run(&edit).await;
        assert!(out.is_error, "{out:?}");
        assert_eq!(
            out.content,
            "Refused: the task says not to change the tests, and this change takes out 1 test \
             line(s) of `test_calc.py`:\nself.assertEqual(add(2, 3), 5)\nKeep the tests \
             exactly as they are and change the code they test instead. `test_calc.py` is \
             unchanged."
        );
        assert_eq!(
            std::fs::read_to_string(dir.path().join("test_calc.py")).unwrap(),
            test
        );
        // A task that does not say so lifts the rule.
        toolbox.keep_for("Make the test expect 6.");
        assert!(!toolbox.run(&edit).await.is_error);
    }

    #[test]
    fn the_numbers_a_task_names_are_those_standing_alone() {
        assert_eq!(
            values_named("In config.json, set the port to 9090 (was 8080), timeout 300."),
            ["9090", "8080", "300"]
        );
        // Short numbers, parts of names and words, decimals and repeats are not values.
        assert_eq!(
            values_named("print 1 to 15 with sha256, v100, x_200, 3.1415 or 2.500"),
            [] as [String; 0]
        );
        assert_eq!(values_named("9090 and 9090."), ["9090"]);
        assert!(holds("\"port\": 9090,", "9090"));
        assert!(!holds("\"port\": 19090,", "9090"));
    }

    #[tokio::test]
    async fn a_number_the_task_names_is_missing_until_a_named_file_holds_it() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("config.json"), "{\"port\": 8080}\n").unwrap();
        let toolbox = Toolbox::new(WorkDir::new(dir.path()).unwrap(), None, &[]);
        let task = "In config.json, set the port to 9090.";
        assert_eq!(toolbox.missing_values(task).await, ["9090"]);
        std::fs::write(dir.path().join("config.json"), "{\"port\": 9090}\n").unwrap();
        assert_eq!(toolbox.missing_values(task).await, [] as [String; 0]);
        // A task that names no file that exists wants nothing of this kind.
        assert_eq!(
            toolbox.missing_values("Listen on port 9090.").await,
            [] as [String; 0]
        );
    }

    fn call(name: &str, arguments: Value) -> ToolCall {
        ToolCall {
            id: "c".into(),
            name: name.into(),
            arguments,
        }
    }

    async fn write(toolbox: &Toolbox, path: &str) -> ToolOutput {
        toolbox
            .run(&call(
                "write_file",
                json!({ "path": path, "content": "new\n" }),
            ))
            .await
    }

    #[tokio::test]
    async fn a_file_that_exists_is_written_only_once_the_session_has_seen_it() {
        let dir = tempfile::tempdir().unwrap();
        for name in ["read.txt", "found.txt", "edited.txt", "blind.txt"] {
            std::fs::write(dir.path().join(name), "old text\n").unwrap();
        }
        let toolbox = Toolbox::new(WorkDir::new(dir.path()).unwrap(), None, &[]);

        let refused = write(&toolbox, "blind.txt").await;
        assert!(refused.is_error);
        assert!(
            refused
                .content
                .starts_with("Cannot write to `blind.txt`: the file exists"),
            "{}",
            refused.content
        );
        assert_eq!(
            std::fs::read_to_string(dir.path().join("blind.txt")).unwrap(),
            "old text\n"
        );

        toolbox
            .run(&call("read_file", json!({ "path": "./read.txt" })))
            .await;
        toolbox
            .run(&call(
                "grep",
                json!({ "pattern": "old", "glob": "found.*" }),
            ))
            .await;
        let edited = toolbox
            .run(&call(
                "edit_file",
                json!({ "path": "edited.txt", "old_string": "old", "new_string": "older" }),
            ))
            .await;
        assert!(!edited.is_error, "{}", edited.content);
        for (name, done) in [
            ("read.txt", &write(&toolbox, "read.txt").await),
            ("found.txt", &write(&toolbox, "found.txt").await),
            ("edited.txt", &write(&toolbox, "edited.txt").await),
            ("new/fresh.txt", &write(&toolbox, "new/fresh.txt").await),
        ] {
            assert!(!done.is_error, "{name}: {}", done.content);
            assert_eq!(
                std::fs::read_to_string(dir.path().join(name)).unwrap(),
                "new\n"
            );
        }
        // A file the session wrote itself may be written again; an unseen one still may not.
        assert!(!write(&toolbox, "new/fresh.txt").await.is_error);
        assert!(write(&toolbox, "blind.txt").await.is_error);

        // Writing what a file holds already changes nothing, and says so.
        let same = call(
            "write_file",
            json!({ "path": "read.txt", "content": "new\n" }),
        );
        assert!(toolbox.writes_nothing_new(&same).await);
        let again = toolbox.run(&same).await;
        assert!(!again.is_error && again.touched.is_empty(), "{again:?}");
        assert_eq!(
            again.content,
            "read.txt already holds exactly this content: nothing changed"
        );
        let other = call(
            "write_file",
            json!({ "path": "read.txt", "content": "newer\n" }),
        );
        assert!(!toolbox.writes_nothing_new(&other).await);
    }

    #[tokio::test]
    async fn a_continued_conversation_has_seen_what_it_read_before() {
        use trellis_llm::{Message, Part, Role, ToolResult};
        let dir = tempfile::tempdir().unwrap();
        for name in ["read.txt", "failed.txt"] {
            std::fs::write(dir.path().join(name), "old text\n").unwrap();
        }
        let toolbox = Toolbox::new(WorkDir::new(dir.path()).unwrap(), None, &[]);
        let exchange = |id: &str, path: &str, is_error: bool| {
            [
                Message {
                    role: Role::Assistant,
                    parts: vec![Part::ToolCall(ToolCall {
                        id: id.into(),
                        name: "read_file".into(),
                        arguments: json!({ "path": path }),
                    })],
                },
                Message {
                    role: Role::User,
                    parts: vec![Part::ToolResult(ToolResult {
                        call_id: id.into(),
                        name: "read_file".into(),
                        content: String::new(),
                        is_error,
                    })],
                },
            ]
        };
        let mut history = exchange("1", "read.txt", false).to_vec();
        history.extend(exchange("2", "failed.txt", true));
        toolbox.remember(&history);
        assert!(!write(&toolbox, "read.txt").await.is_error);
        assert!(write(&toolbox, "failed.txt").await.is_error);
    }
}
