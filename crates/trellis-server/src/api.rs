//! The JSON API. Every route is declared once, with its `#[utoipa::path]` description beside the handler,
//! and [`router`] builds both the axum router and the OpenAPI document from those declarations, so the
//! document served at `/api/openapi.json` cannot drift from what the server does.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use axum::Json;
use axum::extract::{Path as UrlPath, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use trellis_engine::context::resolve_blob;
use trellis_engine::event::EventKind;
use trellis_engine::services::{Choice, Question};
use trellis_engine::{Checkpoint, Event, RunMode, RunStatus, Settings, StageRecord, keys};
use trellis_store::{RunDir, RunMeta, list_runs};
use utoipa::{IntoParams, OpenApi, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::runs::{ActionError, Server, Start};

/// An API error: its status and a JSON body `{"error": "..."}` (or, for an invalid workflow, the
/// validation report).
pub enum ApiError {
    Status(StatusCode, String),
    Invalid(Value),
}

impl ApiError {
    pub fn not_found(message: impl Into<String>) -> Self {
        Self::Status(StatusCode::NOT_FOUND, message.into())
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::Status(StatusCode::BAD_REQUEST, message.into())
    }

    pub fn internal(message: impl std::fmt::Display) -> Self {
        Self::Status(StatusCode::INTERNAL_SERVER_ERROR, message.to_string())
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        match self {
            ApiError::Status(status, message) => {
                (status, Json(json!({ "error": message }))).into_response()
            }
            ApiError::Invalid(report) => {
                (StatusCode::UNPROCESSABLE_ENTITY, Json(report)).into_response()
            }
        }
    }
}

impl From<ActionError> for ApiError {
    fn from(error: ActionError) -> Self {
        let status = match &error {
            ActionError::NotFound(_) => StatusCode::NOT_FOUND,
            ActionError::Conflict(_)
            | ActionError::Run(trellis_run::RunError::Store(trellis_store::StoreError::Busy {
                ..
            })) => StatusCode::CONFLICT,
            ActionError::Invalid(_) | ActionError::Run(trellis_run::RunError::Preflight { .. }) => {
                StatusCode::UNPROCESSABLE_ENTITY
            }
            ActionError::Run(_) => StatusCode::INTERNAL_SERVER_ERROR,
            ActionError::Temporal(_) => StatusCode::BAD_GATEWAY,
        };
        Self::Status(status, error.to_string())
    }
}

impl From<trellis_run::RunError> for ApiError {
    fn from(error: trellis_run::RunError) -> Self {
        ActionError::from(error).into()
    }
}

/// [`trellis_process::task::blocking`], for the work that answers a request.
pub(crate) async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, ApiError> + Send + 'static,
) -> Result<T, ApiError> {
    trellis_process::task::blocking(work).await
}

/// Answers a request whose handler panicked with a 500 and the API's error body, instead of
/// closing the connection without an answer; the server goes on serving.
pub(crate) async fn contain_panics(
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    use futures::FutureExt;
    std::panic::AssertUnwindSafe(next.run(request))
        .catch_unwind()
        .await
        .unwrap_or_else(|_| {
            ApiError::internal("the server failed on this request; see its log").into_response()
        })
}

/// Answers every failed request to the API with the API's error body, `{"error": "..."}`, its
/// status and headers kept: the ones the routes' extractors answer themselves (a body that is not
/// JSON, or not of the request's shape; a missing `Content-Type`), a path no route has, a method
/// its route does not take.
pub(crate) async fn errors_as_json(
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    use axum::http::header::{CONTENT_LENGTH, CONTENT_TYPE};
    let path = request.uri().path();
    if !path.starts_with("/api/") {
        return next.run(request).await;
    }
    let (method, path) = (request.method().clone(), path.to_owned());
    let response = next.run(request).await;
    let status = response.status();
    let json = response
        .headers()
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"));
    if json || !(status.is_client_error() || status.is_server_error()) {
        return response;
    }
    let (parts, body) = response.into_parts();
    let text = axum::body::to_bytes(body, 64 * 1024)
        .await
        .map(|bytes| String::from_utf8_lossy(&bytes).trim().to_owned())
        .unwrap_or_default();
    let message = match status {
        _ if !text.is_empty() => text,
        StatusCode::NOT_FOUND => format!("no API route is `{path}`"),
        StatusCode::METHOD_NOT_ALLOWED => format!("`{path}` does not take {method}"),
        _ => status.canonical_reason().unwrap_or("failed").to_lowercase(),
    };
    let mut answer = ApiError::Status(status, message).into_response();
    for (name, value) in &parts.headers {
        if name != CONTENT_TYPE && name != CONTENT_LENGTH {
            answer.headers_mut().append(name, value.clone());
        }
    }
    answer
}

/// One run, as lists show it.
#[derive(Debug, Serialize, ToSchema)]
pub struct RunSummary {
    pub id: String,
    pub workflow: String,
    /// As readers see it: a run recorded as running whose process is gone is `interrupted`.
    pub status: RunStatus,
    pub goal: Option<String>,
    pub started_at: String,
    pub ended_at: Option<String>,
    /// Stages executed so far.
    pub stage_count: usize,
    /// The stage running now (or waiting), while the run is not finished.
    pub current: Option<String>,
    /// Whether this server is running it.
    pub live: bool,
    /// Whether it waits at a human gate: stopped for input, or running with a question open.
    pub waiting: bool,
    /// What its model calls cost in US dollars, where the providers reported it.
    pub cost_usd: Option<f64>,
    /// The tokens its model calls took, input and output.
    pub tokens: u64,
}

/// A page of runs, newest first.
#[derive(Debug, Serialize, ToSchema)]
pub struct RunList {
    pub runs: Vec<RunSummary>,
    /// How many runs matched the filters.
    pub total: usize,
    pub offset: usize,
    pub limit: usize,
    /// How many runs of the workflow and search asked for are in each state (the board's groups),
    /// whatever `status` asked for.
    pub counts: BTreeMap<String, usize>,
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct RunQuery {
    /// Only runs with this status.
    status: Option<RunStatus>,
    /// Only runs of this workflow (its name).
    workflow: Option<String>,
    /// Only runs whose id, workflow or goal contains this text (any case).
    q: Option<String>,
    #[serde(default)]
    offset: usize,
    /// At most this many runs (default 50, at most 500).
    limit: Option<usize>,
}

/// One option of a human gate.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct GateOption {
    pub label: String,
    /// Its accelerator key (`[A] Approve` → `A`).
    pub key: Option<String>,
}

/// A human gate waiting for an answer.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Gate {
    /// The gate's node id: the `gate` of an answer.
    pub gate: String,
    pub prompt: String,
    pub options: Vec<GateOption>,
    /// Whether free text is accepted.
    pub freeform: bool,
}

