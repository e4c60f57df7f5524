//! Handler kinds and their typed configuration. A node's kind comes from its `type` attribute, else its
//! shape, else its id (`start`/`Start`, `exit`/`Exit`/`end`/`End`); the default shape `box` is an agent.

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

/// What a node does, with the configuration its handler needs.
#[derive(Debug, Clone, PartialEq)]
pub enum NodeKind {
    Start,
    Exit,
    /// Multi-turn LLM with tools (`box`).
    Agent(Box<LlmConfig>),
    /// One LLM call, no tools (`tab`).
    Prompt(Box<LlmConfig>),
    /// A shell or Python script (`parallelogram`).
    Command(CommandConfig),
    /// A human decision (`hexagon`).
    Human(HumanConfig),
    /// Routes on conditions; passes the previous outcome through (`diamond`).
    Conditional,
    /// Fan-out to concurrent branches (`component`).
    Parallel(ParallelConfig),
    /// Merge of parallel results (`tripleoctagon`); with a prompt, a model picks the best branch.
    FanIn(FanInConfig),
    /// A pause (`insulator`).
    Wait(WaitConfig),
    /// A child workflow (`house`).
    SubWorkflow(SubWorkflowConfig),
}

/// The kinds of node, one per handler: what [`NodeKind`] is without its configuration. Written as
/// its `type` name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(into = "&'static str", try_from = "String")]
pub enum HandlerKind {
    Start,
    Exit,
    Agent,
    Prompt,
    Command,
    Human,
    Conditional,
    Parallel,
    FanIn,
    Wait,
    SubWorkflow,
}

impl From<HandlerKind> for &'static str {
    fn from(kind: HandlerKind) -> Self {
        kind.type_name()
    }
}

impl TryFrom<String> for HandlerKind {
    type Error = String;

    fn try_from(name: String) -> Result<Self, String> {
        HandlerKind::from_type(&name).ok_or_else(|| format!("`{name}` is no handler type"))
    }
}

/// One kind's row of [`KINDS`].
#[derive(Debug)]
pub struct KindSpec {
    pub kind: HandlerKind,
    /// The name `type=` takes, and the engine's handler registry uses.
    pub type_name: &'static str,
    /// The shape that selects this kind.
    pub shape: &'static str,
    /// Attributes that apply to this kind, besides [`COMMON_ATTRIBUTES`].
    pub attributes: &'static [&'static str],
    /// The engine runs nodes of this kind itself (they contain other stages); no handler is registered.
    pub engine_runs: bool,
}

/// Attributes every node takes.
pub const COMMON_ATTRIBUTES: &[&str] = &[
    "label",
    "shape",
    "type",
    "class",
    "timeout",
    "max_visits",
    "max_retries",
    "retry_policy",
    "retry_target",
    "fallback_retry_target",
    "goal_gate",
    "auto_status",
    "allow_partial",
];

/// Attributes of agent nodes: those of every node that calls a model, then the agent loop's own.
const AGENT_ATTRIBUTES: &[&str] = &[
    "prompt",
    "reasoning_effort",
    "max_tokens",
    "fidelity",
    "thread_id",
    "model",
    "provider",
    "project_memory",
    "output_schema",
    "output_retries",
    "rules",
    "context",
    "fail_soft",
    "backend",
    "max_turns",
    "allowed_tools",
    "disallowed_tools",
    "env",
    "sandbox",
    "permissions",
    "mcp",
    "skills",
    "max_subagent_depth",
    "requires",
    "verify",
    "eval",
    "eval_policy",
    "judge_model",
    "retry",
    "tools",
    "acp_command",
];

/// Attributes of the nodes that call a model: the agent's, less the agent's own (from `backend` on:
/// the backend and its ACP command, the sandbox, the permissions, the MCP servers, the skills, the
/// sub-agents, SWEny's pre-condition, post-conditions, retries and tool filter, and the loop's
/// settings).
const LLM_ATTRIBUTES: &[&str] = AGENT_ATTRIBUTES
    .split_at(AGENT_ATTRIBUTES.len() - AGENT_OWN)
    .0;

/// How many of [`AGENT_ATTRIBUTES`], at its end, are the agent's own (from `backend`; a test holds
/// the count to the list).
const AGENT_OWN: usize = 18;

