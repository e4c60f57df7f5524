//! `trellis-run` is runs as a library: everything between a workflow file and a finished run record
//! that is not about a terminal. It compiles the workflow ([`load`]), creates the run record, wires the
//! engine to the store, the handlers (created per run, so conversation threads are the run's own), the
//! model client, the event log and the caller's subscribers ([`Run::create`]), executes the run until it ends or is
//! stopped ([`Stop`]) and finishes its record ([`Run::execute`]), marks runs left `running` by a dead
//! process as interrupted ([`mark_interrupted`]), sends steering messages to running agents ([`steer`]), and reopens a stopped run to continue
//! it ([`Resumable`]). `trellis-cli` calls it for `trellis run`/`resume`; `trellis-server` will call the
//! same functions. What the caller decides: who answers human gates, who else hears the events, and how
//! diagnostics and results are shown.

pub mod changes;
mod prepare;
mod run;
mod steer;
mod stop;

pub mod run_file;
pub use run::{
    Finished, Loaded, NewRun, Resumable, Run, RunError, Wiring, load, load_blocking, load_text,
    preflight, recorded_options, sandbox,
};
pub use run_file::{Opened, RunFile, open_blocking};
pub use steer::{SteerError, Steered, steer};
pub use stop::{Stop, interrupt_owner, mark_interrupted, settle};
pub use trellis_llm::known_provider;
pub use trellis_process::sandbox::{Choice as SandboxChoice, Sandbox};
pub use trellis_workflow::CompileOptions;
