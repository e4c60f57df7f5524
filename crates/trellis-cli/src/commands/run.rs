//! `trellis run FILE` and `trellis resume RUN`: the terminal side of a run. The run library
//! (`trellis-run`) compiles, records, wires and executes it; this module picks who answers human gates,
//! shows diagnostics and live progress, turns Ctrl-C, SIGTERM and SIGHUP into cancellation, and prints
//! the summary. Exit codes: 0 succeeded, 1 failed (or invalid workflow), 2 usage or file problems,
//! 3 waiting for input.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context as _, bail};
use serde_json::{Value, json};
use trellis_engine::services::{EventSink, Interviewer};
use trellis_engine::{RunMode, RunStatus, Settings};
use trellis_handlers::interviewer::{Answers, AutoApprove, Console, Unattended};
use trellis_run::{
    Finished, Loaded, NewRun, Opened, Resumable, Run, RunError, SandboxChoice, Stop, Wiring,
};
use trellis_store::resolve_runs_dir;
use trellis_syntax::render::render_terminal;

use super::progress::Progress;
use super::{ColorChoice, EXIT_INVALID, EXIT_USAGE};

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
    /// Stream the models' answers as they are written.
    #[arg(long, short)]
    verbose: bool,
    /// Colour diagnostics.
    #[arg(long, value_enum, default_value_t = ColorChoice::Auto)]
    color: ColorChoice,
    /// Confine commands and agent tools: `auto` (bubblewrap when it works here, else Landlock),
    /// `bubblewrap`, `landlock`, or `none` [default: the config file's `[sandbox] mode`, else auto].
    #[arg(long, value_name = "MODE", env = "TRELLIS_SANDBOX")]
    sandbox: Option<SandboxChoice>,
}

#[derive(clap::Args)]
pub struct RunArgs {
    /// The workflow file, or a run file (`.toml`: Fabro's run configuration) naming one.
    file: PathBuf,
    /// Replace the workflow's goal.
    #[arg(long)]
    goal: Option<String>,
    /// The model for prompt and agent nodes that name none (a node's or a stylesheet's model
    /// stays), over a run file's `[run.model] name` and the workflow's.
    #[arg(long, value_name = "MODEL")]
    model: Option<String>,
    /// The provider of a model the catalog does not place, over a run file's `[run.model]
    /// provider`.
    #[arg(long, value_name = "PROVIDER", value_parser = provider_name)]
    provider: Option<String>,
    /// Simulate models, run no commands and skip waits: test the workflow's shape.
    #[arg(long, conflicts_with = "simulate")]
    dry_run: bool,
    /// Simulate models, but run commands, waits and human gates: test a workflow's deterministic
    /// parts without model keys.
    #[arg(long)]
    simulate: bool,
    /// Put a value into the run context before the first stage (JSON, or else text).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    set: Vec<String>,
    /// An input: what templates name (`{{ inputs.KEY }}`, `$KEY` in prompts) and, for a YAML
    /// workflow, a declared input read as its type; over a run file's; repeat for several. `-V`
    /// is Fabro's spelling.
    #[arg(long = "input", short = 'V', value_name = "KEY=VALUE")]
    input: Vec<String>,
    /// Workflow inputs from a JSON object file; `--input` values override them.
    #[arg(long = "inputs", value_name = "FILE")]
    inputs: Option<PathBuf>,
    /// Stop a run after this many stages, its sub-workflows' stages included (a runaway loop).
    #[arg(long, default_value_t = 10_000)]
    max_steps: u32,
    /// Let `@file` and `workflow=` references read from this directory too (they stay inside the
    /// workflow's directory or its git repository otherwise); repeat for several.
    #[arg(long = "allow-dir", value_name = "DIR")]
    allow_dir: Vec<PathBuf>,
    /// The most agents' tools may do without asking, whatever the workflow says: read-only,
    /// read-write or full (calls beyond it are asked on a terminal, denied without one).
    #[arg(long, value_name = "LEVEL", value_parser = permissions_level)]
    permissions: Option<trellis_workflow::node_kind::Permissions>,
    #[command(flatten)]
    temporal: super::temporal::TemporalArgs,
    #[command(flatten)]
    options: RunOptions,
}

impl RunOptions {
    pub(super) fn json(&self) -> bool {
        self.json
    }

