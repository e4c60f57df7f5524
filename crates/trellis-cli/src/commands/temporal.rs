//! Runs on Temporal from the terminal: `trellis worker`, and the Temporal side of `trellis run` and
//! `trellis resume` — submitting a run, following it as a local run is followed (its progress from
//! the shared run record, its summary and exit code from the workflow's result), answering its gates
//! and cancelling it on Ctrl-C. How runs map onto Temporal is `trellis-temporal`'s.

use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use trellis_engine::RunStatus;
use trellis_engine::services::EventSink;
use trellis_run::{Run, SandboxChoice};
use trellis_store::{EventTail, RunDir};
use trellis_temporal::{DEFAULT_NAMESPACE, DEFAULT_TASK_QUEUE, Target};

use super::progress::Progress;
use super::run::{RunOptions, Summary, report};

/// Where `trellis run` sends a run.
#[derive(clap::Args)]
pub struct TemporalArgs {
    /// Run on Temporal: submit the run to the service at HOST:PORT, whose workers (`trellis
    /// worker`) execute it, and follow it here [default: the config file's `[temporal] address`].
    #[arg(long, value_name = "ADDR")]
    temporal: Option<String>,
    /// The Temporal namespace [default: the config file's, else `default`].
    #[arg(long, value_name = "NAME", requires = "temporal")]
    namespace: Option<String>,
    /// The workers' shared task queue [default: the config file's, else `trellis`].
    #[arg(long, value_name = "QUEUE", requires = "temporal")]
    task_queue: Option<String>,
    /// With Temporal: print the run's id and return once it is submitted, instead of following it.
    #[arg(long)]
    detach: bool,
    /// Run here even when the config file names a Temporal service.
    #[arg(long, conflicts_with = "temporal")]
    local: bool,
    /// With Temporal, where the run's working tree is kept: `shared` (the same path on every
    /// worker) or `git` (the repository's `origin`, at the run's own ref: for workers on machines
    /// that share no working directory) [default: shared].
    #[arg(long, value_enum, value_name = "WHERE")]
    workspace: Option<Workspace>,
}

/// Where a run on Temporal keeps its working tree.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Workspace {
    Shared,
    Git,
}

impl TemporalArgs {
    /// The Temporal service the run goes to: the flags', else the config file's; none for a local run.
    pub fn target(&self) -> anyhow::Result<Option<Target>> {
        if self.local {
            return Ok(None);
        }
        let config = trellis_llm::config::Config::load()?.temporal;
        let Some(address) = self.temporal.clone().or(config.address) else {
            anyhow::ensure!(
                !self.detach,
                "--detach is for runs on Temporal: give --temporal ADDR"
            );
            return Ok(None);
        };
        Ok(Some(target(
            address,
            self.namespace.clone().or(config.namespace),
            self.task_queue.clone().or(config.task_queue),
        )))
    }

    pub fn detach(&self) -> bool {
        self.detach
    }

    /// The repository a run kept on git starts from (`--workspace git`), checked before the run is
    /// recorded; `None` for a working tree every worker shares.
    pub fn origin(
        &self,
        temporal: Option<&Target>,
        work_dir: &std::path::Path,
    ) -> anyhow::Result<Option<trellis_temporal::workspace::Origin>> {
        if self.workspace != Some(Workspace::Git) {
            return Ok(None);
        }
        anyhow::ensure!(
            temporal.is_some(),
            "--workspace git is for runs on Temporal: give --temporal ADDR"
        );
        let origin = trellis_temporal::workspace::origin(work_dir).map_err(anyhow::Error::msg)?;
        if origin.uncommitted {
            trellis_process::note!(
                "warning: {} has uncommitted changes; the run starts from its last commit, without them",
                work_dir.display()
            );
        }
        Ok(Some(origin))
    }
}

fn target(address: String, namespace: Option<String>, task_queue: Option<String>) -> Target {
    Target {
        address,
        namespace: namespace.unwrap_or_else(|| DEFAULT_NAMESPACE.to_owned()),
        task_queue: task_queue.unwrap_or_else(|| DEFAULT_TASK_QUEUE.to_owned()),
    }
}

