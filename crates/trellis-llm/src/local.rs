//! The offline default: a `llama-server` (llama.cpp) that Trellis starts on the first model call, on a
//! free loopback port, waits for, talks to as an OpenAI-compatible server, and stops at the end of the
//! run. `scripts/local-model.sh` builds the server and fetches the models into `~/.cache/trellis/`.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use tokio::process::{Child, Command};
use tokio::sync::Mutex;

use crate::catalog::LOCAL_MODEL_ID;
use crate::config::LocalSettings;
use crate::error::{ErrorKind, LlmError};
use crate::http::Transport;
use crate::message::{Request, Response};
use crate::provider::{OnEvent, Provider};
use crate::providers::OpenAiChat;

/// Runs `"$@"` (the server) until it exits or the process `$1` (trellis) is gone, then stops it.
const WATCHDOG: &str = r#"parent=$1; shift
"$@" & server=$!
trap 'kill $server 2>/dev/null' EXIT
trap 'exit 0' TERM INT
while kill -0 "$parent" 2>/dev/null && kill -0 "$server" 2>/dev/null; do sleep 1; done"#;

/// How long the server may take to load its model.
const STARTUP_TIMEOUT: Duration = Duration::from_mins(3);
const DEFAULT_CONTEXT: u32 = 16_384;

/// How llama-server is told to attend on a CPU (also given to the agent benchmark's peer):
/// - flash attention off: with it, each new token costs more as the context grows (the 20th turn of
///   a session took 33 s, against 20.5 s without; `cargo bench -p trellis-llm --bench turn_latency`);
/// - keys cached in 8 bits: a long context's attention reads half as much (the 20th turn took
///   23.0 - 23.3 s, against 27.9 - 30.4 s with 16-bit keys; 2026-11-28, alternated by hand). Values
///   stay 16-bit: 8-bit values need flash attention.
pub const SERVER_TUNING: [&str; 4] = ["--flash-attn", "off", "--cache-type-k", "q8_0"];

/// The message that tells a user how to get a model at all.
pub const SETUP_HELP: &str = "run `scripts/local-model.sh` to build the local model server and fetch the default model \
     (cached under ~/.cache/trellis), or set ANTHROPIC_API_KEY, OPENAI_API_KEY or GEMINI_API_KEY to use a hosted provider";

/// Whether the local model's files are there, for `trellis models`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LocalState {
    Ready { server: PathBuf, model: PathBuf },
    MissingServer(PathBuf),
    MissingModel(PathBuf),
    NotConfigured,
}

pub fn state(settings: &LocalSettings) -> LocalState {
    match (&settings.server, &settings.model) {
        (Some(server), _) if !server.is_file() => LocalState::MissingServer(server.clone()),
        (_, Some(model)) if !model.is_file() => LocalState::MissingModel(model.clone()),
        (Some(server), Some(model)) => LocalState::Ready {
            server: server.clone(),
            model: model.clone(),
        },
        _ => LocalState::NotConfigured,
    }
}

struct Running {
    child: Child,
    chat: Arc<OpenAiChat>,
}

impl Drop for Running {
    fn drop(&mut self) {
        // However the run ends, the server goes with it.
        stop_group(&self.child);
    }
}

/// The local model as a provider; the server starts on the first call.
pub struct LocalProvider {
    settings: LocalSettings,
    /// Where the server's own output goes (the run directory), if anywhere.
    log: Option<PathBuf>,
    running: Mutex<Option<Running>>,
}

impl LocalProvider {
    pub fn new(settings: LocalSettings, log: Option<PathBuf>) -> Self {
        Self {
            settings,
            log,
            running: Mutex::new(None),
        }
    }

    /// The model id this server answers as: the configured id, else the model file's name for a model
    /// other than the default one.
    pub fn model_id(&self) -> &str {
        if let Some(id) = &self.settings.model_id {
            return id;
        }
        self.settings
            .model
            .as_deref()
            .filter(|m| {
                m.file_name().and_then(|n| n.to_str()) != Some(crate::config::DEFAULT_MODEL_FILE)
            })
            .and_then(|m| m.file_stem()?.to_str())
            .unwrap_or(LOCAL_MODEL_ID)
    }

    fn error(message: impl Into<String>) -> LlmError {
        LlmError::new(ErrorKind::Configuration, "local", message)
    }