    pub(super) fn sandbox(&self) -> Option<SandboxChoice> {
        self.sandbox
    }

    pub(super) fn runs_dir(&self) -> Option<PathBuf> {
        self.runs_dir.clone()
    }

    pub(super) fn verbose(&self) -> bool {
        self.verbose
    }

    /// Who answers gates on a run's workers: the answers file, then `--auto-approve`.
    pub(super) fn gates(&self) -> anyhow::Result<trellis_temporal::Gates> {
        Ok(trellis_temporal::Gates {
            answers: read_answers(self)?.map(|answers| answers.into_iter().collect()),
            auto_approve: self.auto_approve,
        })
    }
}

pub(super) fn provider_name(text: &str) -> Result<String, String> {
    trellis_llm::known_provider(text).map(str::to_owned)
}

pub(super) fn permissions_level(
    text: &str,
) -> Result<trellis_workflow::node_kind::Permissions, String> {
    use trellis_workflow::node_kind::Permissions;
    text.parse().map_err(|()| {
        format!(
            "`{text}` is not a permission level: use {}",
            Permissions::WORDS.join(", ")
        )
    })
}

#[derive(clap::Args)]
pub struct ResumeArgs {
    /// The run id (or a unique prefix of it), or the run's directory.
    run: String,
    #[command(flatten)]
    options: RunOptions,
}

/// The answers file (`--answers`), read and parsed.
fn read_answers(options: &RunOptions) -> anyhow::Result<Option<HashMap<String, String>>> {
    let Some(path) = &options.answers else {
        return Ok(None);
    };
    let text = trellis_syntax::read_text(path)
        .with_context(|| format!("cannot read the answers file {}", path.display()))?;
    let answers = Answers::parse(&text)
        .map_err(|e| anyhow::anyhow!("the answers file {} is not usable: {e}", path.display()))?;
    Ok(Some(answers))
}

/// Answers given up front that name none of their gate's options, reported before anything runs:
/// whether there were any.
fn wrong_answers(options: &RunOptions, loaded: &Loaded) -> anyhow::Result<bool> {
    let (Some(answers), Some(workflow)) = (read_answers(options)?, &loaded.compiled.workflow)
    else {
        return Ok(false);
    };
    let problems = trellis_handlers::human::check_answers(workflow, &answers);
    for problem in &problems {
        trellis_process::note!("error: {problem}");
    }
    Ok(!problems.is_empty())
}

