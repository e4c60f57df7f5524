//! The HTTP transport every adapter shares: POST a JSON body, turn an error status into a typed
//! [`LlmError`] (with `Retry-After`), and read a server-sent-event stream with a per-read timeout.

use std::fmt;
use std::time::Duration;

use bytes::Bytes;
use eventsource_stream::{Event, EventStream, Eventsource};
use futures::{Stream, StreamExt};
use serde_json::Value;

use crate::error::{ErrorKind, LlmError};

/// An API key. It prints as `[redacted]`, and [`Secret::redact`] scrubs it out of provider text.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }

    pub fn expose(&self) -> &str {
        &self.0
    }

    /// `text` with every occurrence of the key replaced.
    pub fn redact(&self, text: &str) -> String {
        if self.0.len() < 4 {
            return text.to_owned();
        }
        text.replace(&self.0, "[redacted]")
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[redacted]")
    }
}

/// How long a stream may go without a byte before the call fails as a network error.
pub const DEFAULT_READ_TIMEOUT: Duration = Duration::from_mins(5);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);
/// Error bodies are read up to this size.
const MAX_ERROR_BODY: usize = 64 * 1024;

/// One provider's connection settings.
#[derive(Clone)]
pub struct Transport {
    http: reqwest::Client,
    pub provider: String,
    pub base_url: String,
    pub key: Option<Secret>,
    pub read_timeout: Duration,
}

impl fmt::Debug for Transport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Transport")
            .field("provider", &self.provider)
            .field("base_url", &self.base_url)
            .field("key", &self.key)
            .finish_non_exhaustive()
    }
}

/// An HTTP client as Trellis makes them (the providers', MCP servers' over HTTP): TLS by rustls on
/// the ring provider, trusting the system's certificates and Mozilla's (bundled, so a machine
/// without a certificate store still reaches the providers), a 30 s connection timeout.
pub fn client() -> reqwest::Client {
    static BUNDLED: std::sync::LazyLock<Vec<reqwest::Certificate>> =
        std::sync::LazyLock::new(|| {
            webpki_root_certs::TLS_SERVER_ROOT_CERTS
                .iter()
                .filter_map(|der| reqwest::Certificate::from_der(der).ok())
                .collect()
        });
    // Once per process; an error only says a provider is installed already.
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::builder()
        .connect_timeout(CONNECT_TIMEOUT)
        .tls_certs_merge(BUNDLED.iter().cloned())
        .build()
        .unwrap_or_else(|_| reqwest::Client::new())
}

impl Transport {
    pub fn new(provider: &str, base_url: &str, key: Option<Secret>) -> Self {
        let http = client();
        Self {
            http,
            provider: provider.to_owned(),
            base_url: base_url.trim_end_matches('/').to_owned(),
            key,
            read_timeout: DEFAULT_READ_TIMEOUT,
        }
    }

    /// The `Authorization: Bearer` header OpenAI and compatible servers take, when there is a key.
    pub fn bearer(&self) -> Vec<(&'static str, String)> {
        self.key
            .iter()
            .map(|key| ("authorization", format!("Bearer {}", key.expose())))
            .collect()
    }

