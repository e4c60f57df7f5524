//! Lifecycle hooks from a run file (Fabro's `[[run.hooks]]`/`[[hooks]]`): the configuration
//! ([`HookSpec`]) and the runner the engine calls at each lifecycle point ([`RunHooks`]).
//!
//! Types: `command` (a shell command, or a program with arguments), `http` (the context sent as
//! JSON in a POST), `prompt` (one model call that answers `{"ok": true}` or
//! `{"ok": false, "reason": ...}`), `agent` (a session with the built-in tools in the run's working
//! directory and sandbox, that looks before it answers so, within `max_tool_rounds`).
//! A hook whose `matcher` (a regular expression) matches none of the point's fields (the node id and
//! handler type of a stage, an edge's ends, a tool's name) does not run. Blocking hooks (the decision
//! points by default: `run_start`, `stage_start`, `edge_selected`, `pre_tool_use`, `sandbox_ready`)
//! run in order and their decisions merge, `block` over `skip`/`override` over `proceed`; the first
//! `block` ends the round. The others run in the background and their decisions are ignored.
//!
//! A command hook proceeds on exit 0 and blocks on exit 2, unless it prints a JSON decision
//! (`{"decision": "skip", "reason": "..."}`); any other exit, or its timeout, blocks. It runs in the
//! run's sandbox (or unconfined with `sandbox = false`), with the secret rules of command stages,
//! `FABRO_EVENT`, `FABRO_RUN_ID`, `FABRO_WORKFLOW`, `FABRO_NODE_ID` and `FABRO_HOOK_CONTEXT` (a JSON
//! file with the context, which is its standard input too). HTTP, prompt and agent hooks fail open:
//! an error, a timeout, a non-2xx answer or an answer that is not a decision proceeds. Every hook run
//! is a `Hook.Completed` event.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use trellis_engine::Emitter;
use trellis_engine::event::EventKind;
use trellis_engine::hooks::{HookContext, HookDecision, HookEvent, Hooks};
use trellis_llm::{Client, Message, Request};
use trellis_process::sandbox::{Policy, Sandbox};

mod agent;

/// A hook as a run file writes it (both of Fabro's documented shapes).
#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq)]
#[serde(default)]
pub struct HookSpec {
    pub id: Option<String>,
    pub name: Option<String>,
    pub event: String,
    #[serde(rename = "type")]
    pub kind: Option<String>,
    pub script: Option<String>,
    pub command: Option<CommandSpec>,
    pub matcher: Option<String>,
    pub blocking: Option<bool>,
    pub timeout: Option<String>,
    pub timeout_ms: Option<u64>,
    pub sandbox: Option<bool>,
    pub url: Option<String>,
    pub headers: BTreeMap<String, String>,
    pub allowed_env_vars: Vec<String>,
    pub tls: Option<String>,
    pub prompt: Option<String>,
    pub model: Option<String>,
    pub max_tool_rounds: Option<u32>,
}

/// A command hook's command: a shell command, or a program and its arguments.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(untagged)]
pub enum CommandSpec {
    Shell(String),
    Argv(Vec<String>),
}

/// What a hook does.
#[derive(Debug, Clone, PartialEq)]
enum Action {
    /// `sh -c` this script.
    Command(String),
    Http {
        url: String,
        headers: BTreeMap<String, String>,
        verify: bool,
    },
    Prompt {
        prompt: String,
        model: Option<String>,
    },
    /// A session with the built-in tools, at most `rounds` rounds of tool calls long.
    Agent {
        prompt: String,
        model: Option<String>,
        rounds: u32,
    },
}

impl Action {
    fn type_name(&self) -> &'static str {
        match self {
            Action::Command(_) => "command",
            Action::Http { .. } => "http",
            Action::Prompt { .. } => "prompt",
            Action::Agent { .. } => "agent",
        }
    }
}

/// A checked hook.
#[derive(Debug, Clone)]
struct Hook {
    name: String,
    event: HookEvent,
    action: Action,
    matcher: Option<regex::Regex>,
    blocking: bool,
    timeout: Duration,
    sandboxed: bool,
}

/// Default time limits, by type.
const COMMAND_TIMEOUT: Duration = Duration::from_mins(1);
const PROMPT_TIMEOUT: Duration = Duration::from_secs(30);