fn interviewer(options: &RunOptions) -> anyhow::Result<Arc<dyn Interviewer>> {
    let fallback: Box<dyn Interviewer> = if options.auto_approve {
        Box::new(AutoApprove)
    } else if std::io::IsTerminal::is_terminal(&std::io::stdin()) {
        Box::new(Console)
    } else {
        Box::new(Unattended)
    };
    Ok(match read_answers(options)? {
        Some(answers) => Arc::new(Answers::new(answers, fallback)),
        None => Arc::from(fallback),
    })
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

/// The inputs given on the command line: `--inputs FILE` (a JSON object), then `--input KEY=VALUE`
/// over it — as values (the context's `input`, read as the workflow declares them) and as text (what
/// templates name).
fn given_inputs(args: &RunArgs) -> Result<(Given, BTreeMap<String, String>), String> {
    let mut provided = serde_json::Map::new();
    if let Some(path) = &args.inputs {
        let text = trellis_syntax::read_text(path)
            .map_err(|e| format!("cannot read the inputs file {}: {e}", path.display()))?;
        match serde_json::from_str(&text) {
            Ok(Value::Object(map)) => provided = map,
            Ok(_) => {
                return Err(format!(
                    "the inputs file {} must hold a JSON object",
                    path.display()
                ));
            }
            Err(e) => {
                return Err(format!(
                    "the inputs file {} is not JSON: {e}",
                    path.display()
                ));
            }
        }
    }
    let mut text: BTreeMap<String, String> = provided
        .iter()
        .map(|(k, v)| {
            (
                k.clone(),
                v.as_str().map_or_else(|| v.to_string(), str::to_owned),
            )
        })
        .collect();
    let mut pairs = Vec::new();
    for pair in &args.input {
        let Some((key, value)) = pair.split_once('=').filter(|(k, _)| !k.trim().is_empty()) else {
            return Err(format!("--input expects KEY=VALUE, found `{pair}`"));
        };
        let key = key.trim();
        pairs.push((key.to_owned(), value.to_owned()));
        text.insert(key.to_owned(), value.to_owned());
    }
    Ok((
        Given {
            file: provided,
            pairs,
        },
        text,
    ))
}

/// Inputs given on the command line, before the workflow says their types.
struct Given {
    /// `--inputs FILE`.
    file: serde_json::Map<String, Value>,
    /// `--input KEY=VALUE`, in order.
    pairs: Vec<(String, String)>,
}

/// Shows a workflow's diagnostics (errors and warnings) on standard error.
fn show_diagnostics(loaded: &Loaded, color: ColorChoice) -> anyhow::Result<()> {
    if !loaded.compiled.diagnostics.is_empty() {
        render_terminal(
            &mut std::io::stderr().lock(),
            &loaded.file,
            &loaded.compiled.diagnostics,
            color.for_stderr(),
        )?;
    }
    Ok(())
}

/// Who answers gates and who else hears the events (the terminal display), and the sandbox (chosen
/// before the runtime starts: choosing may probe `bwrap`).
pub(super) fn wiring(
    options: &RunOptions,
    sandbox: Arc<trellis_run::Sandbox>,
) -> anyhow::Result<Wiring> {
    let runs_dir = resolve_runs_dir(options.runs_dir.clone());
    let progress: Arc<dyn EventSink> = Progress::new(options.verbose, runs_dir);
    Ok(Wiring {
        interviewer: interviewer(options)?,
        subscribers: vec![progress],
        logged: None,
        sandbox,
        pacer: None,
    })
}

/// Where the run's stages work: the run file's `working_dir` (created if missing), else here.
fn work_dir(run_file: Option<&trellis_run::RunFile>) -> anyhow::Result<PathBuf> {
    Ok(match run_file.and_then(|f| f.work_dir.clone()) {
        Some(dir) => {
            std::fs::create_dir_all(&dir).with_context(|| {
                format!(
                    "cannot create the run file's working directory {}",
                    dir.display()
                )
            })?;
            // Resolved whole (`../work`, a link): the sandbox binds and enters it by this path.
            dir.canonicalize().with_context(|| {
                format!(
                    "cannot resolve the run file's working directory {}",
                    dir.display()
                )
            })?
        }
        None => std::env::current_dir()?,
    })
}

pub fn run(args: &RunArgs) -> anyhow::Result<ExitCode> {
    let mut initial = parse_sets(&args.set)?;
    let (given, inputs) = match given_inputs(args) {
        Ok(given) => given,
        Err(problem) => {
            trellis_process::note!("error: {problem}");
            return Ok(ExitCode::from(EXIT_USAGE));
        }
    };
    // Compiled before the runtime starts, on the thread that then runs the workflow (see
    // `load_blocking`).
    let options = trellis_run::CompileOptions {
        goal: args.goal.clone(),
        allowed_dirs: args.allow_dir.clone(),
        inputs,
        model: args.model.clone(),
        ..Default::default()
    };
    let opened = match trellis_run::open_blocking(&args.file, options) {
        Ok(opened) => opened,
        Err(error @ (RunError::Source(_) | RunError::RunFile { .. })) => {
            trellis_process::note!("error: {error}");
            return Ok(ExitCode::from(EXIT_USAGE));
        }
        Err(error) => return Err(error.into()),
    };
    for warning in &opened.warnings {
        trellis_process::note!("{warning}");
    }
    let Opened {
        loaded,
        run_file,
        inputs,
        ..
    } = opened;
    show_diagnostics(&loaded, args.options.color)?;
    if wrong_answers(&args.options, &loaded)? {
        return Ok(ExitCode::from(EXIT_USAGE));
    }
    if let Some(workflow) = &loaded.compiled.workflow {
        let mut provided = run_file
            .as_ref()
            .map(|f| f.input_values.clone())
            .unwrap_or_default();
        provided.extend(given.file);
        for (key, value) in &given.pairs {
            provided.insert(
                key.clone(),
                trellis_workflow::inputs::parse_value(workflow, key, value),
            );
        }
        match trellis_workflow::inputs::for_run(workflow, provided) {
            Ok(Some(input)) => {
                initial.insert(trellis_engine::keys::INPUT.to_owned(), input);
            }
            Ok(None) => {}
            Err(problems) => {
                for problem in problems {
                    trellis_process::note!("error: {problem}");
                }
                return Ok(ExitCode::from(EXIT_USAGE));
            }
        }
    }
    let temporal = args.temporal.target()?;
    let work_dir = work_dir(run_file.as_ref())?;
    let origin = args.temporal.origin(temporal.as_ref(), &work_dir)?;
    // A project file that cannot be read or checked stops the run where its hooks are wired, with
    // the reason: only its warnings are printed here.
    if let Ok(Some(project)) = trellis_run::run_file::ProjectFile::read(&work_dir) {
        for warning in project.warnings() {
            trellis_process::note!("{warning}");
        }
    }
    let mut request = NewRun {
        path: run_file
            .as_ref()
            .map_or_else(|| args.file.clone(), |f| f.graph.clone()),
        initial,
        settings: Settings {
            work_dir,
            mode: RunMode::from_flags(args.dry_run, args.simulate),
            max_steps: args.max_steps,
            allowed_dirs: args
                .allow_dir
                .iter()
                .map(|dir| std::path::absolute(dir).unwrap_or_else(|_| dir.clone()))
                .collect(),
            permissions: args.permissions,
            inputs,
            model: args.model.clone(),
            provider: args.provider.clone(),
            ..Settings::default()
        },
        runs_dir: resolve_runs_dir(args.options.runs_dir.clone()),
        run_file,
        temporal,
        answer_node: None,
    };
    if let Some(file) = &request.run_file {
        file.apply_to(&mut request.settings);
    }
    start(loaded, request, origin, args)
}

/// Creates the run and executes it here, or submits it to Temporal's workers.
fn start(
    loaded: Loaded,
    request: NewRun,
    origin: Option<trellis_temporal::workspace::Origin>,
    args: &RunArgs,
) -> anyhow::Result<ExitCode> {
    let sandbox = super::sandbox(args.options.sandbox)?;
    let temporal = request.temporal.clone();
    super::on_runtime(async {
        // An unreachable service is found before a run is recorded that could never start.
        if let Some(target) = &temporal {
            trellis_temporal::connect(target, "trellis").await?;
        }
        match Run::create(loaded, request, wiring(&args.options, sandbox)?).await {
            Ok(run) => match &temporal {
                Some(target) => {
                    let detach = args.temporal.detach();
                    Box::pin(super::temporal::submit(
                        run,
                        target,
                        origin,
                        &args.options,
                        detach,
                    ))
                    .await
                }
                None => execute(run, &args.options).await,
            },
            Err(error @ RunError::Invalid { .. }) => {
                trellis_process::note!("error: {error}");
                Ok(ExitCode::from(EXIT_INVALID))
            }
            Err(error) => Err(error.into()),
        }
    })?
}

pub fn resume(args: &ResumeArgs) -> anyhow::Result<ExitCode> {
    let sandbox = super::sandbox(args.options.sandbox)?;
    super::on_runtime(async {
        let runs_dir = resolve_runs_dir(args.options.runs_dir.clone());
        // A run on Temporal is its workers' to continue: this process sends answers and follows.
        let record = Arc::new(trellis_store::RunDir::open(&args.run, &runs_dir)?);
        if let Some(target) = record.meta()?.temporal {
            // Answers that name none of their gate's options are refused before they are sent.
            if args.options.answers.is_some() {
                let loaded = Resumable::open(&args.run, &runs_dir).await?.load().await?;
                if wrong_answers(&args.options, &loaded)? {
                    return Ok(ExitCode::from(EXIT_USAGE));
                }
            }
            return super::temporal::resume(record, &target, &args.options).await;
        }
        let resumable = Resumable::open(&args.run, &runs_dir).await?;
        if let Some(status) = resumable.finished() {
            trellis_process::note!(
                "run {} already {}; nothing to resume",
                resumable.id(),
                status.as_str()
            );
            // A run with an answer (`trellis exec`'s) prints it again, as its end did.
            if let (RunStatus::Succeeded, false, Some(node)) =
                (status, args.options.json, resumable.answer_node())
                && let Some(answer) = super::exec::answer_of(record, node.to_owned()).await
            {
                println!("{}", answer.trim_end());
            }
            return Ok(ExitCode::from(if status == RunStatus::Succeeded {
                0
            } else {
                EXIT_INVALID
            }));
        }
        let reaped = resumable.reap().await;
        if reaped > 0 && !args.options.json {
            trellis_process::note!(
                "stopped {reaped} command(s) left running by the interrupted run"
            );
        }
        let loaded = resumable.load().await?;
        show_diagnostics(&loaded, args.options.color)?;
        if wrong_answers(&args.options, &loaded)? {
            return Ok(ExitCode::from(EXIT_USAGE));
        }
        let id = resumable.id().to_owned();
        // A run with an answer (`trellis exec`'s) prints it when it ends, as it would have.
        let answer_node = resumable.answer_node().map(str::to_owned);
        match resumable
            .into_run(loaded, wiring(&args.options, sandbox)?)
            .await
        {
            Ok(run) => match answer_node {
                Some(node) => super::exec::execute(run, &args.options, node).await,
                None => execute(run, &args.options).await,
            },
            Err(RunError::Invalid { .. }) => {
                trellis_process::note!(
                    "error: the workflow saved with run {id} no longer compiles"
                );
                Ok(ExitCode::from(EXIT_INVALID))
            }
            Err(error) => Err(error.into()),
        }
    })?
}

/// Executes a run with Ctrl-C, SIGTERM and SIGHUP cancelling it, then prints its summary.
async fn execute(run: Run, options: &RunOptions) -> anyhow::Result<ExitCode> {
    let ended = execute_signalled(run, options).await?;
    report(
        &ended.summary(),
        options,
        ended.finished.log_error.is_some(),
        ended.stopped_by,
    )
}

/// A run executed here, as it ended.
pub(super) struct Ended {
    pub finished: Finished,
    sandbox: &'static str,
    elapsed: std::time::Duration,
    /// The signal that stopped it, if one did.
    pub stopped_by: Option<u8>,
}

impl Ended {
    pub(super) fn summary(&self) -> Summary<'_> {
        let finished = &self.finished;
        Summary {
            run_id: &finished.run_id,
            run_dir: finished.record.root(),
            status: finished.status,
            checkpoint: &finished.checkpoint,
            error: finished.error.as_ref().map(ToString::to_string),
            sandbox: self.sandbox,
            elapsed: self.elapsed,
            workers: None,
        }
    }
}

