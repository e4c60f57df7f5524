//! Typed model-call errors. Whether an error may be retried is a property of its kind (and of whether
//! output already streamed), never a guess from the message text.

use std::fmt;
use std::time::Duration;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// 429: too many requests or tokens.
    RateLimit,
    /// The provider is overloaded (Anthropic 529, 503).
    Overloaded,
    /// 5xx.
    Server,
    /// Could not connect, the connection dropped, or a read timed out.
    Network,
    /// 401/403: a missing, wrong or unauthorised key.
    Auth,
    /// 400/404/422: the request itself is wrong.
    BadRequest,
    /// The prompt does not fit the model's context window.
    ContextLength,
    /// The provider refused to answer for safety reasons.
    ContentFilter,
    /// The answer broke the protocol: malformed JSON, or a stream that ended without finishing.
    Protocol,
    /// Trellis is not set up for this call (no key, unknown provider, no local model).
    Configuration,
}

impl ErrorKind {
    /// Kinds a later attempt may get past.
    pub fn retryable(self) -> bool {
        matches!(
            self,
            ErrorKind::RateLimit
                | ErrorKind::Overloaded
                | ErrorKind::Server
                | ErrorKind::Network
                | ErrorKind::Protocol
        )
    }

    pub fn as_str(self) -> &'static str {
        match self {
            ErrorKind::RateLimit => "rate_limit",
            ErrorKind::Overloaded => "overloaded",
            ErrorKind::Server => "server",
            ErrorKind::Network => "network",
            ErrorKind::Auth => "auth",
            ErrorKind::BadRequest => "bad_request",
            ErrorKind::ContextLength => "context_length",
            ErrorKind::ContentFilter => "content_filter",
            ErrorKind::Protocol => "protocol",
            ErrorKind::Configuration => "configuration",
        }
    }

    /// The kind an HTTP error status means.
    pub fn from_status(status: u16) -> Self {
        match status {
            429 => ErrorKind::RateLimit,
            503 | 529 => ErrorKind::Overloaded,
            401 | 403 => ErrorKind::Auth,
            413 => ErrorKind::ContextLength,
            408 | 500..=599 => ErrorKind::Server,
            _ => ErrorKind::BadRequest,
        }
    }
}

/// A failed model call. The message never contains an API key: provider text is redacted before it
/// gets here.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub struct LlmError {
    pub kind: ErrorKind,
    pub provider: String,
    pub status: Option<u16>,
    pub message: String,
    /// How long the provider asked us to wait (`Retry-After`).
    pub retry_after: Option<Duration>,
    /// Part of the answer had already streamed when the call failed; it is never retried.
    pub partial_output: bool,
}

impl LlmError {
    pub fn new(kind: ErrorKind, provider: &str, message: impl Into<String>) -> Self {
        Self {
            kind,
            provider: provider.to_owned(),
            status: None,
            message: message.into(),
            retry_after: None,
            partial_output: false,
        }
    }

    #[must_use]
    pub fn with_status(mut self, status: u16) -> Self {
        self.status = Some(status);
        self
    }

    /// Whether another attempt may succeed: a retryable kind, and nothing streamed yet.
    pub fn retryable(&self) -> bool {
        self.kind.retryable() && !self.partial_output
    }
}

impl fmt::Display for LlmError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} error from {}", self.kind.as_str(), self.provider)?;
        if let Some(status) = self.status {
            write!(f, " (HTTP {status})")?;
        }
        write!(f, ": {}", self.message)?;
        if self.partial_output {
            f.write_str(" (after part of the answer had streamed)")?;
        }
        Ok(())
    }
}