impl From<Question> for Gate {
    fn from(question: Question) -> Self {
        Self {
            gate: question.node_id,
            prompt: question.prompt,
            options: question
                .choices
                .into_iter()
                .map(|c| GateOption {
                    label: c.label,
                    key: c.key.map(String::from),
                })
                .collect(),
            freeform: question.freeform,
        }
    }
}

impl Gate {
    fn choices(&self) -> Vec<Choice> {
        self.options
            .iter()
            .map(|o| Choice {
                label: o.label.clone(),
                key: o.key.as_deref().and_then(|k| k.chars().next()),
            })
            .collect()
    }

    /// Whether `text` is an answer the gate takes.
    pub fn accepts(&self, text: &str) -> bool {
        self.freeform || trellis_handlers::human::match_choice(text, &self.choices()).is_some()
    }

    pub fn rejection(&self, text: &str) -> String {
        let labels: Vec<&str> = self.options.iter().map(|o| o.label.as_str()).collect();
        format!(
            "`{text}` is not one of the options of gate `{}`: {}",
            self.gate,
            labels.join(", ")
        )
    }

    fn of(node: String, prompt: String, labels: Vec<String>, freeform: bool) -> Self {
        Self {
            gate: node,
            prompt,
            options: labels
                .into_iter()
                .map(|label| GateOption {
                    key: trellis_workflow::label::accelerator(&label).map(String::from),
                    label,
                })
                .collect(),
            freeform,
        }
    }
}

/// A run with its stages, context and what it waits for.
#[derive(Debug, Serialize, ToSchema)]
pub struct RunDetail {
    #[serde(flatten)]
    pub summary: RunSummary,
    /// The workflow file the run was started from.
    pub source_path: String,
    /// What stopped it, for a failed run.
    pub error: Option<String>,
    /// The run's settings (work directory, mode, step limit).
    pub settings: Settings,
    /// The stages executed, in order.
    pub stages: Vec<StageRecord>,
    /// The run context (engine-internal keys left out).
    #[schema(value_type = Object)]
    pub context: Value,
    /// The human gates waiting for an answer.
    pub waiting: Vec<Gate>,
    /// The edges taken so far, as `from->to#index` keys with how often.
    pub edges: BTreeMap<String, u32>,
}

