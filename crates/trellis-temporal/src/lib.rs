//! `trellis-temporal` runs Trellis runs on [Temporal](https://temporal.io), spread over any number
//! of workers: `trellis run --temporal` creates the run record and starts the run's workflow
//! ([`submit`]); `trellis worker` polls for it ([`worker::run_worker`]).
//!
//! The model: a run is a Temporal workflow whose id is the run's id ([`workflow::TrellisRun`]), and
//! each stage of its main track is an activity, as is each branch of a fan-out there; a
//! sub-workflow there is a child workflow ([`workflow::TrellisSubRun`]) whose activities are the
//! stages of its child run. The run's engine — the same step function, routing, retries and goal
//! gates as a local run — lives on the worker that holds the run and waits before each stage for
//! that stage's activity (its [`trellis_engine::services::Pacer`]). Temporal's history records
//! every stage, answer and timer (gate timeouts, waits); the run record (stage files, checkpoint,
//! events) lives in a runs directory every worker and the submitter reach at the same path; the
//! working tree too, or on a git remote the workers push it to ([`workspace`]). A stage
//! heartbeats every second: a worker that dies is noticed within [`workflow::HEARTBEAT_TIMEOUT`],
//! and another worker resumes the run from its checkpoint, re-running only the interrupted stage,
//! exactly as `trellis resume` does. The stages of a run go to the queue of the worker that holds
//! it; when nobody polls that queue within [`workflow::HANDOVER_TIMEOUT`], any worker takes the run
//! over. The engine crate knows nothing of Temporal.

pub mod worker;
pub mod workflow;
pub mod workspace;

use std::collections::BTreeMap;
use std::path::Path;
use std::str::FromStr;

use temporalio_client::errors::WorkflowGetResultError;
use temporalio_client::{
    Client, ClientOptions, Connection, ConnectionOptions, Url, WorkflowCancelOptions,
    WorkflowGetResultOptions, WorkflowQueryOptions, WorkflowSignalOptions, WorkflowStartOptions,
};
pub use trellis_store::TemporalTarget as Target;

use workflow::TrellisRun;
pub use workflow::{RunEnd, RunInput};

/// The default namespace and shared task queue.
pub const DEFAULT_NAMESPACE: &str = "default";
pub const DEFAULT_TASK_QUEUE: &str = "trellis";

/// Why talking to Temporal failed.
#[derive(Debug, thiserror::Error)]
pub enum TemporalError {
    #[error("`{address}` is not a Temporal address (HOST:PORT or a URL): {reason}")]
    Address { address: String, reason: String },
    #[error("cannot reach Temporal at {address}: {reason}")]
    Connect { address: String, reason: String },
    #[error("Temporal refused {action} of run {run_id}: {reason}")]
    Refused {
        action: &'static str,
        run_id: String,
        reason: String,
    },
    #[error("run {run_id}'s workflow {outcome} on Temporal")]
    Ended { run_id: String, outcome: String },
}

/// The target's address as a URL (`HOST:PORT` means plain HTTP/2 to that host).
fn url(address: &str) -> Result<Url, TemporalError> {
    let text = if address.contains("://") {
        address.to_owned()
    } else {
        format!("http://{address}")
    };
    Url::from_str(&text).map_err(|e| TemporalError::Address {
        address: address.to_owned(),
        reason: e.to_string(),
    })
}

/// A client of `target`'s namespace, named `identity` in Temporal's records.
pub async fn connect(target: &Target, identity: &str) -> Result<Client, TemporalError> {
    let connect_error = |reason: String| TemporalError::Connect {
        address: target.address.clone(),
        reason,
    };
    let options = ConnectionOptions::new(url(&target.address)?)
        .identity(identity.to_owned())
        .build();
    let connection = Connection::connect(options)
        .await
        .map_err(|e| connect_error(e.to_string()))?;
    Client::new(
        connection,
        ClientOptions::new(target.namespace.clone()).build(),
    )
    .map_err(|e| connect_error(e.to_string()))
}

