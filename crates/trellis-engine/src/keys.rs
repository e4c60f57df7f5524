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
/// The edge followed into the current node (its index), for edge-level fidelity and threads.
pub const INCOMING_EDGE: &str = "internal.incoming_edge";
pub const COMMAND_OUTPUT: &str = "command.output";
pub const COMMAND_STDERR: &str = "command.stderr";
pub const COMMAND_EXIT_CODE: &str = "command.exit_code";
pub const HUMAN_SELECTED: &str = "human.gate.selected";
pub const HUMAN_LABEL: &str = "human.gate.label";
pub const HUMAN_TEXT: &str = "human.gate.text";
pub const PARALLEL_RESULTS: &str = "parallel.results";
pub const FAN_IN_BEST_ID: &str = "parallel.fan_in.best_id";
pub const FAN_IN_BEST_OUTCOME: &str = "parallel.fan_in.best_outcome";
