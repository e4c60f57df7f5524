//! Run configuration files: Fabro's `run.toml`, which bundles a workflow with its goal, inputs, model,
//! environment, prepare steps, hooks and MCP servers (`trellis run run.toml`).
//!
//! Version 1 in both spellings Fabro has used: `_version` or `version`, `[workflow] graph` or `graph`,
//! `[run] goal` or `goal`, `[run.inputs]` or `[vars]`, `[run.agent.mcps.NAME]` or `[mcp_servers.NAME]`,
//! `[[run.hooks]]` or `[[hooks]]`. Paths are relative to the file's directory. What Trellis does not do
//! (a Daytona or Docker sandbox, pull requests) is a warning that says what it does instead; an
//! unknown key is a warning naming it, never silently read.

#![allow(
    clippy::disallowed_methods,
    reason = "a run file is read once, before the run starts"
)]

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use trellis_handlers::hooks::HookSpec;
use trellis_workflow::mcp_config::{self, ServerConfig};

/// How bad a problem in a run file is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Severity {
    Error,
    Warning,
}

/// One problem in a run file, said with the key it is about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    pub severity: Severity,
    pub message: String,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let word = match self.severity {
            Severity::Error => "error",
            Severity::Warning => "warning",
        };
        write!(f, "{word}: {}", self.message)
    }
}

/// One prepare step: a shell script or a program with its arguments, with variables of its own.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PrepareStep {
    /// `sh -c SCRIPT`, or the program and its arguments.
    pub argv: Vec<String>,
    /// As written in the file (for the record and messages).
    pub shown: String,
    pub env: BTreeMap<String, String>,
}

