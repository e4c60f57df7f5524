//! A run file's prepare steps (`[[run.prepare.steps]]`): commands run in order before the first stage,
//! in the run's sandbox and working directory with the secret rules of command stages. Each is
//! recorded like a command stage — `prepare/NN/` in the run record holds its `command`, `output`
//! (secrets redacted) and `status.json` — and reported as a `Run.PrepareStep` event. The first that
//! does not exit 0 fails the run before any stage runs; resuming the run prepares it again.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;
use trellis_engine::event::EventKind;
use trellis_engine::{CancellationToken, Engine, EngineError};
use trellis_process::sandbox::{Policy, Sandbox};
use trellis_process::task::blocking;
use trellis_store::RunDir;

use crate::run_file::PrepareStep;

/// How long one step may take.
const STEP_TIMEOUT: Duration = Duration::from_mins(30);

/// Runs the steps in order; the first failure is the run's error.
pub(crate) async fn run(
    steps: &[PrepareStep],
    engine: &Engine,
    record: &Arc<RunDir>,
    sandbox: &Sandbox,
    cancel: &CancellationToken,
) -> Result<(), EngineError> {
    for (index, step) in steps.iter().enumerate() {
        let number = index + 1;
        let started = Instant::now();
        let script = script_of(step);
        let env: Vec<(String, String)> = step
            .env
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .chain([(
                trellis_process::group::RUN_ID_VAR.to_owned(),
                engine.run_id().to_owned(),
            )])
            .collect();
        let shell = trellis_agent::shell::ShellCommand {
            dir: &engine.settings.work_dir,
            command: &script,
            timeout: STEP_TIMEOUT,
            env: &env,
            pass_env: &[],
            sandbox,
            policy: &Policy::default(),
        };
        let output = tokio::select! {
            output = trellis_agent::shell::run(&shell) => output,
            () = cancel.cancelled() => {
                return Err(failed(number, step, "the run was stopped".into()));
            }
        };
        let succeeded = output.note.as_deref() == Some("exit 0");
        let note = output.note.clone().unwrap_or_else(|| "did not run".into());
        let duration_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
        let dir = record.root().join("prepare").join(format!("{number:02}"));
        let status = json!({
            "step": number,
            "command": step.shown,
            "status": if succeeded { "succeeded" } else { "failed" },
            "note": note,
            "duration_ms": duration_ms,
        });
        let (content, shown) = (output.content.clone(), step.shown.clone());
        blocking(move || write_record(&dir, &shown, &content, &status))
            .await
            .map_err(|source| EngineError::Store { source })?;
        engine.emit(
            None,
            EventKind::PrepareStep {
                step: number,
                command: step.shown.clone(),
                succeeded,
                note: note.clone(),
                duration_ms,
            },
        );
        if !succeeded {
            let last = output
                .content
                .lines()
                .rev()
                .map(str::trim)
                .find(|l| !l.is_empty() && !l.starts_with('['))
                .map(|l| format!(": {l}"))
                .unwrap_or_default();
            return Err(failed(number, step, format!("{note}{last}")));
        }
    }
    Ok(())
}

fn failed(number: usize, step: &PrepareStep, reason: String) -> EngineError {
    EngineError::Prepare {
        step: number,
        command: step.shown.clone(),
        reason,
    }
}

/// The step as one shell command.
fn script_of(step: &PrepareStep) -> String {
    match step.argv.as_slice() {
        [sh, c, script] if sh == "sh" && c == "-c" => script.clone(),
        argv => argv
            .iter()
            .map(|a| format!("'{}'", a.replace('\'', r"'\''")))
            .collect::<Vec<_>>()
            .join(" "),
    }
}

/// Blocks: runs on the blocking pool (`prepare::run`).
fn write_record(
    dir: &Path,
    command: &str,
    output: &str,
    status: &serde_json::Value,
) -> std::io::Result<()> {
    // In the run's record, which an earlier step may have written: no link there is followed.
    use trellis_process::files;
    files::create_folders(dir, files::record_folder_mode())?;
    files::write_whole(&dir.join("command"), command.as_bytes())?;
    files::write_whole(&dir.join("output"), output.as_bytes())?;
    files::write_whole(
        &dir.join("status.json"),
        &serde_json::to_vec_pretty(status).unwrap_or_default(),
    )
}
