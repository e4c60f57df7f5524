//! `trellis runs`, `trellis show RUN` and `trellis events RUN [--follow]`: reading run records.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context as _;
use serde_json::{Value, json};
use trellis_engine::Event;
use trellis_engine::event::EventKind;
use trellis_engine::{StageDetails, keys};
use trellis_store::{RunDir, list_runs, resolve_runs_dir};

#[derive(clap::Args)]
pub struct RunsArgs {
    /// Where run records live [default: `$TRELLIS_RUNS_DIR` or `~/.trellis/runs`].
    #[arg(long, value_name = "DIR")]
    runs_dir: Option<PathBuf>,
    /// How many runs to list, newest first (at least 1).
    #[arg(long, default_value = "20")]
    limit: std::num::NonZeroUsize,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
}

#[derive(clap::Args)]
pub struct ShowArgs {
    /// The run id (or a unique prefix), or the run's directory.
    run: String,
    /// Where run records live [default: `$TRELLIS_RUNS_DIR` or `~/.trellis/runs`].
    #[arg(long, value_name = "DIR")]
    runs_dir: Option<PathBuf>,
    /// Print the run as JSON.
    #[arg(long)]
    json: bool,
    /// Print what the run changed in its working directory, as a unified diff (from its start to
    /// its end, or to now while it runs; in a git repository).
    #[arg(long, conflicts_with = "json")]
    changes: bool,
}

#[derive(clap::Args)]
pub struct EventsArgs {
    /// The run id (or a unique prefix), or the run's directory.
    run: String,
    /// Where run records live [default: `$TRELLIS_RUNS_DIR` or `~/.trellis/runs`].
    #[arg(long, value_name = "DIR")]
    runs_dir: Option<PathBuf>,
    /// Keep printing new events until the run ends.
    #[arg(long)]
    follow: bool,
    /// Print the raw JSON lines.
    #[arg(long)]
    json: bool,
}

#[derive(clap::Args)]
pub struct CancelArgs {
    /// The run id (or a unique prefix), or the run's directory.
    run: String,
    /// Where run records live [default: `$TRELLIS_RUNS_DIR` or `~/.trellis/runs`].
    #[arg(long, value_name = "DIR")]
    runs_dir: Option<PathBuf>,
}

/// `trellis cancel RUN`: stops a running run — the process running it here is interrupted as by
/// Ctrl-C, a run on Temporal is cancelled there — and its running stage's processes with it; the run
/// is recorded as cancelled and can be resumed.
pub fn cancel(args: &CancelArgs) -> anyhow::Result<ExitCode> {
    let runs_dir = resolve_runs_dir(args.runs_dir.clone());
    let record = RunDir::open(&args.run, &runs_dir)?;
    let meta = record.meta()?;
    let id = &meta.run_id;
    let not_running = || {
        trellis_process::note!(
            "run {id} is not running ({})",
            record.status(&meta).as_str()
        );
        Ok(ExitCode::from(super::EXIT_INVALID))
    };
    if let Some(target) = &meta.temporal {
        if meta.status.is_finished() || meta.status == trellis_engine::RunStatus::Cancelled {
            return not_running();
        }
        super::on_runtime(trellis_temporal::cancel(target, id))??;
        trellis_process::note!("cancelling run {id} on Temporal");
        return Ok(ExitCode::SUCCESS);
    }
    let Some(pid) = trellis_run::interrupt_owner(&record)
        .with_context(|| format!("cannot stop the process running {id}"))?
    else {
        return not_running();
    };
    trellis_process::note!("cancelling run {id} (process {pid})");
    Ok(ExitCode::SUCCESS)
}

