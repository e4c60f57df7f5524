//! One run from creation to its finished record: [`Run`] and the steps around it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde_json::Value;
use trellis_engine::services::{
    EventSink, Interviewer, RouteChoice, RouteRequest, Router, Subscribers, SystemClock,
};
use trellis_engine::{Checkpoint, Emitter, Engine, EngineError, RunStatus, Services, Settings};
use trellis_handlers::model_router::ModelRouter;
use trellis_llm::{Client, Config};
use trellis_process::sandbox::{Choice, Sandbox};
use trellis_process::task::blocking;
use trellis_store::{EventLog, FileBlobs, Owner, RunDir, RunMeta, StoreError, new_run_id};
use trellis_syntax::SourceFile;
use trellis_workflow::{CompileOptions, Compiled, Workflow};

use crate::Stop;
use crate::run_file::{PrepareStep, RunFile};
use trellis_handlers::hooks::{HookSetting, HookSpec, RunHooks};

/// The run file a run was started from, in its record.
pub const RUN_FILE: &str = "run.toml";

/// Why a run could not be created, reopened or finished.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// The workflow file is missing, unreadable or not text.
    #[error(transparent)]
    Source(#[from] trellis_syntax::SourceError),
    #[error("{path} is not valid; fix the errors above")]
    Invalid { path: PathBuf },
    #[error("the workflow has no start node")]
    NoStart,
    #[error("run {run_id} has no checkpoint to resume from: {source}")]
    NoCheckpoint {
        run_id: String,
        #[source]
        source: StoreError,
    },
    #[error("the run record of {run_id} has no workflow source")]
    NoSource { run_id: String },
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("cannot open the event log {path}: {source}")]
    EventLog {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Models(#[from] trellis_llm::config::ConfigError),
    #[error("{reason}")]
    Sandbox { reason: String },
    /// The run's working tree, kept on a git remote, cannot be checked out.
    #[error("cannot check out the run's working tree: {reason}")]
    WorkingTree { reason: String },
    /// The run file (or the one recorded with the run) has errors.
    #[error("the run file cannot be used:\n{problems}")]
    RunFile { problems: String },
    /// A hook of the config file, the project's `.fabro/project.toml` or the run file does not
    /// check, or the project's file cannot be read.
    #[error("the run's hooks cannot be used:\n{problems}")]
    Hooks { problems: String },
    /// What the workflow needs and this machine lacks (skills, their variables, a search key):
    /// nothing started.
    #[error("the run cannot start:\n{problems}")]
    Preflight { problems: String },
}

/// A compiled workflow file and every diagnostic, for the caller to show.
pub struct Loaded {
    path: PathBuf,
    pub file: SourceFile,
    pub compiled: Compiled,
}

impl Loaded {
    /// The workflow, when it compiled without errors.
    fn into_workflow(self) -> Result<(Workflow, SourceFile), RunError> {
        match self.compiled.workflow {
            Some(workflow) => Ok((workflow, self.file)),
            None => Err(RunError::Invalid { path: self.path }),
        }
    }
}

/// Reads and compiles `path` (on the blocking pool); `@file` references resolve beside `source_path`
/// (the original file of a workflow kept in a run record). `options` gives the goal and the directories
/// references may reach; its `base_dir` is set here.
pub async fn load(
    path: &Path,
    source_path: &Path,
    options: CompileOptions,
) -> Result<Loaded, RunError> {
    let (path, source_path) = (path.to_path_buf(), source_path.to_path_buf());
    blocking(move || load_blocking(&path, &source_path, options)).await
}

/// [`load`] on the calling thread, for a caller that is not on an async runtime: a command line that
/// compiles before it starts one. Compiling there also leaves the memory the compiler freed to the
/// thread that runs the workflow next, instead of to a pool thread's own heap.
pub fn load_blocking(
    path: &Path,
    source_path: &Path,
    options: CompileOptions,
) -> Result<Loaded, RunError> {
    let options = CompileOptions {
        base_dir: source_path.parent().map(Path::to_path_buf),
        ..options
    };
    let (file, compiled) = trellis_workflow::load(path, &options)?;
    Ok(Loaded {
        path: path.to_path_buf(),
        file,
        compiled,
    })
}

/// Compiles a workflow given as text (pasted into the web app, posted to the API). `path` places it for
/// the run record (it need not exist: its extension picks DOT or YAML, and `@file` references resolve
/// beside it); diagnostics name its file name.
pub async fn load_text(path: &Path, text: String, options: CompileOptions) -> Loaded {
    let options = CompileOptions {
        base_dir: path.parent().map(Path::to_path_buf),
        ..options
    };
    let path = path.to_path_buf();
    blocking(move || {
        let name = path.file_name().map_or_else(
            || path.display().to_string(),
            |n| n.to_string_lossy().into_owned(),
        );
        let (file, compiled) = trellis_workflow::compile_text(name, text, &options);
        Loaded {
            path,
            file,
            compiled,
        }
    })
    .await
}

/// How the workflow kept in a run record is compiled again (to resume it, to draw it): with the goal,
/// directories and inputs the run was started with.
pub fn recorded_options(meta: &RunMeta) -> CompileOptions {
    CompileOptions {
        goal: meta.goal.clone(),
        allowed_dirs: meta.settings.allowed_dirs.clone(),
        base_dir: None,
        inputs: meta.settings.inputs.clone(),
        model: meta.settings.model.clone(),
        attribute_texts: false,
    }
}

/// What a new run needs besides its workflow.
pub struct NewRun {
    /// The workflow file, as given (the record keeps its absolute path).
    pub path: PathBuf,
    /// Values put into the context before the first stage.
    pub initial: BTreeMap<String, Value>,
    pub settings: Settings,
    pub runs_dir: PathBuf,
    /// The run file it was started from (`trellis run run.toml`): recorded with the run, and its
    /// environment, model fallbacks, prepare steps, hooks and MCP servers applied.
    pub run_file: Option<RunFile>,
    /// The Temporal service whose workers will run it (`trellis run --temporal`): see [`Run::park`].
    pub temporal: Option<trellis_store::TemporalTarget>,
    /// The node whose last response is the run's answer (`trellis exec`'s agent): recorded, so that
    /// resuming the run prints it too.
    pub answer_node: Option<String>,
}

/// What the caller decides about a run: who answers human gates, and who hears the events besides the
/// run's own event log.
pub struct Wiring {
    pub interviewer: Arc<dyn Interviewer>,
    pub subscribers: Vec<Arc<dyn EventSink>>,
    /// Called each time events are in the run's event log (a live stream reads them then).
    pub logged: Option<trellis_store::Written>,
    /// What its commands and agent tools run in ([`sandbox`]).
    pub sandbox: Arc<Sandbox>,
    /// What paces its main track's stages (a Temporal worker's), if anything does.
    pub pacer: Option<Arc<dyn trellis_engine::services::Pacer>>,
}

/// The sandbox the user asked for — `choice` (a flag), else the configuration file's `[sandbox] mode`,
/// else `auto` — with the configuration's writable grants, and the configuration file itself hidden
/// (it can hold provider keys). Blocking: it may probe `bwrap` and read the configuration.
pub fn sandbox(choice: Option<Choice>) -> Result<Sandbox, RunError> {
    let config = Config::load()?;
    let choice = match (choice, config.sandbox.mode.as_deref()) {
        (Some(choice), _) => choice,
        (None, Some(mode)) => mode.parse().map_err(|reason| RunError::Sandbox {
            reason: format!(
                "{}: [sandbox] mode: {reason}",
                config
                    .file
                    .as_deref()
                    .unwrap_or(Path::new("config"))
                    .display()
            ),
        })?,
        (None, None) => Choice::Auto,
    };
    let sandbox = Sandbox::choose(choice).map_err(|e| RunError::Sandbox {
        reason: e.to_string(),
    })?;
    Ok(sandbox.writable(config.sandbox.write).hide(Config::path()))
}

/// With simulated models (`--dry-run`, `--simulate`), natural-language edges take the first candidate.
struct SimulatedRouter;

#[async_trait::async_trait]
impl Router for SimulatedRouter {
    async fn choose(
        &self,
        request: &RouteRequest<'_>,
        _events: &dyn Emitter,
    ) -> Result<RouteChoice, String> {
        Ok(RouteChoice {
            choice: Some(0),
            answer: request
                .options
                .first()
                .map(|o| o.id.clone())
                .unwrap_or_default(),
            reason: Some("simulated: the first condition".into()),
            model: None,
        })
    }
}

/// A run ready to execute: its engine, record, event log and model client.
pub struct Run {
    engine: Engine,
    record: Arc<RunDir>,
    log: Arc<EventLog>,
    checkpoint: Checkpoint,
    models: Option<Arc<Client>>,
    /// What its commands and agent tools run in.
    sandbox: Arc<Sandbox>,
    /// The run file's prepare steps, run before the first stage.
    prepare: Vec<PrepareStep>,
    /// The run file's hooks (those still running in the background are waited for at the end).
    hooks: Option<Arc<RunHooks>>,
    /// This process's hold on the run, released when the run has finished executing.
    _owner: Owner,
}

/// How a run's execution ended, with the record it left.
pub struct Finished {
    pub run_id: String,
    pub record: Arc<RunDir>,
    /// As recorded: [`RunStatus::Interrupted`] where the engine said cancelled and [`Stop::interrupt`]
    /// stopped it.
    pub status: RunStatus,
    pub checkpoint: Checkpoint,
    pub error: Option<EngineError>,
    /// The event log could not be written completely.
    pub log_error: Option<std::io::Error>,
}

/// What `workflow` needs from this machine to run in `work_dir`, with the run file's MCP servers
/// beside its own (the skills its agent nodes name and their variables, a search key): `Err` says
/// what is missing, one line per problem. `trellis run` checks it before the first stage, `trellis
/// validate --preflight` on asking.
pub fn preflight(
    workflow: &Workflow,
    run_file: Option<&RunFile>,
    work_dir: &Path,
) -> Result<(), String> {
    let env = |name: &str| std::env::var(name).ok();
    let run_servers = run_file.map_or(&[][..], |f| f.mcp_servers.as_slice());
    trellis_handlers::preflight(workflow, run_servers, work_dir, &env)
}

impl Run {
    /// Creates the run record of a new run of the loaded workflow and wires it (on the blocking pool);
    /// a workflow with errors is [`RunError::Invalid`].
    pub async fn create(loaded: Loaded, request: NewRun, wiring: Wiring) -> Result<Run, RunError> {
        blocking(move || Self::create_blocking(loaded, request, wiring)).await
    }

    #[allow(
        clippy::disallowed_methods,
        reason = "runs on the blocking pool (Run::create)"
    )]
    fn create_blocking(loaded: Loaded, request: NewRun, wiring: Wiring) -> Result<Run, RunError> {
        let (workflow, file) = loaded.into_workflow()?;
        if !request.settings.models_simulated() {
            preflight(
                &workflow,
                request.run_file.as_ref(),
                &request.settings.work_dir,
            )
            .map_err(|problems| RunError::Preflight { problems })?;
        }
        let run_id = new_run_id();
        let extension = request
            .path
            .extension()
            .and_then(|e| e.to_str())
            .unwrap_or("fabro");
        let source_path = std::fs::canonicalize(&request.path).unwrap_or(request.path.clone());
        let meta = RunMeta {
            run_id: run_id.clone(),
            workflow: workflow.name.clone(),
            goal: workflow.graph.goal.clone(),
            source_path: source_path.display().to_string(),
            status: RunStatus::Running,
            started_at: trellis_engine::engine::timestamp(),
            ended_at: None,
            settings: request.settings.clone(),
            run_file: request.run_file.as_ref().map(|f| {
                std::fs::canonicalize(&f.path)
                    .unwrap_or(f.path.clone())
                    .display()
                    .to_string()
            }),
            temporal: request.temporal.clone(),
            // Recorded when its tree is published, as the run is submitted.
            workspace: None,
            answer_node: request.answer_node.clone(),
        };
        let recorded = trellis_workflow::inline::inline_file_references(file.text(), &workflow);
        let (record, owner) = RunDir::create(
            &request.runs_dir,
            &meta,
            &recorded,
            &format!("workflow.{extension}"),
        )?;
        if let Some(file) = &request.run_file {
            let path = record.root().join(RUN_FILE);
            trellis_store::write_atomically(&path, file.recorded_text().as_bytes()).map_err(
                |source| StoreError::Io {
                    action: "write",
                    path,
                    source,
                },
            )?;
        }
        let record = Arc::new(record);
        let root = record.root().to_path_buf();
        Self::wire(
            workflow,
            record,
            owner,
            request.settings,
            run_id,
            (wiring, request.run_file.as_ref()),
            |engine| engine.first_checkpoint(request.initial),
        )
        .inspect_err(|_| {
            // Nothing ran (the configuration file or a hook did not check): the record would list
            // as an interrupted run that resuming fails again on.
            let _ = std::fs::remove_dir_all(&root);
        })
    }

    /// Wires the engine of a run whose record exists; `checkpoint` gives where it starts. Blocking: it
    /// reads the model config and opens the event log.
    #[allow(
        clippy::too_many_arguments,
        reason = "the parts of a run, each needed once"
    )]
    fn wire(
        mut workflow: Workflow,
        record: Arc<RunDir>,
        owner: Owner,
        settings: Settings,
        run_id: String,
        (wiring, run_file): (Wiring, Option<&RunFile>),
        checkpoint: impl FnOnce(&Engine) -> Option<Checkpoint>,
    ) -> Result<Run, RunError> {
        // Read once: the model client and the hooks both come from it.
        let config = Config::load()?;
        let graph_provider = workflow.graph.provider.as_deref();
        let models = models(&config, &record, &settings, run_file, graph_provider);
        if let Some(file) = run_file {
            workflow
                .graph
                .mcp_servers
                .extend(file.mcp_servers.iter().cloned());
        }
        let router_model = workflow
            .graph
            .router_model
            .clone()
            .or_else(|| workflow.graph.model.clone());
        let router: Arc<dyn Router> = match &models {
            Some(client) => Arc::new(ModelRouter::new(client.clone(), router_model)),
            None => Arc::new(SimulatedRouter),
        };
        let log =
            Arc::new(
                record
                    .event_log(wiring.logged)
                    .map_err(|source| RunError::EventLog {
                        path: record.events_path(),
                        source,
                    })?,
            );
        // Children may read the run's record but never change it, even when the runs directory lies
        // inside the working directory they may write.
        let runs_dir = record.root().parent().map(Path::to_path_buf);
        let mut sandbox = (*wiring.sandbox)
            .clone()
            .protect(runs_dir)
            .with_env(run_file.map(|f| f.env.clone()).unwrap_or_default());
        if run_file.is_some_and(|f| f.network_off) {
            sandbox = sandbox.without_network();
        }
        let sandbox = Arc::new(sandbox);
        let hooks = run_hooks(
            (&config, run_file),
            HookSetting {
                run_id: run_id.clone(),
                workflow: workflow.name.clone(),
                work_dir: settings.work_dir.clone(),
                dir: record.root().join("hooks"),
                sandbox: sandbox.clone(),
                models: models.clone(),
            },
        )?;
        let subscribers =
            std::iter::once(log.clone() as Arc<dyn EventSink>).chain(wiring.subscribers);
        let services = Services {
            store: record.clone(),
            blobs: Arc::new(FileBlobs::new(record.blobs_dir())),
            events: Subscribers::new(subscribers),
            clock: Arc::new(SystemClock),
            interviewer: wiring.interviewer,
            router: Some(router),
            hooks: hooks
                .clone()
                .map(|hooks| hooks as Arc<dyn trellis_engine::hooks::Hooks>),
            pacer: wiring.pacer,
        };
        // Handlers are the run's own: `full`-fidelity conversation threads live and die with it.
        let handlers = Arc::new(trellis_handlers::standard_handlers(
            models.clone(),
            &sandbox,
        ));
        let engine = Engine::new(Arc::new(workflow), handlers, services, settings, run_id);
        let checkpoint = checkpoint(&engine).ok_or(RunError::NoStart)?;
        Ok(Run {
            engine,
            record,
            log,
            checkpoint,
            models,
            sandbox,
            prepare: run_file.map(|f| f.prepare.clone()).unwrap_or_default(),
            hooks,
            _owner: owner,
        })
    }

    pub fn id(&self) -> &str {
        self.engine.run_id()
    }

    /// The sandbox its commands and agent tools run in.
    pub fn sandbox(&self) -> &Sandbox {
        &self.sandbox
    }

    pub fn workflow_name(&self) -> &str {
        &self.engine.workflow.name
    }

    pub fn record(&self) -> &Arc<RunDir> {
        &self.record
    }

    /// Leaves a new run ready for another process to execute: its first checkpoint saved and its
    /// record released, so that a worker opens it as [`Resumable`] (a run submitted to Temporal).
    pub async fn park(self) -> Result<String, RunError> {
        let Run {
            engine,
            record,
            log,
            checkpoint,
            _owner: owner,
            ..
        } = self;
        let run_id = engine.run_id().to_owned();
        let path = record.root().to_path_buf();
        blocking(move || {
            trellis_engine::services::RunStore::save_checkpoint(&*record, &checkpoint)?;
            log.close()?;
            drop(owner);
            Ok::<_, std::io::Error>(())
        })
        .await
        .map_err(|source| {
            RunError::Store(StoreError::Io {
                action: "write",
                path,
                source,
            })
        })?;
        Ok(run_id)
    }

    /// Executes the run until it ends, waits for input or `cancel` fires; then stops the local model
    /// server (if this run started one), closes the event log and records the status in `run.json`.
    pub async fn execute(self, stop: &Stop) -> Result<Finished, RunError> {
        let Run {
            engine,
            record,
            log,
            checkpoint,
            models,
            sandbox,
            prepare,
            hooks,
            _owner: owner,
        } = self;
        let work_dir = engine.settings.work_dir.clone();
        // Nothing ran yet (a new run, or one stopped before its first stage): the working tree as
        // it starts, then the prepare steps.
        if checkpoint.stage_count == 0 {
            let (root, work_dir) = (record.root().to_path_buf(), work_dir.clone());
            blocking(move || {
                crate::changes::record(&root, &work_dir, crate::changes::Moment::Start);
            })
            .await;
        }
        let prepared = if checkpoint.stage_count == 0 && !prepare.is_empty() {
            crate::prepare::run(&prepare, &engine, &record, &sandbox, stop.token()).await
        } else {
            Ok(())
        };
        let result = match prepared {
            Ok(()) => engine.run(checkpoint, stop.token()).await,
            Err(error) => {
                engine.emit(
                    None,
                    trellis_engine::event::EventKind::WorkflowRunFailed {
                        status: RunStatus::Failed,
                        error: Some(error.to_string()),
                    },
                );
                trellis_engine::RunResult {
                    status: RunStatus::Failed,
                    checkpoint,
                    error: Some(error),
                }
            }
        };
        if let Some(hooks) = &hooks {
            trellis_engine::hooks::Hooks::drain(&**hooks).await;
        }
        let status = stop.recorded(result.status);
        if let Some(models) = &models {
            models.shutdown().await;
        }
        // Every event is in the log once it closes; `run.json` is written meanwhile (the journal
        // already holds the run's end, so neither waits for the other).
        let closing = blocking(move || log.close());
        let finished_record = record.clone();
        let meta_written = blocking(move || {
            let mut meta = finished_record.meta()?;
            meta.status = status;
            // When the run stopped: finished, cancelled or interrupted (a run waiting for input
            // or parked between two stages has not ended; resuming clears it).
            let ongoing = matches!(status, RunStatus::WaitingForInput | RunStatus::Running);
            if !ongoing {
                let end = crate::changes::Moment::End;
                crate::changes::record(finished_record.root(), &work_dir, end);
            }
            meta.ended_at = (!ongoing).then(trellis_engine::engine::timestamp);
            finished_record.write_meta(&meta)
        });
        let (closed, meta_written) = tokio::join!(closing, meta_written);
        let log_error = closed.err();
        meta_written?;
        // The record is complete: the run is free to be resumed.
        drop(owner);
        Ok(Finished {
            run_id: engine.run_id().to_owned(),
            record,
            status,
            checkpoint: result.checkpoint,
            error: result.error,
            log_error,
        })
    }
}

