//! The model catalog: the models Trellis knows by id or alias, with their provider and limits. A model
//! that is not listed still works; its provider is guessed from its name and the caller is warned.

/// One known model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ModelInfo {
    pub id: &'static str,
    pub aliases: &'static [&'static str],
    pub provider: &'static str,
    pub context_window: u32,
    pub max_output: u32,
    pub tools: bool,
    pub reasoning: bool,
}

const fn model(
    id: &'static str,
    aliases: &'static [&'static str],
    provider: &'static str,
    context_window: u32,
    max_output: u32,
    reasoning: bool,
) -> ModelInfo {
    ModelInfo {
        id,
        aliases,
        provider,
        context_window,
        max_output,
        tools: true,
        reasoning,
    }
}

/// The local default model's id, as `trellis` names it.
pub const LOCAL_MODEL_ID: &str = "qwen2.5-coder-1.5b-instruct";
/// The tiny local model used by plumbing tests.
pub const TINY_LOCAL_MODEL_ID: &str = "smollm2-135m-instruct";

pub static MODELS: &[ModelInfo] = &[
    model(
        "claude-opus-4-5",
        &["opus", "claude-opus-4-5-20251101"],
        "anthropic",
        200_000,
        64_000,
        true,
    ),
    model(
        "claude-sonnet-4-5",
        &["sonnet", "claude-sonnet-4-5-20250929"],
        "anthropic",
        200_000,
        64_000,
        true,
    ),
    model(
        "claude-haiku-4-5",
        &["haiku", "claude-haiku-4-5-20251001"],
        "anthropic",
        200_000,
        64_000,
        true,
    ),
    model(
        "claude-opus-4-1",
        &["claude-opus-4-1-20250805"],
        "anthropic",
        200_000,
        32_000,
        true,
    ),
    model(
        "claude-sonnet-4",
        &["claude-sonnet-4-20250514"],
        "anthropic",
        200_000,
        64_000,
        true,
    ),
    model("gpt-5.1", &[], "openai", 400_000, 128_000, true),
    model("gpt-5", &[], "openai", 400_000, 128_000, true),
    model("gpt-5-mini", &[], "openai", 400_000, 128_000, true),
    model("gpt-5-nano", &[], "openai", 400_000, 128_000, true),
    model("gpt-5-codex", &["codex"], "openai", 400_000, 128_000, true),
    model("gpt-4.1", &[], "openai", 1_047_576, 32_768, false),
    model("gpt-4.1-mini", &[], "openai", 1_047_576, 32_768, false),
    model("o3", &[], "openai", 200_000, 100_000, true),
    model("o4-mini", &[], "openai", 200_000, 100_000, true),
    model(
        "gemini-3-pro-preview",
        &["gemini-3-pro"],
        "gemini",
        1_048_576,
        65_536,
        true,
    ),
    model(
        "gemini-2.5-pro",
        &["gemini-pro"],
        "gemini",
        1_048_576,
        65_536,
        true,
    ),
    model(
        "gemini-2.5-flash",
        &["gemini-flash"],
        "gemini",
        1_048_576,
        65_536,
        true,
    ),
    model(
        "gemini-2.5-flash-lite",
        &["gemini-flash-lite"],
        "gemini",
        1_048_576,
        65_536,
        true,
    ),
    ModelInfo {
        id: LOCAL_MODEL_ID,
        aliases: &["local", "qwen2.5-coder"],
        provider: "local",
        context_window: 32_768,
        max_output: 8_192,
        tools: true,
        reasoning: false,
    },
    ModelInfo {
        id: TINY_LOCAL_MODEL_ID,
        aliases: &["smollm2"],
        provider: "local",
        context_window: 8_192,
        max_output: 2_048,
        tools: false,
        reasoning: false,
    },
];

/// The catalog entry for an id or alias (case-insensitive).
pub fn lookup(name: &str) -> Option<&'static ModelInfo> {
    let name = name.trim();
    MODELS.iter().find(|m| {
        m.id.eq_ignore_ascii_case(name) || m.aliases.iter().any(|a| a.eq_ignore_ascii_case(name))
    })
}

/// The provider an unlisted model id most likely belongs to, from its name.
pub fn guess_provider(name: &str) -> Option<&'static str> {
    let name = name.trim().to_ascii_lowercase();
    if name.starts_with("claude") {
        Some("anthropic")
    } else if name.starts_with("gpt-")
        || name.starts_with("o1")
        || name.starts_with("o3")
        || name.starts_with("o4")
        || name.starts_with("chatgpt")
    {
        Some("openai")
    } else if name.starts_with("gemini") {
        Some("gemini")
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_and_aliases_resolve() {
        assert_eq!(lookup("sonnet").map(|m| m.id), Some("claude-sonnet-4-5"));
        assert_eq!(lookup("GPT-5").map(|m| m.provider), Some("openai"));
        assert_eq!(lookup("local").map(|m| m.id), Some(LOCAL_MODEL_ID));
        assert!(lookup("my-finetune").is_none());
    }

    #[test]
    fn unlisted_models_get_a_provider_from_their_name() {
        assert_eq!(guess_provider("claude-next"), Some("anthropic"));
        assert_eq!(guess_provider("gemini-9-ultra"), Some("gemini"));
        assert_eq!(guess_provider("llama3"), None);
    }

    #[test]
    fn no_alias_is_listed_twice() {
        let mut names: Vec<&str> = MODELS
            .iter()
            .flat_map(|m| std::iter::once(m.id).chain(m.aliases.iter().copied()))
            .collect();
        let count = names.len();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), count);
    }
}
