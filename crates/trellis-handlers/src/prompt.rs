//! Prompt nodes (`shape=tab`): one model call without tools. The prompt is the node's own, after a
//! preamble built from the run by fidelity; `full` fidelity continues a conversation shared by every
//! node with the same thread. Project memory (`AGENTS.md`, `CLAUDE.md`, `GEMINI.md` in the working
//! directory) is the system prompt unless `project_memory=false`. The answer sets `last_stage`,
//! `last_response` and `response.<id>`, its routing directive steers the next edge, and an
//! `output_schema` is enforced with repair turns. Writes `prompt.md`, `response.md` and (through the
//! engine) `status.json` for every attempt.
//! `--dry-run` simulates them. Agent nodes share this module's preambles, threads and project memory
//! (see [`crate::agent`]).

use std::collections::HashMap;
use std::sync::Arc;

use async_trait::async_trait;
use parking_lot::Mutex;
use serde_json::json;
use trellis_engine::event::EventKind;
use trellis_engine::{Attempt, Conversation, FailureClass, Handler, Outcome, Stage, keys};
use trellis_llm::{Client, Message, ReasoningEffort, Request};
use trellis_workflow::node_kind::{self, Fidelity, LlmConfig};

use crate::model_call::{ModelCall, Parsed, Shaped, Unshaped};
use crate::output_schema::{self, SchemaError, Structured};
use crate::preamble::{self, PreambleSource};
use crate::routing_directive;

/// How much of a response `last_response` keeps.
const LAST_RESPONSE_CHARS: usize = 200;
/// Project memory files, read from the working directory in this order.
const MEMORY_FILES: &[&str] = &["AGENTS.md", "CLAUDE.md", "GEMINI.md"];
/// Project memory beyond this size is cut.
const MEMORY_LIMIT: usize = 64 * 1024;
/// The thread of `full`-fidelity nodes that name none.
const DEFAULT_THREAD: &str = "default";

pub struct PromptHandler {
    client: Option<Arc<Client>>,
    threads: Arc<Threads>,
}

/// Conversations of `full`-fidelity nodes, by thread id, shared by prompt and agent nodes. They live as
/// long as the process: a resumed run starts them afresh (and the engine degrades its first node to
/// `summary:high`).
#[derive(Default)]
pub struct Threads(Mutex<HashMap<String, Thread>>);

/// A thread's conversation so far, and what the system prompt of the agent session that opened it
/// said of that session alone ([`trellis_llm::Request::system_session`]). A session that continues
/// the thread is shown that same text (what is its own opens its message instead): the prompt it
/// sends then begins as the last one did, and a provider's prompt cache still holds the
/// conversation (llama-server computed all of it again, 25 s of a two-stage thread on CPU).
#[derive(Clone, Default)]
pub(crate) struct Thread {
    pub messages: Vec<Message>,
    pub session: Option<String>,
}

impl Threads {
    fn get(&self, key: &str) -> Option<Thread> {
        self.0.lock().get(key).cloned()
    }

    pub(crate) fn save(&self, key: String, thread: Thread) {
        self.0.lock().insert(key, thread);
    }
}

impl PromptHandler {
    /// `client` is `None` when models are unavailable; such stages then fail with a clear message.
    pub fn new(client: Option<Arc<Client>>, threads: Arc<Threads>) -> Self {
        Self { client, threads }
    }
}

/// The preamble for this stage at `fidelity`.
pub async fn preamble_for(stage: &Stage<'_>, fidelity: Fidelity) -> String {
    let context = stage.context.snapshot();
    let history = stage.history.finished().await;
    let preamble = preamble::build(
        &PreambleSource {
            workflow: stage.workflow,
            run_id: stage.run_id,
            history: &history,
            context: &context,
            blobs: &*stage.services.blobs,
        },
        fidelity,
    );
    // A secret that reached the context (a file a command printed) never reaches a model.
    trellis_process::secrets::redact(&preamble).into_owned()
}

