//! The runs this server is running, and the interviewer that lets the API answer their human gates.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use async_trait::async_trait;
use parking_lot::Mutex;
use serde_json::Value;
use tokio::sync::{Notify, oneshot};
use tokio::task::JoinSet;
use trellis_engine::services::{Answer, Interviewer, Question};
use trellis_engine::{CancellationToken, RunMode, Settings};
use trellis_handlers::human::match_choice;
use trellis_handlers::interviewer::Answers;
use trellis_run::{Loaded, NewRun, Resumable, Run, RunError, Wiring};
use trellis_store::{RunDir, StoreError};

use crate::Config;

/// The server: where runs live, and the runs it is running now.
pub struct Server {
    pub runs_dir: PathBuf,
    pub workflows_dir: Option<PathBuf>,
    pub work_dir: PathBuf,
    pub token: Option<String>,
    /// The `Host` names requests may carry ([`crate::guard`]); `None` accepts any (a server bound to
    /// every address, behind its token).
    pub hosts: Option<Vec<String>>,
    /// What the commands and agent tools of its runs run in.
    pub sandbox: Arc<trellis_run::Sandbox>,
    live: Mutex<HashMap<String, Arc<LiveRun>>>,
    tasks: tokio::sync::Mutex<JoinSet<()>>,
    /// Fired when the server stops: its runs are cancelled (and recorded as interrupted), and event
    /// streams end.
    pub stopping: CancellationToken,
}

/// A run this server is executing.
pub struct LiveRun {
    pub stop: trellis_run::Stop,
    pub gates: WebGates,
    /// Woken each time events are in the run's event log (streams then read it).
    pub wake: Arc<Notify>,
}

impl LiveRun {
    fn new() -> Arc<Self> {
        Arc::new(Self {
            stop: trellis_run::Stop::new(),
            gates: WebGates::default(),
            wake: Arc::new(Notify::new()),
        })
    }
}

