//! The provider seam: one streaming call in the neutral [`Request`]/[`Response`] shape. Each adapter in
//! `providers/` speaks one native HTTP API.

use async_trait::async_trait;

use crate::error::LlmError;
use crate::message::{Request, Response, StreamEvent};

/// Receives events while an answer streams.
pub type OnEvent<'a> = &'a (dyn Fn(StreamEvent) + Send + Sync);

#[async_trait]
pub trait Provider: Send + Sync {
    /// The provider's name (`anthropic`, `openai`, `gemini`, `local`, ...).
    fn name(&self) -> &str;

    /// Streams one answer. Errors after output reached `on_event` are marked `partial_output`.
    async fn stream(&self, request: &Request, on_event: OnEvent<'_>) -> Result<Response, LlmError>;

    /// The one model this provider serves, when it serves only one (the local server).
    fn model_id(&self) -> Option<&str> {
        None
    }

    /// The context window of the model it serves, when the provider knows it (the local server was
    /// started with one).
    fn context_window(&self) -> Option<u32> {
        None
    }

    /// Stops anything the provider started (the local model server). Called at the end of a run.
    async fn shutdown(&self) {}
}