/// `trellis worker`.
#[derive(clap::Args)]
pub struct WorkerArgs {
    /// The Temporal service's address, HOST:PORT [default: the config file's `[temporal] address`].
    #[arg(long, value_name = "ADDR")]
    temporal: Option<String>,
    /// The Temporal namespace [default: the config file's, else `default`].
    #[arg(long, value_name = "NAME")]
    namespace: Option<String>,
    /// The shared task queue to poll [default: the config file's, else `trellis`].
    #[arg(long, value_name = "QUEUE")]
    task_queue: Option<String>,
    /// How many stages it executes at once [default: the number of cores].
    #[arg(long, value_name = "N")]
    slots: Option<usize>,
    /// The runs directory it serves, the one runs are submitted from, at the same path here
    /// [default: `$TRELLIS_RUNS_DIR` or `~/.trellis/runs`]; runs elsewhere are refused.
    #[arg(long, value_name = "DIR")]
    runs_dir: Option<std::path::PathBuf>,
    /// Confine commands and agent tools: `auto`, `bubblewrap`, `landlock` or `none` [default: the
    /// config file's `[sandbox] mode`, else auto].
    #[arg(long, value_name = "MODE", env = "TRELLIS_SANDBOX")]
    sandbox: Option<SandboxChoice>,
    /// Where it checks out the working trees of runs kept on git (`--workspace git`): a directory
    /// commands may not write outside their own checkout [default: `~/.trellis/workspaces`].
    #[arg(long, value_name = "DIR")]
    workspaces: Option<std::path::PathBuf>,
}

/// Runs a worker until Ctrl-C or SIGTERM; the runs it is executing then are interrupted at their
/// checkpoints and taken over by other workers.
pub fn worker(args: &WorkerArgs) -> anyhow::Result<ExitCode> {
    let config = trellis_llm::config::Config::load()?.temporal;
    let Some(address) = args.temporal.clone().or(config.address) else {
        trellis_process::note!(
            "error: trellis worker needs the Temporal service's address: --temporal HOST:PORT, or `address` under `[temporal]` in the config file"
        );
        return Ok(ExitCode::from(super::EXIT_USAGE));
    };
    let target = target(
        address,
        args.namespace.clone().or(config.namespace),
        args.task_queue.clone().or(config.task_queue),
    );
    let sandbox = super::sandbox(args.sandbox)?;
    let slots = args
        .slots
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(2, std::num::NonZero::get));
    let describe = sandbox.describe();
    let runs_dir = trellis_store::resolve_runs_dir(args.runs_dir.clone());
    std::fs::create_dir_all(&runs_dir)
        .with_context(|| format!("cannot create the runs directory {}", runs_dir.display()))?;
    let serves = runs_dir.display().to_string();
    let workspaces = args
        .workspaces
        .clone()
        .unwrap_or_else(trellis_temporal::workspace::default_dir);
    let workspaces = std::path::absolute(&workspaces).unwrap_or(workspaces);
    // The worker's own `git` runs on what lies there: a stage must not be able to write it.
    anyhow::ensure!(
        !sandbox.confined_children_write(&workspaces),
        "--workspaces {} lies where the sandbox lets every command write; choose a directory outside the home directory's tool caches, such as the default ~/.trellis/workspaces",
        workspaces.display()
    );
    super::on_server_runtime(async move {
        let config = trellis_temporal::worker::WorkerConfig {
            target: target.clone(),
            slots,
            sandbox,
            runs_dir,
            workspaces,
        };
        let shutdown = async {
            use tokio::signal::unix::{SignalKind, signal};
            let (Ok(mut interrupt), Ok(mut terminate)) = (
                signal(SignalKind::interrupt()),
                signal(SignalKind::terminate()),
            ) else {
                return std::future::pending().await;
            };
            tokio::select! {
                _ = interrupt.recv() => {}
                _ = terminate.recv() => {}
            }
            trellis_process::note!("worker stopping: its runs are handed to other workers");
        };
        trellis_temporal::worker::run_worker(config, shutdown, |identity| {
            trellis_process::note!(
                "worker {identity} polling `{}` in namespace `{}` at {} ({slots} slots)\n  runs: {serves}\n  sandbox: {describe}",
                target.task_queue, target.namespace, target.address
            );
        })
        .await
    })??;
    Ok(ExitCode::SUCCESS)
}