impl HookSpec {
    /// How messages name the hook: its `name`, else its `id`, else its event.
    pub fn shown_name(&self) -> &str {
        self.name
            .as_deref()
            .or(self.id.as_deref())
            .unwrap_or(&self.event)
    }

    /// Whether the hook can run; the problem otherwise.
    pub fn check(&self) -> Result<(), String> {
        self.checked(&|_: &str| None).map(drop)
    }

    /// The hook ready to run (`env` reads the variables its headers may name).
    fn checked(&self, env: &dyn Fn(&str) -> Option<String>) -> Result<Hook, String> {
        let event = HookEvent::parse(&self.event).ok_or_else(|| {
            let events: Vec<&str> = HookEvent::ALL.iter().map(|e| e.as_str()).collect();
            if self.event.is_empty() {
                format!("`event` is required: one of {}", events.join(", "))
            } else {
                let near = trellis_workflow::rules::closest(&self.event, events.iter().copied())
                    .map_or_else(String::new, |near| format!("did you mean `{near}`? "));
                format!(
                    "unknown event `{}`: {near}events are {}",
                    self.event,
                    events.join(", ")
                )
            }
        })?;
        let kind = match (self.kind.as_deref(), &self.script, &self.command, &self.url) {
            (Some(kind), ..) => kind,
            (None, Some(_), ..) | (None, _, Some(_), _) => "command",
            (None, None, None, Some(_)) => "http",
            (None, None, None, None) if self.prompt.is_some() => "prompt",
            _ => {
                return Err(
                    "say what the hook does: `script` or `command`, `url` (type http), or `prompt` (type prompt or agent)"
                        .into(),
                );
            }
        };
        let action = match kind {
            "command" => Action::Command(match (&self.script, &self.command) {
                (Some(script), None) | (None, Some(CommandSpec::Shell(script))) => script.clone(),
                (None, Some(CommandSpec::Argv(argv))) if !argv.is_empty() => argv
                    .iter()
                    .map(|a| shell_quote(a))
                    .collect::<Vec<_>>()
                    .join(" "),
                (Some(_), Some(_)) => return Err("give `script` or `command`, not both".into()),
                _ => return Err("a command hook needs `script` or `command`".into()),
            }),
            "http" => self.http_action(env)?,
            "prompt" => Action::Prompt {
                prompt: self.prompt.clone().ok_or("a prompt hook needs `prompt`")?,
                model: self.model.clone(),
            },
            "agent" => Action::Agent {
                prompt: self.prompt.clone().ok_or("an agent hook needs `prompt`")?,
                model: self.model.clone(),
                rounds: self.max_tool_rounds.unwrap_or(agent::DEFAULT_ROUNDS),
            },
            other => {
                const TYPES: [&str; 4] = ["command", "http", "prompt", "agent"];
                let near = trellis_workflow::rules::closest(other, TYPES)
                    .map_or_else(String::new, |near| format!("did you mean `{near}`? "));
                return Err(format!(
                    "unknown hook type `{other}`: {near}use command, http, prompt or agent"
                ));
            }
        };
        let matcher = match &self.matcher {
            Some(pattern) => Some(
                regex::Regex::new(pattern)
                    .map_err(|e| format!("`matcher` is not a regular expression: {e}"))?,
            ),
            None => None,
        };
        let timeout = match (&self.timeout, self.timeout_ms) {
            (Some(text), _) => humantime::parse_duration(text)
                .map_err(|e| format!("`timeout = \"{text}\"` is not a duration: {e}"))?,
            (None, Some(ms)) => Duration::from_millis(ms),
            (None, None) if matches!(action, Action::Prompt { .. }) => PROMPT_TIMEOUT,
            (None, None) => COMMAND_TIMEOUT,
        };
        let name = self
            .name
            .clone()
            .or_else(|| self.id.clone())
            .unwrap_or_else(|| format!("{}-{}", event.as_str(), action.type_name()));
        Ok(Hook {
            name,
            event,
            action,
            matcher,
            blocking: self.blocking.unwrap_or(event.blocking_by_default()),
            timeout,
            sandboxed: self.sandbox.unwrap_or(true),
        })
    }