    /// `base_url` joined with `path` (which starts with `/`).
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base_url)
    }

    /// An error of `kind` from this provider, with the key scrubbed from `message`.
    pub fn error(&self, kind: ErrorKind, message: impl AsRef<str>) -> LlmError {
        LlmError::new(kind, &self.provider, self.scrub(message.as_ref()))
    }

    fn scrub(&self, text: &str) -> String {
        match &self.key {
            Some(key) => key.redact(text),
            None => text.to_owned(),
        }
    }

    /// POSTs `body` and opens the event stream of a successful answer.
    pub async fn post_sse(
        &self,
        url: &str,
        headers: &[(&str, String)],
        body: &Value,
    ) -> Result<SseStream, LlmError> {
        let mut request = self
            .http
            .post(url)
            .header("accept", "text/event-stream")
            .json(body);
        for (name, value) in headers {
            request = request.header(*name, value);
        }
        let response = tokio::time::timeout(self.read_timeout, request.send())
            .await
            .map_err(|_| self.error(ErrorKind::Network, "no answer before the read timeout"))?
            .map_err(|e| self.network_error(&e))?;
        let status = response.status();
        if !status.is_success() {
            return Err(self.status_error(response).await);
        }
        let bytes: ByteStream = Box::pin(response.bytes_stream());
        Ok(SseStream {
            inner: bytes.eventsource(),
            transport: self.clone(),
            started: false,
        })
    }

    fn network_error(&self, error: &reqwest::Error) -> LlmError {
        // reqwest's text names the URL, never headers, so the key cannot leak through it.
        let mut text = error.to_string();
        let mut source = std::error::Error::source(error);
        while let Some(cause) = source {
            text.push_str(": ");
            text.push_str(&cause.to_string());
            source = cause.source();
        }
        self.error(ErrorKind::Network, text)
    }

    async fn status_error(&self, response: reqwest::Response) -> LlmError {
        let status = response.status().as_u16();
        let retry_after = retry_after(response.headers());
        let mut body = response.text().await.unwrap_or_default();
        if body.len() > MAX_ERROR_BODY {
            let cut = (0..=MAX_ERROR_BODY)
                .rev()
                .find(|&i| body.is_char_boundary(i))
                .unwrap_or(0);
            body.truncate(cut);
        }
        let (kind, message) = classify_error_body(status, &body);
        let mut error = self.error(kind, message).with_status(status);
        error.retry_after = retry_after;
        error
    }
}

/// Reads `Retry-After` (seconds, possibly fractional) or `retry-after-ms`.
fn retry_after(headers: &reqwest::header::HeaderMap) -> Option<Duration> {
    let read = |name: &str| headers.get(name)?.to_str().ok()?.trim().parse::<f64>().ok();
    if let Some(ms) = read("retry-after-ms").filter(|v| v.is_finite() && *v >= 0.0) {
        return Some(Duration::from_secs_f64(ms / 1000.0));
    }
    read("retry-after")
        .filter(|v| v.is_finite() && *v >= 0.0)
        .map(|secs| Duration::from_secs_f64(secs.min(3600.0)))
}

/// The error kind and message from a provider's error body. The three formats:
/// OpenAI `{"error": {"message", "type", "code"}}`, Anthropic `{"type": "error", "error": {"type",
/// "message"}}`, Gemini `{"error": {"code", "message", "status"}}`.
pub fn classify_error_body(status: u16, body: &str) -> (ErrorKind, String) {
    let mut kind = ErrorKind::from_status(status);
    let parsed: Option<Value> = serde_json::from_str(body).ok();
    let error = parsed.as_ref().and_then(|v| v.get("error"));
    let field = |name: &str| {
        error
            .and_then(|e| e.get(name))
            .and_then(Value::as_str)
            .unwrap_or("")
    };
    let message = match field("message") {
        "" if body.trim().is_empty() => format!("HTTP {status} with an empty body"),
        "" => body.trim().chars().take(500).collect(),
        message => message.to_owned(),
    };
    let code = field("code");
    let kind_word = field("type");
    let gemini_status = field("status");
    // llama-server says `exceed_context_size_error`, "the request exceeds the available context size".
    if code == "context_length_exceeded"
        || kind_word == "exceed_context_size_error"
        || (kind == ErrorKind::BadRequest
            && (message.contains("prompt is too long")
                || message.contains("maximum context length")
                || message.contains("exceeds the context size")
                || message.contains("exceeds the available context size")
                || message.contains("input token count")))
    {
        kind = ErrorKind::ContextLength;
    } else if kind_word == "overloaded_error" {
        kind = ErrorKind::Overloaded;
    } else if kind_word == "rate_limit_error" || gemini_status == "RESOURCE_EXHAUSTED" {
        kind = ErrorKind::RateLimit;
    } else if code == "content_filter" || code == "content_policy_violation" {
        kind = ErrorKind::ContentFilter;
    }
    (kind, message)
}

type ByteStream = std::pin::Pin<Box<dyn Stream<Item = reqwest::Result<Bytes>> + Send>>;

/// Server-sent events of one answer. Every read is bounded by the transport's read timeout.
pub struct SseStream {
    inner: EventStream<ByteStream>,
    transport: Transport,
    /// Whether any output reached the caller (errors after that are never retried).
    pub started: bool,
}

