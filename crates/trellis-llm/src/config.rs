//! Where model settings come from: a TOML config file (`$TRELLIS_CONFIG`, else
//! `$XDG_CONFIG_HOME/trellis/config.toml` or `~/.config/trellis/config.toml`), then the environment,
//! which wins. Keys are held as [`Secret`]s.
//!
//! ```toml
//! default_model = "claude-sonnet-4-5"
//!
//! [providers.anthropic]
//! api_key = "sk-ant-..."
//! base_url = "https://api.anthropic.com"      # no version suffix
//!
//! [providers.openai]
//! api_key = "sk-..."
//! base_url = "https://api.openai.com/v1"      # with /v1
//! api = "responses"                            # or "chat"
//!
//! [providers.openai-compatible]
//! base_url = "http://127.0.0.1:8080/v1"
//!
//! [local]
//! server = "/path/to/llama-server"
//! model = "/path/to/model.gguf"
//! ```

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::http::Secret;

/// The hosted providers, in the order a default is picked.
pub const HOSTED: &[&str] = &["anthropic", "openai", "gemini", "openai-compatible"];

/// The environment variables of each hosted provider: its key and its base URL.
const VARIABLES: &[(&str, &str, &str)] = &[
    ("anthropic", "ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL"),
    ("openai", "OPENAI_API_KEY", "OPENAI_BASE_URL"),
    ("gemini", "GEMINI_API_KEY", "GEMINI_BASE_URL"),
    (
        "openai-compatible",
        "OPENAI_COMPATIBLE_API_KEY",
        "OPENAI_COMPATIBLE_BASE_URL",
    ),
];

/// The variable a user sets to configure `provider`: its key, or for a compatible server its address.
pub fn setup_variable(provider: &str) -> &'static str {
    match VARIABLES.iter().find(|(name, _, _)| *name == provider) {
        Some(("openai-compatible", _, url)) => url,
        Some((_, key, _)) => key,
        None => "a provider key",
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read the config file {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("the config file {path} is not valid: {message}")]
    Invalid { path: PathBuf, message: String },
}

#[derive(Debug, Clone, Default)]
pub struct ProviderSettings {
    pub api_key: Option<Secret>,
    pub base_url: Option<String>,
    /// For OpenAI: `responses` (default) or `chat`.
    pub api: Option<String>,
    /// The context window of the models this provider serves, in tokens, over the catalog's figure
    /// (for servers whose models the catalog does not know).
    pub context_window: Option<u32>,
}

impl ProviderSettings {
    /// The provider can be called: it has a key, or (for a compatible server) an address.
    pub fn is_configured(&self, provider: &str) -> bool {
        if provider == "openai-compatible" {
            self.base_url.is_some()
        } else {
            self.api_key.is_some()
        }
    }
}

#[derive(Debug, Clone, Default)]
pub struct LocalSettings {
    pub server: Option<PathBuf>,
    pub model: Option<PathBuf>,
    /// The model id reported and matched (`qwen2.5-coder-1.5b-instruct` by default).
    pub model_id: Option<String>,
    pub context_size: Option<u32>,
    /// Where the server keeps what it computed for the opening every agent session shares (the
    /// system prompt and the tools), from one run to the next: `prompt-cache/` in the cache.
    pub prompt_cache: Option<PathBuf>,
}

#[derive(Debug, Clone, Default)]
pub struct Config {
    pub providers: BTreeMap<String, ProviderSettings>,
    pub default_model: Option<String>,
    pub default_provider: Option<String>,
    pub local: LocalSettings,
    /// The file the settings came from, if any.
    pub file: Option<PathBuf>,
    /// `[sandbox]`: how commands and agent tools are confined (`mode`: auto, bubblewrap or none;
    /// `write`: more writable paths). Read here because it is the same file; the run library applies it.
    pub sandbox: SandboxSettings,
    /// `[mcp_servers.NAME]` tables, as read (the agent handlers' MCP module reads them).
    pub mcp_servers: BTreeMap<String, serde_json::Value>,
    /// `[[hooks]]` entries, as read: lifecycle hooks for every run (the run library checks and
    /// merges them with the project's and the run file's).
    pub hooks: Vec<serde_json::Value>,
    /// `[temporal]`: the Temporal service `trellis run` submits runs to and `trellis worker` polls
    /// (flags override it).
    pub temporal: TemporalSettings,
}

/// The configuration file's `[temporal]` table.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TemporalSettings {
    /// `HOST:PORT` (or a URL) of the Temporal frontend; runs stay local without it.
    pub address: Option<String>,
    pub namespace: Option<String>,
    pub task_queue: Option<String>,
}

