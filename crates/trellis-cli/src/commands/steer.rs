//! `trellis steer RUN "message" [--node ID]`: a course correction for a running agent, delivered to
//! its model before its next call (`trellis_run::steer`). Refused, with the reason and exit code 1,
//! when no built-in agent stage is running to read it.

use std::path::PathBuf;
use std::process::ExitCode;

use trellis_store::{RunDir, resolve_runs_dir};

#[derive(clap::Args)]
pub struct SteerArgs {
    /// The run id (or a unique prefix), or the run's directory.
    run: String,
    /// The message, as the agent's model will read it.
    message: String,
    /// The agent node to steer, when several are running.
    #[arg(long, value_name = "ID")]
    node: Option<String>,
    /// Where run records live [default: `$TRELLIS_RUNS_DIR` or `~/.trellis/runs`].
    #[arg(long, value_name = "DIR")]
    runs_dir: Option<PathBuf>,
}

pub fn steer(args: &SteerArgs) -> anyhow::Result<ExitCode> {
    let runs_dir = resolve_runs_dir(args.runs_dir.clone());
    let record = RunDir::open(&args.run, &runs_dir)?;
    match trellis_run::steer(&record, &args.message, args.node.as_deref()) {
        Ok(steered) => {
            trellis_process::note!(
                "sent to {} ({}): its model reads it before its next call (see `trellis logs {} {}`)",
                steered.node,
                steered.dir,
                args.run,
                steered.node
            );
            Ok(ExitCode::SUCCESS)
        }
        Err(error) => {
            trellis_process::note!("error: not sent: {error}");
            Ok(ExitCode::from(1))
        }
    }
}
