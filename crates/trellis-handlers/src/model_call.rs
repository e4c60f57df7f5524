//! One model conversation inside a stage: calls through the `trellis-llm` client, the events that
//! report them, usage summed over the turns, and provider errors turned into stage outcomes (a
//! transient error is retryable by the node's retry policy; a missing model stops the run).

use std::time::Instant;

use serde_json::json;
use trellis_engine::{FailureClass, Outcome, Stage};
use trellis_llm::{Client, ErrorKind, LlmError, Request, ResolvedModel, Response, Usage};

/// Event names of model calls.
pub mod events {
    pub const CALL_STARTED: &str = "ModelCallStarted";
    pub const CALL_COMPLETED: &str = "ModelCallCompleted";
    pub const CALL_RETRYING: &str = "ModelCallRetrying";
    pub const WARNING: &str = "ModelWarning";
}

/// A stage's conversation with one model.
pub struct ModelCall<'a> {
    client: &'a Client,
    pub resolved: ResolvedModel,
    stage: &'a Stage<'a>,
    pub usage: Usage,
    pub turns: u32,
}

impl<'a> ModelCall<'a> {
    /// Resolves the node's model; a model that cannot run here is a configuration failure.
    pub fn new(
        client: &'a Client,
        stage: &'a Stage<'a>,
        model: Option<&str>,
        provider: Option<&str>,
    ) -> Result<Self, Box<Outcome>> {
        let resolved = client
            .resolve(model, provider)
            .map_err(|e| Box::new(failure(&e)))?;
        if let Some(warning) = &resolved.warning {
            stage.emitter.emit(
                events::WARNING,
                Some(&stage.node.id),
                json!({ "message": warning }),
            );
        }
        Ok(Self {
            client,
            resolved,
            stage,
            usage: Usage::default(),
            turns: 0,
        })
    }

    /// One call, retried by the client on transient errors; each call is reported as events.
    pub async fn ask(&mut self, request: &Request) -> Result<Response, Box<Outcome>> {
        self.turns += 1;
        let node = Some(self.stage.node.id.as_str());
        let emitter = self.stage.emitter;
        emitter.emit(
            events::CALL_STARTED,
            node,
            json!({ "model": self.resolved.model, "provider": self.resolved.provider, "turn": self.turns }),
        );
        let started = Instant::now();
        let result = self
            .client
            .complete(&self.resolved, request, &|_| {}, &|error, attempt, wait| {
                emitter.emit(
                    events::CALL_RETRYING,
                    node,
                    json!({ "error": error.to_string(), "kind": error.kind.as_str(), "attempt": attempt, "delay_ms": wait.as_millis() }),
                );
            })
            .await;
        let duration_ms = started.elapsed().as_millis();
        match result {
            Ok(response) => {
                self.usage.add(response.usage);
                emitter.emit(
                    events::CALL_COMPLETED,
                    node,
                    json!({
                        "model": response.model, "provider": response.provider, "turn": self.turns,
                        "usage": response.usage, "stop_reason": response.stop_reason, "duration_ms": duration_ms,
                    }),
                );
                Ok(response)
            }
            Err(error) => {
                emitter.emit(
                    events::CALL_COMPLETED,
                    node,
                    json!({ "model": self.resolved.model, "provider": self.resolved.provider, "turn": self.turns, "error": error.to_string(), "kind": error.kind.as_str(), "duration_ms": duration_ms }),
                );
                Err(Box::new(failure(&error)))
            }
        }
    }

    /// Adds the model, provider, usage and turn count to an outcome's details.
    pub fn describe(&self, outcome: &mut Outcome) {
        outcome
            .details
            .insert("model".into(), json!(self.resolved.model));
        outcome
            .details
            .insert("provider".into(), json!(self.resolved.provider));
        outcome.details.insert("usage".into(), json!(self.usage));
        outcome.details.insert("turns".into(), json!(self.turns));
    }
}

/// The stage outcome for a failed model call. A missing or rejected key is a setup problem that stops
/// the run: every later model stage would fail the same way.
pub fn failure(error: &LlmError) -> Outcome {
    let class = if matches!(error.kind, ErrorKind::Configuration | ErrorKind::Auth) {
        FailureClass::Configuration
    } else if error.retryable() {
        FailureClass::Transient
    } else {
        FailureClass::StageFailed
    };
    Outcome::failed(class, error.to_string())
}
