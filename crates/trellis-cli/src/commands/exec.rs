//! `trellis exec "PROMPT"`: one agent, on the working directory, without a workflow file (Fabro's
//! `fabro exec`). The prompt becomes a workflow of one agent node, run as `trellis run` runs a
//! workflow: recorded in the runs directory (so `trellis show`, `logs`, `steer` and `resume` work
//! on it), in the sandbox, with the permissions, MCP servers and skills an agent node has. The
//! agent's last answer goes to standard output, the progress and summary to standard error.

use std::io::{IsTerminal as _, Read as _};
use std::process::ExitCode;

use anyhow::Context as _;
use trellis_engine::{RunMode, RunStatus, Settings};
use trellis_run::{NewRun, Run, RunError};
use trellis_store::resolve_runs_dir;

use super::run::RunOptions;
use super::{EXIT_INVALID, EXIT_USAGE};

/// The agent's node: its stage directories are `NNN-agent@V`, what `trellis logs RUN agent` reads.
const NODE: &str = "agent";

#[derive(clap::Args)]
pub struct ExecArgs {
    /// What the agent is to do; `-`, or nothing with standard input not a terminal, reads it from
    /// standard input.
    prompt: Option<String>,
    /// The model [default: the configured default model].
    #[arg(long, value_name = "MODEL")]
    model: Option<String>,
    /// The provider of a model the catalog does not place.
    #[arg(long, value_name = "PROVIDER", value_parser = super::run::provider_name)]
    provider: Option<String>,
    /// The most the agent's tools may do without asking: read-only, read-write or full (calls
    /// beyond it are asked on a terminal, denied without one) [default: full].
    #[arg(long, value_name = "LEVEL", value_parser = super::run::permissions_level)]
    permissions: Option<trellis_workflow::node_kind::Permissions>,
    /// The most turns (model calls) the agent may take [default: unlimited].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    max_turns: Option<u32>,
    #[command(flatten)]
    options: RunOptions,
}

/// The workflow a prompt runs as: one agent node asked the run's goal, which is the prompt (so the
/// prompt's text reaches the model as written: `$goal` is filled in once, and what it holds is not
/// read as a template).
fn workflow(max_turns: Option<u32>) -> String {
    let turns = max_turns.map_or_else(String::new, |n| format!(", max_turns={n}"));
    format!(
        "digraph exec {{\n  start [shape=Mdiamond]\n  exit [shape=Msquare]\n  {NODE} [shape=box, label=\"Agent\", prompt=\"$goal\"{turns}]\n  start -> {NODE} -> exit\n}}\n"
    )
}

/// The prompt: the argument, or standard input read whole.
fn prompt(given: Option<&str>) -> anyhow::Result<String> {
    let text = match given {
        Some(text) if text != "-" => text.to_owned(),
        _ if given.is_none() && std::io::stdin().is_terminal() => {
            anyhow::bail!(
                "give the prompt: trellis exec \"PROMPT\" (or `-` to read it from standard input)"
            )
        }
        _ => {
            let mut text = String::new();
            std::io::stdin()
                .read_to_string(&mut text)
                .context("cannot read the prompt from standard input")?;
            text
        }
    };
    if text.trim().is_empty() {
        anyhow::bail!("the prompt is empty");
    }
    Ok(text)
}

pub fn exec(args: &ExecArgs) -> anyhow::Result<ExitCode> {
    let prompt = match prompt(args.prompt.as_deref()) {
        Ok(prompt) => prompt,
        Err(problem) => {
            trellis_process::note!("error: {problem:#}");
            return Ok(ExitCode::from(EXIT_USAGE));
        }
    };
    let work_dir = std::env::current_dir()?;
    let path = work_dir.join("exec.fabro");
    let sandbox = super::sandbox(args.options.sandbox())?;
    let options = trellis_run::CompileOptions {
        goal: Some(prompt),
        model: args.model.clone(),
        ..Default::default()
    };
    let request = NewRun {
        path: path.clone(),
        initial: std::collections::BTreeMap::new(),
        settings: Settings {
            work_dir,
            mode: RunMode::default(),
            permissions: args.permissions,
            model: args.model.clone(),
            provider: args.provider.clone(),
            ..Settings::default()
        },
        runs_dir: resolve_runs_dir(args.options.runs_dir()),
        run_file: None,
        temporal: None,
        answer_node: Some(NODE.to_owned()),
    };
    super::on_runtime(async {
        let loaded = trellis_run::load_text(&path, workflow(args.max_turns), options).await;
        match Run::create(loaded, request, super::run::wiring(&args.options, sandbox)?).await {
            Ok(run) => execute(run, &args.options, NODE.to_owned()).await,
            Err(error) => {
                trellis_process::note!("error: {error}");
                Ok(ExitCode::from(match error {
                    RunError::Invalid { .. } => EXIT_INVALID,
                    _ => EXIT_USAGE,
                }))
            }
        }
    })?
}

/// Runs a run whose answer is `node`'s last response (the agent's, started here or resumed), then
/// prints the answer (standard output) and the run's summary (standard error, or the whole as JSON
/// on standard output with `--json`).
pub(super) async fn execute(
    run: Run,
    options: &RunOptions,
    node: String,
) -> anyhow::Result<ExitCode> {
    let ended = super::run::execute_signalled(run, options).await?;
    let answer = if ended.finished.status == RunStatus::Succeeded {
        answer_of(ended.finished.record.clone(), node).await
    } else {
        None
    };
    let summary = ended.summary();
    if options.json() {
        let mut json = summary.json();
        json["response"] = answer.into();
        println!("{}", serde_json::to_string_pretty(&json)?);
    } else {
        if let Some(answer) = &answer {
            println!("{}", answer.trim_end());
        }
        trellis_process::note!("{}", summary.line());
    }
    Ok(summary.exit_code(ended.finished.log_error.is_some(), ended.stopped_by))
}

/// The answer of the run in `record`: `node`'s last response (read on the blocking pool).
pub(super) async fn answer_of(
    record: std::sync::Arc<trellis_store::RunDir>,
    node: String,
) -> Option<String> {
    trellis_process::task::blocking(move || last_answer(&record, &node)).await
}

/// The node's last answer: its last attempt's `response.md`.
fn last_answer(record: &trellis_store::RunDir, node: &str) -> Option<String> {
    let stages = record.checkpoint().ok()?.stages;
    let last = stages.iter().rev().find(|stage| stage.node_id == node)?;
    record.stage_text(&last.dir, "response.md")
}