    /// An http hook's action: its URL (HTTPS unless `tls = "off"`) and headers.
    fn http_action(&self, env: &dyn Fn(&str) -> Option<String>) -> Result<Action, String> {
        let url = self.url.clone().ok_or("an http hook needs `url`")?;
        let tls = self.tls.as_deref().unwrap_or("verify");
        if !["verify", "no_verify", "off"].contains(&tls) {
            return Err(format!("`tls = \"{tls}\"`: use verify, no_verify or off"));
        }
        let plain_allowed = tls == "off" && url.starts_with("http://");
        if !(url.starts_with("https://") || plain_allowed) {
            return Err(format!(
                "`{url}`: an http hook's url must be https:// (or http:// with tls = \"off\")"
            ));
        }
        let mut headers = BTreeMap::new();
        for (name, value) in &self.headers {
            headers.insert(name.clone(), self.header_value(value, env)?);
        }
        Ok(Action::Http {
            url,
            headers,
            verify: tls == "verify",
        })
    }

    /// A header value with `$NAME` (and `{{ env.NAME }}`) replaced for the names `allowed_env_vars`
    /// lists; naming another is an error.
    fn header_value(
        &self,
        value: &str,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<String, String> {
        let pattern = regex::Regex::new(
            r"\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?|\{\{\s*env\.([A-Za-z_][A-Za-z0-9_]*)\s*\}\}",
        )
        .map_err(|e| e.to_string())?;
        let mut problem = None;
        let replaced = pattern.replace_all(value, |caps: &regex::Captures<'_>| {
            let name = caps
                .get(1)
                .or_else(|| caps.get(2))
                .map_or("", |m| m.as_str());
            if !self.allowed_env_vars.iter().any(|allowed| allowed == name) {
                problem.get_or_insert(format!(
                    "header names `{name}`, which `allowed_env_vars` does not list"
                ));
                return String::new();
            }
            env(name).unwrap_or_default()
        });
        match problem {
            Some(problem) => Err(problem),
            None => Ok(replaced.into_owned()),
        }
    }
}

/// `text` as one shell word.
pub(crate) fn shell_quote(text: &str) -> String {
    if !text.is_empty()
        && text
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_./=:,@+".contains(&b))
    {
        text.to_owned()
    } else {
        format!("'{}'", text.replace('\'', r"'\''"))
    }
}

/// Where hooks run and whom they may ask.
pub struct HookSetting {
    pub run_id: String,
    pub workflow: String,
    pub work_dir: PathBuf,
    /// Where context files go (in the run record).
    pub dir: PathBuf,
    pub sandbox: Arc<Sandbox>,
    /// The run's models (none when they are simulated: prompt hooks then proceed).
    pub models: Option<Arc<Client>>,
}

/// A run's hooks, ready to fire.
pub struct RunHooks {
    hooks: Vec<Hook>,
    setting: Arc<HookSetting>,
    background: Mutex<Vec<tokio::task::JoinHandle<()>>>,
    fired: std::sync::atomic::AtomicU64,
}

impl RunHooks {
    /// The run's hooks; `env` reads the variables HTTP headers may name. A hook that does not check
    /// is an error (the run file was checked before, so this is a changed file on resume).
    pub fn new(
        specs: &[HookSpec],
        setting: HookSetting,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Self, String> {
        let hooks = specs
            .iter()
            .map(|spec| spec.checked(env))
            .collect::<Result<Vec<_>, _>>()?;
        for hook in &hooks {
            if let Action::Http { headers, .. } = &hook.action {
                for (name, value) in headers {
                    trellis_process::secrets::register(name, value);
                }
            }
        }
        Ok(Self {
            hooks,
            setting: Arc::new(setting),
            background: Mutex::new(Vec::new()),
            fired: std::sync::atomic::AtomicU64::new(0),
        })
    }
}

#[async_trait]
impl Hooks for RunHooks {
    fn listens(&self, event: HookEvent) -> bool {
        self.hooks.iter().any(|h| h.event == event)
    }

    async fn fire(&self, context: HookContext, events: &dyn Emitter) -> HookDecision {
        let fields: Vec<String> = context
            .event
            .matched_fields(&context)
            .into_iter()
            .map(str::to_owned)
            .collect();
        let event = context.event;
        let context = Arc::new(context);
        let matching = self.hooks.iter().filter(|hook| {
            hook.event == event
                && hook.matcher.as_ref().is_none_or(|m| {
                    // Events without matchable fields always fire.
                    fields.is_empty() || fields.iter().any(|f| m.is_match(f))
                })
        });
        let mut decision = HookDecision::Proceed;
        for hook in matching {
            let number = self
                .fired
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
                + 1;
            let run = HookRun {
                hook: hook.clone(),
                context: context.clone(),
                setting: self.setting.clone(),
                number,
            };
            let background = (!hook.blocking).then(|| events.detached()).flatten();
            if let Some(events) = background {
                let task = tokio::spawn(async move {
                    run.run(&*events).await;
                });
                let mut background = self.background.lock();
                background.retain(|task| !task.is_finished());
                background.push(task);
            } else {
                let decided = run.run(events).await;
                if decided.outranks(&decision) {
                    decision = decided;
                }
                if matches!(decision, HookDecision::Block { .. }) {
                    break;
                }
            }
        }
        decision
    }