/// A node's shape: the name in [`KINDS`] when it is one of theirs (shared, not copied).
pub type Shape = std::borrow::Cow<'static, str>;

/// The one table of node kinds: lowering resolves `type` and `shape` through it, the
/// `unknown-attribute` rule judges attributes by it, and the engine registers handlers by its kinds.
#[rustfmt::skip]
pub const KINDS: &[KindSpec] = &[
    KindSpec { kind: HandlerKind::Start, type_name: "start", shape: "Mdiamond", attributes: &[], engine_runs: false },
    KindSpec { kind: HandlerKind::Exit, type_name: "exit", shape: "Msquare", attributes: &[], engine_runs: false },
    KindSpec { kind: HandlerKind::Agent, type_name: "agent", shape: "box", attributes: AGENT_ATTRIBUTES, engine_runs: false },
    KindSpec { kind: HandlerKind::Prompt, type_name: "prompt", shape: "tab", attributes: LLM_ATTRIBUTES, engine_runs: false },
    KindSpec { kind: HandlerKind::Command, type_name: "command", shape: "parallelogram", attributes: &["script", "language", "env", "capture_artifacts", "sandbox"], engine_runs: false },
    KindSpec { kind: HandlerKind::Human, type_name: "human", shape: "hexagon", attributes: &["human.default_choice"], engine_runs: false },
    KindSpec { kind: HandlerKind::Conditional, type_name: "conditional", shape: "diamond", attributes: &[], engine_runs: false },
    KindSpec { kind: HandlerKind::Parallel, type_name: "parallel", shape: "component", attributes: &["join_policy", "error_policy", "max_parallel"], engine_runs: true },
    KindSpec { kind: HandlerKind::FanIn, type_name: "parallel.fan_in", shape: "tripleoctagon", attributes: LLM_ATTRIBUTES, engine_runs: false },
    KindSpec { kind: HandlerKind::Wait, type_name: "wait", shape: "insulator", attributes: &["duration"], engine_runs: false },
    KindSpec { kind: HandlerKind::SubWorkflow, type_name: "stack.manager_loop", shape: "house", attributes: &["workflow"], engine_runs: true },
];

/// Older or alternative names for handler types.
pub const HANDLER_ALIASES: &[(&str, &str)] = &[
    ("codergen", "agent"),
    ("wait.human", "human"),
    ("tool", "command"),
    ("fan_in", "parallel.fan_in"),
    ("subworkflow", "stack.manager_loop"),
];

impl HandlerKind {
    /// This kind's row of [`KINDS`].
    pub fn spec(self) -> &'static KindSpec {
        KINDS
            .iter()
            .find(|spec| spec.kind == self)
            .expect("every kind has a row in KINDS")
    }

    /// The `type` name (`agent`, `parallel.fan_in`, ...).
    pub fn type_name(self) -> &'static str {
        self.spec().type_name
    }

    /// The kind a `type` name (or one of its aliases) names.
    pub fn from_type(name: &str) -> Option<Self> {
        let name = HANDLER_ALIASES
            .iter()
            .find(|(alias, _)| *alias == name)
            .map_or(name, |(_, to)| *to);
        KINDS.iter().find(|s| s.type_name == name).map(|s| s.kind)
    }

    /// The kind a shape selects.
    pub fn from_shape(shape: &str) -> Option<Self> {
        KINDS.iter().find(|s| s.shape == shape).map(|s| s.kind)
    }
}

impl NodeKind {
    /// The node's kind, without its configuration.
    pub fn handler_kind(&self) -> HandlerKind {
        match self {
            NodeKind::Start => HandlerKind::Start,
            NodeKind::Exit => HandlerKind::Exit,
            NodeKind::Agent(_) => HandlerKind::Agent,
            NodeKind::Prompt(_) => HandlerKind::Prompt,
            NodeKind::Command(_) => HandlerKind::Command,
            NodeKind::Human(_) => HandlerKind::Human,
            NodeKind::Conditional => HandlerKind::Conditional,
            NodeKind::Parallel(_) => HandlerKind::Parallel,
            NodeKind::FanIn(_) => HandlerKind::FanIn,
            NodeKind::Wait(_) => HandlerKind::Wait,
            NodeKind::SubWorkflow(_) => HandlerKind::SubWorkflow,
        }
    }