/// The run's hooks, ready to fire where `setting` says: those of the user's config file, then the
/// project's `.fabro/project.toml`, then the run file (see [`hook_layers`]).
fn run_hooks(
    (config, run_file): (&Config, Option<&RunFile>),
    setting: HookSetting,
) -> Result<Option<Arc<RunHooks>>, RunError> {
    let hooks = hook_layers(config, &setting.work_dir, run_file)?;
    if hooks.is_empty() {
        return Ok(None);
    }
    let hooks =
        RunHooks::new(&hooks, setting, &|name| std::env::var(name).ok()).map_err(|problem| {
            RunError::Hooks {
                problems: format!("a hook cannot run: {problem}"),
            }
        })?;
    Ok(Some(Arc::new(hooks)))
}

/// The hooks of every layer, merged as Fabro merges them: a later layer's hook with the `id` of an
/// earlier one replaces it where it stood, others follow in order. The layers: the user's config file
/// (`[[hooks]]`), the project's `.fabro/project.toml` in the working directory (`[[hooks]]` and
/// `[[run.hooks]]`), the run file. A layer's hook that does not check is an error naming its file.
fn hook_layers(
    config: &Config,
    work_dir: &Path,
    run_file: Option<&RunFile>,
) -> Result<Vec<HookSpec>, RunError> {
    let problem = |source: &Path, problem: String| RunError::Hooks {
        problems: format!("{}: {problem}", source.display()),
    };
    let user: Vec<HookSpec> = config
        .hooks
        .iter()
        .map(|hook| serde_json::from_value(hook.clone()))
        .collect::<Result<_, _>>()
        .map_err(|e| {
            problem(
                config.file.as_deref().unwrap_or(Path::new("config")),
                format!("[[hooks]]: {e}"),
            )
        })?;
    let project = crate::run_file::ProjectFile::read(work_dir)
        .map_err(|problems| RunError::Hooks { problems })?;
    let layers = [
        (config.file.clone(), user),
        project.map_or((None, Vec::new()), |p| (Some(p.path), p.hooks)),
        (
            run_file.map(|f| f.path.clone()),
            run_file.map(|f| f.hooks.clone()).unwrap_or_default(),
        ),
    ];
    let mut merged: Vec<HookSpec> = Vec::new();
    for (source, hooks) in layers {
        for hook in hooks {
            if let Err(e) = hook.check() {
                return Err(problem(
                    source.as_deref().unwrap_or(Path::new("hooks")),
                    format!("hook `{}`: {e}", hook.shown_name()),
                ));
            }
            let same = hook
                .id
                .as_ref()
                .and_then(|id| merged.iter().position(|h| h.id.as_ref() == Some(id)));
            match same {
                Some(at) => merged[at] = hook,
                None => merged.push(hook),
            }
        }
    }
    Ok(merged)
}