    async fn drain(&self) {
        let tasks = std::mem::take(&mut *self.background.lock());
        for task in tasks {
            let _ = task.await;
        }
    }
}

/// One run of one hook.
struct HookRun {
    hook: Hook,
    context: Arc<HookContext>,
    setting: Arc<HookSetting>,
    number: u64,
}

/// What a hook run came to: its decision, and what went wrong with the hook itself.
struct Ran {
    decision: HookDecision,
    error: Option<String>,
}

impl Ran {
    fn decided(decision: HookDecision) -> Self {
        Self {
            decision,
            error: None,
        }
    }

    /// The hook could not decide: it proceeds (fails open), saying why.
    fn open(error: String) -> Self {
        Self {
            decision: HookDecision::Proceed,
            error: Some(error),
        }
    }
}

impl HookRun {
    /// Runs the hook and reports it as a `Hook.Completed` event; its decision (a reason names the
    /// hook).
    async fn run(&self, events: &dyn Emitter) -> HookDecision {
        let started = Instant::now();
        let ran = match &self.hook.action {
            Action::Command(script) => self.command(script).await,
            Action::Http {
                url,
                headers,
                verify,
            } => self.http(url, headers, *verify).await,
            Action::Prompt { prompt, model } => self.prompt(prompt, model.as_deref()).await,
            Action::Agent {
                prompt,
                model,
                rounds,
            } => self.agent(prompt, model.as_deref(), *rounds).await,
        };
        let decision = if self.hook.blocking {
            ran.decision
        } else {
            HookDecision::Proceed
        };
        events.emit(
            self.context.node_id.as_deref(),
            EventKind::HookCompleted {
                hook: self.hook.name.clone(),
                hook_event: self.hook.event.as_str().to_owned(),
                hook_type: self.hook.action.type_name().to_owned(),
                blocking: self.hook.blocking,
                decision: decision.as_str().to_owned(),
                reason: decision.reason().map(str::to_owned),
                duration_ms: u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
                error: ran.error,
            },
        );
        // The run's error names the hook.
        match decision {
            HookDecision::Block { reason } => HookDecision::Block {
                reason: Some(format!(
                    "hook `{}`{}",
                    self.hook.name,
                    reason.map(|r| format!(": {r}")).unwrap_or_default()
                )),
            },
            other => other,
        }
    }

    /// The context as the hook is given it (a file, a POST body, the model's prompt): JSON, with
    /// the run's identity, and known secret values redacted (a tool's input or output may hold one).
    fn context_text(&self) -> String {
        let mut value = serde_json::to_value(&*self.context).unwrap_or_else(|_| json!({}));
        if let Value::Object(map) = &mut value {
            map.insert("run_id".into(), json!(self.setting.run_id));
            map.insert("workflow_name".into(), json!(self.setting.workflow));
            map.insert(
                "cwd".into(),
                json!(self.setting.work_dir.display().to_string()),
            );
        }
        let text = serde_json::to_string_pretty(&value).unwrap_or_default();
        trellis_process::secrets::redact(&text).into_owned()
    }

    /// Writes `text` into the run record's hooks folder as `NNNN-<event><suffix>`, this run's
    /// number and event: its path.
    async fn keep(&self, suffix: &str, text: String) -> std::io::Result<PathBuf> {
        let file = self.setting.dir.join(format!(
            "{:04}-{}{suffix}",
            self.number,
            self.hook.event.as_str()
        ));
        let (dir, path) = (self.setting.dir.clone(), file.clone());
        // In the run's record, which a command may have written: no link there is followed.
        trellis_process::task::blocking(move || {
            use trellis_process::files;
            files::create_folders(&dir, files::record_folder_mode())?;
            files::write_whole(&path, text.as_bytes())
        })
        .await?;
        Ok(file)
    }

