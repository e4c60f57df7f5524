//! `trellis run FILE` and `trellis resume RUN`: compile the workflow, open (or create) its run record,
//! wire the engine to the store, the handlers and an interviewer, run with live progress, and print a
//! summary. Exit codes: 0 succeeded, 1 failed (or invalid workflow), 2 usage or file problems,
//! 3 waiting for input.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context as _, bail};
use serde_json::{Value, json};
use trellis_engine::services::{
    EventSink, Interviewer, RouteChoice, RouteOption, Router, Subscribers,
};
use trellis_engine::{CancellationToken, Engine, Handlers, RunStatus, Services, Settings};
use trellis_handlers::interviewer::{Answers, AutoApprove, Console, Unattended};
use trellis_handlers::model_router::ModelRouter;
use trellis_llm::{Client, Config};
use trellis_store::{EventLog, FileBlobs, RunDir, RunMeta, new_run_id, resolve_runs_dir};
use trellis_syntax::render::render_terminal;
use trellis_workflow::{CompileOptions, Workflow};

use super::progress::Progress;
use super::{EXIT_INVALID, EXIT_USAGE};

/// Exit code for a run that stopped to wait for a human answer.
pub const EXIT_WAITING: u8 = 3;

/// Options shared by `run` and `resume`.
#[derive(clap::Args)]
pub struct RunOptions {
    /// Where run records live [default: `$TRELLIS_RUNS_DIR` or `~/.trellis/runs`].
    #[arg(long, value_name = "DIR")]
    runs_dir: Option<PathBuf>,
    /// Answer every human gate with its first option.
    #[arg(long)]
    auto_approve: bool,
    /// A JSON object mapping human-gate ids to answers (a label, an accelerator key or free text).
    #[arg(long, value_name = "FILE")]
    answers: Option<PathBuf>,
    /// Print the summary as JSON.
    #[arg(long)]
    json: bool,
}

#[derive(clap::Args)]
pub struct RunArgs {
    /// The workflow file.
    file: PathBuf,
    /// Replace the workflow's goal.
    #[arg(long)]
    goal: Option<String>,
    /// Simulate models, run no commands and skip waits: test the workflow's shape.
    #[arg(long)]
    dry_run: bool,
    /// Put a value into the run context before the first stage (JSON, or else text).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    set: Vec<String>,
    /// Stop a run after this many stages (a runaway loop).
    #[arg(long, default_value_t = 10_000)]
    max_steps: u32,
    #[command(flatten)]
    options: RunOptions,
}

#[derive(clap::Args)]
pub struct ResumeArgs {
    /// The run id (or a unique prefix of it), or the run's directory.
    run: String,
    #[command(flatten)]
    options: RunOptions,
}

/// In a dry run, natural-language edges take the first candidate.
struct SimulatedRouter;

#[async_trait::async_trait]
impl Router for SimulatedRouter {
    async fn choose(
        &self,
        _node: &str,
        _options: &[RouteOption],
        _context: &BTreeMap<String, Value>,
        _events: &dyn trellis_engine::Emitter,
    ) -> Result<RouteChoice, String> {
        Ok(RouteChoice {
            choice: Some(0),
            details: Value::Null,
        })
    }
}

fn interviewer(options: &RunOptions) -> anyhow::Result<Arc<dyn Interviewer>> {
    let fallback: Box<dyn Interviewer> = if options.auto_approve {
        Box::new(AutoApprove)
    } else if std::io::IsTerminal::is_terminal(&std::io::stdin()) {
        Box::new(Console)
    } else {
        Box::new(Unattended)
    };
    let Some(path) = &options.answers else {
        return Ok(Arc::from(fallback));
    };
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read the answers file {}", path.display()))?;
    let answers: HashMap<String, String> = Answers::parse(&text)
        .map_err(|e| anyhow::anyhow!("the answers file {} is not usable: {e}", path.display()))?;
    Ok(Arc::new(Answers::new(answers, fallback)))
}