/// A new run: a workflow file under `--workflows` or the workflow's source text.
#[derive(Debug, Deserialize, ToSchema)]
pub struct StartRequest {
    /// A workflow file, relative to the server's `--workflows` directory.
    pub workflow: Option<String>,
    /// The workflow's source text (DOT, or YAML when `name` ends in `.yaml`/`.yml`).
    pub source: Option<String>,
    /// The file name of `source`, for diagnostics and the record (default `workflow.fabro`).
    pub name: Option<String>,
    /// Replaces the workflow's goal.
    pub goal: Option<String>,
    /// Values put into the run context before the first stage.
    #[serde(default)]
    #[schema(value_type = Object)]
    pub set: BTreeMap<String, Value>,
    /// The workflow's input: what its templates name (`{{ inputs.NAME }}`), and for a YAML workflow
    /// its declared `inputs`, checked against their declaration.
    #[serde(default)]
    #[schema(value_type = Object)]
    pub input: serde_json::Map<String, Value>,
    /// The model for nodes that name none (`trellis run --model`): over a run file's and the
    /// workflow's; a node's or stylesheet's own still wins.
    pub model: Option<String>,
    /// The provider of a model the catalog does not place (`trellis run --provider`): anthropic,
    /// openai, gemini, openai-compatible or local.
    pub provider: Option<String>,
    /// Simulate models, run no commands and skip waits.
    #[serde(default)]
    pub dry_run: bool,
    /// Simulate models but run commands, waits and gates.
    #[serde(default)]
    pub simulate: bool,
}

/// A workflow to validate: a file under `--workflows`, or source text.
#[derive(Debug, Deserialize, ToSchema)]
pub struct ValidateRequest {
    /// A workflow file, relative to `--workflows`.
    pub workflow: Option<String>,
    pub source: Option<String>,
    /// Its file name (default `workflow.fabro`; `.yaml`/`.yml` reads YAML).
    pub name: Option<String>,
    /// The inputs a run would be given (`POST /api/runs`' `input`), which templates name.
    #[serde(default)]
    #[schema(value_type = Object)]
    pub input: serde_json::Map<String, Value>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct Started {
    pub id: String,
}

/// An answer to a human gate.
#[derive(Debug, Deserialize, ToSchema)]
pub struct AnswerRequest {
    /// The gate's node id.
    pub gate: String,
    /// An option's label, its accelerator key, or free text where the gate takes it.
    pub answer: String,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct Accepted {
    pub id: String,
    pub status: String,
}

/// A workflow file under `--workflows`.
#[derive(Debug, Serialize, ToSchema)]
pub struct WorkflowFile {
    /// Relative to `--workflows`: what `POST /api/runs` takes as `workflow`.
    pub path: String,
    pub name: Option<String>,
    pub valid: bool,
    pub errors: usize,
    pub warnings: usize,
    pub nodes: Option<usize>,
    /// Every error is a template naming an input (or the goal) the file does not give: the run's
    /// inputs or goal would make it valid.
    pub needs_inputs: bool,
    /// Why the file could not be read.
    pub error: Option<String>,
}

#[derive(OpenApi)]
#[openapi(paths(crate::files::artifact))]
struct ArtifactDoc;

#[derive(OpenApi)]
#[openapi(info(
    title = "Trellis",
    description = "Start, watch and steer Trellis workflow runs. Event streams are Server-Sent Events whose `id` is the event's `seq`."
))]
struct ApiDoc;

/// The API's routes and their OpenAPI document, built from the same declarations.
pub fn router(server: Arc<Server>) -> (axum::Router, utoipa::openapi::OpenApi) {
    let (router, document) = OpenApiRouter::with_openapi(ApiDoc::openapi())
        .routes(routes!(list_runs_handler, start_run))
        .routes(routes!(get_run))
        .routes(routes!(crate::events::events))
        .routes(routes!(crate::events::stage_output))
        .routes(routes!(crate::files::stage_file))
        .routes(routes!(crate::graph::run_graph))
        .routes(routes!(answer))
        .routes(routes!(cancel))
        .routes(routes!(steer))
        .routes(routes!(changes))
        .routes(routes!(resume))
        .routes(routes!(validate))
        .routes(routes!(workflows))
        .routes(routes!(health))
        .with_state(server.clone())
        .split_for_parts();
    // A path parameter spanning several segments is declared to axum as `{*path}`; the document
    // names the same route `{path}` (the `artifact` handler's declaration).
    let mut document = document;
    document.merge(ArtifactDoc::openapi());
    let router = router.route(
        "/api/runs/{id}/artifacts/{*path}",
        axum::routing::get(crate::files::artifact).with_state(server),
    );
    let openapi = Arc::new(document.clone());
    let router = router.route(
        "/api/openapi.json",
        axum::routing::get(move || {
            let openapi = openapi.clone();
            async move { Json((*openapi).clone()) }
        }),
    );
    (router, document)
}

