//! `trellis-agent`: the multi-turn, tool-using agent loop that agent nodes (`shape=box`) run. A
//! [`Session`] sends the model a prompt with tool definitions, runs the tools it calls —
//! `read_file`, `write_file`, `edit_file`, `shell`, `grep`, `glob`, `list_dir`, all confined to the
//! run's working directory ([`WorkDir`]) — sends the results back (cut to each tool's limit), and
//! repeats until the model answers without a tool call. It tracks the files it wrote, detects loops,
//! and compacts its history when it nears the model's context window. Sits on `trellis-llm`; the agent
//! handler in `trellis-handlers` drives it and turns its [`AgentEvent`]s into run events.
//! Its shell starts children through `trellis-process` (process groups, secrets, the sandbox), as every
//! other process a run starts does.

mod compaction;
mod definitions;
mod file_tools;
mod loop_detector;
mod patch;
mod session;
pub mod shell;
pub mod subagents;
mod tools;
mod truncate;
pub mod web;
mod work_dir;

pub use file_tools::{bare_path, named_paths};
pub use session::{
    AgentEvent, Approver, FINISH, Inbox, Model, Observer, STEERING_PREFIX, Session, Settings, Stop,
    WHOLE_CONTENT,
};
pub use tools::{
    Category, EXTERNAL_LIMIT, ExternalTools, Tool, ToolOutput, Toolbox, combined, filtered,
};
pub use truncate::{Keep, Limit};
pub use work_dir::{WorkDir, create_folders, open_file};
