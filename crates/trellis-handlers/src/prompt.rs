//! Prompt nodes (`shape=tab`): one model call without tools. The prompt is the node's own, after a
//! preamble built from the run by fidelity; `full` fidelity continues a conversation shared by every
//! node with the same thread. Project memory (`AGENTS.md`, `CLAUDE.md`, `GEMINI.md` in the working
//! directory) is the system prompt unless `project_memory=false`. The answer sets `last_stage`,
//! `last_response` and `response.<id>`, its routing directive steers the next edge, and an
//! `output_schema` is enforced with repair turns. Writes `prompt.md`, `response.md` and (through the
//! engine) `status.json` for every attempt.
//!
//! Agent nodes (`shape=box`) need the multi-turn agent loop with tools; until it exists they fail with
//! a configuration error in real runs. `--dry-run` simulates both.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use serde_json::json;
use trellis_engine::event::EventKind;
use trellis_engine::{Attempt, FailureClass, Handler, Outcome, Stage, keys};
use trellis_llm::{Client, Message, ReasoningEffort, Request};
use trellis_workflow::NodeKind;
use trellis_workflow::node_kind::{self, Fidelity, LlmConfig};

use crate::model_call::{ModelCall, Parsed, Shaped, Unshaped};
use crate::output_schema::{self, SchemaError, Structured};
use crate::preamble::{self, PreambleSource};

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
    /// Conversations of `full`-fidelity nodes, by thread id. They live as long as the process: a
    /// resumed run starts them afresh (and the engine degrades its first node to `summary:high`).
    threads: Mutex<HashMap<String, Vec<Message>>>,
}

impl PromptHandler {
    /// `client` is `None` when models are unavailable; such stages then fail with a clear message.
    pub fn new(client: Option<Arc<Client>>) -> Self {
        Self {
            client,
            threads: Mutex::new(HashMap::new()),
        }
    }

    fn thread(&self, key: &str) -> Option<Vec<Message>> {
        self.threads
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(key)
            .cloned()
    }

    fn save_thread(&self, key: String, messages: Vec<Message>) {
        self.threads
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(key, messages);
    }
}

/// The stage's resolved fidelity and thread (set by the engine).
fn fidelity_of(stage: &Stage<'_>) -> (Fidelity, Option<String>) {
    let fidelity = stage
        .context
        .get(keys::FIDELITY)
        .and_then(|v| v.as_str().and_then(|s| s.parse().ok()))
        .unwrap_or_default();
    let thread = stage
        .context
        .get(keys::THREAD_ID)
        .and_then(|v| v.as_str().map(str::to_owned));
    (fidelity, thread)
}

/// The preamble for this stage at `fidelity`.
pub fn preamble_for(stage: &Stage<'_>, fidelity: Fidelity) -> String {
    let context = stage.context.snapshot();
    let history = stage.history.finished();
    preamble::build(
        &PreambleSource {
            workflow: stage.workflow,
            run_id: stage.run_id,
            history: &history,
            context: &context,
            blobs: &*stage.services.blobs,
        },
        fidelity,
    )
}

/// The project memory as one system prompt, or `None` when there is none.
pub async fn project_memory(stage: &Stage<'_>) -> Option<String> {
    let mut parts = Vec::new();
    for name in MEMORY_FILES {
        let path = stage.settings.work_dir.join(name);
        if let Ok(text) = tokio::fs::read_to_string(&path).await
            && !text.trim().is_empty()
        {
            parts.push(format!(
                "# {name}\n\n{}",
                preamble::clip(text.trim(), MEMORY_LIMIT)
            ));
        }
    }
    (!parts.is_empty()).then(|| parts.join("\n\n"))
}

fn effort(effort: node_kind::ReasoningEffort) -> ReasoningEffort {
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
        .insert(format!("response.{node_id}"), json!(response));
}

/// Writes a stage file; a failure to write is reported but never loses the answer.
pub(crate) async fn write_stage_file(stage: &Stage<'_>, name: &str, text: &str) {
    if let Err(error) = tokio::fs::write(stage.dir.join(name), text).await {
        stage.emitter.emit(
            Some(&stage.node.id),
            EventKind::ModelWarning {
                message: format!("cannot write {name}: {error}"),
            },
        );
    }
}

fn simulated(stage: &Stage<'_>) -> String {
    format!("[Simulated] Response for stage: {}", stage.node.id)
}

impl PromptHandler {
    /// One model call (or a simulated one in a dry run).
    async fn outcome(&self, stage: &Stage<'_>) -> Outcome {
        let Some(llm) = stage.node.kind.llm() else {
            return Outcome::success();
        };
        if stage.settings.dry_run {
            let response = simulated(stage);
            write_stage_file(stage, "prompt.md", &llm.prompt).await;
            write_stage_file(stage, "response.md", &response).await;
            let mut outcome = Outcome::success();
            response_updates(&mut outcome, &stage.node.id, &response);
            return outcome;
        }
        if matches!(stage.node.kind, NodeKind::Agent(_)) {
            return Outcome::failed(
                FailureClass::Configuration,
                format!(
                    "agent node `{}` needs the multi-turn agent loop with tools, which this version of trellis does not have yet; \
                     use a prompt node (shape=tab) for a single model call, or --dry-run to simulate",
                    stage.node.id
                ),
            );
        }
        let Some(client) = &self.client else {
            return Outcome::failed(
                FailureClass::Configuration,
                format!(
                    "no model configured: prompt node `{}` needs a model; {}",
                    stage.node.id,
                    trellis_llm::local::SETUP_HELP
                ),
            );
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

/// The assembled first message of a prompt stage and the thread it continues.
struct Opening {
    prompt: String,
    messages: Vec<Message>,
    thread_key: Option<String>,
    fidelity: Fidelity,
}

impl PromptHandler {
    /// The preamble by fidelity, the node's prompt and schema instructions, and the thread so far.
    fn open(&self, stage: &Stage<'_>, llm: &LlmConfig) -> Opening {
        let (fidelity, thread) = fidelity_of(stage);
        let thread_key = (fidelity == Fidelity::Full)
            .then(|| thread.unwrap_or_else(|| DEFAULT_THREAD.to_owned()));
        let messages = thread_key
            .as_deref()
            .and_then(|k| self.thread(k))
            .unwrap_or_default();
        // A full-fidelity node that starts its thread has no conversation to continue: it gets the
        // default preamble instead, so it still knows what happened before it.
        let preamble = match fidelity {
            Fidelity::Full if !messages.is_empty() => String::new(),
            Fidelity::Full => preamble_for(stage, Fidelity::Compact),
            other => preamble_for(stage, other),
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
            messages,
            thread_key,
            fidelity,
        }
    }

    async fn run_prompt(&self, client: &Client, stage: &Stage<'_>, llm: &LlmConfig) -> Outcome {
        let mut call = match ModelCall::for_stage(client, stage) {
            Ok(call) => call,
            Err(outcome) => return *outcome,
        };
        let Opening {
            prompt,
            mut messages,
            thread_key,
            fidelity,
        } = self.open(stage, llm);
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
            reasoning_effort: Some(effort(llm.reasoning_effort)),
            temperature: None,
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
            self.save_thread(key, request.messages);
        }
        let mut outcome = Outcome::success();
        response_updates(&mut outcome, &stage.node.id, &answer.response.text);
        match answer.value {
            Structured::Free(Some(directive)) | Structured::Routing(directive) => {
                directive.apply(&mut outcome);
            }
            Structured::Free(None) => {}
            Structured::Json(value) => {
                outcome
                    .context_updates
                    .insert(format!("output.{}", stage.node.id), value);
            }
        }
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
