//! `node-id` (error): a node id fits in a stage directory's name.
//!
//! Every stage of a run is recorded in a directory named after its node (`007-review@2`), and file
//! systems limit a name to 255 bytes. A longer id would make the run fail at that stage, so it is
//! refused up front:
//!
//! ```dot
//! a_node_id_of_three_hundred_characters… [prompt="..."]   // error: at most 200 bytes
//! ```

use trellis_syntax::{Diagnostic, Severity};

use crate::rules::Rule;
use crate::workflow::Workflow;

pub const RULE: Rule = Rule {
    code: "node-id",
    severity: Severity::Error,
    summary: "node ids are at most 200 bytes (they name stage directories)",
};

/// The longest node id: the stage directory adds a rank, a visit count and two separators.
pub const MAX_ID_BYTES: usize = 200;

pub fn check(workflow: &Workflow, out: &mut Vec<Diagnostic>) {
    for node in workflow.nodes.iter().filter(|n| n.id.len() > MAX_ID_BYTES) {
        out.push(
            RULE.diagnostic(
                format!(
                    "node id `{}…` is {} bytes long; stage directories are named after node ids, so they may have at most {MAX_ID_BYTES}",
                    node.id.chars().take(40).collect::<String>(),
                    node.id.len()
                ),
                node.span,
            )
            .with_label("too long")
            .with_help("use a shorter id, and put the description in `label`"),
        );
    }
}