    async fn command(&self, script: &str) -> Ran {
        let file = match self.keep(".json", self.context_text()).await {
            Ok(file) => file,
            Err(e) => {
                return Ran::decided(HookDecision::Block {
                    reason: Some(format!("cannot write the hook's context file: {e}")),
                });
            }
        };
        let mut env: Vec<(String, String)> = vec![
            ("FABRO_EVENT".into(), self.hook.event.as_str().into()),
            ("FABRO_RUN_ID".into(), self.setting.run_id.clone()),
            ("FABRO_WORKFLOW".into(), self.setting.workflow.clone()),
            ("FABRO_HOOK_CONTEXT".into(), file.display().to_string()),
            (
                trellis_process::group::RUN_ID_VAR.into(),
                self.setting.run_id.clone(),
            ),
        ];
        if let Some(node) = &self.context.node_id {
            env.push(("FABRO_NODE_ID".into(), node.clone()));
        }
        // Unconfined only when the run file says `sandbox = false`.
        let unconfined = Sandbox::none().with_env(
            self.setting
                .sandbox
                .env()
                .map(|(k, v)| (k.to_owned(), v.to_owned())),
        );
        let sandbox = if self.hook.sandboxed {
            &*self.setting.sandbox
        } else {
            &unconfined
        };
        // The context on standard input too, as Fabro pipes it to a hook on the host.
        let script = format!("exec <\"$FABRO_HOOK_CONTEXT\"\n{script}");
        let output = trellis_agent::shell::run(&trellis_agent::shell::ShellCommand {
            dir: &self.setting.work_dir,
            command: &script,
            timeout: self.hook.timeout,
            env: &env,
            pass_env: &[],
            sandbox,
            policy: &Policy::default(),
        })
        .await;
        let stated = stated_decision(&output.content);
        match output.note.as_deref() {
            Some("exit 0") => Ran::decided(stated.unwrap_or_default()),
            Some("exit 2") => Ran::decided(stated.unwrap_or(HookDecision::Block {
                reason: last_line(&output.content),
            })),
            Some("timed out") => Ran {
                decision: HookDecision::Block {
                    reason: Some(format!(
                        "timed out after {}",
                        humantime::format_duration(self.hook.timeout)
                    )),
                },
                error: Some("timed out".into()),
            },
            Some(note) => Ran::decided(HookDecision::Block {
                reason: Some(format!("hook {}", note.replace("exit", "exited with code"))),
            }),
            None => Ran {
                decision: HookDecision::Block {
                    reason: Some("the hook could not run".into()),
                },
                error: Some(output.content),
            },
        }
    }

    async fn http(&self, url: &str, headers: &BTreeMap<String, String>, verify: bool) -> Ran {
        let client = if verify {
            trellis_llm::http_client()
        } else {
            // Installs the TLS provider once, as every client of Trellis does.
            drop(trellis_llm::http_client());
            match reqwest::Client::builder()
                .danger_accept_invalid_certs(true)
                .build()
            {
                Ok(client) => client,
                Err(e) => return Ran::open(e.to_string()),
            }
        };
        let mut request = client
            .post(url)
            .timeout(self.hook.timeout)
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(self.context_text());
        for (name, value) in headers {
            request = request.header(name, value);
        }
        match request.send().await {
            Ok(response) if response.status().is_success() => {
                let text = response.text().await.unwrap_or_default();
                Ran::decided(stated_decision(&text).unwrap_or_default())
            }
            Ok(response) => Ran::open(format!("{url} answered {}", response.status())),
            Err(e) => Ran::open(format!("{url}: {e}")),
        }
    }

    /// The run's models and the one a prompt or agent hook asks (`haiku` unless it names one); why
    /// the hook proceeds without asking otherwise.
    fn model(&self, model: Option<&str>) -> Result<(&Client, trellis_llm::ResolvedModel), Ran> {
        let Some(client) = &self.setting.models else {
            return Err(Ran::open("models are simulated in this run".into()));
        };
        match client.resolve(Some(model.unwrap_or("haiku")), None) {
            Ok(resolved) => Ok((client, resolved)),
            Err(e) => Err(Ran::open(e.to_string())),
        }
    }

    /// What a prompt or agent hook is first shown: its instructions, then the event's context.
    fn instructions(&self, prompt: &str) -> String {
        format!(
            "{prompt}\n\nEvent context:\n```json\n{}\n```",
            self.context_text()
        )
    }

