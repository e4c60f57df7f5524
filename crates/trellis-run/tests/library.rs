//! The run library used as the server will use it: no terminal, its own event subscriber, its own
//! cancellation token, then a resume of the cancelled run.

#![allow(
    clippy::disallowed_methods,
    reason = "tests and benchmarks set up and read files around the code they run"
)]

use std::path::Path;
use std::sync::Arc;

use trellis_engine::services::EventSink;
use trellis_engine::services::memory::{MemoryEvents, NoAnswers};
use trellis_engine::{RunStatus, Settings};
use trellis_run::{NewRun, Resumable, Run, Stop, Wiring};

fn wiring(events: &Arc<MemoryEvents>) -> Wiring {
    Wiring {
        interviewer: Arc::new(NoAnswers),
        subscribers: vec![events.clone() as Arc<dyn EventSink>],
        logged: None,
        sandbox: Arc::new(trellis_run::Sandbox::none()),
        pacer: None,
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_run_is_created_executed_cancelled_and_resumed_through_the_library() {
    let dir = tempfile::tempdir().unwrap();
    let work = dir.path();
    let file = work.join("w.fabro");
    std::fs::write(
        &file,
        "digraph W { start [shape=Mdiamond]\n exit [shape=Msquare]\n \
         first [shape=parallelogram, script=\"echo first >> first.log\"]\n \
         slow [shape=parallelogram, script=\"test -f again || { touch again; sleep 30; }\"]\n \
         start -> first -> slow -> exit }",
    )
    .unwrap();
    let loaded = trellis_run::load(&file, &file, trellis_run::CompileOptions::default())
        .await
        .unwrap();
    assert_eq!(
        loaded.compiled.diagnostics,
        [] as [trellis_syntax::diagnostic::Diagnostic; 0]
    );
    let events = Arc::new(MemoryEvents::default());
    let request = NewRun {
        path: file.clone(),
        initial: [("ticket".to_owned(), serde_json::json!("T-1"))].into(),
        settings: Settings {
            work_dir: work.to_path_buf(),
            max_steps: 100,
            ..Settings::default()
        },
        runs_dir: work.join("runs"),
        run_file: None,
        temporal: None,
        answer_node: None,
    };
    let run = Run::create(loaded, request, wiring(&events)).await.unwrap();
    let id = run.id().to_owned();
    let stop = Stop::new();
    let stopper = {
        let (stop, again) = (stop.clone(), work.join("again"));
        async move {
            // Once the slow command is running (it has touched its marker), stop the run from
            // outside, as SIGTERM does.
            while !again.exists() {
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            }
            stop.interrupt();
        }
    };
    let (finished, ()) = tokio::join!(run.execute(&stop), stopper);
    let finished = finished.unwrap();
    assert_eq!(finished.status, RunStatus::Interrupted);
    assert!(finished.log_error.is_none());
    assert_eq!(finished.checkpoint.next_node(), Some("slow"));
    assert_eq!(finished.checkpoint.track.context["ticket"], "T-1");
    // The extra subscriber heard exactly what the log holds.
    let logged: Vec<String> = finished
        .record
        .events()
        .unwrap()
        .iter()
        .map(|e| e.name().to_owned())
        .collect();
    assert_eq!(logged, events.names());
    assert_eq!(
        logged.last().map(String::as_str),
        Some("WorkflowRunCancelled")
    );
    assert_eq!(
        finished.record.meta().unwrap().status,
        RunStatus::Interrupted
    );

    let resumable = Resumable::open(&id, &work.join("runs")).await.unwrap();
    assert_eq!(resumable.finished(), None);
    let loaded = resumable.load().await.unwrap();
    let resumed_events = Arc::new(MemoryEvents::default());
    let run = resumable
        .into_run(loaded, wiring(&resumed_events))
        .await
        .unwrap();
    let finished = run.execute(&Stop::new()).await.unwrap();
    assert_eq!(
        finished.status,
        RunStatus::Succeeded,
        "{:?}",
        finished.error
    );
    assert_eq!(
        std::fs::read_to_string(work.join("first.log")).unwrap(),
        "first\n",
        "finished stages are not run again"
    );
    let meta = finished.record.meta().unwrap();
    assert_eq!(meta.status, RunStatus::Succeeded);
    assert_eq!(meta.settings.max_steps, 100, "the run keeps its settings");
    assert!(Path::new(&meta.source_path).is_absolute());
}