fn parse_sets(sets: &[String]) -> anyhow::Result<BTreeMap<String, Value>> {
    sets.iter()
        .map(|set| {
            let Some((key, value)) = set.split_once('=') else {
                bail!("--set expects KEY=VALUE, found `{set}`")
            };
            let key = key.trim();
            if key.is_empty() {
                bail!("--set expects KEY=VALUE, found `{set}`");
            }
            let value =
                serde_json::from_str(value).unwrap_or_else(|_| Value::String(value.to_owned()));
            Ok((key.to_owned(), value))
        })
        .collect()
}

/// Compiles a workflow, printing its diagnostics; `None` when it has errors.
fn compile(
    path: &Path,
    source_path: &Path,
    goal: Option<String>,
) -> anyhow::Result<Option<Workflow>> {
    let base_dir = source_path.parent().map(Path::to_path_buf);
    let options = CompileOptions { goal, base_dir };
    let (file, compiled) = trellis_workflow::load(path, &options)?;
    if compiled.has_errors() || !compiled.diagnostics.is_empty() {
        render_terminal(
            &mut std::io::stderr().lock(),
            &file,
            &compiled.diagnostics,
            std::io::IsTerminal::is_terminal(&std::io::stderr()),
        )?;
    }
    Ok(compiled.workflow)
}

struct Prepared {
    engine: Engine,
    record: Arc<RunDir>,
    log: Arc<EventLog>,
    checkpoint: trellis_engine::Checkpoint,
    models: Option<Arc<Client>>,
}

/// The model client of a real run: providers from the config file and the environment, and the local
/// model server, whose output goes to `llama-server.log` in the run record. Dry runs have none.
fn models(record: &RunDir, dry_run: bool) -> anyhow::Result<Option<Arc<Client>>> {
    if dry_run {
        return Ok(None);
    }
    let config = Config::load()?;
    Ok(Some(Arc::new(Client::from_config(
        &config,
        Some(record.root().join("llama-server.log")),
    ))))
}

/// The engine's handlers and services, with models where the run has them. Events go to the run's
/// event log and to the terminal display; the log is returned so the run can close it.
fn wiring(
    record: &Arc<RunDir>,
    options: &RunOptions,
    models: Option<&Arc<Client>>,
) -> anyhow::Result<(Arc<Handlers>, Services, Arc<EventLog>)> {
    let router: Arc<dyn Router> = match models {
        Some(client) => Arc::new(ModelRouter::new(client.clone(), None)),
        None => Arc::new(SimulatedRouter),
    };
    let log = Arc::new(
        record
            .event_log()
            .with_context(|| format!("cannot open {}", record.events_path().display()))?,
    );
    let progress: Arc<dyn EventSink> = Progress::new();
    let services = Services {
        store: record.clone(),
        blobs: Arc::new(FileBlobs::new(record.blobs_dir())),
        events: Subscribers::new([log.clone() as Arc<dyn EventSink>, progress]),
        interviewer: interviewer(options)?,
        router: Some(router),
    };
    Ok((
        Arc::new(trellis_handlers::standard_handlers(models.cloned())),
        services,
        log,
    ))
}

pub fn run(args: &RunArgs) -> anyhow::Result<ExitCode> {
    let runtime = tokio::runtime::Runtime::new()?;
    runtime.block_on(async {
        let initial = parse_sets(&args.set)?;
        let source = match std::fs::read_to_string(&args.file) {
            Ok(source) => source,
            Err(error) => {
                eprintln!("error: cannot read {}: {error}", args.file.display());
                return Ok(ExitCode::from(EXIT_USAGE));
            }
        };
        let Some(workflow) = compile(&args.file, &args.file, args.goal.clone())? else {
            eprintln!("error: {} is not valid; fix the errors above", args.file.display());
            return Ok(ExitCode::from(EXIT_INVALID));
        };
        let runs_dir = resolve_runs_dir(args.options.runs_dir.clone());
        let run_id = new_run_id();
        let extension = args.file.extension().and_then(|e| e.to_str()).unwrap_or("fabro");
        let source_path = std::fs::canonicalize(&args.file).unwrap_or_else(|_| args.file.clone());
        let meta = RunMeta {
            run_id: run_id.clone(),
            workflow: workflow.name.clone(),
            goal: workflow.graph.goal.clone(),
            source_path: source_path.display().to_string(),
            status: RunStatus::Running.as_str().to_owned(),
            started_at: trellis_engine::engine::timestamp(),
            ended_at: None,
            settings: json!({ "dry_run": args.dry_run, "max_steps": args.max_steps, "work_dir": std::env::current_dir()?.display().to_string() }),
        };
        let recorded = trellis_workflow::inline::inline_file_references(&source, &workflow);
        let record = Arc::new(RunDir::create(&runs_dir, &meta, &recorded, &format!("workflow.{extension}"))?);
        let settings = Settings { work_dir: std::env::current_dir()?, dry_run: args.dry_run, max_steps: args.max_steps };
        let workflow = Arc::new(workflow);
        let models = models(&record, args.dry_run)?;
        let (handlers, services, log) = wiring(&record, &args.options, models.as_ref())?;
        let engine = Engine::new(workflow, handlers, services, settings, run_id);
        let checkpoint = engine.first_checkpoint(initial).context("the workflow has no start node")?;
        finish(Prepared { engine, record, log, checkpoint, models }, &args.options).await
    })
}