    /// The handler type name (`agent`, `parallel.fan_in`, ...).
    pub fn type_name(&self) -> &'static str {
        self.handler_kind().type_name()
    }

    /// The LLM settings of nodes that call a model.
    pub fn llm(&self) -> Option<&LlmConfig> {
        match self {
            NodeKind::Agent(c) | NodeKind::Prompt(c) => Some(c),
            NodeKind::FanIn(f) => f.llm.as_deref(),
            _ => None,
        }
    }

    pub fn llm_mut(&mut self) -> Option<&mut LlmConfig> {
        match self {
            NodeKind::Agent(c) | NodeKind::Prompt(c) => Some(c),
            NodeKind::FanIn(f) => f.llm.as_deref_mut(),
            _ => None,
        }
    }
}

/// Settings of agent, prompt and prompted fan-in nodes.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LlmConfig {
    /// The prompt after `@file` loading and `$goal` expansion; empty when the node has none.
    pub prompt: String,
    /// The file the prompt came from, for `@path` prompts.
    pub prompt_file: Option<PathBuf>,
    pub model: Option<String>,
    pub provider: Option<String>,
    /// As the node (or the stylesheet) gives it; [`LlmConfig::effort`] is what applies.
    pub reasoning_effort: Option<ReasoningEffort>,
    pub max_tokens: Option<u32>,
    pub fidelity: Option<Fidelity>,
    pub thread_id: Option<String>,
    pub project_memory: bool,
    pub backend: Backend,
    /// The command that starts the node's Agent Client Protocol agent (`backend="acp"`); its CLI's
    /// default ([`AgentCli::acp_command`]) when none is set.
    pub acp_command: Option<String>,
    pub output_schema: Option<OutputSchema>,
    /// Repair turns for invalid structured output (default 2; negative values count as 0).
    pub output_retries: u32,
    /// Agent nodes: the most turns the loop may take (`max_turns`; unlimited when absent).
    pub max_turns: Option<u32>,
    /// Agent nodes: the only tools offered (`allowed_tools`, comma-separated), when given.
    pub allowed_tools: Option<Vec<String>>,
    /// Agent nodes: tools never offered (`disallowed_tools`).
    pub disallowed_tools: Vec<String>,
    /// Agent nodes: secret variables the shell tool gets (`env`, comma-separated names).
    pub pass_env: Box<[String]>,
    /// Agent nodes: what the shell tool asks of the run's sandbox (`sandbox`, over the graph's).
    pub sandbox: SandboxPolicy,
    /// Agent nodes: which tools run without asking (`permissions`, over the graph's; `full` when
    /// neither says).
    pub permissions: Permissions,
    /// Agent nodes: the MCP servers whose tools they get (`mcp`, comma-separated names; every
    /// configured server when absent, none with `mcp=""`).
    pub mcp: Option<Vec<String>>,
    /// Agent nodes: the skills whose instructions are part of their prompt (`skills`,
    /// comma-separated names).
    pub skills: Option<Vec<String>>,
    /// Agent nodes: how deep sub-agents may nest (`max_subagent_depth`; 0 offers no sub-agent
    /// tools). The handler decides the default.
    pub max_subagent_depth: Option<u32>,
    /// Agent nodes: SWEny's checks — the pre-condition, the post-conditions and their retries.
    pub checks: crate::requires::Checks,
    /// Agent nodes: SWEny's filter of the tools skills and MCP servers give (`tools`, JSON).
    pub tool_filter: Option<crate::requires::ToolFilter>,
}

impl LlmConfig {
    /// The reasoning effort that applies: the given one, else the default.
    pub fn effort(&self) -> ReasoningEffort {
        self.reasoning_effort.unwrap_or_default()
    }
}

/// `sandbox="network=off, write=/data"`: what a command or an agent's shell asks of the run's sandbox,
/// as comma-separated items — `network=on|off`, and `write=PATH` (repeatable; `~/` is the home
/// directory) for more writable paths. A node's items apply over the graph's. Turning the sandbox off
/// is the user's decision (`trellis run --sandbox none`), never a workflow's.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SandboxPolicy {
    pub network_off: bool,
    pub writable: Box<[PathBuf]>,
}