/// Why the API could not do what was asked of a run.
#[derive(Debug, thiserror::Error)]
pub enum ActionError {
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    Conflict(String),
    #[error("{0}")]
    Invalid(String),
    #[error(transparent)]
    Run(#[from] RunError),
    /// The Temporal service a run lives on refused or could not be reached.
    #[error(transparent)]
    Temporal(#[from] trellis_temporal::TemporalError),
}

impl From<StoreError> for ActionError {
    fn from(error: StoreError) -> Self {
        match error {
            StoreError::NotFound { .. } | StoreError::Ambiguous { .. } => {
                Self::NotFound(error.to_string())
            }
            StoreError::Busy { .. } => Self::Conflict(error.to_string()),
            other => Self::Run(RunError::Store(other)),
        }
    }
}

/// What a new run of the API is asked to do, besides its workflow.
pub struct Start {
    pub set: BTreeMap<String, Value>,
    pub mode: RunMode,
    /// The run file the run starts from, if it was one.
    pub run_file: Option<trellis_run::RunFile>,
    /// The inputs the workflow was compiled with.
    pub inputs: BTreeMap<String, String>,
    /// The model and provider for nodes that name none, over the run file's.
    pub model: Option<String>,
    pub provider: Option<String>,
}

impl Server {
    pub fn new(config: &Config) -> Arc<Self> {
        Arc::new(Self {
            runs_dir: config.runs_dir.clone(),
            workflows_dir: config.workflows_dir.clone(),
            work_dir: config.work_dir.clone(),
            token: config.token.clone(),
            hosts: crate::guard::allowed_hosts(config),
            sandbox: config.sandbox.clone(),
            live: Mutex::new(HashMap::new()),
            tasks: tokio::sync::Mutex::new(JoinSet::new()),
            stopping: CancellationToken::new(),
        })
    }

    /// The live run `id`, when this server runs it.
    pub fn live(&self, id: &str) -> Option<Arc<LiveRun>> {
        self.live.lock().get(id).cloned()
    }

    /// Opens the record of run `id`. Only run ids (letters and digits) are looked up: a path or `..`
    /// never reaches the file system, and a run directory that is a symbolic link is not a run.
    pub fn record(&self, id: &str) -> Result<RunDir, ActionError> {
        let plain =
            !id.is_empty() && id.len() <= 64 && id.bytes().all(|b| b.is_ascii_alphanumeric());
        if !plain {
            return Err(ActionError::NotFound(format!("no run `{id}`")));
        }
        let dir = self.runs_dir.join(id);
        // A run directory that is a symbolic link would lead the server's files and records out of
        // the runs directory.
        let linked = std::fs::symlink_metadata(&dir).map_or(true, |m| !m.is_dir());
        if linked || !dir.join("run.json").is_file() {
            return Err(ActionError::NotFound(format!("no run `{id}`")));
        }
        // By its path: a bare id would first be looked up in the server's working directory.
        Ok(RunDir::open(&dir.display().to_string(), &self.runs_dir)?)
    }

    /// Creates a run of a compiled workflow and starts it; returns its id.
    pub async fn start(
        self: &Arc<Self>,
        loaded: Loaded,
        path: PathBuf,
        start: Start,
    ) -> Result<String, ActionError> {
        let live = LiveRun::new();
        // A run file's working directory, when it names one inside the server's.
        let work_dir = match start.run_file.as_ref().and_then(|f| f.work_dir.as_ref()) {
            Some(dir) => self.inside_work_dir(dir)?,
            None => self.work_dir.clone(),
        };
        let mut request = NewRun {
            path,
            initial: start.set,
            settings: Settings {
                work_dir,
                mode: start.mode,
                max_steps: 10_000,
                allowed_dirs: Vec::new(),
                permissions: None,
                inputs: start.inputs,
                model: start.model,
                provider: start.provider,
                ..Settings::default()
            },
            runs_dir: self.runs_dir.clone(),
            run_file: start.run_file,
            temporal: None,
            answer_node: None,
        };
        if let Some(file) = &request.run_file {
            file.apply_to(&mut request.settings);
        }
        let run = Run::create(loaded, request, wiring(&live, None, &self.sandbox)).await?;
        let id = run.id().to_owned();
        self.launch(run, live).await;
        Ok(id)
    }

    /// Resumes a stopped run (interrupted, cancelled, failed mid-way, or waiting for input, then with
    /// `answer` for its gate); returns once it is running.
    pub async fn resume(
        self: &Arc<Self>,
        id: &str,
        answer: Option<(String, String)>,
    ) -> Result<(), ActionError> {
        let record = self.record(id)?;
        let meta = record.meta()?;
        let run_id = meta.run_id;
        // A run on Temporal is its workers' to continue: a new workflow takes it from its checkpoint.
        if let Some(target) = meta.temporal {
            if !matches!(
                meta.status,
                trellis_engine::RunStatus::Cancelled | trellis_engine::RunStatus::Interrupted
            ) {
                return Err(ActionError::Conflict(format!(
                    "run {run_id} is {} on Temporal; nothing to resume",
                    meta.status.as_str()
                )));
            }
            let gates = trellis_temporal::Gates {
                answers: answer.map(|(gate, text)| BTreeMap::from([(gate, text)])),
                auto_approve: false,
            };
            trellis_temporal::submit(&target, &run_id, &self.runs_dir, gates).await?;
            return Ok(());
        }
        let resumable = Resumable::open(&run_id, &self.runs_dir).await?;
        if let Some(status) = resumable.finished() {
            return Err(ActionError::Conflict(format!(
                "run {run_id} already {}; nothing to resume",
                status.as_str()
            )));
        }
        let reaped = resumable.reap().await;
        if reaped > 0 {
            trellis_process::note!(
                "run {run_id}: stopped {reaped} command(s) left running by the interrupted run"
            );
        }
        let loaded = resumable.load().await?;
        let live = LiveRun::new();
        let run = resumable
            .into_run(loaded, wiring(&live, answer, &self.sandbox))
            .await
            .map_err(|error| match error {
                RunError::Invalid { .. } => ActionError::Invalid(format!(
                    "the workflow saved with run {run_id} no longer compiles"
                )),
                other => other.into(),
            })?;
        self.launch(run, live).await;
        Ok(())
    }

    async fn launch(self: &Arc<Self>, run: Run, live: Arc<LiveRun>) {
        let id = run.id().to_owned();
        self.live.lock().insert(id.clone(), live.clone());
        let server = self.clone();
        let stop = live.stop.clone();
        // The run is a task of its own: a panic in it ends that task, not the server.
        let execution = tokio::spawn(async move { run.execute(&stop).await });
        let mut tasks = self.tasks.lock().await;
        while tasks.try_join_next().is_some() {}
        tasks.spawn(async move {
            match execution.await {
                Ok(Ok(finished)) => {
                    let error = finished
                        .error
                        .map(|e| format!(": {e}"))
                        .unwrap_or_default();
                    trellis_process::note!("run {id} {}{error}", finished.status.as_str());
                }
                Ok(Err(error)) => trellis_process::note!("run {id} could not finish its record: {error}"),
                Err(failure) => trellis_process::note!(
                    "run {id} stopped abnormally ({failure}); its record is kept and it can be resumed"
                ),
            }
            server.live.lock().remove(&id);
            live.wake.notify_waiters();
        });
    }

    /// Cancels run `id`: this server's own run through its token; a run another process (a terminal)
    /// runs with SIGINT, which that process records as cancelled.
    pub async fn cancel(&self, id: &str) -> Result<(), ActionError> {
        let record = self.record(id)?;
        let meta = record.meta()?;
        let run_id = meta.run_id;
        if let Some(target) = meta.temporal {
            if meta.status.is_finished() || meta.status == trellis_engine::RunStatus::Cancelled {
                return Err(ActionError::Conflict(format!(
                    "run {run_id} is not running"
                )));
            }
            return Ok(trellis_temporal::cancel(&target, &run_id).await?);
        }
        if let Some(live) = self.live(&run_id) {
            live.stop.cancel();
            return Ok(());
        }
        match trellis_run::interrupt_owner(&record) {
            Ok(Some(_)) => Ok(()),
            Ok(None) => Err(ActionError::Conflict(format!(
                "run {run_id} is not running"
            ))),
            Err(e) => Err(ActionError::Conflict(format!(
                "cannot stop the process running {run_id}: {e}"
            ))),
        }
    }

    /// Answers the human gate `gate` of run `id`: a live run continues at once; a run that stopped to
    /// wait for input is resumed with the answer.
    pub async fn answer(
        self: &Arc<Self>,
        id: &str,
        gate: &str,
        text: &str,
        waiting: Option<&crate::api::Gate>,
    ) -> Result<(), ActionError> {
        let record = self.record(id)?;
        let run_id = record.meta()?.run_id;
        if let Some(live) = self.live(&run_id) {
            return live.gates.answer(gate, text);
        }
        let Some(waiting) = waiting.filter(|w| w.gate == gate) else {
            return Err(ActionError::Conflict(format!(
                "run {run_id} is not waiting at a gate `{gate}`"
            )));
        };
        if !waiting.accepts(text) {
            return Err(ActionError::Invalid(waiting.rejection(text)));
        }
        if let Some(target) = record.meta()?.temporal {
            let answers = BTreeMap::from([(gate.to_owned(), text.to_owned())]);
            return Ok(trellis_temporal::answer(&target, &run_id, answers).await?);
        }
        self.resume(&run_id, Some((gate.to_owned(), text.to_owned())))
            .await
    }

    /// The server is stopping: every run it is running is cancelled (recorded as interrupted) and
    /// every event stream ends.
    pub fn stop(&self) {
        self.stopping.cancel();
        for live in self.live.lock().values() {
            live.stop.interrupt();
        }
    }

    /// Waits until every run this server started has finished its record.
    pub async fn wait_for_runs(&self) {
        let mut tasks = self.tasks.lock().await;
        while tasks.join_next().await.is_some() {}
    }

    /// The workflow file `relative` under `--workflows`; never a path outside it.
    /// `dir` (a run file's working directory) when it lies inside the server's working directory:
    /// a run started over HTTP works nowhere else.
    fn inside_work_dir(&self, dir: &Path) -> Result<PathBuf, ActionError> {
        let root = self
            .work_dir
            .canonicalize()
            .unwrap_or_else(|_| self.work_dir.clone());
        match dir.canonicalize() {
            Ok(full) if full.starts_with(&root) => Ok(full),
            _ => Err(ActionError::Invalid(format!(
                "the run file's working directory {} is not an existing directory inside the server's working directory {}",
                dir.display(),
                root.display()
            ))),
        }
    }

    pub fn workflow_path(&self, relative: &str) -> Result<PathBuf, ActionError> {
        let Some(dir) = &self.workflows_dir else {
            return Err(ActionError::Invalid(
                "the server was started without --workflows; send the workflow's source instead"
                    .into(),
            ));
        };
        let not_found =
            || ActionError::NotFound(format!("no workflow `{relative}` under --workflows"));
        let path = Path::new(relative);
        if path.is_absolute()
            || path
                .components()
                .any(|c| !matches!(c, std::path::Component::Normal(_)))
        {
            return Err(not_found());
        }
        let root = dir.canonicalize().map_err(|_| not_found())?;
        let full = root.join(path).canonicalize().map_err(|_| not_found())?;
        if !full.starts_with(&root) || !full.is_file() {
            return Err(not_found());
        }
        Ok(full)
    }
}

fn wiring(
    live: &Arc<LiveRun>,
    answer: Option<(String, String)>,
    sandbox: &Arc<trellis_run::Sandbox>,
) -> Wiring {
    let gates: Arc<dyn Interviewer> = Arc::new(live.gates.clone());
    let interviewer: Arc<dyn Interviewer> = match answer {
        Some((gate, text)) => Arc::new(Answers::new(
            HashMap::from([(gate, text)]),
            Box::new(live.gates.clone()),
        )),
        None => gates,
    };
    let wake = live.wake.clone();
    Wiring {
        interviewer,
        subscribers: Vec::new(),
        logged: Some(Arc::new(move || wake.notify_waiters())),
        sandbox: sandbox.clone(),
        pacer: None,
    }
}

/// Human gates answered through the API: a gate waits (up to its timeout) until an answer is posted.
#[derive(Clone, Default)]
pub struct WebGates(Arc<Mutex<HashMap<String, Pending>>>);

struct Pending {
    question: Question,
    reply: oneshot::Sender<Answer>,
}

/// Forgets a gate's question when its `ask` ends (answered, timed out, or the run cancelled).
struct Asked<'a>(&'a WebGates, String);

impl Drop for Asked<'_> {
    fn drop(&mut self) {
        self.0.0.lock().remove(&self.1);
    }
}

