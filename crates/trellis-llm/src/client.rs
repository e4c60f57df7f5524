//! The one client callers use: it resolves a model name to a provider and model id (through the
//! catalog), and makes the call with retries.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use crate::catalog::{self, ModelInfo};
use crate::config::{Config, ProviderSettings};
use crate::error::{ErrorKind, LlmError};
use crate::http::Transport;
use crate::local::{LocalProvider, SETUP_HELP};
use crate::message::{Request, Response, StopReason};
use crate::provider::{OnEvent, Provider};
use crate::providers::{Anthropic, Gemini, OpenAiChat, OpenAiResponses};
use crate::retry::RetryPolicy;

/// A model name resolved to where it runs.
#[derive(Debug, Clone, PartialEq)]
pub struct ResolvedModel {
    pub provider: String,
    /// The id sent to the provider.
    pub model: String,
    pub info: Option<&'static ModelInfo>,
    /// Said once to the user: an unknown model id, or a hosted model replaced by the local one.
    pub warning: Option<String>,
}

/// Called before each retry with the error, the attempt about to start, and the wait.
pub type OnRetry<'a> = &'a (dyn Fn(&LlmError, u32, Duration) + Send + Sync);

pub struct Client {
    providers: BTreeMap<String, Arc<dyn Provider>>,
    /// Whether a hosted provider is configured; without one every model runs locally.
    hosted: bool,
    default_model: Option<String>,
    default_provider: Option<String>,
    /// Context windows the config sets, by provider.
    context_windows: BTreeMap<String, u32>,
    /// Models to try, in order, when one cannot answer for a reason of its provider's
    /// ([`Client::fallbacks_after`]).
    fallbacks: Vec<String>,
    pub retry: RetryPolicy,
}

impl Client {
    /// A client for every provider `config` configures, plus the local model. `local_log` receives the
    /// local server's output.
    pub fn from_config(config: &Config, local_log: Option<PathBuf>) -> Self {
        let mut providers: BTreeMap<String, Arc<dyn Provider>> = BTreeMap::new();
        for name in config.configured() {
            let settings = &config.providers[name];
            providers.insert(name.to_owned(), build_provider(name, settings));
        }
        let hosted = !providers.is_empty();
        providers.insert(
            "local".into(),
            Arc::new(LocalProvider::new(config.local.clone(), local_log)),
        );
        Self {
            providers,
            hosted,
            default_model: config.default_model.clone(),
            default_provider: config.default_provider.clone(),
            context_windows: config
                .providers
                .iter()
                .filter_map(|(name, p)| Some((name.clone(), p.context_window?)))
                .collect(),
            fallbacks: Vec::new(),
            retry: RetryPolicy::default(),
        }
    }

    /// The same client with the run's model choice (`--provider`, a run file's `[run.model]`):
    /// `provider` for models the catalog does not place, and `fallbacks` — providers (`openai`: its
    /// usual model), models, or `provider/model` — tried in order when a model's provider fails a
    /// call.
    #[must_use]
    pub fn with_run_model(mut self, provider: Option<String>, fallbacks: Vec<String>) -> Self {
        if provider.is_some() {
            self.default_provider = provider;
        }
        self.fallbacks = fallbacks;
        self
    }

    /// The models to try after `failed` could not answer because its provider failed (a kind that
    /// [`ErrorKind::retryable`], after the retries): each fallback that runs here and is not `failed`
    /// itself, in order.
    pub fn fallbacks_after(&self, failed: &ResolvedModel) -> Vec<ResolvedModel> {
        let mut models: Vec<ResolvedModel> = Vec::new();
        for entry in &self.fallbacks {
            let entry = entry.trim();
            let provider_only = normalize_provider(entry);
            let resolved = if let Some((provider, model)) = entry.split_once('/') {
                self.resolve(Some(model), Some(provider))
            } else if crate::config::HOSTED.contains(&provider_only) || provider_only == "local" {
                self.resolve(Some(default_model_for(provider_only)), Some(provider_only))
            } else {
                self.resolve(Some(entry), None)
            };
            let Ok(resolved) = resolved else { continue };
            let same =
                |m: &ResolvedModel| m.provider == resolved.provider && m.model == resolved.model;
            if !same(failed) && !models.iter().any(same) {
                models.push(resolved);
            }
        }
        models
    }