/// The project memory as one system prompt, or `None` when there is none: the memory files of every
/// folder from the repository's root (the nearest folder above with `.git`) down to the working
/// directory, outermost first; just the working directory's outside a repository.
pub async fn project_memory(stage: &Stage<'_>) -> Option<String> {
    let work_dir = tokio::fs::canonicalize(&stage.settings.work_dir)
        .await
        .unwrap_or_else(|_| stage.settings.work_dir.clone());
    let mut dirs = vec![work_dir.as_path()];
    for dir in work_dir.ancestors() {
        if tokio::fs::try_exists(dir.join(".git"))
            .await
            .unwrap_or(false)
        {
            dirs = work_dir.ancestors().take_while(|d| *d != dir).collect();
            dirs.push(dir);
            dirs.reverse();
            break;
        }
    }
    let paths: Vec<std::path::PathBuf> = dirs
        .iter()
        .flat_map(|dir| MEMORY_FILES.iter().map(|name| dir.join(name)))
        .collect();
    let root = dirs[0].to_path_buf();
    let parts = trellis_process::task::blocking(move || {
        let mut parts = Vec::new();
        for path in paths {
            // A link may point to another memory file (`CLAUDE.md -> AGENTS.md`); one out of the
            // project (a cloned repository's `AGENTS.md -> ~/.aws/credentials`) is not followed:
            // it would send the user's secrets to the model.
            if let Ok(text) = trellis_syntax::read_found_text(&path, &root)
                && !text.trim().is_empty()
            {
                let shown = path.strip_prefix(&root).unwrap_or(&path).display();
                parts.push(format!(
                    "# {shown}\n\n{}",
                    preamble::clip(text.trim(), MEMORY_LIMIT)
                ));
            }
        }
        parts
    })
    .await;
    (!parts.is_empty()).then(|| parts.join("\n\n"))
}

pub(crate) fn effort(effort: node_kind::ReasoningEffort) -> ReasoningEffort {
    match effort {
        node_kind::ReasoningEffort::High => ReasoningEffort::High,
        node_kind::ReasoningEffort::Medium => ReasoningEffort::Medium,
        node_kind::ReasoningEffort::Low => ReasoningEffort::Low,
    }
}

/// The three keys every prompt and agent node sets from its response.
pub fn response_updates(outcome: &mut Outcome, node_id: &str, response: &str) {
    outcome
        .context_updates
        .insert(keys::LAST_STAGE.into(), json!(node_id));
    outcome.context_updates.insert(
        keys::LAST_RESPONSE.into(),
        json!(
            response
                .chars()
                .take(LAST_RESPONSE_CHARS)
                .collect::<String>()
        ),
    );
    outcome
        .context_updates
        .insert(keys::response_of(node_id), json!(response));
}

/// Writes `text` as the file `name` in `dir`, whole ([`trellis_process::files::write_whole`]: a
/// new file renamed over the name), so a reader never sees part of it and a link that a command
/// planted under that name in the stage's folder is replaced, not written through.
pub(crate) async fn write_record_file(
    dir: &std::path::Path,
    name: &str,
    text: &str,
) -> std::io::Result<()> {
    let (path, bytes) = (dir.join(name), text.as_bytes().to_vec());
    trellis_process::task::blocking(move || trellis_process::files::write_whole(&path, &bytes))
        .await
}

/// Writes a stage file; a failure to write is reported but never loses the answer.
pub(crate) async fn write_stage_file(stage: &Stage<'_>, name: &str, text: &str) {
    if let Err(error) = write_record_file(stage.dir, name, text).await {
        stage.emitter.emit(
            Some(&stage.node.id),
            EventKind::ModelWarning {
                message: format!("cannot write {name}: {error}"),
            },
        );
    }
}

/// The outcome of a simulated model stage (`--dry-run`, `--simulate`): a canned answer, recorded like
/// a real one. It takes the labelled edge nearest the end of the run ([`simulated_label`]), so a
/// simulated run reaches the exit of a workflow whose review loops back on its other labels; a node
/// with a custom output schema answers the simplest value the schema accepts.
pub(crate) async fn simulated_outcome(stage: &Stage<'_>, llm: &LlmConfig) -> Outcome {
    let mut response = format!("[Simulated] Response for stage: {}", stage.node.id);
    // A custom schema gets the simplest value it accepts, so conditions on `output.<id>` see one.
    let output = match &llm.output_schema {
        Some(node_kind::OutputSchema::JsonSchema { schema, .. }) => {
            let value = output_schema::sample(schema);
            response = format!("{response}\n\n{value}");
            Some(value)
        }
        _ => None,
    };
    write_stage_file(stage, "prompt.md", &llm.prompt).await;
    write_stage_file(stage, "response.md", &response).await;
    let mut outcome = Outcome::success();
    response_updates(&mut outcome, &stage.node.id, &response);
    if let Some(value) = output {
        Structured::Json(value).apply(&mut outcome, &stage.node.id);
    }
    outcome.preferred_label = simulated_label(stage);
    outcome
}