pub fn runs(args: &RunsArgs) -> anyhow::Result<ExitCode> {
    let runs_dir = resolve_runs_dir(args.runs_dir.clone());
    let mut rows = Vec::new();
    for path in list_runs(&runs_dir).into_iter().take(args.limit.get()) {
        let record = RunDir::open(&path.display().to_string(), &runs_dir)?;
        let mut meta = match record.meta() {
            Ok(meta) => meta,
            Err(error) => {
                trellis_process::note!("warning: {error}; that run is left out");
                continue;
            }
        };
        meta.status = record.status(&meta);
        let stages = record.checkpoint().map_or(0, |c| c.stage_count);
        rows.push((meta, stages));
    }
    if args.json {
        let list: Vec<Value> = rows
            .iter()
            .map(|(m, stages)| json!({ "run_id": m.run_id, "workflow": m.workflow, "status": m.status, "started_at": m.started_at, "ended_at": m.ended_at, "stages": stages }))
            .collect();
        println!("{}", serde_json::to_string_pretty(&list)?);
    } else if rows.is_empty() {
        println!("no runs in {}", runs_dir.display());
    } else {
        println!(
            "{:<26}  {:<18}  {:<24}  {:>6}  workflow",
            "run", "status", "started", "stages"
        );
        for (meta, stages) in rows {
            println!(
                "{:<26}  {:<18}  {:<24}  {stages:>6}  {}",
                meta.run_id,
                meta.status,
                meta.started_at,
                super::printable(&meta.workflow)
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}

pub fn show(args: &ShowArgs) -> anyhow::Result<ExitCode> {
    let runs_dir = resolve_runs_dir(args.runs_dir.clone());
    let record = RunDir::open(&args.run, &runs_dir)?;
    let mut meta = record.meta()?;
    meta.status = record.status(&meta);
    if args.changes {
        let changes = trellis_run::changes::read(record.root())
            .map_err(|why| anyhow::anyhow!("no changes to show for run {}: {why}", meta.run_id))?;
        print!("{}", changes.diff);
        if changes.truncated {
            trellis_process::note!(
                "(the diff is cut at {} bytes)",
                trellis_run::changes::MAX_DIFF_BYTES
            );
        }
        return Ok(ExitCode::SUCCESS);
    }
    let checkpoint = record.checkpoint().ok();
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&json!({ "run": meta, "checkpoint": checkpoint }))?
        );
        return Ok(ExitCode::SUCCESS);
    }
    println!(
        "Run {} of {}",
        meta.run_id,
        super::printable(&meta.workflow)
    );
    println!("  status:  {}", meta.status);
    if let Some(goal) = &meta.goal {
        println!("  goal:    {}", super::printable(goal));
    }
    println!(
        "  started: {}{}",
        meta.started_at,
        meta.ended_at
            .as_deref()
            .map(|e| format!("  ended: {e}"))
            .unwrap_or_default()
    );
    println!("  record:  {}", record.root().display());
    if let Some(temporal) = &meta.temporal {
        println!(
            "  on Temporal: {} (namespace `{}`, queue `{}`)",
            temporal.address, temporal.namespace, temporal.task_queue
        );
    }
    let Some(checkpoint) = checkpoint else {
        println!("  (no checkpoint yet)");
        return Ok(ExitCode::SUCCESS);
    };
    if let Some(failure) = &checkpoint.failure {
        println!("  error:   {}", super::printable(failure));
    }
    if let Some(next) = checkpoint.next_node()
        && !checkpoint.status.is_finished()
    {
        println!("  next:    {next}");
    }
    println!("\nStages:");
    let (mut tokens_in, mut tokens_out) = (0, 0);
    for stage in &checkpoint.stages {
        let mut reason = stage
            .failure_reason
            .as_deref()
            .map(|r| {
                format!(
                    "  {}",
                    super::printable(r.lines().next().unwrap_or_default())
                )
            })
            .unwrap_or_default();
        if let Some(model) = &stage.details.model {
            let usage = model.usage;
            tokens_in += usage.input_tokens;
            tokens_out += usage.output_tokens;
            reason = format!(
                "  {}, {} in / {} out{reason}",
                model.model, usage.input_tokens, usage.output_tokens
            );
        }
        println!(
            "  {:>3}  {:<24} {:<20} {:>8.1}s{reason}",
            stage.rank,
            format!("{}@{} #{}", stage.node_id, stage.visit, stage.attempt),
            stage.status.as_str(),
            Duration::from_millis(stage.duration_ms).as_secs_f64()
        );
        print_artifacts(&stage.details);
    }
    if tokens_in + tokens_out > 0 {
        println!("  tokens: {tokens_in} in / {tokens_out} out");
    }
    print_changes(&record, &meta.run_id);
    print_run_file_activity(&record);
    print_context(&record, &checkpoint);
    Ok(ExitCode::SUCCESS)
}