    /// A client over the given providers (tests, benchmarks).
    pub fn with_providers(providers: Vec<Arc<dyn Provider>>) -> Self {
        let hosted = providers.iter().any(|p| p.name() != "local");
        Self {
            providers: providers
                .into_iter()
                .map(|p| (p.name().to_owned(), p))
                .collect(),
            hosted,
            default_model: None,
            default_provider: None,
            context_windows: BTreeMap::new(),
            fallbacks: Vec::new(),
            retry: RetryPolicy::default(),
        }
    }

    /// The provider names this client can call.
    pub fn providers(&self) -> impl Iterator<Item = &str> {
        self.providers.keys().map(String::as_str)
    }

    /// Where `model` (or the default model) from `provider` (or the usual one) runs.
    pub fn resolve(
        &self,
        model: Option<&str>,
        provider: Option<&str>,
    ) -> Result<ResolvedModel, LlmError> {
        let model = model.or(self.default_model.as_deref());
        let info = model.and_then(catalog::lookup);
        let wanted = provider
            .map(normalize_provider)
            .or(info.map(|i| i.provider))
            .or(model.and_then(catalog::guess_provider))
            .or(self.default_provider.as_deref())
            .or_else(|| self.first_hosted());
        let unknown = match (model, info) {
            (Some(name), None) => Some(format!(
                "model `{name}` is not in the catalog; passing it to the provider as it is"
            )),
            _ => None,
        };
        // No hosted provider at all: everything runs on the local model.
        if !self.hosted || wanted == Some("local") || wanted.is_none() {
            let local_id = self.local_model_id();
            let warning = match (model, info) {
                (Some(name), Some(i)) if i.provider == "local" => (i.id != local_id).then(|| {
                    format!("model `{name}` is not the local server's model; using `{local_id}`")
                }),
                (Some(name), _) => Some(format!(
                    "no provider key is set, so `{name}` runs on the local model `{local_id}`"
                )),
                (None, _) => None,
            };
            return Ok(ResolvedModel {
                provider: "local".into(),
                model: local_id,
                info: catalog::lookup(&self.local_model_id()),
                warning,
            });
        }
        let wanted = wanted.unwrap_or("local");
        if !self.providers.contains_key(wanted) {
            let message = match known_provider(wanted) {
                Ok(_) => format!(
                    "provider `{wanted}` is not configured{}: set {} (or add it to the config file)",
                    model
                        .map(|m| format!(" (needed by model `{m}`)"))
                        .unwrap_or_default(),
                    crate::config::setup_variable(wanted)
                ),
                Err(unknown) => unknown,
            };
            return Err(LlmError::new(ErrorKind::Configuration, wanted, message));
        }
        let model_id = match (model, info) {
            (_, Some(i)) => i.id.to_owned(),
            (Some(name), None) => name.to_owned(),
            (None, None) => default_model_for(wanted).to_owned(),
        };
        Ok(ResolvedModel {
            provider: wanted.to_owned(),
            info: catalog::lookup(&model_id),
            model: model_id,
            warning: unknown,
        })
    }

    fn first_hosted(&self) -> Option<&str> {
        crate::config::HOSTED
            .iter()
            .copied()
            .find(|p| self.providers.contains_key(*p))
    }

    fn local_model_id(&self) -> String {
        self.providers
            .get("local")
            .and_then(|p| p.model_id())
            .unwrap_or(catalog::LOCAL_MODEL_ID)
            .to_owned()
    }

    /// The context window of a resolved model in tokens: the config's figure for its provider, else
    /// what the provider reports (the local server), else the catalog's.
    pub fn context_window(&self, resolved: &ResolvedModel) -> Option<u32> {
        self.context_windows
            .get(&resolved.provider)
            .copied()
            .or_else(|| {
                self.providers
                    .get(&resolved.provider)
                    .and_then(|p| p.context_window())
            })
            .or(resolved.info.map(|i| i.context_window))
    }