    async fn prompt(&self, prompt: &str, model: Option<&str>) -> Ran {
        let (client, resolved) = match self.model(model) {
            Ok(asked) => asked,
            Err(open) => return open,
        };
        let request = Request {
            system: Some(
                "You check one point of a workflow run before it goes on. Read the event context \
                 and the instructions, then answer with JSON only: {\"ok\": true} to let it go on, \
                 or {\"ok\": false, \"reason\": \"...\"} to stop it."
                    .into(),
            ),
            messages: vec![Message::user(self.instructions(prompt))],
            max_tokens: Some(512),
            ..Request::default()
        };
        let call = client.complete(&resolved, &request, &|_| {}, &|_, _, _| {});
        let response = match tokio::time::timeout(self.hook.timeout, call).await {
            Ok(Ok(response)) => response,
            Ok(Err(e)) => return Ran::open(e.to_string()),
            Err(_) => return Ran::open("timed out".into()),
        };
        verdict(&response.text)
    }
}

/// What a prompt or agent hook's model answered: the last JSON object with a boolean `ok`, whose
/// `false` blocks with its `reason`; an answer without one fails open.
fn verdict(text: &str) -> Ran {
    let verdict = crate::routing_directive::json_objects(text)
        .into_iter()
        .rev()
        .find(|o| o.get("ok").is_some_and(Value::is_boolean));
    match verdict {
        Some(object) if object["ok"] == Value::Bool(false) => Ran::decided(HookDecision::Block {
            reason: object
                .get("reason")
                .and_then(Value::as_str)
                .map(str::to_owned),
        }),
        Some(_) => Ran::decided(HookDecision::Proceed),
        None => Ran::open(format!(
            "the model's answer is not a decision: {}",
            text.chars().take(200).collect::<String>()
        )),
    }
}

/// What stands before an agent's tool calls: its permission gate, then the run's tool hooks
/// (`pre_tool_use`, which may refuse a call — the model is told why — and `post_tool_use` or
/// `post_tool_use_failure` once it ran).
pub(crate) struct ToolGuard {
    gate: Option<crate::permissions::Gate>,
    hooks: Option<(Arc<dyn Hooks>, Arc<dyn Emitter>)>,
    node_id: String,
}

impl ToolGuard {
    /// The guard of a stage's agent; none when neither a gate nor a tool hook stands there.
    pub(crate) fn of(
        stage: &trellis_engine::Stage<'_>,
        gate: Option<crate::permissions::Gate>,
    ) -> Option<Self> {
        let tool_events = [
            HookEvent::PreToolUse,
            HookEvent::PostToolUse,
            HookEvent::PostToolUseFailure,
        ];
        let hooks = stage
            .services
            .hooks
            .clone()
            .filter(|hooks| tool_events.iter().any(|e| hooks.listens(*e)))
            .and_then(|hooks| Some((hooks, stage.emitter.detached()?)));
        (gate.is_some() || hooks.is_some()).then(|| Self {
            gate,
            hooks,
            node_id: stage.node.id.clone(),
        })
    }

    fn context(&self, event: HookEvent, call: &trellis_llm::ToolCall) -> HookContext {
        let mut context = HookContext::new(event).node(&self.node_id);
        context.tool_name = Some(call.name.clone());
        context
    }
}

#[async_trait]
impl trellis_agent::Approver for ToolGuard {
    async fn approve(
        &self,
        call: &trellis_llm::ToolCall,
        category: trellis_agent::Category,
        observer: &dyn trellis_agent::Observer,
    ) -> Result<(), String> {
        if let Some(gate) = &self.gate {
            gate.approve(call, category, observer).await?;
        }
        let Some((hooks, events)) = &self.hooks else {
            return Ok(());
        };
        let mut context = self.context(HookEvent::PreToolUse, call);
        context.tool_input = Some(call.arguments.clone());
        match hooks.fire(context, &**events).await {
            HookDecision::Proceed | HookDecision::Override { .. } => Ok(()),
            HookDecision::Skip { reason } | HookDecision::Block { reason } => Err(format!(
                "This call was refused by the run's hooks{}",
                reason.map(|r| format!(": {r}")).unwrap_or_default()
            )),
        }
    }

