//! What a handler records beside a stage's outcome, typed: the model that answered and what it cost, a
//! command's script, output and exit code, the artifacts it captured. Written flat into the stage's
//! `status.json`, kept with the stage record for preambles and `trellis show`, and carried by
//! `StageCompleted`/`StageFailed`.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Tokens a model call (or a stage's calls together) used.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
pub struct TokenUsage {
    pub input_tokens: u64,
    pub output_tokens: u64,
    #[serde(default)]
    pub cached_tokens: u64,
    #[serde(default)]
    pub reasoning_tokens: u64,
}

/// A test artifact a command produced, by its path relative to the working directory.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
pub struct Artifact {
    pub path: String,
    pub bytes: u64,
    /// Why it was not copied into the run record (too large); absent for captured files.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub skipped: Option<String>,
}

/// A model conversation's facts: which model answered, and what it cost.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
pub struct ModelDetails {
    pub model: String,
    #[serde(default)]
    pub provider: String,
    #[serde(default)]
    pub usage: TokenUsage,
    #[serde(default)]
    pub turns: u32,
    /// What the calls cost in US dollars, where the provider or CLI reports it.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub cost_usd: Option<f64>,
}

/// The handler's details of one stage attempt. Every field is optional: each handler fills its own.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
pub struct StageDetails {
    /// Model stages: the model, provider, usage and turns.
    #[serde(flatten, skip_serializing_if = "Option::is_none", default)]
    pub model: Option<ModelDetails>,
    /// Repair turns a structured answer needed.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub repairs: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub stop_reason: Option<Value>,
    /// CLI agent stages (`backend="cli"`): the CLI that ran the node, and its session id (for
    /// `claude --resume`, `codex exec resume`, `gemini --resume`).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub cli: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub session_id: Option<String>,
    /// `auto_status=true` stages counted as succeeded although their answer gave no status: why they
    /// would have failed.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub auto_status: Option<String>,
    /// Agent stages: the tool calls the loop ran.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub tool_calls: Option<u32>,
    /// The fidelity the stage's prompt was built with.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub fidelity: Option<String>,
    /// Command stages: the script, its output (blob references) and its exit code.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub script: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub stdout: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub stderr: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub exit_code: Option<i32>,
    /// Artifacts copied into the run record, and those left out with the reason.
    #[serde(skip_serializing_if = "Vec::is_empty", default)]
    pub artifacts: Vec<Artifact>,
    #[serde(skip_serializing_if = "Vec::is_empty", default)]
    pub artifacts_skipped: Vec<Artifact>,
    /// Fan-out stages: branches cancelled once the join policy decided.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub cancelled_branches: Option<usize>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn details_are_written_flat_and_read_back() {
        let details = StageDetails {
            model: Some(ModelDetails {
                model: "claude-sonnet-4-5".into(),
                provider: "anthropic".into(),
                usage: TokenUsage {
                    input_tokens: 12,
                    output_tokens: 3,
                    ..TokenUsage::default()
                },
                turns: 1,
                cost_usd: None,
            }),
            repairs: Some(0),
            ..StageDetails::default()
        };
        let json = serde_json::to_value(&details).unwrap();
        assert_eq!(json["model"], "claude-sonnet-4-5");
        assert_eq!(json["usage"]["input_tokens"], 12);
        assert!(json.get("script").is_none());
        assert_eq!(
            serde_json::from_value::<StageDetails>(json).unwrap(),
            details
        );
        let command: StageDetails =
            serde_json::from_value(serde_json::json!({ "script": "make", "exit_code": 2 }))
                .unwrap();
        assert_eq!(command.model, None);
        assert_eq!(command.exit_code, Some(2));
    }
}