/// Who answers a run's human gates when nobody has yet: the answers given up front, then the first
/// option (`auto_approve`), else the run waits for answers sent with [`answer`].
#[derive(Debug, Clone, Default)]
pub struct Gates {
    pub answers: Option<BTreeMap<String, String>>,
    pub auto_approve: bool,
}

/// Starts the workflow of run `run_id`, whose record (with its first checkpoint) is in `runs_dir`.
pub async fn submit(
    target: &Target,
    run_id: &str,
    runs_dir: &Path,
    gates: Gates,
) -> Result<(), TemporalError> {
    let client = connect(target, &identity()).await?;
    let input = RunInput {
        run_id: run_id.to_owned(),
        runs_dir: runs_dir.display().to_string(),
        answers: gates.answers,
        auto_approve: gates.auto_approve,
        carried: None,
    };
    client
        .start_workflow(
            TrellisRun::run,
            input,
            WorkflowStartOptions::new(target.task_queue.clone(), run_id.to_owned()).build(),
        )
        .await
        .map_err(|e| TemporalError::Refused {
            action: "the start",
            run_id: run_id.to_owned(),
            reason: e.to_string(),
        })?;
    Ok(())
}

/// Waits for run `run_id`'s workflow to end.
pub async fn result(target: &Target, run_id: &str) -> Result<RunEnd, TemporalError> {
    let client = connect(target, &identity()).await?;
    let handle = client.get_workflow_handle::<TrellisRun>(run_id.to_owned());
    handle
        .get_result(WorkflowGetResultOptions::default())
        .await
        .map_err(|e| TemporalError::Ended {
            run_id: run_id.to_owned(),
            outcome: match &e {
                // The failure's first cause is "activity task failed"; the reason is at the root.
                WorkflowGetResultError::Failed(failure) => {
                    let root =
                        std::iter::successors(Some(failure.failure()), |f| f.cause.as_deref())
                            .last()
                            .map_or_else(|| e.to_string(), |f| f.message.clone());
                    format!("failed: {root}")
                }
                other => other.to_string(),
            },
        })
}

/// The gate run `run_id` waits at, if it waits (with its timeout, which Temporal counts down).
pub async fn waiting_gate(
    target: &Target,
    run_id: &str,
) -> Result<Option<workflow::WaitingGate>, TemporalError> {
    let client = connect(target, &identity()).await?;
    client
        .get_workflow_handle::<TrellisRun>(run_id.to_owned())
        .query(TrellisRun::gate, (), WorkflowQueryOptions::default())
        .await
        .map_err(|e| TemporalError::Refused {
            action: "a query",
            run_id: run_id.to_owned(),
            reason: e.to_string(),
        })
}

/// Sends answers to run `run_id`'s human gates (node id → answer).
pub async fn answer(
    target: &Target,
    run_id: &str,
    answers: BTreeMap<String, String>,
) -> Result<(), TemporalError> {
    let client = connect(target, &identity()).await?;
    client
        .get_workflow_handle::<TrellisRun>(run_id.to_owned())
        .signal(
            TrellisRun::answer,
            answers,
            WorkflowSignalOptions::default(),
        )
        .await
        .map_err(|e| TemporalError::Refused {
            action: "the answers",
            run_id: run_id.to_owned(),
            reason: e.to_string(),
        })
}

/// Cancels run `run_id`: its running stage is stopped (its process tree with it) and the run is
/// recorded as cancelled.
pub async fn cancel(target: &Target, run_id: &str) -> Result<(), TemporalError> {
    let client = connect(target, &identity()).await?;
    client
        .get_workflow_handle::<TrellisRun>(run_id.to_owned())
        .cancel(WorkflowCancelOptions::default())
        .await
        .map_err(|e| TemporalError::Refused {
            action: "cancelling",
            run_id: run_id.to_owned(),
            reason: e.to_string(),
        })
}

/// Whether `text` can be a run's id (a ULID's letters and digits): ids from the workflow's input and
/// the record name directories, so nothing else is taken.
pub(crate) fn is_run_id(text: &str) -> bool {
    !text.is_empty() && text.chars().all(|c| c.is_ascii_alphanumeric())
}

/// This process, as Temporal's records name it.
fn identity() -> String {
    format!("trellis-{}", std::process::id())
}