/// Files listed under "Files changed" before the rest are counted.
const CHANGED_FILES_SHOWN: usize = 20;

/// What the run changed in its working directory, file by file, when it recorded that (in a git
/// repository); `--changes` prints the diff.
fn print_changes(record: &RunDir, run_id: &str) {
    let Ok(changes) = trellis_run::changes::read(record.root()) else {
        return;
    };
    let so_far = if changes.live { " so far" } else { "" };
    if changes.files.is_empty() {
        println!("\nFiles changed{so_far}: none");
        return;
    }
    let lines = |count: Option<u64>| count.unwrap_or(0);
    let added: u64 = changes.files.iter().map(|f| lines(f.added)).sum();
    let removed: u64 = changes.files.iter().map(|f| lines(f.removed)).sum();
    println!(
        "\nFiles changed{so_far}: {} (+{added} −{removed}); `trellis show {run_id} --changes` prints the diff",
        changes.files.len(),
    );
    let width = changes
        .files
        .iter()
        .take(CHANGED_FILES_SHOWN)
        .map(|f| f.path.chars().count())
        .max()
        .unwrap_or(0)
        .min(60);
    for file in changes.files.iter().take(CHANGED_FILES_SHOWN) {
        let counts = match (file.added, file.removed) {
            (Some(added), Some(removed)) => format!("+{added} −{removed}"),
            _ => "binary".to_owned(),
        };
        println!("  {:<width$}  {counts}", super::printable(&file.path));
    }
    if let Some(more) = changes.files.len().checked_sub(CHANGED_FILES_SHOWN)
        && more > 0
    {
        println!("  … and {more} more");
    }
}

/// The run's context, less the engine's own keys: each value on one line, cut to 100 characters.
fn print_context(record: &RunDir, checkpoint: &trellis_engine::Checkpoint) {
    println!("\nContext:");
    let blobs = trellis_store::FileBlobs::new(record.blobs_dir());
    for (key, value) in checkpoint
        .track
        .context
        .iter()
        .filter(|(k, _)| !keys::is_engine_key(k))
    {
        // Values kept as blobs are shown, not their references.
        let value = &trellis_engine::context::resolve_blob(value.clone(), &blobs);
        let text = match value {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        };
        let mut shown: String = text.chars().take(100).collect();
        if text.chars().count() > 100 {
            shown.push('…');
        }
        println!("  {} = {}", super::printable(key), super::printable(&shown));
    }
}

/// A run file's prepare steps and every hook run, from the event log.
fn print_run_file_activity(record: &RunDir) {
    let events = record.events().unwrap_or_default();
    let mut prepare = Vec::new();
    let mut hooks = Vec::new();
    for event in &events {
        match &event.kind {
            EventKind::PrepareStep {
                step,
                command,
                succeeded,
                note,
                duration_ms,
            } => prepare.push(format!(
                "  {step:>3}  {:<44} {:<9} {:>7.1}s  {note}",
                command.lines().next().unwrap_or_default(),
                if *succeeded { "succeeded" } else { "failed" },
                Duration::from_millis(*duration_ms).as_secs_f64()
            )),
            EventKind::HookCompleted {
                hook,
                hook_event,
                hook_type,
                decision,
                reason,
                duration_ms,
                error,
                ..
            } => {
                let at = event
                    .node_id
                    .as_deref()
                    .map_or_else(|| hook_event.clone(), |n| format!("{hook_event} {n}"));
                let why: Vec<&str> = reason
                    .iter()
                    .chain(error)
                    .map(|r| r.lines().next().unwrap_or_default())
                    .collect();
                let why = if why.is_empty() {
                    String::new()
                } else {
                    format!("  {}", why.join("; "))
                };
                hooks.push(format!(
                    "  {:<20} {:<28} {:<8} {:<9} {:>6.1}s{why}",
                    hook,
                    at,
                    hook_type,
                    decision,
                    Duration::from_millis(*duration_ms).as_secs_f64()
                ));
            }
            _ => {}
        }
    }
    if !prepare.is_empty() {
        println!("\nPrepare:");
        for line in prepare {
            println!("{line}");
        }
    }
    if !hooks.is_empty() {
        println!("\nHooks:");
        for line in hooks {
            println!("{line}");
        }
    }
}