/// A run as lists show it, from its record: `status` as readers see it, and its checkpoint if read.
fn summary(
    server: &Server,
    meta: RunMeta,
    status: RunStatus,
    checkpoint: Option<&Checkpoint>,
) -> RunSummary {
    let finished = status.is_finished();
    let live = server.live(&meta.run_id);
    let waiting = status == RunStatus::WaitingForInput
        || live
            .as_ref()
            .is_some_and(|live| !live.gates.pending().is_empty());
    let models = checkpoint
        .into_iter()
        .flat_map(|c| &c.stages)
        .filter_map(|stage| stage.details.model.as_ref());
    let (mut cost_usd, mut tokens) = (None, 0);
    for model in models {
        tokens += model.usage.input_tokens + model.usage.output_tokens;
        if let Some(cost) = model.cost_usd {
            *cost_usd.get_or_insert(0.0) += cost;
        }
    }
    RunSummary {
        waiting,
        cost_usd,
        tokens,
        stage_count: checkpoint.map_or(0, |c| c.stage_count),
        current: checkpoint
            .filter(|_| !finished)
            .and_then(|c| c.next_node().map(str::to_owned)),
        live: live.is_some(),
        id: meta.run_id,
        workflow: meta.workflow,
        status,
        goal: meta.goal,
        started_at: meta.started_at,
        ended_at: meta.ended_at,
    }
}

/// Lists runs, newest first.
#[utoipa::path(get, path = "/api/runs", params(RunQuery), responses((status = 200, body = RunList)))]
async fn list_runs_handler(
    State(server): State<Arc<Server>>,
    query: Result<Query<RunQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<RunList>, ApiError> {
    // A bad filter (`?status=bogus`) is the API's own 400, with the values it takes.
    let Query(query) = query.map_err(|rejection| ApiError::bad_request(rejection.body_text()))?;
    blocking(move || {
        let limit = query.limit.unwrap_or(50).clamp(1, 500);
        let search = query.q.as_deref().map(str::to_lowercase);
        let found = |meta: &RunMeta, text: &str| {
            [Some(&meta.run_id), Some(&meta.workflow), meta.goal.as_ref()]
                .into_iter()
                .flatten()
                .any(|field| field.to_lowercase().contains(text))
        };
        let mut matched = Vec::new();
        let mut counts = BTreeMap::new();
        for path in list_runs(&server.runs_dir) {
            let Ok(record) = RunDir::open(&path.display().to_string(), &server.runs_dir) else {
                continue;
            };
            let Ok(meta) = record.meta() else { continue };
            if query.workflow.as_ref().is_some_and(|w| *w != meta.workflow)
                || search.as_deref().is_some_and(|text| !found(&meta, text))
            {
                continue;
            }
            let status = record.status(&meta);
            // Only a live run can be waiting with `running` as its status: its gates are asked.
            let live_waiting = server
                .live(&meta.run_id)
                .is_some_and(|live| !live.gates.pending().is_empty());
            let state = if live_waiting && status == RunStatus::Running {
                RunStatus::WaitingForInput
            } else {
                status
            };
            *counts.entry(state.as_str().to_owned()).or_insert(0) += 1;
            if query.status.is_some_and(|s| s != state) {
                continue;
            }
            matched.push((record, meta, status));
        }
        let total = matched.len();
        let runs = matched
            .into_iter()
            .skip(query.offset)
            .take(limit)
            .map(|(record, meta, status)| {
                summary(&server, meta, status, record.checkpoint().ok().as_ref())
            })
            .collect();
        Ok(Json(RunList {
            runs,
            total,
            offset: query.offset,
            limit,
            counts,
        }))
    })
    .await
}

/// The gates a run that stopped to wait for input waits at, from its event log.
fn waiting_from_events(events: &[Event]) -> Vec<Gate> {
    let mut asked: BTreeMap<String, Gate> = BTreeMap::new();
    for event in events {
        match (&event.kind, &event.node_id) {
            (
                EventKind::HumanGateAsked {
                    prompt,
                    options,
                    freeform,
                },
                Some(node),
            ) => {
                asked.insert(
                    node.clone(),
                    Gate::of(node.clone(), prompt.clone(), options.clone(), *freeform),
                );
            }
            (EventKind::HumanGateAnswered { .. }, Some(node)) => {
                asked.remove(node);
            }
            _ => {}
        }
    }
    asked.into_values().collect()
}

/// The gates run `record` waits at: a live run's pending questions, or the last unanswered ones of a run
/// stopped waiting for input (`status` as readers see it).
pub(crate) fn waiting(
    server: &Server,
    record: &RunDir,
    meta: &RunMeta,
    status: RunStatus,
) -> Vec<Gate> {
    if let Some(live) = server.live(&meta.run_id) {
        return live.gates.pending().into_iter().map(Gate::from).collect();
    }
    if status != RunStatus::WaitingForInput {
        return Vec::new();
    }
    record
        .events()
        .map(|events| waiting_from_events(&events))
        .unwrap_or_default()
}

/// Context values longer than this are cut (with a note of how much) in a run's detail.
const MAX_SHOWN: usize = 64 << 10;

/// A context value as the API shows it: long text cut at [`MAX_SHOWN`] bytes, saying how much was cut.
fn shown(value: Value) -> Value {
    match value {
        Value::String(text) if text.len() > MAX_SHOWN => {
            let mut end = MAX_SHOWN;
            while !text.is_char_boundary(end) {
                end -= 1;
            }
            Value::String(format!(
                "{}… [{} more bytes]",
                &text[..end],
                text.len() - end
            ))
        }
        other => other,
    }
}

/// A run with its stages, context and the gates it waits at.
#[utoipa::path(get, path = "/api/runs/{id}", params(("id" = String, Path, description = "The run id")),
    responses((status = 200, body = RunDetail), (status = 404, description = "No such run")))]