    /// One call with retries. `request.model` is replaced by the resolved id.
    pub async fn complete(
        &self,
        resolved: &ResolvedModel,
        request: &Request,
        on_event: OnEvent<'_>,
        on_retry: OnRetry<'_>,
    ) -> Result<Response, LlmError> {
        let provider = self.providers.get(&resolved.provider).ok_or_else(|| {
            LlmError::new(
                ErrorKind::Configuration,
                &resolved.provider,
                format!(
                    "provider `{}` is not configured; {SETUP_HELP}",
                    resolved.provider
                ),
            )
        })?;
        let mut request = request.clone();
        request.model.clone_from(&resolved.model);
        let reasoning = resolved.info.is_some_and(|i| i.reasoning);
        if !reasoning {
            request.reasoning_effort = None;
        }
        // OpenAI's reasoning models refuse a temperature.
        if reasoning && resolved.provider == "openai" {
            request.temperature = None;
        }
        let mut attempt = 1;
        loop {
            match provider.stream(&request, on_event).await {
                Ok(response) => return Ok(structured(&request, response)),
                Err(error) => {
                    let Some(wait) = self.retry.delay(&error, attempt + 1) else {
                        return Err(error);
                    };
                    attempt += 1;
                    on_retry(&error, attempt, wait);
                    tokio::time::sleep(wait).await;
                }
            }
        }
    }

    /// Stops every provider's background work (the local server).
    pub async fn shutdown(&self) {
        for provider in self.providers.values() {
            provider.shutdown().await;
        }
    }
}

/// A structured answer given as a call of the answer tool (Anthropic) becomes the answer's text.
fn structured(request: &Request, mut response: Response) -> Response {
    let Some(format) = &request.response_schema else {
        return response;
    };
    if let Some(at) = response
        .tool_calls
        .iter()
        .position(|call| call.name == format.name)
    {
        let call = response.tool_calls.remove(at);
        response.text = call.arguments.to_string();
        if response.tool_calls.is_empty() {
            response.stop_reason = StopReason::EndTurn;
        }
    }
    response
}

/// The provider `name` names (`claude`, `google` and the other aliases included), or why it names
/// none: a `--provider` or a run file's `[run.model] provider` that is a typo.
pub fn known_provider(name: &str) -> Result<&'static str, String> {
    let wanted = normalize_provider(name);
    crate::config::HOSTED
        .iter()
        .chain(&["local"])
        .find(|known| **known == wanted)
        .copied()
        .ok_or_else(|| {
            format!(
                "unknown provider `{name}`: use {} or local",
                crate::config::HOSTED.join(", ")
            )
        })
}

/// The other names providers go by, and the provider each names.
pub const PROVIDER_ALIASES: &[(&str, &str)] = &[
    ("claude", "anthropic"),
    ("google", "gemini"),
    ("openai_compatible", "openai-compatible"),
    ("compatible", "openai-compatible"),
    ("llama", "local"),
    ("llama.cpp", "local"),
    ("llama-server", "local"),
];

fn normalize_provider(name: &str) -> &str {
    let name = name.trim();
    PROVIDER_ALIASES
        .iter()
        .find(|(alias, _)| *alias == name)
        .map_or(name, |(_, provider)| provider)
}

fn default_model_for(provider: &str) -> &'static str {
    match provider {
        "anthropic" => "claude-sonnet-4-5",
        "openai" => "gpt-5",
        "gemini" => "gemini-2.5-pro",
        _ => "default",
    }
}

/// The adapter for a configured hosted provider.
pub fn build_provider(name: &str, settings: &ProviderSettings) -> Arc<dyn Provider> {
    let default_url = match name {
        "anthropic" => "https://api.anthropic.com",
        "openai" => "https://api.openai.com/v1",
        "gemini" => "https://generativelanguage.googleapis.com",
        _ => "http://127.0.0.1:8080/v1",
    };
    let base = settings.base_url.as_deref().unwrap_or(default_url);
    let transport = Transport::new(name, base, settings.api_key.clone());
    match name {
        "anthropic" => Arc::new(Anthropic::new(transport)),
        "gemini" => Arc::new(Gemini::new(transport)),
        "openai" if settings.api.as_deref() == Some("chat") => {
            Arc::new(OpenAiChat::openai(transport))
        }
        "openai" => Arc::new(OpenAiResponses::new(transport)),
        _ => Arc::new(OpenAiChat::compatible(transport)),
    }
}