pub fn resume(args: &ResumeArgs) -> anyhow::Result<ExitCode> {
    let runtime = tokio::runtime::Runtime::new()?;
    runtime.block_on(async {
        let runs_dir = resolve_runs_dir(args.options.runs_dir.clone());
        let record = Arc::new(RunDir::open(&args.run, &runs_dir)?);
        let meta = record.meta()?;
        let mut checkpoint = record
            .checkpoint()
            .with_context(|| format!("run {} has no checkpoint to resume from", meta.run_id))?;
        // Events written after the last checkpoint (by a killed process) keep their numbers.
        let last_seq = record.events()?.last().map_or(0, |e| e.seq);
        checkpoint.seq = checkpoint.seq.max(last_seq);
        if checkpoint.status.is_finished() {
            eprintln!(
                "run {} already {}; nothing to resume",
                meta.run_id,
                checkpoint.status.as_str()
            );
            return Ok(ExitCode::from(
                if checkpoint.status == RunStatus::Succeeded {
                    0
                } else {
                    EXIT_INVALID
                },
            ));
        }
        let reaped = {
            let (root, run_id) = (record.root().to_path_buf(), meta.run_id.clone());
            tokio::task::spawn_blocking(move || trellis_handlers::command::reap(&root, &run_id))
                .await
                .unwrap_or(0)
        };
        if reaped > 0 && !args.options.json {
            eprintln!("stopped {reaped} command(s) left running by the interrupted run");
        }
        let source = record
            .source_file()
            .context("the run record has no workflow source")?;
        let original = PathBuf::from(&meta.source_path);
        let Some(workflow) = compile(&source, &original, meta.goal.clone())? else {
            eprintln!(
                "error: the workflow saved with run {} no longer compiles",
                meta.run_id
            );
            return Ok(ExitCode::from(EXIT_INVALID));
        };
        let dry_run = meta
            .settings
            .get("dry_run")
            .and_then(Value::as_bool)
            .unwrap_or(false);
        let work_dir = meta
            .settings
            .get("work_dir")
            .and_then(Value::as_str)
            .map_or_else(|| PathBuf::from("."), PathBuf::from);
        let max_steps = meta
            .settings
            .get("max_steps")
            .and_then(Value::as_u64)
            .and_then(|n| u32::try_from(n).ok())
            .unwrap_or(10_000);
        let settings = Settings {
            work_dir,
            dry_run,
            max_steps,
        };
        let models = models(&record, dry_run)?;
        let (handlers, services, log) = wiring(&record, &args.options, models.as_ref())?;
        let engine = Engine::new(
            Arc::new(workflow),
            handlers,
            services,
            settings,
            meta.run_id.clone(),
        );
        finish(
            Prepared {
                engine,
                record,
                log,
                checkpoint,
                models,
            },
            &args.options,
        )
        .await
    })
}