/// Submits a new run (its record created) to `target`'s workers; follows it unless `detach`.
pub async fn submit(
    run: Run,
    target: &Target,
    origin: Option<trellis_temporal::workspace::Origin>,
    options: &RunOptions,
    detach: bool,
) -> anyhow::Result<ExitCode> {
    let run_id = run.id().to_owned();
    let workflow = run.workflow_name().to_owned();
    let record = run.record().clone();
    let runs_dir = record
        .root()
        .parent()
        .context("the run record has no runs directory")?
        .to_path_buf();
    let gates = options.gates()?;
    run.park().await?;
    let mut kept_on = None;
    if let Some(origin) = origin {
        let (id, kept) = (run_id.clone(), record.clone());
        let published = trellis_process::task::blocking(move || {
            let workspace = origin.publish(&id)?;
            let remote = workspace.remote.clone();
            record_workspace(&kept, workspace).map(|()| remote)
        })
        .await;
        match published {
            Ok(remote) => kept_on = Some(remote),
            Err(reason) => {
                mark_failed(&record);
                anyhow::bail!("run {run_id} cannot start: {reason}");
            }
        }
    }
    if let Err(error) = trellis_temporal::submit(target, &run_id, &runs_dir, gates).await {
        // The record says why the run never started, for `trellis runs` and the web app.
        mark_failed(&record);
        return Err(error.into());
    }
    if detach {
        if options.json() {
            println!(
                "{}",
                serde_json::json!({ "run_id": run_id, "temporal": target })
            );
        } else {
            println!("{run_id}");
        }
        return Ok(ExitCode::SUCCESS);
    }
    if !options.json() {
        trellis_process::note!(
            "Run {run_id} of {workflow}\n  record: {}\n  on Temporal: {} (namespace `{}`, queue `{}`)",
            record.root().display(),
            target.address,
            target.namespace,
            target.task_queue
        );
        if let Some(remote) = kept_on {
            trellis_process::note!(
                "  working tree: {} at {remote}",
                trellis_temporal::workspace::run_ref(&run_id)
            );
        }
    }
    follow(&record, target, options).await
}

/// Records where the run's working tree is kept, for its workers.
fn record_workspace(record: &RunDir, workspace: trellis_store::GitWorkspace) -> Result<(), String> {
    let mut meta = record.meta().map_err(|e| e.to_string())?;
    meta.workspace = Some(workspace);
    record.write_meta(&meta).map_err(|e| e.to_string())
}

/// `trellis resume` of a run on Temporal: sends the answers file's answers, if any, then follows
/// the run until it ends or waits again.
pub async fn resume(
    record: Arc<RunDir>,
    target: &Target,
    options: &RunOptions,
) -> anyhow::Result<ExitCode> {
    let meta = record.meta()?;
    if meta.status.is_finished() {
        trellis_process::note!(
            "run {} already {}; nothing to resume",
            meta.run_id,
            meta.status.as_str()
        );
        return Ok(ExitCode::from(if meta.status == RunStatus::Succeeded {
            0
        } else {
            super::EXIT_INVALID
        }));
    }
    // A cancelled run's workflow has ended: a new one continues it from its checkpoint.
    if matches!(meta.status, RunStatus::Cancelled | RunStatus::Interrupted) {
        let runs_dir = record
            .root()
            .parent()
            .unwrap_or(Path::new("."))
            .to_path_buf();
        trellis_temporal::submit(target, &meta.run_id, &runs_dir, options.gates()?).await?;
    } else if let Some(answers) = options.gates()?.answers {
        trellis_temporal::answer(target, &meta.run_id, answers).await?;
    } else if meta.status == RunStatus::WaitingForInput {
        trellis_process::note!(
            "run {} waits for input on Temporal; answer with: trellis resume {} --answers FILE",
            meta.run_id,
            meta.run_id
        );
        return Ok(ExitCode::from(super::run::EXIT_WAITING));
    }
    follow(&record, target, options).await
}