/// Executes a run with Ctrl-C, SIGTERM and SIGHUP cancelling it: says where its record is as it
/// starts, and when its event log could not be written whole as it ends.
pub(super) async fn execute_signalled(run: Run, options: &RunOptions) -> anyhow::Result<Ended> {
    let started = Instant::now();
    if !options.json {
        trellis_process::note!(
            "Run {} of {}\n  record: {}\n  sandbox: {}",
            run.id(),
            super::printable(run.workflow_name()),
            run.record().root().display(),
            run.sandbox().describe()
        );
    }
    let sandbox = run.sandbox().name();
    let stop = Stop::new();
    let signal = tokio::spawn(stop_signal(stop.clone()));
    // On the heap: a run's future is the engine's, large.
    let finished = Box::pin(run.execute(&stop)).await?;
    signal.abort();
    let stopped_by = signal.await.ok().flatten();
    if let Some(log_error) = &finished.log_error {
        trellis_process::note!(
            "error: the event log of run {} is incomplete: {log_error}",
            finished.run_id
        );
    }
    Ok(Ended {
        finished,
        sandbox,
        elapsed: started.elapsed(),
        stopped_by,
    })
}

/// How a run ended, to show.
pub(super) struct Summary<'a> {
    pub run_id: &'a str,
    pub run_dir: &'a std::path::Path,
    pub status: RunStatus,
    pub checkpoint: &'a trellis_engine::Checkpoint,
    pub error: Option<String>,
    pub sandbox: &'a str,
    pub elapsed: std::time::Duration,
    /// The Temporal workers that held it in turn, and how many times its worker was lost (runs on
    /// Temporal).
    pub workers: Option<(Vec<String>, u32)>,
}

