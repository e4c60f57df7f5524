//! Where the test peers live: the cache that `scripts/local-model.sh` and `scripts/test-peers.sh`
//! fill (`$TRELLIS_CACHE_DIR`, else `~/.cache/trellis`).

use std::path::PathBuf;

/// The cache directory the setup scripts write.
pub fn cache_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("TRELLIS_CACHE_DIR") {
        return dir.into();
    }
    if let Some(dir) = std::env::var_os("XDG_CACHE_HOME") {
        return PathBuf::from(dir).join("trellis");
    }
    PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache/trellis")
}

/// Reports a peer that is not installed: a skip (with the reason printed), or a failure when
/// `TRELLIS_REQUIRE_PEERS=1`. Returns so the caller can `return` after it.
#[allow(
    clippy::disallowed_macros,
    reason = "a test's message, which the test harness captures as it captures eprintln! alone"
)]
pub fn missing_peer(what: &str) {
    let message = format!("{what} is not installed; run scripts/test-peers.sh");
    assert!(
        std::env::var("TRELLIS_REQUIRE_PEERS").as_deref() != Ok("1"),
        "{message} (TRELLIS_REQUIRE_PEERS=1)"
    );
    eprintln!("skipping: {message}");
}

/// The local model server and its two models.
#[derive(Debug, Clone)]
pub struct LocalModelFiles {
    pub server: PathBuf,
    /// Qwen2.5-Coder-1.5B, the default model.
    pub default_model: PathBuf,
    /// SmolLM2-135M, for fast plumbing tests.
    pub tiny_model: PathBuf,
}

/// The local model files, or `None` (after [`missing_peer`]) when any is missing.
pub fn local_model_files() -> Option<LocalModelFiles> {
    let cache = cache_dir();
    let files = LocalModelFiles {
        server: cache.join("bin/llama-server"),
        default_model: cache.join("models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"),
        tiny_model: cache.join("models/smollm2-135m-instruct-q4_1.gguf"),
    };
    for path in [&files.server, &files.default_model, &files.tiny_model] {
        if !path.is_file() {
            missing_peer(&format!("the local model ({})", path.display()));
            return None;
        }
    }
    Some(files)
}
