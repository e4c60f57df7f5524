//! A stage attempt's `status.json`, typed: what the engine writes through the run store.

use serde::{Deserialize, Serialize};

use crate::event::EdgeChoice;
use crate::outcome::Outcome;

/// A stage attempt's `status.json`: where and when it ran, its outcome (none while it waits for
/// input), and the routing decision when a model judged the edges out of it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StatusFile {
    pub node_id: String,
    pub visit: u32,
    pub attempt: u32,
    pub duration_ms: u64,
    /// The attempt stopped at a human gate with nobody to answer it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub waiting_for_input: bool,
    #[serde(flatten, default)]
    pub outcome: Option<Outcome>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub routing: Option<EdgeChoice>,
}

impl StatusFile {
    /// The status of an attempt that finished with `outcome`.
    pub fn finished(
        outcome: &Outcome,
        node_id: &str,
        visit: u32,
        attempt: u32,
        duration_ms: u64,
    ) -> Self {
        Self {
            node_id: node_id.to_owned(),
            visit,
            attempt,
            duration_ms,
            waiting_for_input: false,
            outcome: Some(outcome.clone()),
            routing: None,
        }
    }

    /// The status of an attempt that waits for input.
    pub fn waiting(node_id: &str, visit: u32, attempt: u32, duration_ms: u64) -> Self {
        Self {
            node_id: node_id.to_owned(),
            visit,
            attempt,
            duration_ms,
            waiting_for_input: true,
            outcome: None,
            routing: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::outcome::FailureClass;

    #[test]
    fn the_file_keeps_its_flat_layout_and_reads_back() {
        let mut status = StatusFile::finished(
            &Outcome::failed(FailureClass::Transient, "busy"),
            "plan",
            2,
            3,
            40,
        );
        status.routing = Some(EdgeChoice {
            to: "next".into(),
            ..EdgeChoice::default()
        });
        let value = serde_json::to_value(&status).unwrap();
        assert_eq!(value["status"], "failed");
        assert_eq!(value["failure"]["reason"], "busy");
        assert_eq!(value["node_id"], "plan");
        assert_eq!(value["attempt"], 3);
        assert_eq!(value["routing"]["to"], "next");
        assert!(value.get("waiting_for_input").is_none());
        assert_eq!(serde_json::from_value::<StatusFile>(value).unwrap(), status);

        let waiting = StatusFile::waiting("gate", 1, 1, 5);
        let value = serde_json::to_value(&waiting).unwrap();
        assert_eq!(value["waiting_for_input"], true);
        assert!(value.get("status").is_none());
        assert_eq!(
            serde_json::from_value::<StatusFile>(value).unwrap(),
            waiting
        );
    }
}