impl SandboxPolicy {
    /// This policy with `text`'s items applied over it.
    pub fn with(mut self, text: &str) -> Result<Self, String> {
        let mut writable = std::mem::take(&mut self.writable).into_vec();
        for item in text.split(',').map(str::trim).filter(|i| !i.is_empty()) {
            let (key, value) = item
                .split_once('=')
                .map_or((item, ""), |(k, v)| (k.trim(), v.trim()));
            match (key, value) {
                ("network", "off" | "false") => self.network_off = true,
                ("network", "on" | "true") => self.network_off = false,
                ("write", path) if !path.is_empty() => writable.push(expand_home(path)),
                ("none" | "off", _) => {
                    return Err("a workflow cannot turn the sandbox off; the user does, with `trellis run --sandbox none`".to_owned());
                }
                _ => {
                    return Err(format!(
                        "unknown sandbox item `{item}`: use network=on|off and write=PATH"
                    ));
                }
            }
        }
        self.writable = writable.into_boxed_slice();
        Ok(self)
    }
}

impl FromStr for SandboxPolicy {
    type Err = String;
    fn from_str(text: &str) -> Result<Self, String> {
        Self::default().with(text)
    }
}

/// `~/x` as a path under the home directory; anything else as written.
fn expand_home(path: &str) -> PathBuf {
    match (path.strip_prefix("~/"), std::env::var_os("HOME")) {
        (Some(rest), Some(home)) => PathBuf::from(home).join(rest),
        _ => PathBuf::from(path),
    }
}

/// `output_schema`: the built-in routing schema or a JSON Schema loaded from a file.
#[derive(Debug, Clone, PartialEq)]
pub enum OutputSchema {
    Routing,
    JsonSchema {
        path: Option<PathBuf>,
        schema: serde_json::Value,
    },
}

#[derive(Debug, Clone, PartialEq)]
pub struct CommandConfig {
    pub script: String,
    pub language: ScriptLanguage,
    /// What the command asks of the run's sandbox (`sandbox`, over the graph's).
    pub sandbox: SandboxPolicy,
    /// Secret variables the command gets (`env`, comma-separated names); others are withheld.
    pub pass_env: Box<[String]>,
    /// Whether test artifacts the command writes are copied into the run record
    /// (`capture_artifacts`, on the node or the graph; default true).
    pub capture_artifacts: bool,
}

#[derive(Debug, Clone, PartialEq, Default)]
pub struct HumanConfig {
    /// The option taken when `timeout` runs out (`human.default_choice`).
    pub default_choice: Option<String>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct ParallelConfig {
    pub join_policy: JoinPolicy,
    pub error_policy: ErrorPolicy,
    pub max_parallel: u32,
    /// The fan-in node the branches meet at, resolved once at compile time (none if they never do).
    pub fan_in: Option<crate::workflow::NodeIndex>,
}

#[derive(Debug, Clone, PartialEq, Default)]
pub struct FanInConfig {
    /// Present when the fan-in has a prompt: a model picks the best branch.
    pub llm: Option<Box<LlmConfig>>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct WaitConfig {
    pub duration: Duration,
}

#[derive(Debug, Clone, PartialEq)]
pub struct SubWorkflowConfig {
    /// The child workflow file, resolved against the parent's directory.
    pub workflow: PathBuf,
}

/// Declares a small enum parsed from fixed words, with its `FromStr`, `Display` and word list.
macro_rules! word_enum {
    ($(#[$meta:meta])* $name:ident { $($variant:ident = $word:literal),+ $(,)? }) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum $name { $($variant),+ }

        impl Default for $name {
            /// The first word listed.
            fn default() -> Self {
                [$($name::$variant),+][0]
            }
        }

        impl $name {
            pub const WORDS: &'static [&'static str] = &[$($word),+];

            pub fn as_str(self) -> &'static str {
                match self { $($name::$variant => $word),+ }
            }
        }

        impl FromStr for $name {
            type Err = ();
            fn from_str(s: &str) -> Result<Self, ()> {
                match s.trim() { $($word => Ok($name::$variant),)+ _ => Err(()) }
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }

        /// Written as its word.
        impl serde::Serialize for $name {
            fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                serializer.serialize_str(self.as_str())
            }
        }

        impl<'de> serde::Deserialize<'de> for $name {
            fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                let word = String::deserialize(deserializer)?;
                word.parse().map_err(|()| {
                    serde::de::Error::custom(format!(
                        "`{word}` is not one of {}",
                        Self::WORDS.join(", ")
                    ))
                })
            }
        }
    };
}