/// The artifacts a stage captured, and those it left out with the reason.
fn print_artifacts(details: &StageDetails) {
    let captured = details.artifacts.iter().map(|a| ("artifact", a));
    let skipped = details
        .artifacts_skipped
        .iter()
        .map(|a| ("not captured", a));
    for (verb, artifact) in captured.chain(skipped) {
        let why = artifact
            .skipped
            .as_deref()
            .map(|r| format!(" ({r})"))
            .unwrap_or_default();
        println!(
            "         {verb}: {}, {} bytes{why}",
            artifact.path, artifact.bytes
        );
    }
}

fn print_event(event: &Event, json: bool) -> anyhow::Result<()> {
    if json {
        println!("{}", serde_json::to_string(event)?);
    } else {
        let fields = serde_json::to_string(&event.fields())?;
        println!(
            "{:>5}  {}  {:<28} {:<16} {fields}",
            event.seq,
            event.ts,
            event.name(),
            event.node_id.as_deref().unwrap_or("-")
        );
    }
    Ok(())
}

pub fn events(args: &EventsArgs) -> anyhow::Result<ExitCode> {
    let runs_dir = resolve_runs_dir(args.runs_dir.clone());
    let record = RunDir::open(&args.run, &runs_dir)?;
    if !args.follow {
        let (events, damaged) = record.events_checked()?;
        warn_damaged(&record, &damaged);
        for event in &events {
            print_event(event, args.json)?;
        }
        return Ok(ExitCode::SUCCESS);
    }
    // Following reads what the log adds (a line still being written waits for its end).
    let mut tail = record.event_tail();
    let mut ended = false;
    loop {
        // Asked before reading: a run that ends in between wrote everything before it let go. A run
        // on Temporal has no local owner while it is parked or waits for a timer; its record says it
        // still runs.
        let running = record.has_live_owner()
            || record.meta().is_ok_and(|meta| {
                meta.temporal.is_some() && meta.status == trellis_engine::RunStatus::Running
            });
        let (events, damaged) = tail.read()?;
        warn_damaged(&record, &damaged);
        for event in &events {
            print_event(event, args.json)?;
            ended = event.kind.ends_run();
        }
        let finished = ended
            && record
                .checkpoint()
                .is_ok_and(|c| c.status != trellis_engine::RunStatus::Running);
        if finished {
            return Ok(ExitCode::SUCCESS);
        }
        // Nobody will write more: the process that ran it is gone.
        if !running && events.is_empty() {
            let id = record.meta().map(|m| m.run_id).unwrap_or_default();
            trellis_process::note!(
                "the run was interrupted: the process running it is gone; continue it with `trellis resume {id}`"
            );
            return Ok(ExitCode::SUCCESS);
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Reports lines of the event log that are not events, by number; they are skipped.
fn warn_damaged(record: &RunDir, damaged: &[usize]) {
    if damaged.is_empty() {
        return;
    }
    let numbers: Vec<String> = damaged.iter().map(ToString::to_string).collect();
    trellis_process::note!(
        "warning: {} has lines that are not events (line {}); they are skipped",
        record.events_path().display(),
        numbers.join(", ")
    );
}