async fn get_run(
    State(server): State<Arc<Server>>,
    UrlPath(id): UrlPath<String>,
) -> Result<Json<RunDetail>, ApiError> {
    blocking(move || {
        let record = server.record(&id)?;
        let meta = record.meta().map_err(ApiError::internal)?;
        let checkpoint = record.checkpoint().ok();
        let status = record.status(&meta);
        let waiting = waiting(&server, &record, &meta, status);
        let (source_path, settings) = (meta.source_path.clone(), meta.settings.clone());
        let summary = summary(&server, meta, status, checkpoint.as_ref());
        let (stages, context, edges, error) = match checkpoint {
            Some(checkpoint) => {
                let blobs = trellis_store::FileBlobs::new(record.blobs_dir());
                let context: serde_json::Map<String, Value> = checkpoint
                    .track
                    .context
                    .iter()
                    .filter(|(k, _)| !keys::is_engine_key(k))
                    .map(|(k, v)| (k.clone(), shown(resolve_blob(v.clone(), &blobs))))
                    .collect();
                (
                    checkpoint.stages.clone(),
                    Value::Object(context),
                    checkpoint
                        .track
                        .edge_counts
                        .iter()
                        .map(|(key, count)| (key.to_string(), *count))
                        .collect(),
                    checkpoint.failure.clone(),
                )
            }
            None => (Vec::new(), json!({}), BTreeMap::new(), None),
        };
        Ok(Json(RunDetail {
            summary,
            source_path,
            error,
            settings,
            stages,
            context,
            waiting,
            edges,
        }))
    })
    .await
}

/// Opens a workflow from a request: a workflow or run file (`.toml`) under `--workflows`, or a
/// workflow's source text. A run file's graph must lie under `--workflows` too.
async fn open_requested(
    server: &Server,
    workflow: Option<&str>,
    source: Option<String>,
    name: Option<&str>,
    options: trellis_run::CompileOptions,
) -> Result<(trellis_run::Opened, PathBuf), ApiError> {
    let Some(relative) = workflow.filter(|w| trellis_run::run_file::is_run_file(Path::new(w)))
    else {
        let inputs = options.inputs.clone();
        let (loaded, path) = load_requested(server, workflow, source, name, options).await?;
        return Ok((
            trellis_run::Opened {
                loaded,
                run_file: None,
                warnings: Vec::new(),
                inputs,
            },
            path,
        ));
    };
    let path = server.workflow_path(relative)?;
    let opened = {
        let path = path.clone();
        trellis_process::task::blocking(move || trellis_run::open_blocking(&path, options))
            .await
            .map_err(|e| ApiError::Status(StatusCode::UNPROCESSABLE_ENTITY, e.to_string()))?
    };
    let graph = opened
        .run_file
        .as_ref()
        .map(|f| f.graph.clone())
        .unwrap_or_default();
    let graph_relative = graph
        .strip_prefix(path.parent().unwrap_or(Path::new("")))
        .ok()
        .and_then(|g| Path::new(relative).parent().map(|dir| dir.join(g)))
        .unwrap_or_default();
    // The graph must be a workflow file under --workflows, as if it had been asked for itself.
    let graph = server
        .workflow_path(&graph_relative.to_string_lossy())
        .map_err(|_| {
            ApiError::Status(
                StatusCode::UNPROCESSABLE_ENTITY,
                format!(
                    "the run file's graph {} is not a workflow file under --workflows",
                    graph.display()
                ),
            )
        })?;
    Ok((opened, graph))
}

