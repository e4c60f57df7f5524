//! The offline default: a `llama-server` (llama.cpp) that Trellis starts on the first model call, on a
//! free loopback port, waits for, talks to as an OpenAI-compatible server, and stops at the end of the
//! run. `scripts/local-model.sh` builds the server and fetches the models into `~/.cache/trellis/`.

use std::collections::HashSet;
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
use crate::http::{Secret, Transport};
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
///
/// Not used: n-gram speculative decoding (`--spec-type ngram-simple`, `ngram-mod`), which drafts an
/// answer's tokens from what the context already holds. On this CPU checking a draft costs about
/// what it saves: an agent's answers came at 7.1 - 11.0 tokens a second against 8.9 - 9.8 without
/// (2026-11-29, four suite tasks; a tenth of the tokens drafted at all, 21 - 94 % of those
/// accepted), and the greedy answers changed (a batch's arithmetic differs from a token's), which
/// sent two tasks on much longer paths. Nor a smaller physical batch (`--ubatch-size` 64, 128 or
/// 256 against the default 512): 677 new tokens after 10,883 cached took 36.6 - 37.1 s against
/// 37.4 - 41.4 s, after 1,681 cached 18.4 - 20.6 s against 21.2 - 21.8 s (2026-11-29, one server
/// each, the cache restored from one saved slot): the long context's cost is the same.
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
    /// The prompt cache on disk, when the server was given one.
    slots: Option<Arc<Slots>>,
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

    async fn chat(&self) -> Result<(Arc<OpenAiChat>, Option<Arc<Slots>>), LlmError> {
        let mut running = self.running.lock().await;
        if let Some(r) = running.as_mut() {
            match r.child.try_wait() {
                Ok(None) => return Ok((r.chat.clone(), r.slots.clone())),
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
        let handles = (started.chat.clone(), started.slots.clone());
        *running = Some(started);
        Ok(handles)
    }

    async fn start(&self, server: &Path, model: &Path) -> Result<Running, LlmError> {
        let port = trellis_process::port::free_port()
            .map_err(|e| Self::error(format!("no free loopback port: {e}")))?;
        let log = match &self.log {
            // In the run's record, where a command may have planted a link at its name.
            Some(path) => match trellis_process::files::create_no_link_async(path).await {
                Ok(file) => Stdio::from(file.into_std().await),
                Err(_) => Stdio::null(),
            },
            None => Stdio::null(),
        };
        let context = self.settings.context_size.unwrap_or(DEFAULT_CONTEXT);
        let threads = std::thread::available_parallelism().map_or(2, std::num::NonZero::get);
        // Only this process may use the server: it listens on loopback, where any local user could
        // otherwise send it prompts or have it save and restore its cache. The key goes in the
        // environment, which other users cannot read (a command line they can).
        let key = trellis_process::secrets::random_token().map_err(|e| {
            Self::error(format!(
                "cannot read /dev/urandom for the server's key: {e}"
            ))
        })?;
        let slot_dir = match &self.settings.prompt_cache {
            Some(dir) => prompt_cache_dir(dir).await,
            None => None,
        };
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
            .args(
                slot_dir
                    .iter()
                    .flat_map(|dir| [std::ffi::OsStr::new("--slot-save-path"), dir.as_os_str()]),
            )
            .env("LLAMA_API_KEY", &key)
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
        let key = Secret::new(key);
        let transport = Transport::new("local", &format!("{base}/v1"), Some(key.clone()));
        let slots = match slot_dir {
            Some(dir) => {
                Slots::of_server(dir, base, key, http, identity(server, model, context).await).await
            }
            None => None,
        };
        Ok(Running {
            child,
            chat: Arc::new(OpenAiChat::llama_server(transport)),
            slots,
        })
    }
}

/// The prompt cache: llama-server saves the KV cache of its slot to files in `dir`
/// (`--slot-save-path`) and restores them. What is saved is the opening that every agent session of
/// a kind shares — the system prompt and the tools, never a task or a conversation — so that a run's
/// first turn reads it instead of computing it again: the server reuses the longest common prefix
/// of what its slot holds and the prompt it is sent.
struct Slots {
    /// The server build, the model and the settings a saved cache is only good for.
    identity: String,
    dir: PathBuf,
    base: String,
    key: Secret,
    http: reqwest::Client,
    /// The openings restored or saved in this server's life, by file name.
    primed: Mutex<HashSet<String>>,
}

/// The prompt cache keeps its newest files up to this many bytes (the default model's opening of
/// ~1,040 tokens takes 23 MB).
const PROMPT_CACHE_BYTES: u64 = 256 * 1024 * 1024;

impl Slots {
    /// The prompt cache in `dir` of the server at `base`; `None` when the server keeps no slots to
    /// save (another build, a stand-in).
    async fn of_server(
        dir: PathBuf,
        base: String,
        key: Secret,
        http: reqwest::Client,
        identity: String,
    ) -> Option<Arc<Self>> {
        let keeps_slots = http
            .get(format!("{base}/slots"))
            .bearer_auth(key.expose())
            .send()
            .await
            .is_ok_and(|response| response.status().is_success());
        keeps_slots.then(|| {
            Arc::new(Self {
                identity,
                dir,
                base,
                key,
                http,
                primed: Mutex::new(HashSet::new()),
            })
        })
    }

    /// Before `request`, when it is the first of its kind in this server's life: restores the opening
    /// it shares with others of its kind, or has the server compute it (a one-token answer to the
    /// system prompt and the tools alone, which the request then reads from the slot) and saves it.
    /// Nothing here fails the call: without the cache the server computes the opening as part of
    /// the request.
    async fn prime(&self, chat: &OpenAiChat, request: &Request) {
        let Some(opening) = opening(request) else {
            return;
        };
        let name = self.file_name(&opening);
        let mut primed = self.primed.lock().await;
        if !primed.insert(name.clone()) {
            return;
        }
        let path = self.dir.join(&name);
        // When it is not restored (the slot busy with another session's request), it is computed
        // and saved again below, over it.
        if tokio::fs::try_exists(&path).await.unwrap_or(false)
            && self.slot_action("restore", &name).await
        {
            // Used: the last to go when the cache is pruned.
            if let Ok(file) = tokio::fs::File::options().write(true).open(&path).await {
                let _ = file
                    .into_std()
                    .await
                    .set_modified(std::time::SystemTime::now());
            }
            return;
        }
        if chat.stream(&opening, &|_| {}).await.is_err() {
            return;
        }
        // Saved under a name of its own, then renamed: another run's server never reads half a file.
        let temporary = format!("{name}.{}.tmp", std::process::id());
        if self.slot_action("save", &temporary).await
            && tokio::fs::rename(self.dir.join(&temporary), &path)
                .await
                .is_ok()
        {
            self.prune(&name).await;
        } else {
            let _ = tokio::fs::remove_file(self.dir.join(&temporary)).await;
        }
    }

    /// The file an opening's cache is saved in: a hash of what it depends on.
    fn file_name(&self, opening: &Request) -> String {
        use sha2::Digest as _;
        use std::fmt::Write as _;
        let mut hash = sha2::Sha256::new();
        hash.update(self.identity.as_bytes());
        hash.update(serde_json::to_vec(opening).unwrap_or_default());
        let mut name = String::new();
        for byte in &hash.finalize()[..16] {
            let _ = write!(name, "{byte:02x}");
        }
        name + ".bin"
    }

    /// Asks the server to save its slot to `file` in the cache, or restore it from there.
    async fn slot_action(&self, action: &str, file: &str) -> bool {
        self.http
            .post(format!("{}/slots/0?action={action}", self.base))
            .bearer_auth(self.key.expose())
            .json(&serde_json::json!({ "filename": file }))
            .send()
            .await
            .is_ok_and(|response| response.status().is_success())
    }

    /// Removes the oldest files (by when they were last used) past [`PROMPT_CACHE_BYTES`], never
    /// `kept`; and what a run that died mid-save left.
    async fn prune(&self, kept: &str) {
        let Ok(mut entries) = tokio::fs::read_dir(&self.dir).await else {
            return;
        };
        let mut files = Vec::new();
        while let Ok(Some(entry)) = entries.next_entry().await {
            let path = entry.path();
            let Ok(meta) = entry.metadata().await else {
                continue;
            };
            let used = meta.modified().unwrap_or(std::time::UNIX_EPOCH);
            let stale = used
                .elapsed()
                .is_ok_and(|age| age > Duration::from_hours(1));
            match path.extension().and_then(|e| e.to_str()) {
                Some("tmp") if stale => {
                    let _ = tokio::fs::remove_file(&path).await;
                }
                Some("bin") if entry.file_name() != kept => files.push((used, meta.len(), path)),
                _ => {}
            }
        }
        files.sort_by_key(|&(used, _, _)| std::cmp::Reverse(used));
        let mut total = tokio::fs::metadata(self.dir.join(kept))
            .await
            .map_or(0, |m| m.len());
        for (_, len, path) in files {
            total += len;
            if total > PROMPT_CACHE_BYTES {
                let _ = tokio::fs::remove_file(path).await;
            }
        }
    }
}

/// The request that computes what every session like `request` opens with: its system prompt and
/// tools alone — nothing of its session or conversation — and a one-token answer. `None` when
/// there is neither.
fn opening(request: &Request) -> Option<Request> {
    (request.system.is_some() || !request.tools.is_empty()).then(|| Request {
        model: request.model.clone(),
        system: request.system.clone(),
        tools: request.tools.clone(),
        max_tokens: Some(1),
        temperature: Some(0.0),
        cache_prompt: true,
        ..Request::default()
    })
}

/// The prompt cache's directory, made if need be and readable by its owner alone (it holds what
/// the model computed from system prompts, which may quote the project's memory files); `None`
/// when it cannot be, and the server then runs without one.
async fn prompt_cache_dir(dir: &Path) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt as _;
    tokio::fs::create_dir_all(dir).await.ok()?;
    tokio::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
        .await
        .ok()?;
    Some(dir.to_owned())
}