    async fn ran(&self, call: &trellis_llm::ToolCall, output: &trellis_agent::ToolOutput) {
        let Some((hooks, events)) = &self.hooks else {
            return;
        };
        let event = if output.is_error {
            HookEvent::PostToolUseFailure
        } else {
            HookEvent::PostToolUse
        };
        let mut context = self.context(event, call);
        context.tool_call_id = Some(call.id.clone());
        if output.is_error {
            context.error_message = Some(output.content.clone());
        } else {
            context.tool_output = Some(output.content.clone());
        }
        hooks.fire(context, &**events).await;
    }
}

/// The decision a hook printed or answered: the last JSON object with a `decision`.
fn stated_decision(text: &str) -> Option<HookDecision> {
    let object = crate::routing_directive::json_objects(text)
        .into_iter()
        .rev()
        .find(|o| o.get("decision").is_some_and(Value::is_string))?;
    let reason = object
        .get("reason")
        .and_then(Value::as_str)
        .map(str::to_owned);
    Some(match object["decision"].as_str().unwrap_or_default() {
        "skip" => HookDecision::Skip { reason },
        "block" => HookDecision::Block { reason },
        "override" => match object.get("edge_to").and_then(Value::as_str) {
            Some(to) => HookDecision::Override {
                edge_to: to.to_owned(),
                reason,
            },
            None => HookDecision::Block {
                reason: Some("an `override` decision needs `edge_to`".into()),
            },
        },
        _ => HookDecision::Proceed,
    })
}

/// The last line a command printed before its exit note, as a block's reason.
fn last_line(output: &str) -> Option<String> {
    output
        .lines()
        .rev()
        .map(str::trim)
        .find(|l| !l.is_empty() && !l.starts_with("[exit") && *l != "[stderr]")
        .map(str::to_owned)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(toml_text: &str) -> HookSpec {
        toml::from_str(toml_text).unwrap()
    }

    #[test]
    fn hooks_check_their_fields() {
        assert!(
            spec("event = \"stage_start\"\nscript = \"true\"")
                .check()
                .is_ok()
        );
        assert!(
            spec("event = \"stage_start\"\ncommand = [\"echo\", \"a b\"]")
                .check()
                .is_ok()
        );
        assert!(
            spec("event = \"run_complete\"\ntype = \"agent\"\nprompt = \"Run the tests\"")
                .check()
                .is_ok()
        );
        let cases = [
            (
                "event = \"stage_strat\"\nscript = \"x\"",
                "unknown event `stage_strat`: did you mean `stage_start`?",
            ),
            ("event = \"run_start\"", "say what the hook does"),
            (
                "event = \"run_start\"\ntype = \"http\"\nurl = \"http://x\"",
                "https://",
            ),
            (
                "event = \"run_start\"\nscript = \"x\"\nmatcher = \"(\"",
                "regular expression",
            ),
            (
                "event = \"run_start\"\nscript = \"x\"\ntimeout = \"soon\"",
                "duration",
            ),
            (
                "event = \"run_start\"\ntype = \"agent\"\nmodel = \"haiku\"",
                "an agent hook needs `prompt`",
            ),
            (
                "event = \"run_start\"\ntype = \"shell\"\nprompt = \"p\"",
                "use command, http, prompt or agent",
            ),
            (
                "event = \"run_start\"\ntype = \"promt\"\nprompt = \"p\"",
                "unknown hook type `promt`: did you mean `prompt`?",
            ),
            (
                "event = \"run_start\"\ntype = \"http\"\nurl = \"https://x\"\nheaders = { A = \"$KEY\" }",
                "allowed_env_vars",
            ),
        ];
        for (text, expected) in cases {
            let problem = spec(text).check().unwrap_err();
            assert!(problem.contains(expected), "{text}: {problem}");
        }
    }

    #[test]
    fn decisions_are_read_from_json() {
        assert_eq!(
            stated_decision("noise\n{\"decision\": \"skip\", \"reason\": \"off\"}\n[exit 0]"),
            Some(HookDecision::Skip {
                reason: Some("off".into())
            })
        );
        assert_eq!(
            stated_decision("{\"decision\": \"override\", \"edge_to\": \"b\"}"),
            Some(HookDecision::Override {
                edge_to: "b".into(),
                reason: None
            })
        );
        assert_eq!(stated_decision("nothing"), None);
        assert_eq!(shell_quote("a b'c"), r"'a b'\''c'");
    }
}