/// Shows the run's progress from its record while its workflow runs, then its summary.
async fn follow(
    record: &Arc<RunDir>,
    target: &Target,
    options: &RunOptions,
) -> anyhow::Result<ExitCode> {
    use tokio::signal::unix::{SignalKind, signal};
    let started = Instant::now();
    let run_id = record.meta()?.run_id;
    let runs_dir = record
        .root()
        .parent()
        .unwrap_or(Path::new("."))
        .to_path_buf();
    let progress = (!options.json()).then(|| Progress::new(options.verbose(), runs_dir));
    let mut tail = record.event_tail();
    // Events from before this process started following (a resumed run's) are not shown again.
    let _ = tail.read();
    let result = trellis_temporal::result(target, &run_id);
    tokio::pin!(result);
    let mut tick = tokio::time::interval(Duration::from_millis(200));
    let mut interrupt = signal(SignalKind::interrupt())?;
    let mut cancelled = false;
    let end = loop {
        tokio::select! {
            end = &mut result => break Some(end),
            _ = tick.tick() => {
                // A run waiting for an answer stops being followed, as a local run stops: its
                // workflow waits on Temporal for `trellis resume --answers` — unless the gate has
                // a timeout, which Temporal counts down and which the run then goes on from.
                if show(&mut tail, progress.as_deref()) && !gate_times_out(target, &run_id).await {
                    break None;
                }
            }
            _ = interrupt.recv(), if !cancelled => {
                cancelled = true;
                trellis_process::note!("cancelling run {run_id} on Temporal…");
                if let Err(error) = trellis_temporal::cancel(target, &run_id).await {
                    trellis_process::note!("error: {error}");
                }
            }
        }
    };
    show(&mut tail, progress.as_deref());
    let (status, error, workers) = match end {
        Some(Ok(end)) => (end.status, end.error, Some((end.workers, end.handovers))),
        // The workflow itself failed (a worker refused the run, or lost it too often): no worker
        // will record that, so the record is marked here.
        Some(Err(error)) => {
            mark_failed(record);
            (RunStatus::Failed, Some(error.to_string()), None)
        }
        None => (RunStatus::WaitingForInput, None, None),
    };
    let checkpoint = record.checkpoint()?;
    report(
        &Summary {
            run_id: &run_id,
            run_dir: record.root(),
            status,
            checkpoint: &checkpoint,
            error,
            sandbox: "the workers'",
            elapsed: started.elapsed(),
            workers,
        },
        options,
        false,
        cancelled.then_some(2),
    )
}

/// Whether the gate the run waits at has a timeout (the workflow is asked; it may take a moment to
/// take in the stage's end).
async fn gate_times_out(target: &Target, run_id: &str) -> bool {
    for _ in 0..20 {
        if let Ok(Some(gate)) = trellis_temporal::waiting_gate(target, run_id).await {
            return gate.timeout_ms.is_some();
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    false
}

/// Records a run no worker will finish as failed.
fn mark_failed(record: &RunDir) {
    if let Err(error) = trellis_run::settle(record, RunStatus::Failed) {
        trellis_process::note!("error: cannot record the run as failed: {error}");
    }
}

/// Hands the events the log gained to the progress display; says whether the run stopped to wait
/// for input.
fn show(tail: &mut EventTail, progress: Option<&Progress>) -> bool {
    let Ok((events, _)) = tail.read() else {
        return false;
    };
    if let Some(progress) = progress {
        for event in &events {
            progress.emit(event);
        }
    }
    events.iter().any(|event| {
        matches!(
            event.kind,
            trellis_engine::event::EventKind::WorkflowRunWaitingForInput { .. }
        )
    })
}