/// The label a simulated answer picks: of the node's labelled edges, the one whose target is fewest
/// steps from the end of the run (the first declared among equals), as a model following the workflow's
/// main path would; a review that can approve or loop back approves.
fn simulated_label(stage: &Stage<'_>) -> Option<String> {
    let workflow = stage.workflow;
    let index = workflow.node_index(&stage.node.id)?;
    let steps = workflow.steps_to_end();
    workflow
        .outgoing(index)
        .filter(|e| e.label.is_some())
        .min_by_key(|e| steps[e.to].unwrap_or(usize::MAX))
        .and_then(|e| e.label.clone())
}

/// `auto_status=true`: a stage whose answer gave no status where its `output_schema="routing"` asks for
/// one (no routing object at all, after the repair turns) counts as succeeded instead of failing, with
/// the reason kept in `status.json`. `missing` says whether the status was missing rather than
/// malformed; a malformed one, and every other failure, stands.
pub(crate) fn auto_status(
    stage: &Stage<'_>,
    llm: &LlmConfig,
    response: &str,
    problem: &str,
    missing: bool,
) -> Option<Outcome> {
    if !stage.node.common.auto_status
        || !missing
        || llm.output_schema != Some(node_kind::OutputSchema::Routing)
    {
        return None;
    }
    let mut outcome = Outcome::success();
    response_updates(&mut outcome, &stage.node.id, response);
    outcome.details.auto_status = Some(format!(
        "the answer gave no status ({problem}); auto_status=true counts the stage as succeeded"
    ));
    Some(outcome)
}

/// The outcome of a model stage when no model is configured.
pub(crate) fn no_model(stage: &Stage<'_>) -> Outcome {
    Outcome::failed(
        FailureClass::Configuration,
        format!(
            "no model configured: node `{}` needs a model; {}",
            stage.node.id,
            trellis_llm::local::SETUP_HELP
        ),
    )
}

impl PromptHandler {
    /// One model call (or a simulated one in a dry run).
    async fn outcome(&self, stage: &Stage<'_>) -> Outcome {
        let Some(llm) = stage.node.kind.llm() else {
            return Outcome::success();
        };
        if stage.settings.models_simulated() {
            return simulated_outcome(stage, llm).await;
        }
        let Some(client) = &self.client else {
            return no_model(stage);
        };
        self.run_prompt(client, stage, llm).await
    }
}

#[async_trait]
impl Handler for PromptHandler {
    async fn execute(&self, stage: &Stage<'_>) -> Attempt {
        self.outcome(stage).await.into()
    }
}

/// The assembled first message of a model stage and the thread it continues.
pub(crate) struct Opening {
    pub prompt: String,
    /// What the stage is asked to do: the workflow's goal and the node's own prompt, without the
    /// rest of the preamble (it quotes earlier stages' output, whose file names and numbers are not
    /// the task's).
    pub task: String,
    /// The thread so far: empty when the stage starts it, or has none.
    pub thread: Thread,
    pub thread_key: Option<String>,
    pub fidelity: Fidelity,
}

impl Opening {
    /// The preamble by fidelity, the node's prompt and schema instructions, and the thread so far.
    pub(crate) async fn new(stage: &Stage<'_>, llm: &LlmConfig, threads: &Threads) -> Opening {
        let Conversation { fidelity, thread } = stage.conversation.clone();
        let thread_key = (fidelity == Fidelity::Full)
            .then(|| thread.unwrap_or_else(|| DEFAULT_THREAD.to_owned()));
        let thread = thread_key
            .as_deref()
            .and_then(|k| threads.get(k))
            .unwrap_or_default();
        // A full-fidelity node that starts its thread has no conversation to continue: it gets the
        // default preamble instead, so it still knows what happened before it.
        let preamble = match fidelity {
            Fidelity::Full if !thread.messages.is_empty() => String::new(),
            Fidelity::Full => preamble_for(stage, Fidelity::Compact).await,
            other => preamble_for(stage, other).await,
        };
        let mut prompt = if preamble.is_empty() {
            llm.prompt.clone()
        } else {
            format!("{}\n\n{}", preamble.trim_end(), llm.prompt)
        };
        if let Some(extra) = llm
            .output_schema
            .as_ref()
            .and_then(output_schema::instructions)
        {
            prompt = format!("{prompt}\n\n{extra}");
        }
        Opening {
            prompt,
            task: match &stage.workflow.graph.goal {
                Some(goal) => format!("{goal}\n{}", llm.prompt),
                None => llm.prompt.clone(),
            },
            thread,
            thread_key,
            fidelity,
        }
    }
}

