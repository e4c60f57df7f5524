//! Stage outcome words. Internally one enum; input accepts both vocabularies (`success`/`succeeded`,
//! `fail`/`failed`, `partial_success`/`partially_succeeded`, `skipped`), output uses the newer words.

use std::fmt;
use std::str::FromStr;

/// How a stage ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum StageStatus {
    Succeeded,
    PartiallySucceeded,
    Failed,
    Skipped,
}

impl StageStatus {
    /// The canonical (newer) word.
    pub fn as_str(self) -> &'static str {
        match self {
            StageStatus::Succeeded => "succeeded",
            StageStatus::PartiallySucceeded => "partially_succeeded",
            StageStatus::Failed => "failed",
            StageStatus::Skipped => "skipped",
        }
    }

    /// Every accepted spelling, for error messages.
    /// Every word that names a status.
    pub const WORDS: &'static [&'static str] = &[
        "success",
        "succeeded",
        "partial_success",
        "partially_succeeded",
        "fail",
        "failed",
        "failure",
        "skipped",
        "skip",
    ];
    pub const ACCEPTED: &'static str =
        "success, succeeded, partial_success, partially_succeeded, fail, failed, skipped";
}

impl FromStr for StageStatus {
    type Err = ();

    fn from_str(word: &str) -> Result<Self, ()> {
        match word.trim().to_ascii_lowercase().as_str() {
            "success" | "succeeded" => Ok(StageStatus::Succeeded),
            "partial_success" | "partially_succeeded" => Ok(StageStatus::PartiallySucceeded),
            "fail" | "failed" | "failure" => Ok(StageStatus::Failed),
            "skipped" | "skip" => Ok(StageStatus::Skipped),
            _ => Err(()),
        }
    }
}

impl fmt::Display for StageStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_vocabularies_parse() {
        for (word, status) in [
            ("success", StageStatus::Succeeded),
            ("succeeded", StageStatus::Succeeded),
            ("fail", StageStatus::Failed),
            ("failed", StageStatus::Failed),
            ("partial_success", StageStatus::PartiallySucceeded),
            ("partially_succeeded", StageStatus::PartiallySucceeded),
            ("skipped", StageStatus::Skipped),
        ] {
            assert_eq!(word.parse::<StageStatus>(), Ok(status), "{word}");
        }
        assert!("sucess".parse::<StageStatus>().is_err());
    }
}