async fn finish(prepared: Prepared, options: &RunOptions) -> anyhow::Result<ExitCode> {
    let Prepared {
        engine,
        record,
        log,
        checkpoint,
        models,
    } = prepared;
    let started = Instant::now();
    if !options.json {
        eprintln!(
            "Run {} of {}\n  record: {}",
            engine.run_id(),
            engine.workflow.name,
            record.root().display()
        );
    }
    let cancel = CancellationToken::new();
    let signal = tokio::spawn(stop_signal(cancel.clone()));
    let result = engine.run(checkpoint, &cancel).await;
    signal.abort();
    let stopped_by = signal.await.ok().flatten();
    // Every event is in the log once it closes; a write error there means the record is incomplete.
    let log_error = tokio::task::spawn_blocking(move || log.close())
        .await
        .map_or_else(
            |e| Some(e.to_string()),
            |closed| closed.err().map(|e| e.to_string()),
        );
    if let Some(error) = &log_error {
        eprintln!(
            "error: the event log of run {} is incomplete: {error}",
            engine.run_id()
        );
    }
    if let Some(models) = &models {
        // Stops the local model server, if this run started one.
        models.shutdown().await;
    }
    let mut meta = record.meta()?;
    result.status.as_str().clone_into(&mut meta.status);
    meta.ended_at = result
        .status
        .is_finished()
        .then(trellis_engine::engine::timestamp);
    record.write_meta(&meta)?;
    let elapsed = started.elapsed();
    let stages = result.checkpoint.stages.len();
    if options.json {
        let summary = json!({
            "run_id": engine.run_id(), "run_dir": record.root().display().to_string(), "status": result.status.as_str(),
            "stages": stages, "waiting_at": (result.status == RunStatus::WaitingForInput).then(|| result.checkpoint.next_node()),
            "stopped_at": (result.status == RunStatus::Cancelled).then(|| result.checkpoint.next_node()),
            "error": result.error.as_ref().map(ToString::to_string),
        });
        println!("{}", serde_json::to_string_pretty(&summary)?);
    } else {
        match result.status {
            RunStatus::Succeeded => println!(
                "Run {} succeeded: {stages} stages in {:.1}s",
                engine.run_id(),
                elapsed.as_secs_f64()
            ),
            RunStatus::WaitingForInput => println!(
                "Run {} is waiting for input at `{}`; answer with: trellis resume {} --answers FILE (or run it on a terminal)",
                engine.run_id(),
                result.checkpoint.next_node().unwrap_or("?"),
                engine.run_id()
            ),
            RunStatus::Cancelled => println!(
                "Run {} was cancelled at `{}`; continue it with: trellis resume {}",
                engine.run_id(),
                result.checkpoint.next_node().unwrap_or("?"),
                engine.run_id()
            ),
            _ => println!(
                "Run {} failed after {stages} stages: {}",
                engine.run_id(),
                result
                    .error
                    .as_ref()
                    .map_or_else(|| "unknown error".to_owned(), ToString::to_string)
            ),
        }
    }
    Ok(match result.status {
        RunStatus::Succeeded if log_error.is_some() => ExitCode::from(EXIT_INVALID),
        RunStatus::Succeeded => ExitCode::SUCCESS,
        RunStatus::WaitingForInput => ExitCode::from(EXIT_WAITING),
        // 128 + the signal's number, as a shell reports a command the signal stopped.
        RunStatus::Cancelled => ExitCode::from(128 + stopped_by.unwrap_or(2)),
        _ => ExitCode::from(EXIT_INVALID),
    })
}

/// Waits for Ctrl-C (SIGINT), SIGTERM or SIGHUP and cancels the run; returns the signal's number.
async fn stop_signal(cancel: CancellationToken) -> Option<u8> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut interrupt = signal(SignalKind::interrupt()).ok()?;
    let mut terminate = signal(SignalKind::terminate()).ok()?;
    let mut hangup = signal(SignalKind::hangup()).ok()?;
    let number = tokio::select! {
        _ = interrupt.recv() => SignalKind::interrupt(),
        _ = terminate.recv() => SignalKind::terminate(),
        _ = hangup.recv() => SignalKind::hangup(),
    };
    cancel.cancel();
    u8::try_from(number.as_raw_value()).ok()
}