impl PromptHandler {
    async fn run_prompt(&self, client: &Client, stage: &Stage<'_>, llm: &LlmConfig) -> Outcome {
        let mut call = match ModelCall::for_stage(client, stage) {
            Ok(call) => call,
            Err(outcome) => return *outcome,
        };
        let Opening {
            prompt,
            thread,
            thread_key,
            fidelity,
            ..
        } = Opening::new(stage, llm, &self.threads).await;
        let Thread {
            mut messages,
            session,
        } = thread;
        write_stage_file(stage, "prompt.md", &prompt).await;
        messages.push(Message::user(prompt));
        let mut request = Request {
            model: String::new(),
            system: if llm.project_memory {
                project_memory(stage).await
            } else {
                None
            },
            messages,
            tools: Vec::new(),
            max_tokens: llm.max_tokens,
            reasoning_effort: Some(effort(llm.effort())),
            temperature: None,
            response_schema: None,
            // A thread's next prompt continues this conversation.
            cache_prompt: thread_key.is_some(),
            ..Request::default()
        };
        let answer = ask_for_schema(&mut call, &mut request, llm).await;
        let answer = match answer {
            Ok(answer) => answer,
            Err(unshaped) => {
                let (mut outcome, last) =
                    call.unshaped_outcome(unshaped, "output schema validation failed");
                if let Some((response, log)) = last {
                    write_stage_file(stage, "response.md", &response.text).await;
                    write_stage_file(stage, "repairs.md", &log).await;
                    let missing = !routing_directive::has_directive(&response.text);
                    let reason = outcome.failure_reason().unwrap_or_default().to_owned();
                    if let Some(mut auto) =
                        auto_status(stage, llm, &response.text, &reason, missing)
                    {
                        call.describe(&mut auto);
                        auto.details.repairs = outcome.details.repairs;
                        return auto;
                    }
                    response_updates(&mut outcome, &stage.node.id, &response.text);
                }
                return outcome;
            }
        };
        write_stage_file(stage, "response.md", &answer.response.text).await;
        if !answer.log.is_empty() {
            write_stage_file(stage, "repairs.md", &answer.log).await;
        }
        request.messages.push(answer.response.to_message());
        if let Some(key) = thread_key {
            let messages = request.messages;
            self.threads.save(key, Thread { messages, session });
        }
        let mut outcome = Outcome::success();
        response_updates(&mut outcome, &stage.node.id, &answer.response.text);
        answer.value.apply(&mut outcome, &stage.node.id);
        call.describe(&mut outcome);
        outcome.details.repairs = Some(answer.repairs);
        outcome.details.stop_reason = serde_json::to_value(&answer.response.stop_reason).ok();
        outcome.details.fidelity = Some(fidelity.as_str().to_owned());
        outcome
    }
}

/// Asks until the answer meets the node's output schema, with up to `output_retries` repair turns in
/// the same conversation (none without a schema).
async fn ask_for_schema(
    call: &mut ModelCall<'_>,
    request: &mut Request,
    llm: &LlmConfig,
) -> Result<Shaped<Structured>, Unshaped> {
    let repairs = llm.output_schema.as_ref().map_or(0, |_| llm.output_retries);
    call.ask_until(
        request,
        repairs,
        |text| match output_schema::check(llm.output_schema.as_ref(), text) {
            Ok(structured) => Parsed::Valid(structured),
            Err(SchemaError::Invalid(problems)) => Parsed::Invalid(problems),
            Err(SchemaError::BadSchema(reason)) => Parsed::Fatal(Box::new(Outcome::failed(
                FailureClass::Configuration,
                reason,
            ))),
        },
        |problems| match &llm.output_schema {
            Some(schema) => output_schema::repair_message(schema, problems),
            None => problems.to_owned(),
        },
    )
    .await
}