/// What a saved cache is only good for: the server's build and the model (their files' paths,
/// sizes and times) and the settings that shape the cache.
async fn identity(server: &Path, model: &Path, context: u32) -> String {
    async fn file(path: &Path) -> String {
        let meta = tokio::fs::metadata(path).await.ok();
        format!(
            "{} {:?} {:?}",
            path.display(),
            meta.as_ref().map(std::fs::Metadata::len),
            meta.and_then(|m| m.modified().ok())
        )
    }
    format!(
        "{}\n{}\n--ctx-size {context} {}",
        file(server).await,
        file(model).await,
        SERVER_TUNING.join(" ")
    )
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
        let (chat, slots) = self.chat().await?;
        let mut request = request.clone();
        request.model = self.model_id().to_owned();
        // Reasoning effort means nothing to these models; an unbounded answer could run for minutes.
        request.reasoning_effort = None;
        let cap = crate::catalog::lookup(self.model_id()).map_or(4096, |m| m.max_output);
        request.max_tokens = Some(request.max_tokens.map_or(cap, |m| m.min(cap)));
        // Greedy decoding: a small model keeps to instructions and JSON shapes far better, and a run
        // repeated on the same machine gives the same answers.
        request.temperature = Some(request.temperature.unwrap_or(0.0));
        if let Some(slots) = slots.filter(|_| request.cache_prompt) {
            slots.prime(&chat, &request).await;
        }
        chat.stream(&request, on_event).await
    }

    async fn shutdown(&self) {
        if let Some(mut running) = self.running.lock().await.take() {
            stop_group(&running.child);
            let _ = running.child.kill().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::{Message, ToolChoice, ToolDef};

    #[test]
    fn an_opening_is_the_system_prompt_and_the_tools_alone() {
        let tool = ToolDef {
            name: "read_file".into(),
            description: "Reads a file.".into(),
            parameters: serde_json::json!({ "type": "object" }),
        };
        let request = Request {
            model: "m".into(),
            system: Some("You are an agent.".into()),
            system_session: Some("The working directory holds:\na.py".into()),
            messages: vec![Message::user("Fix a.py; the key is s3cr3t.")],
            tools: vec![tool.clone()],
            max_tokens: Some(4096),
            tool_choice: ToolChoice::Required,
            cache_prompt: true,
            ..Request::default()
        };
        let shared = opening(&request).unwrap();
        assert_eq!(
            shared,
            Request {
                model: "m".into(),
                system: Some("You are an agent.".into()),
                tools: vec![tool],
                max_tokens: Some(1),
                temperature: Some(0.0),
                cache_prompt: true,
                ..Request::default()
            }
        );
        // Sessions differing in all but the opening share it.
        let another = Request {
            system_session: None,
            messages: vec![Message::user("Something else.")],
            ..request.clone()
        };
        assert_eq!(opening(&another), Some(shared));
        assert_eq!(opening(&Request::default()), None);
    }
}