    async fn chat(&self) -> Result<Arc<OpenAiChat>, LlmError> {
        let mut running = self.running.lock().await;
        if let Some(r) = running.as_mut() {
            match r.child.try_wait() {
                Ok(None) => return Ok(r.chat.clone()),
                // The server died (out of memory, killed): start it again.
                _ => *running = None,
            }
        }
        let (server, model) = match state(&self.settings) {
            LocalState::Ready { server, model } => (server, model),
            LocalState::MissingServer(path) => {
                return Err(Self::error(format!(
                    "no model provider is configured and the local model server is missing ({}); {SETUP_HELP}",
                    path.display()
                )));
            }
            LocalState::MissingModel(path) => {
                return Err(Self::error(format!(
                    "no model provider is configured and the local model is missing ({}); {SETUP_HELP}",
                    path.display()
                )));
            }
            LocalState::NotConfigured => {
                return Err(Self::error(format!(
                    "no model provider is configured; {SETUP_HELP}"
                )));
            }
        };
        let started = self.start(&server, &model).await?;
        let chat = started.chat.clone();
        *running = Some(started);
        Ok(chat)
    }

    async fn start(&self, server: &Path, model: &Path) -> Result<Running, LlmError> {
        let port = trellis_process::port::free_port()
            .map_err(|e| Self::error(format!("no free loopback port: {e}")))?;
        let log = match &self.log {
            Some(path) => match tokio::fs::File::create(path).await {
                Ok(file) => Stdio::from(file.into_std().await),
                Err(_) => Stdio::null(),
            },
            None => Stdio::null(),
        };
        let context = self.settings.context_size.unwrap_or(DEFAULT_CONTEXT);
        let threads = std::thread::available_parallelism().map_or(2, std::num::NonZero::get);
        // The server runs under a small shell watchdog in its own process group: when this process
        // dies without stopping it (SIGKILL), the watchdog notices within a second and stops the
        // server, so no orphan keeps a model in memory.
        let mut command = Command::new("sh");
        command
            .args(["-c", WATCHDOG, "trellis-local-model"])
            .arg(std::process::id().to_string())
            .arg(server)
            .arg("--model")
            .arg(model)
            .args(["--host", "127.0.0.1", "--port", &port.to_string()])
            .args(["--ctx-size", &context.to_string(), "--parallel", "1"])
            .args(["--threads", &threads.to_string()])
            .args(SERVER_TUNING)
            .args(["--alias", self.model_id(), "--jinja", "--no-webui"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .process_group(0)
            .kill_on_drop(true);
        let mut child = command.spawn().map_err(|e| {
            Self::error(format!(
                "cannot start the local model server {}: {e}",
                server.display()
            ))
        })?;
        let base = format!("http://127.0.0.1:{port}");
        let http = crate::http::client();
        let deadline = Instant::now() + STARTUP_TIMEOUT;
        loop {
            if let Ok(Some(status)) = child.try_wait() {
                let hint = self
                    .log
                    .as_ref()
                    .map(|p| format!(" (its output is in {})", p.display()))
                    .unwrap_or_default();
                return Err(Self::error(format!(
                    "the local model server exited while loading the model ({status}){hint}"
                )));
            }
            if let Ok(response) = http.get(format!("{base}/health")).send().await
                && response.status().is_success()
            {
                break;
            }
            if Instant::now() > deadline {
                stop_group(&child);
                let _ = child.kill().await;
                return Err(Self::error(format!(
                    "the local model server did not become ready within {}s",
                    STARTUP_TIMEOUT.as_secs()
                )));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let transport = Transport::new("local", &format!("{base}/v1"), None);
        Ok(Running {
            child,
            chat: Arc::new(OpenAiChat::llama_server(transport)),
        })
    }
}

/// Stops the watchdog and the server with it (their process group). The server keeps no state worth
/// a graceful shutdown, and SIGKILL leaves no window in which it still holds the model.
fn stop_group(child: &Child) {
    if let Some(pid) = child.id() {
        trellis_process::group::kill_group(pid);
    }
}

#[async_trait]
impl Provider for LocalProvider {
    fn name(&self) -> &'static str {
        "local"
    }

    fn model_id(&self) -> Option<&str> {
        Some(LocalProvider::model_id(self))
    }

    fn context_window(&self) -> Option<u32> {
        Some(self.settings.context_size.unwrap_or(DEFAULT_CONTEXT))
    }

    async fn stream(&self, request: &Request, on_event: OnEvent<'_>) -> Result<Response, LlmError> {
        let chat = self.chat().await?;
        let mut request = request.clone();
        request.model = self.model_id().to_owned();
        // Reasoning effort means nothing to these models; an unbounded answer could run for minutes.
        request.reasoning_effort = None;
        let cap = crate::catalog::lookup(self.model_id()).map_or(4096, |m| m.max_output);
        request.max_tokens = Some(request.max_tokens.map_or(cap, |m| m.min(cap)));
        // Greedy decoding: a small model keeps to instructions and JSON shapes far better, and a run
        // repeated on the same machine gives the same answers.
        request.temperature = Some(request.temperature.unwrap_or(0.0));
        chat.stream(&request, on_event).await
    }

    async fn shutdown(&self) {
        if let Some(mut running) = self.running.lock().await.take() {
            stop_group(&running.child);
            let _ = running.child.kill().await;
        }
    }
}
