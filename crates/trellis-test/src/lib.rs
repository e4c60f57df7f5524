//! `trellis-test`: support for tests, never shipped. It finds and starts the real protocol peers the
//! tests talk to — `llmock` (a mock of the providers' HTTP APIs) and the local `llama-server` with its
//! models — as installed by `scripts/test-peers.sh`. A missing peer skips the test with a printed
//! reason, unless `TRELLIS_REQUIRE_PEERS=1` (set by CI), where it fails.

#![allow(
    clippy::disallowed_methods,
    reason = "test support sets up files before and after the code under test runs"
)]

mod git;
pub mod http;
mod llmock;
mod peers;
mod swap;
mod temporal;
pub mod workflows;

pub use git::git;
pub use llmock::Llmock;
pub use peers::{LocalModelFiles, cache_dir, local_model_files, missing_peer};
pub use swap::{Swapping, folder_swapped_for_a_link_out, swapping};
pub use temporal::TemporalServer;