word_enum! {
    /// How much prior context a model node sees (`fidelity`; default `compact`, the first word).
    Fidelity {
        Compact = "compact",
        Full = "full",
        SummaryHigh = "summary:high",
        SummaryMedium = "summary:medium",
        SummaryLow = "summary:low",
        Truncate = "truncate",
    }
}

word_enum! {
    /// `reasoning_effort` (default `high`, the first word).
    ReasoningEffort { High = "high", Medium = "medium", Low = "low" }
}

word_enum! {
    /// What an agent's tools may do without asking a person (`permissions`, Fabro's levels; default
    /// `full`, the first word: in a workflow the workflow and its sandbox are the trust boundary).
    /// `read-write` asks before `shell` and any tool it does not know; `read-only` also before
    /// writing files. Reading, searching and listing are always allowed.
    Permissions { Full = "full", ReadWrite = "read-write", ReadOnly = "read-only" }
}

word_enum! {
    /// Agent execution backend (default `api`).
    Backend { Api = "api", Cli = "cli", Acp = "acp" }
}

/// The providers a node's `provider` and the graph's `default_provider` name (`trellis-run` checks
/// the model client has exactly these, and reads each of [`PROVIDER_ALIASES`] as one of them).
pub const PROVIDERS: &[&str] = &[
    "anthropic",
    "openai",
    "gemini",
    "openai-compatible",
    "local",
];

/// The other names of [`PROVIDERS`].
pub const PROVIDER_ALIASES: &[&str] = &[
    "claude",
    "google",
    "openai_compatible",
    "compatible",
    "llama",
    "llama.cpp",
    "llama-server",
];

/// The built-in agent's tools, as `allowed_tools` and `disallowed_tools` name them: its own (the
/// last four offered only when `allowed_tools` names them), then the sub-agent tools
/// (`trellis-handlers` checks the agent offers exactly these).
pub const AGENT_TOOLS: &[&str] = &[
    "read_file",
    "write_file",
    "edit_file",
    "shell",
    "grep",
    "glob",
    "list_dir",
    "read_many_files",
    "web_fetch",
    "web_search",
    "apply_patch",
    "spawn_agent",
    "send_input",
    "wait",
    "close_agent",
];

/// Agent-node attributes an agent that runs a session of its own (a CLI's, an ACP agent's) may not
/// honour; the CLIs that honour the last two (or the last one) say so in [`AgentCli::unhonoured`].
const SESSION_AGENT_ATTRIBUTES: &[&str] = &[
    "tools",
    "max_subagent_depth",
    "permissions",
    "mcp",
    "skills",
    "allowed_tools",
    "disallowed_tools",
    "max_tokens",
    "thread_id",
    "max_turns",
    "reasoning_effort",
];

word_enum! {
    /// The coding-agent CLI a `backend="cli"` agent node runs, chosen by its provider (see
    /// [`AgentCli::for_node`]).
    AgentCli { Claude = "claude", Codex = "codex", Gemini = "gemini" }
}