/// The model client of a real run: providers from the config file and the environment, and the local
/// model server, whose output goes to `llama-server.log` in the run record; with the run's provider
/// (`--provider`, the run file's, else the workflow's `default_provider`) and the run file's
/// fallbacks. Runs with simulated models have none.
fn models(
    config: &Config,
    record: &RunDir,
    settings: &Settings,
    run_file: Option<&RunFile>,
    graph_provider: Option<&str>,
) -> Option<Arc<Client>> {
    if settings.models_simulated() {
        return None;
    }
    let client = Client::from_config(config, Some(record.root().join("llama-server.log")));
    // A record from before the provider was kept in the settings has it in its run file only.
    let provider = settings
        .provider
        .clone()
        .or_else(|| run_file.and_then(|f| f.provider.clone()))
        .or_else(|| graph_provider.map(str::to_owned));
    let fallbacks = run_file.map(|f| f.fallbacks.clone()).unwrap_or_default();
    Some(Arc::new(client.with_run_model(provider, fallbacks)))
}

/// The run file recorded with a run, read again (placed where the original was, so its relative
/// paths mean what they meant); `None` for a run started from a workflow file.
#[allow(
    clippy::disallowed_methods,
    reason = "runs on the blocking pool (Resumable::open)"
)]
fn recorded_run_file(record: &RunDir, meta: &RunMeta) -> Result<Option<RunFile>, RunError> {
    let path = record.root().join(RUN_FILE);
    let Ok(text) = std::fs::read_to_string(&path) else {
        return Ok(None);
    };
    let placed = meta
        .run_file
        .as_deref()
        .map_or_else(|| path.clone(), PathBuf::from);
    let env = |name: &str| std::env::var(name).ok();
    // Secrets the file wrote out were redacted from its copy: they are read again from the file
    // itself, if it is still the one the run started with.
    let text = if text.contains("[redacted ") {
        let original = std::fs::read_to_string(&placed).ok().filter(|original| {
            RunFile::parse(&placed, original.clone(), &env)
                .0
                .is_some_and(|f| f.recorded_text() == text)
        });
        original.ok_or_else(|| RunError::RunFile {
            problems: format!(
                "the run file {} held secrets, which its record does not keep, and it is gone or changed since the run started; restore it to resume",
                placed.display()
            ),
        })?
    } else {
        text
    };
    let (file, problems) = RunFile::parse(&placed, text, &env);
    match file {
        Some(file) => Ok(Some(file)),
        None => Err(RunError::RunFile {
            problems: problems
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join("\n"),
        }),
    }
}