impl SseStream {
    /// The next event; `None` when the server closed the stream.
    pub async fn next(&mut self) -> Option<Result<Event, LlmError>> {
        let item = match tokio::time::timeout(self.transport.read_timeout, self.inner.next()).await
        {
            Ok(item) => item?,
            Err(_) => {
                return Some(Err(self.fail(
                    ErrorKind::Network,
                    "the stream stalled past the read timeout",
                )));
            }
        };
        Some(item.map_err(|e| self.fail(ErrorKind::Network, format!("the stream broke: {e}"))))
    }

    /// An error at this point of the stream, marked partial when output already went out.
    pub fn fail(&self, kind: ErrorKind, message: impl AsRef<str>) -> LlmError {
        let mut error = self.transport.error(kind, message);
        error.partial_output = self.started;
        error
    }

    /// Parses an event's data as JSON, failing as a protocol error.
    pub fn json(&self, event: &Event) -> Result<Value, LlmError> {
        serde_json::from_str(&event.data).map_err(|e| {
            self.fail(
                ErrorKind::Protocol,
                format!("a streamed chunk is not valid JSON ({e})"),
            )
        })
    }

    /// Reads an event whose data names its type in a `type` field (Anthropic's and the Responses
    /// API's) as the protocol's event type `T`; a server that leaves the field out has it from the
    /// event's SSE name.
    pub fn typed_event<T: serde::de::DeserializeOwned>(
        &self,
        event: &Event,
    ) -> Result<T, LlmError> {
        let mut data = self.json(event)?;
        if data.get("type").is_none()
            && let Some(map) = data.as_object_mut()
        {
            map.insert("type".into(), Value::String(event.event.clone()));
        }
        self.parse(data)
    }

    /// Reads a streamed chunk (its JSON) as the protocol's type `T`, failing as a protocol error.
    pub fn parse<T: serde::de::DeserializeOwned>(&self, data: Value) -> Result<T, LlmError> {
        serde_json::from_value(data).map_err(|e| {
            self.fail(
                ErrorKind::Protocol,
                format!("a streamed chunk is not what the protocol says ({e})"),
            )
        })
    }

    /// The stream ended before the provider said the answer was complete.
    pub fn ended_early(&self) -> LlmError {
        self.fail(
            ErrorKind::Protocol,
            "the stream ended before the answer was complete",
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_providers_context_overflow_is_one_kind() {
        for (status, body) in [
            (
                400,
                r#"{"error": {"code": 400, "type": "exceed_context_size_error", "message": "the request exceeds the available context size, try increasing it", "n_prompt_tokens": 17000, "n_ctx": 16384}}"#,
            ),
            (
                400,
                r#"{"type": "error", "error": {"type": "invalid_request_error", "message": "prompt is too long: 210000 tokens > 200000 maximum"}}"#,
            ),
            (
                400,
                r#"{"error": {"message": "This model's maximum context length is 128000 tokens.", "type": "invalid_request_error", "code": "context_length_exceeded"}}"#,
            ),
            (
                400,
                r#"{"error": {"code": 400, "message": "The input token count (1200000) exceeds the maximum number of tokens allowed (1048576).", "status": "INVALID_ARGUMENT"}}"#,
            ),
        ] {
            assert_eq!(
                classify_error_body(status, body).0,
                ErrorKind::ContextLength,
                "{body}"
            );
        }
    }
}

#[cfg(test)]
mod client_tests {
    #[test]
    fn the_client_builds_with_the_bundled_certificates() {
        // `client` falls back to a default client on a builder error; this one must not fail.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let certs: Vec<reqwest::Certificate> = webpki_root_certs::TLS_SERVER_ROOT_CERTS
            .iter()
            .filter_map(|der| reqwest::Certificate::from_der(der).ok())
            .collect();
        assert!(certs.len() > 100, "{}", certs.len());
        reqwest::Client::builder()
            .tls_certs_merge(certs)
            .build()
            .unwrap();
    }

    #[tokio::test]
    async fn an_https_request_gets_as_far_as_connecting() {
        // TLS is set up (a provider is installed): the request fails only for want of a server.
        let error = super::client()
            .get("https://127.0.0.1:9/")
            .send()
            .await
            .unwrap_err();
        assert!(error.is_connect(), "{error:?}");
    }
}