impl WebGates {
    /// The questions waiting for an answer.
    pub fn pending(&self) -> Vec<Question> {
        self.0.lock().values().map(|p| p.question.clone()).collect()
    }

    /// Answers gate `gate` with a label, an accelerator key or (where the gate takes it) free text.
    pub fn answer(&self, gate: &str, text: &str) -> Result<(), ActionError> {
        let mut pending = self.0.lock();
        let Some(waiting) = pending.get(gate) else {
            return Err(ActionError::Conflict(format!(
                "no gate `{gate}` is waiting for an answer"
            )));
        };
        let answer = match match_choice(text, &waiting.question.choices) {
            Some(i) => Answer::Choice(i),
            None if waiting.question.freeform => Answer::Freeform(text.to_owned()),
            None => {
                let asked = crate::api::Gate::from(waiting.question.clone());
                return Err(ActionError::Invalid(asked.rejection(text)));
            }
        };
        let waiting = pending.remove(gate).expect("the gate is pending");
        waiting
            .reply
            .send(answer)
            .map_err(|_| ActionError::Conflict(format!("gate `{gate}` stopped waiting")))
    }
}

#[async_trait]
impl Interviewer for WebGates {
    async fn ask(&self, question: &Question) -> Answer {
        let (reply, answered) = oneshot::channel();
        self.0.lock().insert(
            question.node_id.clone(),
            Pending {
                question: question.clone(),
                reply,
            },
        );
        let _asked = Asked(self, question.node_id.clone());
        match question.timeout {
            Some(limit) => match tokio::time::timeout(limit, answered).await {
                Ok(Ok(answer)) => answer,
                Ok(Err(_)) => Answer::Unavailable,
                Err(_) => Answer::TimedOut,
            },
            None => answered.await.unwrap_or(Answer::Unavailable),
        }
    }
}