/// A stopped run, opened to continue it.
pub struct Resumable {
    record: Arc<RunDir>,
    meta: RunMeta,
    checkpoint: Checkpoint,
    /// Claimed before anything else is touched: a run another process is running is refused, and
    /// its commands are never reaped.
    owner: Owner,
    /// The run file recorded with the run, read again.
    run_file: Option<RunFile>,
}

impl Resumable {
    /// Opens run `reference` (an id, a unique id prefix, or a run directory) under `runs_dir`.
    pub async fn open(reference: &str, runs_dir: &Path) -> Result<Self, RunError> {
        let (reference, runs_dir) = (reference.to_owned(), runs_dir.to_path_buf());
        blocking(move || Self::open_blocking(&reference, &runs_dir)).await
    }

    fn open_blocking(reference: &str, runs_dir: &Path) -> Result<Self, RunError> {
        let record = Arc::new(RunDir::open(reference, runs_dir)?);
        let mut meta = record.meta()?;
        let owner = record.claim(&meta.run_id)?;
        record.remove_temporary_files();
        let mut checkpoint = record.checkpoint_to_resume().map_err(|source| {
            // A run that cannot be resumed still gets its stray commands stopped.
            trellis_process::group::reap_run(&meta.run_id);
            RunError::NoCheckpoint {
                run_id: meta.run_id.clone(),
                source,
            }
        })?;
        // Events written after the last checkpoint (by a killed process) keep their numbers.
        let last_seq = record.events()?.last().map_or(0, |e| e.seq);
        checkpoint.seq = checkpoint.seq.max(last_seq);
        // The run is running again (a reader sees `interrupted` or `waiting` no longer).
        if !checkpoint.status.is_finished() && meta.status != RunStatus::Running {
            meta.status = RunStatus::Running;
            meta.ended_at = None;
            record.write_meta(&meta)?;
            crate::changes::reopened(record.root());
        }
        let run_file = recorded_run_file(&record, &meta)?;
        Ok(Self {
            record,
            meta,
            checkpoint,
            owner,
            run_file,
        })
    }