impl AgentCli {
    /// The product a user installs, for messages.
    pub fn product(self) -> &'static str {
        match self {
            AgentCli::Claude => "Claude Code",
            AgentCli::Codex => "Codex CLI",
            AgentCli::Gemini => "Gemini CLI",
        }
    }

    /// The command that starts the agent as an Agent Client Protocol server (`backend="acp"`, when
    /// the node sets no `acp_command`): Zed's adapters for Claude Code and Codex, Gemini CLI's own
    /// mode.
    pub fn acp_command(self) -> &'static str {
        match self {
            AgentCli::Claude => "npx -y @zed-industries/claude-code-acp",
            AgentCli::Codex => "npx -y @zed-industries/codex-acp",
            AgentCli::Gemini => "gemini --experimental-acp",
        }
    }

    /// The provider whose models the CLI runs.
    pub fn provider(self) -> &'static str {
        match self {
            AgentCli::Claude => "anthropic",
            AgentCli::Codex => "openai",
            AgentCli::Gemini => "gemini",
        }
    }

    /// The CLI for an agent node: by its `provider` (`anthropic`/`claude`, `openai`/`codex`,
    /// `gemini`/`google`), else by its model's name (`claude-*`, `sonnet`, `opus`, `haiku`; `gpt-*`,
    /// `o1`-`o4`, `codex-*`; `gemini-*`), else Claude Code. A provider with no CLI is an error.
    pub fn for_node(llm: &LlmConfig) -> Result<AgentCli, String> {
        if let Some(provider) = llm.provider.as_deref() {
            return match provider.trim().to_ascii_lowercase().as_str() {
                "anthropic" | "claude" => Ok(AgentCli::Claude),
                "openai" | "codex" => Ok(AgentCli::Codex),
                "gemini" | "google" => Ok(AgentCli::Gemini),
                other => Err(format!(
                    "provider `{other}` has no agent CLI: backend=\"cli\" runs claude (provider anthropic), codex (openai) or gemini (gemini)"
                )),
            };
        }
        let model = llm
            .model
            .as_deref()
            .unwrap_or_default()
            .trim()
            .to_ascii_lowercase();
        let starts = |prefixes: &[&str]| prefixes.iter().any(|p| model.starts_with(p));
        Ok(if starts(&["gpt", "o1", "o3", "o4", "codex", "chatgpt"]) {
            AgentCli::Codex
        } else if starts(&["gemini"]) {
            AgentCli::Gemini
        } else {
            AgentCli::Claude
        })
    }

    /// Agent-node attributes this CLI cannot honour when set on the node: permissions (every CLI runs
    /// with its own prompts turned off), tool narrowing and the
    /// per-turn token limit (every CLI chooses its own tools and limits), threads (each stage is a new
    /// CLI session), and the turn limit and reasoning effort where the CLI has no flag for them.
    pub fn unhonoured(self) -> &'static [&'static str] {
        let honoured_at_end = match self {
            AgentCli::Claude => 2,
            AgentCli::Codex => 1,
            AgentCli::Gemini => 0,
        };
        &SESSION_AGENT_ATTRIBUTES[..SESSION_AGENT_ATTRIBUTES.len() - honoured_at_end]
    }

    /// Agent-node attributes an ACP agent (`backend="acp"`) is not told about: those a CLI ignores,
    /// less `permissions` (its permission requests and the files and terminals Trellis serves it
    /// follow them) and `mcp` (the servers of its session).
    pub fn acp_unhonoured() -> impl Iterator<Item = &'static str> {
        SESSION_AGENT_ATTRIBUTES
            .iter()
            .copied()
            .filter(|a| !matches!(*a, "permissions" | "mcp"))
    }
}

word_enum! {
    /// The language of a command node's script.
    ScriptLanguage { Shell = "shell", Python = "python" }
}

word_enum! {
    /// How parallel branch failures are handled.
    ErrorPolicy { Continue = "continue", FailFast = "fail_fast", Ignore = "ignore" }
}

word_enum! {
    /// Named retry presets.
    RetryPreset { None = "none", Standard = "standard", Aggressive = "aggressive", Linear = "linear", Patient = "patient" }
}

/// A retry schedule: attempts and backoff (DESIGN.md §3). Delays are capped at 60 s, with jitter.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RetryPolicy {
    pub preset: RetryPreset,
    pub max_attempts: u32,
    pub initial_delay: Duration,
    pub backoff_factor: f64,
}

impl RetryPolicy {
    pub const MAX_DELAY: Duration = Duration::from_mins(1);

    pub fn preset(preset: RetryPreset) -> Self {
        let (max_attempts, initial_ms, backoff_factor) = match preset {
            RetryPreset::None => (1, 0, 1.0),
            RetryPreset::Standard => (5, 5000, 2.0),
            RetryPreset::Aggressive => (5, 500, 2.0),
            RetryPreset::Linear => (3, 500, 1.0),
            RetryPreset::Patient => (3, 2000, 3.0),
        };
        Self {
            preset,
            max_attempts,
            initial_delay: Duration::from_millis(initial_ms),
            backoff_factor,
        }
    }
}