/// Compiles a workflow from a request: a file under `--workflows`, or source text.
async fn load_requested(
    server: &Server,
    workflow: Option<&str>,
    source: Option<String>,
    name: Option<&str>,
    options: trellis_run::CompileOptions,
) -> Result<(trellis_run::Loaded, PathBuf), ApiError> {
    match (workflow, source) {
        (Some(relative), None) => {
            let path = server.workflow_path(relative)?;
            let mut loaded = trellis_run::load(&path, &path, options).await?;
            loaded.file = loaded.file.named(relative);
            Ok((loaded, path))
        }
        (None, Some(source)) => {
            let name = source_name(name)?;
            let base = server
                .workflows_dir
                .clone()
                .unwrap_or_else(|| server.work_dir.clone());
            let path = base.join(name);
            Ok((trellis_run::load_text(&path, source, options).await, path))
        }
        _ => Err(ApiError::bad_request(
            "give either `workflow` (a file under --workflows) or `source` (the workflow's text)",
        )),
    }
}

/// A pasted workflow's file name: a plain name ending in `.fabro`, `.dot`, `.yaml` or `.yml`.
fn source_name(name: Option<&str>) -> Result<&str, ApiError> {
    let name = name.unwrap_or("workflow.fabro");
    let plain = Path::new(name).file_name().is_some_and(|n| n == name);
    let known = [".fabro", ".dot", ".yaml", ".yml"]
        .iter()
        .any(|e| name.ends_with(e));
    if plain && known && !name.starts_with('.') {
        Ok(name)
    } else {
        Err(ApiError::bad_request(format!(
            "`name` must be a file name ending in .fabro, .dot, .yaml or .yml, found `{name}`"
        )))
    }
}

/// Starts a run; `422` with the validation report when the workflow has errors.
#[utoipa::path(post, path = "/api/runs", request_body = StartRequest,
    responses((status = 201, body = Started), (status = 422, description = "The workflow has errors: the validation report, as `trellis validate --format json` prints it"),
        (status = 404, description = "No such workflow file")))]
async fn start_run(
    State(server): State<Arc<Server>>,
    Json(request): Json<StartRequest>,
) -> Result<(StatusCode, Json<Started>), ApiError> {
    if request.dry_run && request.simulate {
        return Err(ApiError::bad_request(
            "`dry_run` and `simulate` exclude each other",
        ));
    }
    let asked_provider = request
        .provider
        .as_deref()
        .map(trellis_run::known_provider)
        .transpose()
        .map_err(|e| ApiError::bad_request(format!("`provider`: {e}")))?
        .map(str::to_owned);
    let options = trellis_run::CompileOptions {
        goal: request.goal,
        model: request.model.clone(),
        inputs: template_inputs(&request.input),
        ..Default::default()
    };
    let (opened, path) = open_requested(
        &server,
        request.workflow.as_deref(),
        request.source,
        request.name.as_deref(),
        options,
    )
    .await?;
    let trellis_run::Opened {
        loaded,
        run_file,
        inputs,
        ..
    } = opened;
    if loaded.compiled.has_errors() {
        let report = trellis_workflow::report(&loaded.file, &loaded.compiled);
        return Err(ApiError::Invalid(trellis_workflow::report_document(vec![
            report,
        ])));
    }
    let mut set = request.set;
    if let Some(workflow) = &loaded.compiled.workflow {
        let mut provided = run_file
            .as_ref()
            .map(|f| f.input_values.clone())
            .unwrap_or_default();
        provided.extend(request.input);
        let input = trellis_workflow::inputs::for_run(workflow, provided).map_err(|problems| {
            ApiError::Status(StatusCode::UNPROCESSABLE_ENTITY, problems.join("; "))
        })?;
        if let Some(input) = input {
            set.insert(keys::INPUT.to_owned(), input);
        }
    }
    let start = Start {
        set,
        mode: RunMode::from_flags(request.dry_run, request.simulate),
        run_file,
        inputs,
        model: request.model,
        provider: asked_provider,
    };
    let id = server.start(loaded, path, start).await?;
    Ok((StatusCode::CREATED, Json(Started { id })))
}

/// A request's `input` as the workflow's templates name it (`{{ inputs.NAME }}`): strings as they
/// are, other values as JSON text.
fn template_inputs(input: &serde_json::Map<String, Value>) -> BTreeMap<String, String> {
    input
        .iter()
        .map(|(k, v)| {
            (
                k.clone(),
                v.as_str().map_or_else(|| v.to_string(), str::to_owned),
            )
        })
        .collect()
}

/// Validates a workflow (a file under `--workflows` or source text): the report `trellis validate
/// --format json` prints.
#[utoipa::path(post, path = "/api/validate", request_body = ValidateRequest,
    responses((status = 200, description = "The validation report (`valid`, `files` with diagnostics)")))]