/// Prints a run's summary (as JSON with `--json`) and gives its exit code; `stopped_by` is the
/// signal that stopped it, if one did.
pub(super) fn report(
    summary: &Summary<'_>,
    options: &RunOptions,
    log_incomplete: bool,
    stopped_by: Option<u8>,
) -> anyhow::Result<ExitCode> {
    if options.json {
        println!("{}", serde_json::to_string_pretty(&summary.json())?);
    } else {
        println!("{}", summary.line());
    }
    Ok(summary.exit_code(log_incomplete, stopped_by))
}

impl Summary<'_> {
    /// The summary as `--json` prints it.
    pub(super) fn json(&self) -> Value {
        let (status, checkpoint) = (self.status, self.checkpoint);
        let mut summary = json!({
            "run_id": self.run_id, "run_dir": self.run_dir.display().to_string(),
            "status": status.as_str(),
            "stages": checkpoint.stage_count, "waiting_at": (status == RunStatus::WaitingForInput).then(|| checkpoint.next_node()),
            "stopped_at": matches!(status, RunStatus::Cancelled | RunStatus::Interrupted).then(|| checkpoint.next_node()),
            "error": self.error,
            "sandbox": self.sandbox,
        });
        if let Some((workers, handovers)) = &self.workers {
            summary["workers"] = json!(workers);
            summary["handovers"] = json!(handovers);
        }
        summary
    }

    /// The summary in one line: how the run ended and what to do next.
    pub(super) fn line(&self) -> String {
        let (run_id, stages) = (self.run_id, self.checkpoint.stage_count);
        match self.status {
            RunStatus::Succeeded => format!(
                "Run {run_id} succeeded: {stages} stages in {:.1}s",
                self.elapsed.as_secs_f64()
            ),
            RunStatus::WaitingForInput => format!(
                "Run {run_id} is waiting for input at `{}`; answer with: trellis resume {run_id} --answers FILE (or run it on a terminal)",
                self.checkpoint.next_node().unwrap_or("?"),
            ),
            status @ (RunStatus::Cancelled | RunStatus::Interrupted) => format!(
                "Run {run_id} was {} at `{}`; continue it with: trellis resume {run_id}",
                status.as_str(),
                self.checkpoint.next_node().unwrap_or("?"),
            ),
            _ => format!(
                "Run {run_id} failed after {stages} stages: {}",
                self.error.as_deref().unwrap_or("unknown error")
            ),
        }
    }

    /// The exit code: 0 succeeded, 1 failed (or its event log is incomplete), 3 waiting for
    /// input, 128 + the signal that stopped it.
    pub(super) fn exit_code(&self, log_incomplete: bool, stopped_by: Option<u8>) -> ExitCode {
        match self.status {
            RunStatus::Succeeded if log_incomplete => ExitCode::from(EXIT_INVALID),
            RunStatus::Succeeded => ExitCode::SUCCESS,
            RunStatus::WaitingForInput => ExitCode::from(EXIT_WAITING),
            // 128 + the signal's number, as a shell reports a command the signal stopped.
            RunStatus::Cancelled | RunStatus::Interrupted => {
                ExitCode::from(128 + stopped_by.unwrap_or(2))
            }
            _ => ExitCode::from(EXIT_INVALID),
        }
    }
}