/// The configuration file's `[sandbox]` table.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SandboxSettings {
    pub mode: Option<String>,
    #[serde(default)]
    pub write: Vec<PathBuf>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct FileConfig {
    default_model: Option<String>,
    default_provider: Option<String>,
    #[serde(default)]
    providers: BTreeMap<String, FileProvider>,
    #[serde(default)]
    local: FileLocal,
    #[serde(default)]
    sandbox: SandboxSettings,
    /// Read as they are; the MCP module checks them.
    #[serde(default)]
    mcp_servers: BTreeMap<String, toml::Value>,
    /// Read as they are; the run library checks them.
    #[serde(default)]
    hooks: Vec<toml::Value>,
    #[serde(default)]
    temporal: TemporalSettings,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct FileProvider {
    api_key: Option<String>,
    base_url: Option<String>,
    api: Option<String>,
    context_window: Option<u32>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct FileLocal {
    server: Option<PathBuf>,
    model: Option<PathBuf>,
    model_id: Option<String>,
    context_size: Option<u32>,
}

impl Config {
    /// Where the config file is (or would be): `$TRELLIS_CONFIG`, else under `$XDG_CONFIG_HOME` or
    /// `~/.config`. It can hold provider keys, so children never see it (the sandbox hides it).
    pub fn path() -> Option<PathBuf> {
        Self::path_with(&|name| std::env::var(name).ok().filter(|v| !v.trim().is_empty()))
    }

    fn path_with(env: &dyn Fn(&str) -> Option<String>) -> Option<PathBuf> {
        env("TRELLIS_CONFIG")
            .map(PathBuf::from)
            .or_else(|| env("XDG_CONFIG_HOME").map(|d| Path::new(&d).join("trellis/config.toml")))
            .or_else(|| {
                env("HOME").map(|home| Path::new(&home).join(".config/trellis/config.toml"))
            })
    }

    /// Settings from the config file and the process environment.
    pub fn load() -> Result<Self, ConfigError> {
        Self::load_with(&|name| std::env::var(name).ok().filter(|v| !v.trim().is_empty()))
    }

    /// Settings from the config file and `env` (a lookup, so tests need not touch the process).
    pub fn load_with(env: &dyn Fn(&str) -> Option<String>) -> Result<Self, ConfigError> {
        let path = Self::path_with(env);
        let mut config = match path {
            Some(path) if path.exists() || env("TRELLIS_CONFIG").is_some() => {
                Self::from_file(&path)?
            }
            _ => Self::default(),
        };
        config.apply_env(env);
        Ok(config)
    }

    #[allow(
        clippy::disallowed_methods,
        reason = "read once before a run starts; async callers load the config on the blocking pool"
    )]
    fn from_file(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_owned(),
            source,
        })?;
        let file: FileConfig = toml::from_str(&text).map_err(|e| ConfigError::Invalid {
            path: path.to_owned(),
            // toml's message quotes the offending line, which may hold a key: keep only the first line.
            message: e.message().lines().next().unwrap_or_default().to_owned(),
        })?;
        for name in file.providers.keys() {
            if !HOSTED.contains(&name.as_str()) {
                return Err(ConfigError::Invalid {
                    path: path.to_owned(),
                    message: format!("unknown provider `{name}` (known: {})", HOSTED.join(", ")),
                });
            }
        }
        Ok(Self {
            providers: file
                .providers
                .into_iter()
                .map(|(name, p)| {
                    (
                        name,
                        ProviderSettings {
                            api_key: p.api_key.map(Secret::new),
                            base_url: p.base_url,
                            api: p.api,
                            context_window: p.context_window,
                        },
                    )
                })
                .collect(),
            default_model: file.default_model,
            default_provider: file.default_provider,
            local: LocalSettings {
                server: file.local.server,
                model: file.local.model,
                model_id: file.local.model_id,
                context_size: file.local.context_size,
                prompt_cache: None,
            },
            file: Some(path.to_owned()),
            sandbox: file.sandbox,
            mcp_servers: file
                .mcp_servers
                .into_iter()
                .filter_map(|(name, table)| Some((name, serde_json::to_value(table).ok()?)))
                .collect(),
            hooks: file
                .hooks
                .into_iter()
                .filter_map(|hook| serde_json::to_value(hook).ok())
                .collect(),
            temporal: file.temporal,
        })
    }

    fn apply_env(&mut self, env: &dyn Fn(&str) -> Option<String>) {
        for &(provider, key_var, url_var) in VARIABLES {
            let key = env(key_var);
            let url = env(url_var);
            if key.is_none() && url.is_none() {
                continue;
            }
            let settings = self.providers.entry(provider.to_owned()).or_default();
            if let Some(key) = key {
                settings.api_key = Some(Secret::new(key));
            }
            if url.is_some() {
                settings.base_url = url;
            }
        }
        if let Some(api) = env("TRELLIS_OPENAI_API") {
            self.providers.entry("openai".into()).or_default().api = Some(api);
        }
        if let Some(model) = env("TRELLIS_MODEL") {
            self.default_model = Some(model);
        }
        if let Some(server) = env("TRELLIS_LLAMA_SERVER") {
            self.local.server = Some(server.into());
        }
        if let Some(model) = env("TRELLIS_LOCAL_MODEL") {
            self.local.model = Some(model.into());
        }
        if let Some(id) = env("TRELLIS_LOCAL_MODEL_ID") {
            self.local.model_id = Some(id);
        }
        self.local.cache_defaults(env);
    }

    /// The hosted providers that can be called, in preference order.
    pub fn configured(&self) -> Vec<&'static str> {
        HOSTED
            .iter()
            .copied()
            .filter(|name| {
                self.providers
                    .get(*name)
                    .is_some_and(|p| p.is_configured(name))
            })
            .collect()
    }
}