async fn validate(
    State(server): State<Arc<Server>>,
    Json(request): Json<ValidateRequest>,
) -> Result<Json<Value>, ApiError> {
    let (loaded, _) = load_requested(
        &server,
        request.workflow.as_deref(),
        request.source,
        request.name.as_deref(),
        trellis_run::CompileOptions {
            inputs: template_inputs(&request.input),
            ..Default::default()
        },
    )
    .await?;
    let report = trellis_workflow::report(&loaded.file, &loaded.compiled);
    Ok(Json(trellis_workflow::report_document(vec![report])))
}

/// Answers a human gate: a live run continues; a run stopped waiting for input resumes with the answer.
#[utoipa::path(post, path = "/api/runs/{id}/answers", request_body = AnswerRequest,
    params(("id" = String, Path, description = "The run id")),
    responses((status = 202, body = Accepted), (status = 409, description = "The run is not waiting at that gate"),
        (status = 422, description = "The answer is not one of the gate's options")))]
async fn answer(
    State(server): State<Arc<Server>>,
    UrlPath(id): UrlPath<String>,
    Json(request): Json<AnswerRequest>,
) -> Result<(StatusCode, Json<Accepted>), ApiError> {
    let (lookup, run) = (server.clone(), id.clone());
    let waiting = blocking(move || {
        let record = lookup.record(&run)?;
        let meta = record.meta().map_err(ApiError::internal)?;
        let status = record.status(&meta);
        Ok(waiting(&lookup, &record, &meta, status))
    })
    .await?;
    let gate = waiting.iter().find(|g| g.gate == request.gate);
    server
        .answer(&id, &request.gate, &request.answer, gate)
        .await?;
    Ok((
        StatusCode::ACCEPTED,
        Json(Accepted {
            id,
            status: "running".into(),
        }),
    ))
}

/// Cancels a running run, its commands and model calls included; it is recorded as cancelled.
#[utoipa::path(post, path = "/api/runs/{id}/cancel", params(("id" = String, Path, description = "The run id")),
    responses((status = 202, body = Accepted), (status = 409, description = "The run is not running")))]
async fn cancel(
    State(server): State<Arc<Server>>,
    UrlPath(id): UrlPath<String>,
) -> Result<(StatusCode, Json<Accepted>), ApiError> {
    server.cancel(&id).await?;
    Ok((
        StatusCode::ACCEPTED,
        Json(Accepted {
            id,
            status: "cancelling".into(),
        }),
    ))
}

/// A steering message for a running agent.
#[derive(Debug, Deserialize, ToSchema)]
pub struct SteerRequest {
    /// The message, as the agent's model will read it.
    pub text: String,
    /// The agent node to steer; may be left out when one agent stage is running.
    #[serde(default)]
    pub node: Option<String>,
}

/// Where a steering message went.
#[derive(Debug, Serialize, ToSchema)]
pub struct SteerSent {
    pub node: String,
    /// The stage directory whose transcript will show it.
    pub stage: String,
}

/// Sends a running agent a message, delivered to its model before its next call and shown in its
/// transcript; refused when no built-in agent stage is running to read it.
#[utoipa::path(post, path = "/api/runs/{id}/steer", params(("id" = String, Path, description = "The run id")),
    request_body = SteerRequest,
    responses((status = 202, body = SteerSent),
        (status = 400, description = "An empty message"),
        (status = 404, description = "No such run"),
        (status = 409, description = "No agent stage (or not the one named) is running to read it, or several are and none was named")))]
async fn steer(
    State(server): State<Arc<Server>>,
    UrlPath(id): UrlPath<String>,
    Json(request): Json<SteerRequest>,
) -> Result<(StatusCode, Json<SteerSent>), ApiError> {
    let sent = blocking(move || {
        let record = server.record(&id)?;
        trellis_run::steer(&record, &request.text, request.node.as_deref()).map_err(|error| {
            let status = match &error {
                trellis_run::SteerError::Empty => StatusCode::BAD_REQUEST,
                trellis_run::SteerError::Record(_) | trellis_run::SteerError::Send(_) => {
                    StatusCode::INTERNAL_SERVER_ERROR
                }
                _ => StatusCode::CONFLICT,
            };
            ApiError::Status(status, error.to_string())
        })
    })
    .await?;
    Ok((
        StatusCode::ACCEPTED,
        Json(SteerSent {
            node: sent.node,
            stage: sent.dir,
        }),
    ))
}

/// What the run changed in its working directory: the files with their lines added and removed,
/// and the unified diff, from its start to its end (or to now while it runs). Only for runs in a
/// git repository.
#[utoipa::path(get, path = "/api/runs/{id}/changes", params(("id" = String, Path, description = "The run id")),
    responses((status = 200, body = trellis_run::changes::Changes),
        (status = 404, description = "No such run"),
        (status = 409, description = "The run recorded no changes (not in a git repository, or started before they were recorded); the error says why")))]