/// Waits for Ctrl-C (SIGINT), SIGTERM or SIGHUP and stops the run; returns the signal's number.
/// Ctrl-C is the user cancelling; SIGTERM and SIGHUP interrupt the run from outside (a shutdown, a
/// closed terminal). Either way the checkpoint is resumable.
async fn stop_signal(stop: Stop) -> Option<u8> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut interrupt = signal(SignalKind::interrupt()).ok()?;
    let mut terminate = signal(SignalKind::terminate()).ok()?;
    let mut hangup = signal(SignalKind::hangup()).ok()?;
    let number = tokio::select! {
        _ = interrupt.recv() => SignalKind::interrupt(),
        _ = terminate.recv() => SignalKind::terminate(),
        _ = hangup.recv() => SignalKind::hangup(),
    };
    if number == SignalKind::interrupt() {
        stop.cancel();
    } else {
        stop.interrupt();
    }
    let code = u8::try_from(number.as_raw_value()).ok();
    // The run stops within moments; should something it waits on never return (a thread stuck in the
    // kernel), the process ends anyway: its record is durable at every step.
    std::thread::spawn(move || {
        std::thread::sleep(STOP_GRACE);
        trellis_process::note!(
            "trellis: still stopping {} s after the signal; exiting now (resume the run later)",
            STOP_GRACE.as_secs()
        );
        std::process::exit(128 + i32::from(code.unwrap_or(15)));
    });
    code
}

/// How long a signalled run may take to stop before the process exits regardless.
const STOP_GRACE: std::time::Duration = std::time::Duration::from_secs(5);
