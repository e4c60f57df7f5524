//! One model conversation: calls through the `trellis-llm` client, the events that report them, usage
//! summed over the turns, provider errors turned into stage outcomes (a transient error is retryable by
//! the node's retry policy; a missing model stops the run), and the one "ask, parse, repair" loop that
//! every caller needing a shaped answer uses — prompt output schemas, the fan-in's choice, the `when`
//! router, and the agent loop's repair turns.

use std::fmt::Write as _;
use std::time::Instant;

use trellis_engine::event::{EventKind, ModelCallEnd};
use trellis_engine::{Emitter, FailureClass, Outcome, Stage};
use trellis_engine::{ModelDetails, TokenUsage};
use trellis_llm::{
    Client, ErrorKind, LlmError, Message, Request, ResolvedModel, Response, StreamEvent, Usage,
};

/// A conversation with one model on behalf of one node (a stage, or the router of its edges).
pub struct ModelCall<'a> {
    client: &'a Client,
    pub resolved: ResolvedModel,
    emitter: &'a dyn Emitter,
    node_id: &'a str,
    pub usage: Usage,
    pub turns: u32,
    /// What went wrong with the last call, when it failed.
    last_error: Option<ErrorKind>,
}

/// What a parser says of an answer.
pub enum Parsed<T> {
    /// The answer has the shape wanted.
    Valid(T),
    /// It does not: the problem, told to the model in a repair turn.
    Invalid(String),
    /// Asking again cannot help (a broken schema): the stage ends with this outcome.
    Fatal(Box<Outcome>),
}

/// A shaped answer: the value, the response it came from, the repair turns it took, and a log of the
/// rejected responses with their problems.
pub struct Shaped<T> {
    pub value: T,
    pub response: Response,
    pub repairs: u32,
    pub log: String,
}

/// Why no shaped answer came.
pub enum Unshaped {
    /// The call failed, or the parser said asking again cannot help.
    Failed(Box<Outcome>),
    /// Every repair turn was used: the last response, its problem, and the log.
    Exhausted {
        response: Box<Response>,
        problem: String,
        repairs: u32,
        log: String,
    },
}

impl<'a> ModelCall<'a> {
    /// Resolves `model`; a model that cannot run here is a configuration failure.
    pub fn new(
        client: &'a Client,
        emitter: &'a dyn Emitter,
        node_id: &'a str,
        model: Option<&str>,
        provider: Option<&str>,
    ) -> Result<Self, Box<Outcome>> {
        let resolved = client
            .resolve(model, provider)
            .map_err(|e| Box::new(failure(&e)))?;
        if let Some(warning) = &resolved.warning {
            emitter.emit(
                Some(node_id),
                EventKind::ModelWarning {
                    message: warning.clone(),
                },
            );
        }
        Ok(Self {
            client,
            resolved,
            emitter,
            node_id,
            usage: Usage::default(),
            turns: 0,
            last_error: None,
        })
    }

    /// The conversation of a stage's own node, with the node's model and provider.
    pub fn for_stage(client: &'a Client, stage: &'a Stage<'a>) -> Result<Self, Box<Outcome>> {
        let llm = stage.node.kind.llm();
        Self::new(
            client,
            stage.emitter,
            &stage.node.id,
            llm.and_then(|l| l.model.as_deref()),
            llm.and_then(|l| l.provider.as_deref()),
        )
    }

    /// One call, retried by the client on transient errors; each call is reported as events. A
    /// stream that broke after its answer began is asked again, the same turn with the same
    /// conversation, up to [`trellis_llm::TURN_RETRIES`] times. When the provider still fails, the
    /// run's fallback models (`[run.model] fallbacks`) are tried in order, and the one that answers
    /// serves the rest of the stage.
    pub async fn ask(&mut self, request: &Request) -> Result<Response, Box<Outcome>> {
        self.turns += 1;
        let mut fallbacks: Option<std::vec::IntoIter<ResolvedModel>> = None;
        let mut turn_retries = 0;
        loop {
            let error = match self.call(request).await {
                Ok(response) => return Ok(response),
                Err(error) => error,
            };
            if let Some(wait) = self.client.retry.turn_delay(&error, turn_retries + 1) {
                turn_retries += 1;
                self.emitter
                    .emit(Some(self.node_id), retrying(&error, turn_retries + 1, wait));
                tokio::time::sleep(wait).await;
                continue;
            }
            if !error.kind.retryable() {
                return Err(Box::new(failure(&error)));
            }
            let next = fallbacks
                .get_or_insert_with(|| self.client.fallbacks_after(&self.resolved).into_iter())
                .next();
            let Some(next) = next else {
                return Err(Box::new(failure(&error)));
            };
            self.emitter.emit(
                Some(self.node_id),
                EventKind::ModelWarning {
                    message: format!(
                        "{}/{} failed ({error}); falling back to {}/{}",
                        self.resolved.provider, self.resolved.model, next.provider, next.model
                    ),
                },
            );
            self.resolved = next;
        }
    }