impl LocalSettings {
    /// Fills unset paths with the cache that `scripts/local-model.sh` writes (and the prompt cache
    /// beside it).
    fn cache_defaults(&mut self, env: &dyn Fn(&str) -> Option<String>) {
        let cache = env("TRELLIS_CACHE_DIR").map(PathBuf::from).or_else(|| {
            env("XDG_CACHE_HOME")
                .map(|d| Path::new(&d).join("trellis"))
                .or_else(|| env("HOME").map(|h| Path::new(&h).join(".cache/trellis")))
        });
        let Some(cache) = cache else { return };
        if self.server.is_none() {
            self.server = Some(cache.join("bin/llama-server"));
        }
        if self.model.is_none() {
            self.model = Some(cache.join("models").join(DEFAULT_MODEL_FILE));
        }
        if self.prompt_cache.is_none() {
            self.prompt_cache = Some(cache.join("prompt-cache"));
        }
    }
}

/// The default local model's file name in the cache.
pub const DEFAULT_MODEL_FILE: &str = "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf";
/// The tiny local model's file name in the cache.
pub const TINY_MODEL_FILE: &str = "smollm2-135m-instruct-q4_1.gguf";

#[cfg(test)]
#[allow(clippy::disallowed_methods, reason = "tests write config files")]
mod tests {
    use super::*;

    fn env_of(pairs: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<String> {
        move |name| {
            pairs
                .iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| (*v).to_owned())
        }
    }

    #[test]
    fn environment_configures_providers_and_keys_stay_secret() {
        let config = Config::load_with(&env_of(&[
            ("ANTHROPIC_API_KEY", "sk-ant-secret-123"),
            ("OPENAI_BASE_URL", "http://127.0.0.1:9/v1"),
            ("HOME", "/nonexistent"),
        ]))
        .unwrap();
        assert_eq!(config.configured(), vec!["anthropic"]);
        let debug = format!("{config:?}");
        assert!(!debug.contains("sk-ant-secret-123"), "{debug}");
        assert_eq!(
            config.local.model.unwrap(),
            PathBuf::from("/nonexistent/.cache/trellis/models").join(DEFAULT_MODEL_FILE)
        );
    }

    #[test]
    fn config_file_is_read_and_environment_wins() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config.toml");
        std::fs::write(
            &path,
            "default_model = \"gpt-5\"\n[providers.openai]\napi_key = \"from-file\"\napi = \"chat\"\n",
        )
        .unwrap();
        let path_str: &'static str = Box::leak(path.display().to_string().into_boxed_str());
        let pairs: &'static [(&str, &str)] = Box::leak(Box::new([
            ("TRELLIS_CONFIG", path_str),
            ("OPENAI_API_KEY", "from-env"),
        ]));
        let config = Config::load_with(&env_of(pairs)).unwrap();
        let openai = &config.providers["openai"];
        assert_eq!(openai.api_key.as_ref().unwrap().expose(), "from-env");
        assert_eq!(openai.api.as_deref(), Some("chat"));
        assert_eq!(config.default_model.as_deref(), Some("gpt-5"));
    }

    #[test]
    fn a_bad_config_file_names_the_file_and_not_the_key() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config.toml");
        std::fs::write(&path, "[providers.antropic]\napi_key = \"sk-leak\"\n").unwrap();
        let err = Config::from_file(&path).unwrap_err().to_string();
        assert!(
            err.contains("config.toml") && err.contains("antropic"),
            "{err}"
        );
        assert!(!err.contains("sk-leak"));
    }
}
