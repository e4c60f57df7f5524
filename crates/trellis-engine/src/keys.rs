//! Well-known run-context keys, in one place. Handlers and the engine write them; conditions, preambles
//! and tools read them.

pub const OUTCOME: &str = "outcome";
pub const PREFERRED_LABEL: &str = "preferred_label";
pub const CURRENT_NODE: &str = "current_node";
pub const FAILURE_CLASS: &str = "failure_class";
pub const FAILURE_SIGNATURE: &str = "failure_signature";
pub const FAILURE_REASON: &str = "failure_reason";
pub const LAST_STAGE: &str = "last_stage";
pub const LAST_RESPONSE: &str = "last_response";
pub const GRAPH_PREFIX: &str = "graph.";
pub const RUN_ID: &str = "internal.run_id";
pub const WORK_DIR: &str = "internal.work_dir";
pub const NODE_VISIT_COUNT: &str = "internal.node_visit_count";
pub const RETRY_COUNT_PREFIX: &str = "internal.retry_count.";
pub const FIDELITY: &str = "internal.fidelity";
pub const THREAD_ID: &str = "internal.thread_id";
pub const COMMAND_OUTPUT: &str = "command.output";
pub const COMMAND_STDERR: &str = "command.stderr";
pub const COMMAND_EXIT_CODE: &str = "command.exit_code";
pub const HUMAN_SELECTED: &str = "human.gate.selected";
pub const HUMAN_LABEL: &str = "human.gate.label";
pub const HUMAN_TEXT: &str = "human.gate.text";
pub const PARALLEL_RESULTS: &str = "parallel.results";
pub const FAN_IN_BEST_ID: &str = "parallel.fan_in.best_id";
pub const FAN_IN_BEST_OUTCOME: &str = "parallel.fan_in.best_outcome";
/// The workflow's input values (a YAML workflow's `inputs`), as one object.
pub const INPUT: &str = "input";
pub const RESPONSE_PREFIX: &str = "response.";
pub const OUTPUT_PREFIX: &str = "output.";
pub const EVALS_PREFIX: &str = "evals.";

/// Where a node's response text is kept.
pub fn response_of(node_id: &str) -> String {
    format!("{RESPONSE_PREFIX}{node_id}")
}

/// Where the retries a node used are kept (`internal.retry_count.<node>`). Written once the node
/// used a retry (and set back on a later visit), so a long run holds no key for the nodes that never
/// retried: a condition reads a missing count as 0 (see [`read_as_zero`]).
pub fn retry_count_of(node_id: &str) -> String {
    format!("{RETRY_COUNT_PREFIX}{node_id}")
}

/// Whether a missing `key` reads as 0: the retries a node used, when it never retried.
pub fn read_as_zero(key: &str) -> bool {
    key.starts_with(RETRY_COUNT_PREFIX)
}

/// Where a node's structured output (the JSON its output schema accepted) is kept.
pub fn output_of(node_id: &str) -> String {
    format!("{OUTPUT_PREFIX}{node_id}")
}

/// Where a node's evaluators' verdicts are kept (SWEny's `eval`), by evaluator name.
pub fn evals_of(node_id: &str) -> String {
    format!("{EVALS_PREFIX}{node_id}")
}

/// Whether `key` is one of the engine-managed keys of the context document: the `internal.*` keys, the
/// mirrored `graph.*` attributes, and the keys the engine rewrites after every stage (`outcome`,
/// `preferred_label`, `current_node`, `failure_class`, `failure_reason`, `failure_signature`). The one
/// place this is decided: branch merging, sub-workflows, preambles, the router and `trellis show`
/// all ask here. A user key that merely starts with the same letters (`current_plan`) is not one.
pub fn is_engine_key(key: &str) -> bool {
    const STAGE_KEYS: &[&str] = &[
        OUTCOME,
        PREFERRED_LABEL,
        CURRENT_NODE,
        FAILURE_CLASS,
        FAILURE_REASON,
        FAILURE_SIGNATURE,
    ];
    is_bookkeeping(key) || STAGE_KEYS.contains(&key)
}

/// The engine keys that describe the run rather than the last stage: `internal.*` and the mirrored
/// `graph.*` attributes. A model judging the last stage (the `when` router) is shown every other key,
/// the stage's `outcome` and failure keys among them.
pub fn is_bookkeeping(key: &str) -> bool {
    key.starts_with(INTERNAL_PREFIX) || key.starts_with(GRAPH_PREFIX)
}

/// The prefix of the engine's own bookkeeping keys.
pub const INTERNAL_PREFIX: &str = "internal.";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn engine_keys_are_decided_by_name_not_by_prefix_letters() {
        for key in [
            "internal.run_id",
            "graph.goal",
            "outcome",
            "current_node",
            "failure_reason",
        ] {
            assert!(is_engine_key(key), "{key}");
        }
        for key in [
            "current_plan",
            "outcomes",
            "tests_passed",
            "response.plan",
            "command.output",
        ] {
            assert!(!is_engine_key(key), "{key}");
        }
    }
}