async fn changes(
    State(server): State<Arc<Server>>,
    UrlPath(id): UrlPath<String>,
) -> Result<Json<trellis_run::changes::Changes>, ApiError> {
    blocking(move || {
        let record = server.record(&id)?;
        trellis_run::changes::read(record.root())
            .map(Json)
            .map_err(|why| ApiError::Status(StatusCode::CONFLICT, why))
    })
    .await
}

/// Resumes a stopped run from its last checkpoint.
#[utoipa::path(post, path = "/api/runs/{id}/resume", params(("id" = String, Path, description = "The run id")),
    responses((status = 202, body = Accepted), (status = 409, description = "The run is running or finished")))]
async fn resume(
    State(server): State<Arc<Server>>,
    UrlPath(id): UrlPath<String>,
) -> Result<(StatusCode, Json<Accepted>), ApiError> {
    server.resume(&id, None).await?;
    Ok((
        StatusCode::ACCEPTED,
        Json(Accepted {
            id,
            status: "running".into(),
        }),
    ))
}

/// The workflow files under `--workflows`, with their validation state.
#[utoipa::path(get, path = "/api/workflows", responses((status = 200, body = Vec<WorkflowFile>)))]
async fn workflows(State(server): State<Arc<Server>>) -> Result<Json<Vec<WorkflowFile>>, ApiError> {
    let Some(dir) = server.workflows_dir.clone() else {
        return Ok(Json(Vec::new()));
    };
    blocking(move || Ok(Json(workflow_files(&dir)))).await
}

/// At most this many workflow files are listed.
const MAX_WORKFLOWS: usize = 500;

fn workflow_files(dir: &Path) -> Vec<WorkflowFile> {
    let mut files: Vec<PathBuf> = walk_workflows(dir);
    files.sort();
    files.truncate(MAX_WORKFLOWS);
    files
        .into_iter()
        .map(|path| {
            let relative = path
                .strip_prefix(dir)
                .unwrap_or(&path)
                .display()
                .to_string();
            // A run file (`.toml`) is listed with the workflow it names, compiled with its inputs.
            match trellis_run::open_blocking(&path, trellis_run::CompileOptions::default())
                .map(|opened| opened.loaded.compiled)
            {
                Ok(compiled) => {
                    let tally = trellis_syntax::Tally::of(&compiled.diagnostics);
                    WorkflowFile {
                        path: relative,
                        name: compiled.outline.as_ref().map(|o| o.name.clone()),
                        nodes: compiled.outline.as_ref().map(|o| o.nodes),
                        valid: tally.errors == 0,
                        errors: tally.errors,
                        warnings: tally.warnings,
                        needs_inputs: trellis_workflow::rules::template_variable::needs_inputs(
                            &compiled.diagnostics,
                        ),
                        error: None,
                    }
                }
                Err(error) => WorkflowFile {
                    path: relative,
                    name: None,
                    nodes: None,
                    valid: false,
                    errors: 1,
                    warnings: 0,
                    needs_inputs: false,
                    error: Some(error.to_string()),
                },
            }
        })
        .collect()
}

/// Workflow files (`.fabro`, `.dot`, `.yaml`, `.yml`) and run files (`.toml`) under `dir`, hidden
/// folders skipped, four levels deep.
#[allow(
    clippy::disallowed_methods,
    reason = "runs on the blocking pool (workflows)"
)]
fn walk_workflows(dir: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut folders = vec![(dir.to_path_buf(), 0)];
    while let Some((folder, depth)) = folders.pop() {
        let Ok(entries) = std::fs::read_dir(&folder) else {
            continue;
        };
        for entry in entries.flatten() {
            let name = entry.file_name();
            let name = name.to_string_lossy();
            if name.starts_with('.') || name == "target" || name == "node_modules" {
                continue;
            }
            let Ok(kind) = entry.file_type() else {
                continue;
            };
            let path = entry.path();
            if kind.is_dir() && depth < 4 {
                folders.push((path, depth + 1));
            } else if kind.is_file()
                && [".fabro", ".dot", ".yaml", ".yml", ".toml"]
                    .iter()
                    .any(|e| name.ends_with(e))
                && found.len() < MAX_WORKFLOWS * 2
            {
                found.push(path);
            }
        }
    }
    found
}

/// The server is up.
#[utoipa::path(get, path = "/healthz", responses((status = 200, description = "`{\"status\": \"ok\"}`")))]
async fn health() -> Json<Value> {
    Json(json!({ "status": "ok" }))
}