    pub fn id(&self) -> &str {
        &self.meta.run_id
    }

    /// Where the run keeps its working tree for workers that share none, when on a git remote.
    pub fn workspace(&self) -> Option<&trellis_store::GitWorkspace> {
        self.meta.workspace.as_ref()
    }

    /// The node whose last response is the run's answer (`trellis exec`'s agent), if it has one.
    pub fn answer_node(&self) -> Option<&str> {
        self.meta.answer_node.as_deref()
    }

    /// Runs it in `work_dir` rather than where it was started (a worker's checkout of its tree).
    pub fn set_work_dir(&mut self, work_dir: PathBuf) {
        self.meta.settings.work_dir = work_dir;
    }

    /// The run's status when it has already finished (nothing to resume).
    pub fn finished(&self) -> Option<RunStatus> {
        self.checkpoint
            .status
            .is_finished()
            .then_some(self.checkpoint.status)
    }

    /// Stops the commands the interrupted process left running; returns how many.
    pub async fn reap(&self) -> usize {
        let run_id = self.meta.run_id.clone();
        blocking(move || trellis_process::group::reap_run(&run_id)).await
    }

    /// Compiles the workflow source kept with the run (its `@file` references inlined).
    pub async fn load(&self) -> Result<Loaded, RunError> {
        let record = self.record.clone();
        let source = blocking(move || record.source_file())
            .await
            .ok_or_else(|| RunError::NoSource {
                run_id: self.meta.run_id.clone(),
            })?;
        load(
            &source,
            Path::new(&self.meta.source_path),
            recorded_options(&self.meta),
        )
        .await
    }

    /// Wires the run again (on the blocking pool) to continue from its checkpoint, with the settings it
    /// was started with.
    pub async fn into_run(self, loaded: Loaded, wiring: Wiring) -> Result<Run, RunError> {
        blocking(move || self.into_run_blocking(loaded, wiring)).await
    }

    fn into_run_blocking(self, loaded: Loaded, wiring: Wiring) -> Result<Run, RunError> {
        let (workflow, _) = loaded.into_workflow()?;
        let Resumable {
            record,
            meta,
            checkpoint,
            owner,
            run_file,
        } = self;
        Run::wire(
            workflow,
            record,
            owner,
            meta.settings,
            meta.run_id,
            (wiring, run_file.as_ref()),
            |_| Some(checkpoint),
        )
    }
}
