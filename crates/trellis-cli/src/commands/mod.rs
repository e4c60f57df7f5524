//! One module per subcommand. Shared here: exit codes and colour choice.

pub mod graph;
pub mod models;
mod progress;
pub mod rules;
pub mod run;
pub mod runs;
pub mod serve;
pub mod validate;

use std::io::IsTerminal;

use clap::ValueEnum;

/// Exit code for a workflow with errors.
pub const EXIT_INVALID: u8 = 1;
/// Exit code for usage and file-system problems.
pub const EXIT_USAGE: u8 = 2;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ColorChoice {
    Auto,
    Always,
    Never,
}

impl ColorChoice {
    /// Whether to colour output written to a stream with the given terminal-ness.
    pub fn enabled(self, is_terminal: bool) -> bool {
        match self {
            ColorChoice::Always => true,
            ColorChoice::Never => false,
            ColorChoice::Auto => is_terminal && std::env::var_os("NO_COLOR").is_none(),
        }
    }

    pub fn for_stdout(self) -> bool {
        self.enabled(std::io::stdout().is_terminal())
    }

    pub fn for_stderr(self) -> bool {
        self.enabled(std::io::stderr().is_terminal())
    }
}

/// `--format`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OutputFormat {
    Text,
    Json,
}
