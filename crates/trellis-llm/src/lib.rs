//! `trellis-llm`: one client for every model provider. Callers build a neutral [`Request`] (system
//! prompt, messages, tools), resolve a model name through the [`catalog`] to a provider, and get a
//! [`Response`] (text, tool calls, usage, stop reason) or a typed [`LlmError`] whose `retryable` flag
//! drives retries. Adapters speak each provider's native streaming HTTP API: Anthropic Messages, OpenAI
//! Responses and Chat Completions, Gemini, and any OpenAI-compatible server — including the local
//! `llama-server` that is the offline default. Sits below `trellis-agent` and `trellis-handlers`.

pub mod catalog;
mod client;
pub mod config;
mod error;
mod http;
pub mod local;
mod message;
mod provider;
pub mod providers;
mod retry;
pub mod text_tool_calls;

pub use client::{
    Client, OnRetry, PROVIDER_ALIASES, ResolvedModel, build_provider, known_provider,
};
pub use config::Config;
pub use error::{ErrorKind, LlmError};
pub use http::{Secret, Transport, client as http_client};
pub use message::{
    Message, Part, ReasoningEffort, Request, Response, ResponseSchema, Role, StopReason,
    StreamEvent, ToolCall, ToolChoice, ToolDef, ToolResult, Usage,
};
pub use provider::{OnEvent, Provider};
pub use retry::{MAX_RETRY_AFTER, RetryPolicy, TURN_RETRIES};