    /// One call to the current model, with the client's retries, reported as events.
    async fn call(&mut self, request: &Request) -> Result<Response, trellis_llm::LlmError> {
        let node = Some(self.node_id);
        let emitter = self.emitter;
        emitter.emit(
            node,
            EventKind::ModelCallStarted {
                model: self.resolved.model.clone(),
                provider: self.resolved.provider.clone(),
                turn: self.turns,
            },
        );
        let started = Instant::now();
        let result = self
            .client
            .complete(
                &self.resolved,
                request,
                &|event| {
                    if let StreamEvent::TextDelta(text) = event {
                        emitter.emit(node, EventKind::ModelTextDelta { text });
                    }
                },
                &|error, attempt, wait| emitter.emit(node, retrying(error, attempt, wait)),
            )
            .await;
        let duration_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last_error = result.as_ref().err().map(|error| error.kind);
        let mut end = ModelCallEnd {
            model: self.resolved.model.clone(),
            provider: self.resolved.provider.clone(),
            turn: self.turns,
            duration_ms,
            usage: None,
            stop_reason: None,
            error: None,
            kind: None,
        };
        match result {
            Ok(response) => {
                self.usage.add(response.usage);
                end.model.clone_from(&response.model);
                end.provider.clone_from(&response.provider);
                end.usage = Some(token_usage(response.usage));
                end.stop_reason = serde_json::to_value(&response.stop_reason).ok();
                emitter.emit(node, EventKind::ModelCallCompleted(end));
                Ok(response)
            }
            Err(error) => {
                end.error = Some(error.to_string());
                end.kind = Some(error.kind.as_str().to_owned());
                emitter.emit(node, EventKind::ModelCallCompleted(end));
                Err(error)
            }
        }
    }

    /// Asks until `parse` accepts the answer. A rejected answer stays in the conversation, followed by
    /// a repair turn that `repair` words from the problem, at most `repairs` times.
    pub async fn ask_until<T>(
        &mut self,
        request: &mut Request,
        repairs: u32,
        parse: impl Fn(&str) -> Parsed<T>,
        repair: impl Fn(&str) -> String,
    ) -> Result<Shaped<T>, Unshaped> {
        let mut used = 0;
        let mut log = String::new();
        loop {
            let response = self.ask(request).await.map_err(Unshaped::Failed)?;
            let problem = match parse(&response.text) {
                Parsed::Valid(value) => {
                    return Ok(Shaped {
                        value,
                        response,
                        repairs: used,
                        log,
                    });
                }
                Parsed::Fatal(outcome) => return Err(Unshaped::Failed(outcome)),
                Parsed::Invalid(problem) => problem,
            };
            let _ = write!(
                log,
                "## Response {}\n\n{}\n\n## Problems\n\n{problem}\n\n",
                used + 1,
                response.text
            );
            if used >= repairs {
                return Err(Unshaped::Exhausted {
                    response: Box::new(response),
                    problem,
                    repairs: used,
                    log,
                });
            }
            used += 1;
            request.messages.push(response.to_message());
            request.messages.push(Message::user(repair(&problem)));
        }
    }

    /// The outcome when no shaped answer came — the call's own failure, or `"{what} after N repair
    /// attempt(s): {problem}"` — described with the model and usage; with the last response and the
    /// repair log when the repairs ran out, for the caller to record.
    pub fn unshaped_outcome(
        &self,
        unshaped: Unshaped,
        what: &str,
    ) -> (Outcome, Option<(Box<Response>, String)>) {
        let (mut outcome, last) = match unshaped {
            Unshaped::Failed(outcome) => (*outcome, None),
            Unshaped::Exhausted {
                response,
                problem,
                repairs,
                log,
            } => {
                let mut outcome = Outcome::failed(
                    FailureClass::StageFailed,
                    format!("{what} after {repairs} repair attempt(s): {problem}"),
                );
                outcome.details.repairs = Some(repairs);
                (outcome, Some((response, log)))
            }
        };
        self.describe(&mut outcome);
        (outcome, last)
    }

    /// The model, provider, usage and turn count of the conversation so far.
    pub fn details(&self) -> ModelDetails {
        ModelDetails {
            model: self.resolved.model.clone(),
            provider: self.resolved.provider.clone(),
            usage: token_usage(self.usage),
            turns: self.turns,
            cost_usd: None,
        }
    }

    /// Records the model, provider, usage and turn count in an outcome's details.
    pub fn describe(&self, outcome: &mut Outcome) {
        outcome.details.model = Some(self.details());
    }
}

/// An agent session reaches its model through the stage's conversation, so its calls are reported,
/// retried and counted like every other model call.
#[async_trait::async_trait]
impl trellis_agent::Model for ModelCall<'_> {
    type Error = Box<Outcome>;

    async fn ask(&mut self, request: &Request) -> Result<Response, Box<Outcome>> {
        ModelCall::ask(self, request).await
    }

    fn overflowed(&self, _error: &Box<Outcome>) -> bool {
        self.last_error == Some(ErrorKind::ContextLength)
    }
}

/// A call's usage in the engine's terms.
pub fn token_usage(usage: Usage) -> TokenUsage {
    TokenUsage {
        input_tokens: usage.input_tokens,
        output_tokens: usage.output_tokens,
        cached_tokens: usage.cached_tokens,
        reasoning_tokens: usage.reasoning_tokens,
    }
}

/// The stage outcome for a failed model call. A missing or rejected key is a setup problem that stops
/// the run: every later model stage would fail the same way. A transient error is transient even
/// when the stream broke after output began (its turn retries spent): the stage may be run again.
pub fn failure(error: &LlmError) -> Outcome {
    let class = if matches!(error.kind, ErrorKind::Configuration | ErrorKind::Auth) {
        FailureClass::Configuration
    } else if error.kind == ErrorKind::ContextLength {
        FailureClass::BudgetExhausted
    } else if error.kind.retryable() {
        FailureClass::Transient
    } else {
        FailureClass::StageFailed
    };
    Outcome::failed(class, error.to_string())
}

/// The event of a call about to be made again: attempt `attempt` of the call (the client's
/// retries) or of the turn (a stream that broke after output), after `wait`.
fn retrying(error: &LlmError, attempt: u32, wait: std::time::Duration) -> EventKind {
    EventKind::ModelCallRetrying {
        error: error.to_string(),
        kind: error.kind.as_str().to_owned(),
        attempt,
        delay_ms: u64::try_from(wait.as_millis()).unwrap_or(u64::MAX),
    }
}