/// When a fan-in may proceed. Written as in the workflow (`k_of_n(2)`).
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(into = "String", try_from = "String")]
pub enum JoinPolicy {
    WaitAll,
    FirstSuccess,
    /// At least N branches succeeded.
    KOfN(u32),
    /// At least this fraction (0 < F ≤ 1) of branches succeeded.
    Quorum(f64),
}

impl JoinPolicy {
    pub const FORMS: &'static str = "wait_all, first_success, k_of_n(N), quorum(F)";
}

impl FromStr for JoinPolicy {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let s = s.trim();
        let argument = |name: &str| {
            s.strip_prefix(name)
                .and_then(|r| r.strip_prefix('('))
                .and_then(|r| r.strip_suffix(')'))
        };
        match s {
            "wait_all" => return Ok(JoinPolicy::WaitAll),
            "first_success" => return Ok(JoinPolicy::FirstSuccess),
            _ => {}
        }
        if let Some(n) = argument("k_of_n") {
            return match n.trim().parse::<u32>() {
                Ok(n) if n >= 1 => Ok(JoinPolicy::KOfN(n)),
                _ => Err(format!(
                    "k_of_n needs a whole number of branches of at least 1, found `{n}`"
                )),
            };
        }
        if let Some(f) = argument("quorum") {
            return match f.trim().parse::<f64>() {
                Ok(f) if f > 0.0 && f <= 1.0 => Ok(JoinPolicy::Quorum(f)),
                _ => Err(format!(
                    "quorum needs a fraction of branches in (0, 1], found `{f}`"
                )),
            };
        }
        Err(format!("unknown join policy `{s}`"))
    }
}

impl From<JoinPolicy> for String {
    fn from(policy: JoinPolicy) -> Self {
        policy.to_string()
    }
}

impl TryFrom<String> for JoinPolicy {
    type Error = String;

    fn try_from(text: String) -> Result<Self, String> {
        text.parse()
    }
}

impl fmt::Display for JoinPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            JoinPolicy::WaitAll => f.write_str("wait_all"),
            JoinPolicy::FirstSuccess => f.write_str("first_success"),
            JoinPolicy::KOfN(n) => write!(f, "k_of_n({n})"),
            JoinPolicy::Quorum(q) => write!(f, "quorum({q})"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_agents_own_attributes_start_at_backend() {
        assert_eq!(
            AGENT_ATTRIBUTES[AGENT_ATTRIBUTES.len() - AGENT_OWN],
            "backend"
        );
        assert!(!LLM_ATTRIBUTES.contains(&"acp_command"));
        assert!(LLM_ATTRIBUTES.contains(&"fail_soft"));
    }

    #[test]
    fn join_policies_parse() {
        assert_eq!("wait_all".parse(), Ok(JoinPolicy::WaitAll));
        assert_eq!("k_of_n(2)".parse(), Ok(JoinPolicy::KOfN(2)));
        assert_eq!("quorum(0.5)".parse(), Ok(JoinPolicy::Quorum(0.5)));
        assert!("k_of_n(0)".parse::<JoinPolicy>().is_err());
        assert!("quorum(2)".parse::<JoinPolicy>().is_err());
        assert!("majority".parse::<JoinPolicy>().is_err());
    }

    #[test]
    fn every_kind_has_one_row_and_a_shape_of_its_own() {
        for spec in KINDS {
            assert_eq!(spec.kind.spec().type_name, spec.type_name);
            assert_eq!(HandlerKind::from_shape(spec.shape), Some(spec.kind));
            assert_eq!(HandlerKind::from_type(spec.type_name), Some(spec.kind));
        }
        assert_eq!(HandlerKind::from_type("codergen"), Some(HandlerKind::Agent));
    }

    #[test]
    fn fidelity_words() {
        assert_eq!("summary:high".parse(), Ok(Fidelity::SummaryHigh));
        assert!("summary".parse::<Fidelity>().is_err());
    }

    #[test]
    fn retry_presets_follow_the_design() {
        let standard = RetryPolicy::preset(RetryPreset::Standard);
        assert_eq!(
            (standard.max_attempts, standard.initial_delay),
            (5, Duration::from_secs(5))
        );
        assert_eq!(RetryPolicy::preset(RetryPreset::None).max_attempts, 1);
        assert!(
            (RetryPolicy::preset(RetryPreset::Patient).backoff_factor - 3.0).abs() < f64::EPSILON
        );
    }
}