/// A run file, read and checked.
#[derive(Debug, Clone, Default)]
pub struct RunFile {
    /// The file.
    pub path: PathBuf,
    /// Its text as read.
    pub text: String,
    /// The workflow it runs.
    pub graph: PathBuf,
    pub goal: Option<String>,
    /// Where stages run (`[run] working_dir`).
    pub work_dir: Option<PathBuf>,
    /// Template inputs, as text (`[run.inputs]`).
    pub inputs: BTreeMap<String, String>,
    /// The same inputs as typed values (the run's `input` in the context).
    pub input_values: serde_json::Map<String, serde_json::Value>,
    /// `[run.model]`.
    pub model: Option<String>,
    pub provider: Option<String>,
    pub fallbacks: Vec<String>,
    /// `[[run.prepare.steps]]`, run before the first stage.
    pub prepare: Vec<PrepareStep>,
    /// `[run.sandbox.env]`, resolved from the caller's environment.
    pub env: BTreeMap<String, String>,
    /// Every stage's network is cut: the provider's network setting says so (Docker's
    /// `network_mode = "none"`, Daytona's `network = "block"` or an allow list).
    pub network_off: bool,
    /// `[run.checkpoint] exclude_globs`.
    pub exclude_globs: Vec<String>,
    /// `[run.artifacts] include`.
    pub artifacts: Vec<String>,
    /// `[mcp_servers.*]`, then `[run.agent.mcps.*]` (a later one wins a name).
    pub mcp_servers: Vec<(String, trellis_workflow::mcp_config::ServerConfig)>,
    /// `[[run.hooks]]` and `[[hooks]]`.
    pub hooks: Vec<HookSpec>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct Document {
    #[serde(rename = "_version")]
    underscore_version: Option<toml::Value>,
    version: Option<toml::Value>,
    graph: Option<String>,
    goal: Option<String>,
    workflow: Option<WorkflowSection>,
    run: Option<RunSection>,
    vars: Option<BTreeMap<String, toml::Value>>,
    hooks: Vec<HookSpec>,
    mcp_servers: BTreeMap<String, toml::Value>,
    // Fabro's other settings tables: they configure Fabro itself.
    project: Option<toml::Value>,
    cli: Option<toml::Value>,
    server: Option<toml::Value>,
    features: Option<toml::Value>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct WorkflowSection {
    graph: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct RunSection {
    goal: Option<String>,
    working_dir: Option<String>,
    model: Option<ModelSection>,
    prepare: Option<PrepareSection>,
    sandbox: Option<SandboxSection>,
    checkpoint: Option<CheckpointSection>,
    inputs: Option<BTreeMap<String, toml::Value>>,
    artifacts: Option<ArtifactsSection>,
    agent: Option<AgentSection>,
    pull_request: Option<toml::Value>,
    hooks: Vec<HookSpec>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct ModelSection {
    name: Option<String>,
    provider: Option<String>,
    fallbacks: Vec<String>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct PrepareSection {
    steps: Vec<StepSection>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct StepSection {
    script: Option<String>,
    command: Option<Vec<String>>,
    env: BTreeMap<String, String>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct SandboxSection {
    provider: Option<String>,
    preserve: Option<bool>,
    devcontainer: Option<bool>,
    docker: Option<toml::Value>,
    daytona: Option<toml::Value>,
    local: Option<toml::Value>,
    env: BTreeMap<String, String>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct CheckpointSection {
    exclude_globs: Vec<String>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct ArtifactsSection {
    include: Vec<String>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct AgentSection {
    mcps: BTreeMap<String, toml::Value>,
}

/// A workflow opened to run or validate: from a workflow file, or from a run file naming one.
pub struct Opened {
    pub loaded: crate::Loaded,
    /// The run file, when one was given.
    pub run_file: Option<RunFile>,
    /// The run file's warnings.
    pub warnings: Vec<Problem>,
    /// The inputs the workflow was compiled with (the run file's, then `options.inputs` over them).
    pub inputs: BTreeMap<String, String>,
}

/// Opens `path` — a workflow, or a run file (`.toml`) — and compiles the workflow. For a run file,
/// its goal, inputs and model apply under `options` (a `--goal` wins over the file's goal, and
/// `--input` values over its inputs of the same name), and its graph is compiled with references
/// resolving beside it. A run file with errors is [`crate::RunError::RunFile`].
pub fn open_blocking(
    path: &Path,
    options: trellis_workflow::CompileOptions,
) -> Result<Opened, crate::RunError> {
    if !is_run_file(path) {
        let inputs = options.inputs.clone();
        return Ok(Opened {
            loaded: crate::load_blocking(path, path, options)?,
            run_file: None,
            warnings: Vec::new(),
            inputs,
        });
    }
    let (file, problems) = RunFile::load(path, &|name| std::env::var(name).ok());
    let Some(file) = file else {
        return Err(crate::RunError::RunFile {
            problems: problems
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join("\n"),
        });
    };
    let mut inputs = file.inputs.clone();
    inputs.extend(options.inputs);
    let options = trellis_workflow::CompileOptions {
        goal: options.goal.or_else(|| file.goal.clone()),
        inputs: inputs.clone(),
        model: options.model.or_else(|| file.model.clone()),
        ..options
    };
    let loaded = crate::load_blocking(&file.graph, &file.graph, options)?;
    Ok(Opened {
        loaded,
        run_file: Some(file),
        warnings: problems,
        inputs,
    })
}

/// Where a project's Fabro settings are, in its working directory: Trellis runs their hooks.
pub const PROJECT_FILE: &str = ".fabro/project.toml";

/// A project's `.fabro/project.toml`, understood in one place: the hooks Trellis runs (its `[[hooks]]` and
/// `[[run.hooks]]`, merged with the config file's and the run file's), and the settings it does not
/// apply, which are named in a warning rather than silently passed over.
#[derive(Debug)]
pub struct ProjectFile {
    /// Where it is.
    pub path: PathBuf,
    /// Its hooks, `[[hooks]]` then `[[run.hooks]]`.
    pub hooks: Vec<HookSpec>,
    /// The keys it sets that Trellis does not apply (`run.goal`, `vars`, ...).
    unused: Vec<String>,
}

impl ProjectFile {
    /// The project file in `work_dir`, or `None` when there is none. An error (naming the file)
    /// when it cannot be read or is not TOML, or when one of its hooks asks to run outside the
    /// sandbox: a file in the working directory is anyone's to write (a stage's, a cloned
    /// repository's), so its hooks run confined, whatever they say.
    pub fn read(work_dir: &Path) -> Result<Option<Self>, String> {
        #[derive(Deserialize)]
        struct Layout {
            #[serde(default)]
            hooks: Vec<HookSpec>,
            #[serde(default)]
            run: RunPart,
        }
        #[derive(Deserialize, Default)]
        #[serde(expecting = "a table (`[run]`)")]
        struct RunPart {
            #[serde(default)]
            hooks: Vec<HookSpec>,
        }
        let path = work_dir.join(PROJECT_FILE);
        let text = match trellis_syntax::read_found_text(&path, work_dir) {
            Ok(text) => text,
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::NotFound | std::io::ErrorKind::NotADirectory
                ) =>
            {
                return Ok(None);
            }
            // Its hooks would silently not run. A link out of the project may be the user's own:
            // say where such hooks go.
            Err(e) => {
                let hint = if e.kind() == std::io::ErrorKind::PermissionDenied {
                    "; hooks of your own go in your config file or a run file you name"
                } else {
                    ""
                };
                return Err(format!("{}: cannot read it: {e}{hint}", path.display()));
            }
        };
        let fail = |problem: String| format!("{}: {problem}", path.display());
        let layout: Layout = toml::from_str(&text).map_err(|e| fail(e.to_string()))?;
        let table: toml::Table = toml::from_str(&text).map_err(|e| fail(e.to_string()))?;
        let hooks: Vec<HookSpec> = layout.hooks.into_iter().chain(layout.run.hooks).collect();
        let mut unused = Vec::new();
        for (key, value) in &table {
            match (key.as_str(), value) {
                ("hooks" | "_version" | "version", _) => {}
                ("run", toml::Value::Table(run)) => unused.extend(
                    run.keys()
                        .filter(|k| *k != "hooks")
                        .map(|k| format!("run.{k}")),
                ),
                _ => unused.push(key.clone()),
            }
        }
        if let Some(hook) = hooks.iter().find(|h| h.sandbox == Some(false)) {
            return Err(fail(format!(
                "hook `{}` asks to run outside the sandbox (`sandbox = false`); only the hooks of your config file and of a run file you name may",
                hook.shown_name()
            )));
        }
        Ok(Some(Self {
            path,
            hooks,
            unused,
        }))
    }

    /// A warning naming the settings Trellis does not apply, if it sets any.
    pub fn warnings(&self) -> Vec<Problem> {
        if self.unused.is_empty() {
            return Vec::new();
        }
        vec![warning(format!(
            "{}: Trellis reads only a project file's hooks; {} not applied (put run settings in a run file)",
            self.path.display(),
            self.unused
                .iter()
                .map(|k| format!("`{k}`"))
                .collect::<Vec<_>>()
                .join(", ")
                + if self.unused.len() == 1 {
                    " is"
                } else {
                    " are"
                }
        ))]
    }
}

/// Whether a path names a run file (by its extension).
pub fn is_run_file(path: &Path) -> bool {
    path.extension().is_some_and(|e| e == "toml")
}

impl RunFile {
    /// Reads and checks the run file at `path`; `env` reads the caller's environment (for
    /// `{{ env.NAME }}`). `None` when it has errors (all of them are in the problems).
    pub fn load(
        path: &Path,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> (Option<RunFile>, Vec<Problem>) {
        match trellis_syntax::read_text(path) {
            Ok(text) => Self::parse(path, text, env),
            Err(e) => (
                None,
                vec![Problem {
                    severity: Severity::Error,
                    message: format!("cannot read the run file {}: {e}", path.display()),
                }],
            ),
        }
    }

    /// Checks the text of a run file placed at `path` (relative paths resolve beside it).
    pub fn parse(
        path: &Path,
        text: String,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> (Option<RunFile>, Vec<Problem>) {
        let name = path.display().to_string();
        let mut problems = Vec::new();
        let mut unknown = Vec::new();
        let document: Document = match toml::Deserializer::parse(&text)
            .map_err(|e| e.to_string())
            .and_then(|de| {
                // Paths through an `Option` say `?`: the key is the same without it.
                serde_ignored::deserialize(de, |key| {
                    unknown.push(key.to_string().replace(".?", "").replace("?.", ""));
                })
                .map_err(|e: toml::de::Error| e.to_string())
            }) {
            Ok(document) => document,
            Err(e) => {
                problems.push(Problem {
                    severity: Severity::Error,
                    message: format!("{name} is not a valid run file: {}", e.trim_end()),
                });
                return (None, problems);
            }
        };
        if let Ok(table) = toml::from_str::<toml::Table>(&text) {
            register_secrets(&table);
        }
        for key in unknown {
            problems.push(warning(format!(
                "{name}: unknown key `{key}` is ignored (Trellis reads Fabro's run file version 1)"
            )));
        }
        let mut check = Check {
            name: &name,
            problems,
            env,
        };
        let file = check.read(path, text, document);
        let problems = check.problems;
        let valid = !problems.iter().any(|p| p.severity == Severity::Error);
        (valid.then_some(file), problems)
    }

    /// Sets the run-wide settings the file gives: its model and provider where the command line
    /// gave none (`--model`, `--provider`), its artifact globs and excluded paths.
    pub fn apply_to(&self, settings: &mut trellis_engine::Settings) {
        if settings.model.is_none() {
            settings.model.clone_from(&self.model);
        }
        if settings.provider.is_none() {
            settings.provider.clone_from(&self.provider);
        }
        settings.artifacts.clone_from(&self.artifacts);
        settings.exclude_globs.clone_from(&self.exclude_globs);
    }

    /// The file's text as it goes into a run record: every known secret value redacted (the file
    /// names environment variables as `{{ env.NAME }}`, which stay as written).
    pub fn recorded_text(&self) -> String {
        trellis_process::secrets::redact(&self.text).into_owned()
    }
}

/// Registers the secrets a run file writes out — a value under a secret-looking name
/// (`API_KEY = "..."`, in `[run.sandbox.env]`, an MCP server's `env`, a hook's or a server's
/// `headers`) — so they are redacted from the run record, the file's recorded copy included. Values
/// that name the environment (`{{ env.NAME }}`, `$NAME`) hold no secret themselves.
fn register_secrets(table: &toml::Table) {
    for (key, value) in table {
        match value {
            toml::Value::String(text)
                if (trellis_process::secrets::is_secret(key)
                    || key.eq_ignore_ascii_case("authorization"))
                    && !text.contains("{{")
                    && !text.contains('$') =>
            {
                trellis_process::secrets::register(key, text);
            }
            toml::Value::Table(inner) => register_secrets(inner),
            toml::Value::Array(items) => {
                for item in items {
                    if let toml::Value::Table(inner) = item {
                        register_secrets(inner);
                    }
                }
            }
            _ => {}
        }
    }
}

fn warning(message: String) -> Problem {
    Problem {
        severity: Severity::Warning,
        message,
    }
}

struct Check<'a> {
    name: &'a str,
    problems: Vec<Problem>,
    env: &'a dyn Fn(&str) -> Option<String>,
}

impl Check<'_> {
    fn error(&mut self, message: impl std::fmt::Display) {
        self.problems.push(Problem {
            severity: Severity::Error,
            message: format!("{}: {message}", self.name),
        });
    }

    fn warn(&mut self, message: impl std::fmt::Display) {
        self.problems
            .push(warning(format!("{}: {message}", self.name)));
    }

    fn read(&mut self, path: &Path, text: String, document: Document) -> RunFile {
        self.version(&document);
        let dir = path.parent().unwrap_or(Path::new("."));
        let run = document.run.unwrap_or_default();
        let graph = document
            .workflow
            .and_then(|w| w.graph)
            .or(document.graph)
            .unwrap_or_else(|| "workflow.fabro".to_owned());
        let goal = run.goal.or(document.goal);
        let inputs = match (run.inputs, document.vars) {
            (Some(inputs), Some(_)) => {
                self.warn("both `[run.inputs]` and `[vars]` are set; `[vars]` is ignored");
                inputs
            }
            (Some(inputs), None) | (None, Some(inputs)) => inputs,
            (None, None) => BTreeMap::new(),
        };
        let (inputs, input_values) = self.inputs(inputs);
        let model = run.model.unwrap_or_default();
        let mut file = RunFile {
            path: path.to_path_buf(),
            graph: dir.join(graph),
            goal,
            work_dir: run.working_dir.map(|d| dir.join(d)),
            inputs,
            input_values,
            model: model.name,
            provider: model.provider,
            fallbacks: model.fallbacks,
            prepare: self.prepare(run.prepare.unwrap_or_default()),
            exclude_globs: run.checkpoint.unwrap_or_default().exclude_globs,
            artifacts: run.artifacts.unwrap_or_default().include,
            ..RunFile::default()
        };
        if let Some(Err(problem)) = file.provider.as_deref().map(trellis_llm::known_provider) {
            self.error(format!("`[run.model] provider`: {problem}"));
        }
        if file.fallbacks.iter().any(|f| f == "...") {
            self.warn("`...` in `[run.model] fallbacks` splices in fallbacks of other layers; Trellis has none, so it is dropped");
            file.fallbacks.retain(|f| f != "...");
        }
        for glob in file.exclude_globs.iter().chain(&file.artifacts) {
            if let Err(e) = globset::Glob::new(glob) {
                self.error(format!("`{glob}` is not a valid glob: {e}"));
            }
        }
        (file.env, file.network_off) = self.sandbox(run.sandbox.unwrap_or_default());
        file.mcp_servers =
            self.mcp_servers(run.agent.unwrap_or_default().mcps, document.mcp_servers);
        if run.pull_request.is_some() {
            self.warn("`[run.pull_request]` is ignored: Trellis does not open pull requests (a command stage running `gh pr create` does)");
        }
        for (table, value) in [
            ("project", document.project),
            ("cli", document.cli),
            ("server", document.server),
            ("features", document.features),
        ] {
            if value.is_some() {
                self.warn(format!(
                    "`[{table}]` configures Fabro itself and is ignored by Trellis"
                ));
            }
        }
        file.hooks = run.hooks;
        file.hooks.extend(document.hooks);
        for (index, hook) in file.hooks.iter().enumerate() {
            if let Err(problem) = hook.check() {
                let which = hook
                    .name
                    .as_deref()
                    .or(hook.id.as_deref())
                    .map_or_else(|| format!("hook {}", index + 1), |n| format!("hook `{n}`"));
                self.error(format!("{which}: {problem}"));
            }
        }
        file.text = text;
        file
    }

    fn version(&mut self, document: &Document) {
        let version = document
            .underscore_version
            .as_ref()
            .or(document.version.as_ref());
        match version {
            None | Some(toml::Value::Integer(1)) => {}
            Some(toml::Value::String(v)) if v == "1" => {}
            Some(other) => self.error(format!(
                "version {other} is not supported: Trellis reads run files of version 1"
            )),
        }
    }

    /// Inputs as template text and as typed values.
    fn inputs(
        &mut self,
        inputs: BTreeMap<String, toml::Value>,
    ) -> (
        BTreeMap<String, String>,
        serde_json::Map<String, serde_json::Value>,
    ) {
        let mut text = BTreeMap::new();
        let mut values = serde_json::Map::new();
        for (name, value) in inputs {
            let as_text = match &value {
                toml::Value::String(s) => s.clone(),
                toml::Value::Integer(_)
                | toml::Value::Float(_)
                | toml::Value::Boolean(_)
                | toml::Value::Datetime(_) => value.to_string(),
                toml::Value::Array(_) | toml::Value::Table(_) => {
                    match serde_json::to_string(&value) {
                        Ok(json) => json,
                        Err(e) => {
                            self.error(format!("input `{name}`: {e}"));
                            continue;
                        }
                    }
                }
            };
            values.insert(
                name.clone(),
                serde_json::to_value(&value).unwrap_or(serde_json::Value::Null),
            );
            text.insert(name, as_text);
        }
        (text, values)
    }

    fn prepare(&mut self, prepare: PrepareSection) -> Vec<PrepareStep> {
        let mut steps = Vec::new();
        for (index, step) in prepare.steps.into_iter().enumerate() {
            let (argv, shown) = match (step.script, step.command) {
                (Some(script), None) => (
                    vec!["sh".to_owned(), "-c".to_owned(), script.clone()],
                    script,
                ),
                (None, Some(command)) if !command.is_empty() => {
                    let shown = command.join(" ");
                    (command, shown)
                }
                (Some(_), Some(_)) => {
                    self.error(format!(
                        "prepare step {}: give `script` or `command`, not both",
                        index + 1
                    ));
                    continue;
                }
                _ => {
                    self.error(format!(
                        "prepare step {} needs `script` (a shell command) or `command` (a program and its arguments)",
                        index + 1
                    ));
                    continue;
                }
            };
            steps.push(PrepareStep {
                argv,
                shown,
                env: step.env,
            });
        }
        steps
    }

    /// `[run.sandbox]`: the environment, resolved, and whether the stages' network is cut; the
    /// settings of providers Trellis does not run are warnings, but for their network's.
    fn sandbox(&mut self, mut sandbox: SandboxSection) -> (BTreeMap<String, String>, bool) {
        match sandbox.provider.as_deref() {
            None | Some("local") => {}
            Some(provider @ ("docker" | "daytona")) => self.warn(format!(
                "`[run.sandbox] provider = \"{provider}\"`: Trellis does not start {provider} sandboxes; the run's stages run here, in Trellis's own sandbox (bubblewrap or Landlock; `--sandbox`)"
            )),
            Some(other) => self.error(format!(
                "`[run.sandbox] provider = \"{other}\"` is not a sandbox provider (Fabro's are local, docker and daytona)"
            )),
        }
        let network_off = self.network(&mut sandbox);
        for (key, set) in [
            ("docker", sandbox.docker.is_some()),
            ("daytona", sandbox.daytona.is_some()),
            ("local", sandbox.local.is_some()),
            ("preserve", sandbox.preserve.is_some()),
            ("devcontainer", sandbox.devcontainer.is_some()),
        ] {
            if set {
                self.warn(format!(
                    "`run.sandbox.{key}` is ignored: it configures a sandbox provider Trellis does not run"
                ));
            }
        }
        let mut env = BTreeMap::new();
        for (name, value) in sandbox.env {
            match self.env_value(&value) {
                Ok(resolved) => {
                    // A value the user handed to the run from their environment is kept out of
                    // records as the environment's secrets are.
                    if value.contains("{{") && trellis_process::secrets::is_secret(&name) {
                        trellis_process::secrets::register(&name, &resolved);
                    }
                    env.insert(name, resolved);
                }
                Err(missing) => self.error(format!(
                    "`[run.sandbox.env] {name}`: `{{{{ env.{missing} }}}}` names a variable that is not set"
                )),
            }
        }
        (env, network_off)
    }

    /// Whether the provider's network setting cuts the stages' network: Docker's `network_mode`
    /// (Docker is Fabro's default provider) or Daytona's `network`, whichever provider is named.
    /// The setting is taken out of its table, so what is left there is what Trellis ignores.
    fn network(&mut self, sandbox: &mut SandboxSection) -> bool {
        let (table, provider, key) = match sandbox.provider.as_deref() {
            None | Some("docker") => (&mut sandbox.docker, "docker", "network_mode"),
            Some("daytona") => (&mut sandbox.daytona, "daytona", "network"),
            _ => return false,
        };
        let Some(toml::Value::Table(settings)) = table else {
            return false;
        };
        let Some(value) = settings.remove(key) else {
            return false;
        };
        if settings.is_empty() {
            *table = None;
        }
        let at = format!("`[run.sandbox.{provider}] {key}`");
        match (key, &value) {
            ("network_mode", toml::Value::String(mode)) => mode == "none",
            ("network", toml::Value::String(mode)) if mode == "block" => true,
            ("network", toml::Value::String(mode)) if mode == "allow_all" => false,
            ("network", toml::Value::Table(allow)) if allow.contains_key("allow_list") => {
                self.warn(format!(
                    "{at}: Trellis cannot let a stage reach only some addresses, so the run's stages get no network at all (a loopback of their own); set `network = \"allow_all\"` to give them all of it"
                ));
                true
            }
            ("network", _) => {
                self.error(format!(
                    "{at} is \"allow_all\", \"block\" or {{ allow_list = [...] }}, not {value}"
                ));
                false
            }
            _ => {
                self.error(format!("{at} is a Docker network mode, not {value}"));
                false
            }
        }
    }

    /// A value with `{{ env.NAME }}` references resolved; the name of the first unset one.
    fn env_value(&self, value: &str) -> Result<String, String> {
        let mut result = String::with_capacity(value.len());
        let mut rest = value;
        while let Some(start) = rest.find("{{") {
            result.push_str(&rest[..start]);
            let after = &rest[start + 2..];
            let Some(end) = after.find("}}") else {
                result.push_str(&rest[start..]);
                return Ok(result);
            };
            let expression = after[..end].trim();
            match expression.strip_prefix("env.") {
                Some(name) => result.push_str(&(self.env)(name).ok_or_else(|| name.to_owned())?),
                None => result.push_str(&rest[start..start + 2 + end + 2]),
            }
            rest = &after[end + 2..];
        }
        result.push_str(rest);
        Ok(result)
    }

    /// The MCP servers: `[run.agent.mcps.NAME]` (whose `command` is a list, `script` a shell
    /// command, timeouts human durations) and `[mcp_servers.NAME]`, each read as the user config
    /// file's `[mcp_servers.NAME]` is; one that cannot be used is an error.
    fn mcp_servers(
        &mut self,
        mcps: BTreeMap<String, toml::Value>,
        legacy: BTreeMap<String, toml::Value>,
    ) -> Vec<(String, ServerConfig)> {
        let mut servers = Vec::new();
        let tables = legacy
            .into_iter()
            .map(|(name, value)| (name, value, "mcp_servers"))
            .chain(
                mcps.into_iter()
                    .map(|(name, v)| (name, v, "run.agent.mcps")),
            );
        for (name, value, table_name) in tables {
            let at = format!("[{table_name}.{name}]");
            let Some(mut table) = value.as_table().cloned() else {
                self.error(format!("MCP server `{at}` must be a table"));
                continue;
            };
            if let Some(script) = table.remove("script") {
                let script = script.as_str().unwrap_or_default().to_owned();
                table.insert(
                    "command".into(),
                    toml::Value::Array(vec!["sh".into(), "-c".into(), script.into()]),
                );
            }
            for key in ["startup_timeout", "tool_timeout"] {
                if let Some(value) = table.remove(key) {
                    let text = value.as_str().unwrap_or_default();
                    match humantime::parse_duration(text) {
                        Ok(duration) => {
                            let secs = i64::try_from(duration.as_secs().max(1)).unwrap_or(i64::MAX);
                            table.insert(format!("{key}_secs"), toml::Value::Integer(secs));
                        }
                        Err(e) => self.error(format!(
                            "MCP server {at}: `{key} = \"{text}\"` is not a duration: {e}"
                        )),
                    }
                }
            }
            for (key, value) in &mut table {
                let Some(map) = value
                    .as_table_mut()
                    .filter(|_| key == "env" || key == "headers")
                else {
                    continue;
                };
                for (var, text) in map.iter_mut() {
                    let Some(s) = text.as_str() else { continue };
                    match self.env_value(s) {
                        Ok(resolved) => *text = resolved.into(),
                        Err(missing) => self.error(format!(
                            "MCP server {at} {key} `{var}`: `{{{{ env.{missing} }}}}` names a variable that is not set"
                        )),
                    }
                }
            }
            let source = format!("{} {at}", self.name);
            let server = serde_json::to_value(table)
                .map_err(|e| e.to_string())
                .and_then(|value| mcp_config::user_server(value, source));
            match server {
                Ok(config) => servers.push((name, config)),
                Err(problem) => self.error(format!("MCP server {at}: {problem}")),
            }
        }
        servers
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A workflow's `provider` is checked at validation against the workflow language's names:
    /// they are the model client's providers and other names exactly.
    #[test]
    fn the_workflow_language_names_exactly_the_clients_providers() {
        use std::collections::BTreeSet;
        use trellis_workflow::node_kind::{PROVIDER_ALIASES, PROVIDERS};
        let client: BTreeSet<&str> = trellis_llm::config::HOSTED
            .iter()
            .copied()
            .chain(["local"])
            .collect();
        assert_eq!(client, PROVIDERS.iter().copied().collect());
        let aliases: BTreeSet<&str> = trellis_llm::PROVIDER_ALIASES
            .iter()
            .map(|(a, _)| *a)
            .collect();
        assert_eq!(aliases, PROVIDER_ALIASES.iter().copied().collect());
        for name in PROVIDERS.iter().chain(PROVIDER_ALIASES) {
            assert!(trellis_llm::known_provider(name).is_ok(), "{name}");
        }
    }

    fn parse(text: &str) -> (Option<RunFile>, Vec<Problem>) {
        let env = |name: &str| (name == "MY_REGION").then(|| "eu".to_owned());
        RunFile::parse(Path::new("/p/runs/ci.toml"), text.to_owned(), &env)
    }

    #[test]
    fn both_spellings_read_the_same() {
        let (new, problems) = parse(
            "_version = 1\n[workflow]\ngraph = \"ci.fabro\"\n[run]\ngoal = \"Test\"\n[run.inputs]\nlanguage = \"rust\"\njobs = 4\n",
        );
        assert!(problems.is_empty(), "{problems:?}");
        let (old, problems) = parse(
            "version = 1\ngraph = \"ci.fabro\"\ngoal = \"Test\"\n[vars]\nlanguage = \"rust\"\njobs = 4\n",
        );
        assert!(problems.is_empty(), "{problems:?}");
        let (new, old) = (new.unwrap(), old.unwrap());
        assert_eq!(new.graph, Path::new("/p/runs/ci.fabro"));
        assert_eq!(
            (new.graph, new.goal, new.inputs.clone()),
            (old.graph, old.goal, old.inputs)
        );
        assert_eq!(new.inputs["jobs"], "4");
        assert_eq!(new.input_values["jobs"], serde_json::json!(4));
    }

    #[test]
    fn unknown_keys_and_foreign_sandboxes_are_warnings() {
        let (file, problems) = parse(
            "_version = 1\ncolour = 1\n[run]\ngaol = \"x\"\n[run.sandbox]\nprovider = \"daytona\"\n[run.sandbox.env]\nREGION = \"api.{{ env.MY_REGION }}.example\"\n[run.pull_request]\nenabled = true\n",
        );
        let text: Vec<String> = problems.iter().map(ToString::to_string).collect();
        assert!(text.iter().all(|p| p.starts_with("warning")), "{text:?}");
        assert!(text.iter().any(|p| p.contains("`colour`")), "{text:?}");
        assert!(text.iter().any(|p| p.contains("`run.gaol`")), "{text:?}");
        assert!(text.iter().any(|p| p.contains("daytona")), "{text:?}");
        assert!(text.iter().any(|p| p.contains("pull requests")), "{text:?}");
        assert_eq!(file.unwrap().env["REGION"], "api.eu.example");
    }

    /// The provider's network setting is read: Docker's (the default provider's) `network_mode`,
    /// Daytona's `network`; an allow list cuts the network too, with a warning; the rest of the
    /// table is ignored, with the usual warning.
    #[test]
    fn a_providers_network_setting_cuts_the_stages_network() {
        let network = |text: &str| {
            let (file, problems) = parse(&format!("_version = 1\n{text}"));
            let text: Vec<String> = problems.iter().map(ToString::to_string).collect();
            (file.map(|f| f.network_off), text)
        };
        assert_eq!(network("").0, Some(false));
        let (cut, said) = network("[run.sandbox.docker]\nnetwork_mode = \"none\"\n");
        assert_eq!((cut, said.len()), (Some(true), 0), "{said:?}");
        let (cut, said) =
            network("[run.sandbox.docker]\nnetwork_mode = \"bridge\"\nimage = \"x\"\n");
        assert_eq!(cut, Some(false));
        assert!(
            said[0].contains("`run.sandbox.docker` is ignored"),
            "{said:?}"
        );
        let daytona = "[run.sandbox]\nprovider = \"daytona\"\n[run.sandbox.daytona]\n";
        assert_eq!(
            network(&format!("{daytona}network = \"block\"")).0,
            Some(true)
        );
        assert_eq!(
            network(&format!("{daytona}network = \"allow_all\"")).0,
            Some(false)
        );
        let (cut, said) = network(&format!(
            "{daytona}network = {{ allow_list = [\"10.0.0.0/8\"] }}"
        ));
        assert_eq!(cut, Some(true));
        assert!(
            said.iter()
                .any(|p| p.contains("cannot let a stage reach only some addresses")),
            "{said:?}"
        );
        // The setting of a provider not named is not read.
        let (cut, _) = network(
            "[run.sandbox]\nprovider = \"daytona\"\n[run.sandbox.docker]\nnetwork_mode = \"none\"\n",
        );
        assert_eq!(cut, Some(false));
        let (cut, said) = network(&format!("{daytona}network = \"blocked\""));
        assert_eq!(cut, None);
        assert!(
            said.iter().any(|p| p.contains("`[run.sandbox.daytona] network` is \"allow_all\", \"block\" or { allow_list = [...] }, not \"blocked\"")),
            "{said:?}"
        );
        let (cut, _) = network("[run.sandbox.docker]\nnetwork_mode = 0\n");
        assert_eq!(cut, None);
    }

    #[test]
    fn errors_name_the_key() {
        let (file, problems) = parse(
            "_version = 2\n[run.sandbox.env]\nKEY = \"{{ env.NOT_SET }}\"\n[[run.prepare.steps]]\nenv = {}\n",
        );
        assert!(file.is_none());
        let text: Vec<String> = problems.iter().map(ToString::to_string).collect();
        assert!(text.iter().any(|p| p.contains("version 2")), "{text:?}");
        assert!(text.iter().any(|p| p.contains("NOT_SET")), "{text:?}");
        assert!(
            text.iter().any(|p| p.contains("prepare step 1")),
            "{text:?}"
        );
        let (_, problems) = parse("not toml [");
        assert!(
            problems[0].message.contains("not a valid run file"),
            "{problems:?}"
        );
    }

    #[test]
    fn mcp_servers_are_read_as_the_config_files_are() {
        let (file, problems) = parse(
            "[run.agent.mcps.fs]\ntype = \"stdio\"\nscript = \"serve-fs\"\nstartup_timeout = \"1m\"\n[mcp_servers.web]\ntype = \"http\"\nurl = \"https://example.com/mcp\"\n",
        );
        assert!(problems.is_empty(), "{problems:?}");
        let servers = file.unwrap().mcp_servers;
        let names: Vec<&str> = servers.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["web", "fs"]);
        let fs = &servers[1].1;
        assert_eq!(
            fs.endpoint,
            mcp_config::Endpoint::Stdio {
                command: vec!["sh".into(), "-c".into(), "serve-fs".into()],
                env: BTreeMap::new(),
            }
        );
        assert_eq!(fs.startup_timeout, std::time::Duration::from_mins(1));
        assert_eq!(fs.source, "/p/runs/ci.toml [run.agent.mcps.fs]");
    }

    #[test]
    fn an_mcp_server_that_cannot_be_used_is_an_error() {
        for (server, problem) in [
            (
                "type = \"sandbox\"\ncommand = [\"pw\"]\nport = 99999",
                "`port = 99999` is not a port (1 to 65535)",
            ),
            (
                "type = \"sandbox\"\ncommand = [\"pw\"]\nport = 0",
                "`port = 0` is not a port",
            ),
            ("type = \"sandbox\"\ncommand = [\"pw\"]", "needs `port`"),
            (
                "type = \"sandbox\"\ncommand = [\"pw\"]\nport = \"abc\"",
                "invalid type",
            ),
            ("type = \"sandbox\"\nport = 3100", "needs `command`"),
            (
                "type = \"sse\"\nurl = \"http://x\"",
                "unknown server type `sse`",
            ),
            ("comand = [\"x\"]", "unknown field `comand`"),
            (
                "type = \"http\"\nurl = \"ftp://x\"",
                "is not an http:// or https:// URL",
            ),
        ] {
            let (file, problems) = parse(&format!("[run.agent.mcps.pw]\n{server}\n"));
            assert!(file.is_none(), "{server}");
            let message = &problems[0].message;
            assert!(
                message.starts_with("/p/runs/ci.toml: MCP server [run.agent.mcps.pw]: ")
                    && message.contains(problem),
                "{server}: {message}"
            );
        }
    }
}
