//! Journal replay as a property: for random runs of small workflows (loops, goal gates, fan-outs;
//! stage outcomes drawn from a seed) stopped after every possible number of steps, the snapshot the
//! run started from with the journal replayed over it is the state the engine held when it stopped;
//! and a reader given the journal cut anywhere — after any entry, or torn inside the next — reads
//! exactly the entries before the cut, never a part of one.

#![allow(
    clippy::disallowed_methods,
    reason = "the test writes and cuts run records on disk"
)]

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use trellis_engine::checkpoint::JournalEntry;
use trellis_engine::services::Subscribers;
use trellis_engine::services::memory::{FixedClock, NoAnswers};
use trellis_engine::{
    Attempt, CancellationToken, Checkpoint, Engine, FailureClass, Handler, Handlers, Outcome,
    RunStatus, Services, Settings, Stage,
};
use trellis_store::{FileBlobs, RunDir, RunMeta};
use trellis_workflow::node_kind::HandlerKind;
use trellis_workflow::{CompileOptions, compile_text};

/// A small random number generator (SplitMix64): the seed decides every draw.
struct Draws(u64);

impl Draws {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        usize::try_from(self.next() % n.max(1) as u64).unwrap()
    }
}

/// Succeeds, fails, asks for a retry or sets a value, as the seed and the stage (node, visit,
/// attempt) say: the same seed makes the same run, whatever the step limit.
struct Drawn(u64);

#[async_trait]
impl Handler for Drawn {
    async fn execute(&self, stage: &Stage<'_>) -> Attempt {
        let node = stage
            .node
            .id
            .bytes()
            .fold(0u64, |h, b| h.wrapping_mul(31).wrapping_add(u64::from(b)));
        let mut draws =
            Draws(self.0 ^ node ^ (u64::from(stage.visit) << 32) ^ u64::from(stage.attempt));
        match draws.below(5) {
            0 => Outcome::failed(FailureClass::StageFailed, "drawn to fail"),
            1 => Outcome::failed(FailureClass::Transient, "drawn to retry"),
            2 => Outcome::success()
                .with_update(format!("k{}", draws.below(3)), "v".repeat(draws.below(40))),
            _ => Outcome::success(),
        }
        .into()
    }
}

const WORKFLOWS: &[&str] = &[
    // A loop that goes round until a stage succeeds, with retries.
    r#"digraph Loop {
        graph [default_max_retries=1]
        start [shape=Mdiamond]; exit [shape=Msquare]
        a [type=command, script="x"]; b [type=command, script="x"]
        start -> a -> b
        b -> exit [condition="outcome=success"]
        b -> a [condition="outcome!=success"]
    }"#,
    // A goal gate that sends the run back.
    r#"digraph Gate {
        graph [default_max_retries=0]
        start [shape=Mdiamond]; exit [shape=Msquare]
        work [type=command, script="x", goal_gate=true, retry_target="work", max_visits=6]
        tidy [type=command, script="x"]
        start -> work -> tidy -> exit
    }"#,
    // A fan-out whose branches run stages of their own, then a fan-in.
    r#"digraph Fan {
        graph [default_max_retries=0]
        start [shape=Mdiamond]; exit [shape=Msquare]
        fan [shape=component, join_policy="k_of_n(1)"]
        a1 [type=command, script="x"]; a2 [type=command, script="x"]
        b1 [type=command, script="x"]; c1 [type=command, script="x"]
        join [shape=tripleoctagon]
        after [type=command, script="x"]
        start -> fan
        fan -> a1 -> a2 -> join
        fan -> b1 -> join
        fan -> c1 -> join
        join -> after -> exit
    }"#,
];

struct Ran {
    record: RunDir,
    /// The engine's state when it stopped.
    last: Checkpoint,
    _owner: trellis_store::Owner,
}

async fn run(dir: &Path, text: &str, seed: u64, max_steps: u32) -> Ran {
    let (_, compiled) = compile_text("w.fabro", text, &CompileOptions::default());
    let workflow = compiled
        .workflow
        .unwrap_or_else(|| panic!("{:?}", compiled.diagnostics));
    let settings = Settings {
        work_dir: dir.to_path_buf(),
        max_steps,
        ..Settings::default()
    };
    let meta = RunMeta {
        run_id: format!("R{seed}x{max_steps}"),
        workflow: workflow.name.clone(),
        goal: None,
        source_path: "w.fabro".into(),
        status: RunStatus::Running,
        started_at: "t".into(),
        ended_at: None,
        settings: settings.clone(),
        run_file: None,
        temporal: None,
        workspace: None,
        answer_node: None,
    };
    let (record, owner) = RunDir::create(dir, &meta, text, "w.fabro").unwrap();
    let record = Arc::new(record);
    let mut handlers = Handlers::with_control_flow();
    handlers.register(HandlerKind::Command, Arc::new(Drawn(seed)));
    let services = Services {
        store: record.clone(),
        blobs: Arc::new(FileBlobs::new(record.blobs_dir())),
        events: Subscribers::default(),
        interviewer: Arc::new(NoAnswers),
        router: None,
        clock: Arc::new(FixedClock(
            SystemTime::UNIX_EPOCH + Duration::from_secs(1_795_000_000),
        )),
        hooks: None,
        pacer: None,
    };
    let engine = Engine::new(
        Arc::new(workflow),
        Arc::new(handlers),
        services,
        settings,
        meta.run_id.clone(),
    );
    let first = engine.first_checkpoint(BTreeMap::new()).unwrap();
    let result = engine.run(first, &CancellationToken::new()).await;
    drop(engine);
    // File work the engine started on the blocking pool and stopped waiting for (a branch no longer
    // needed) runs to its end, holding the record until then: a moment. (Seen: 1 ms.)
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while Arc::strong_count(&record) > 1 && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    Ran {
        record: Arc::into_inner(record).expect("the engine let go of the record"),
        last: result.checkpoint,
        _owner: owner,
    }
}

/// The state a reader should get: `start` with `entries` replayed, the stages collected.
fn replayed(start: &Checkpoint, entries: &[JournalEntry]) -> Checkpoint {
    let mut state = start.clone();
    for entry in entries.iter().filter(|e| e.n > start.journal) {
        state.replay(entry);
    }
    state
}

/// What replay must reproduce: all a checkpoint records (its JSON: in-memory details such as the
/// last outcome's stage directory are not part of it) but the run's status and failure, which the
/// run's end sets without a journal entry (the last snapshot holds them), and the stages, which a
/// snapshot does not hold.
fn comparable(checkpoint: &Checkpoint) -> serde_json::Value {
    serde_json::to_value(Checkpoint {
        status: RunStatus::Running,
        failure: None,
        stages: Vec::new(),
        ..checkpoint.clone()
    })
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replaying_the_journal_gives_the_state_at_every_step_and_torn_lines_are_dropped() {
    let root = tempfile::tempdir().unwrap();
    let mut cuts = 0;
    for (w, text) in (0u64..).zip(WORKFLOWS) {
        for seed in (0..4u64).map(|s| s * 7919 + w) {
            for max_steps in 1..=14 {
                let dir = root.path().join(format!("w{w}-s{seed}-m{max_steps}"));
                std::fs::create_dir_all(&dir).unwrap();
                let ran = run(&dir, text, seed, max_steps).await;
                let case = format!("workflow {w}, seed {seed}, {max_steps} steps");
                // The snapshot the run started from is kept beside the last one.
                let first: Checkpoint = serde_json::from_str(
                    &std::fs::read_to_string(ran.record.root().join("checkpoint.prev.json"))
                        .unwrap(),
                )
                .unwrap();
                let journal =
                    std::fs::read_to_string(ran.record.journal_path()).unwrap_or_default();
                let lines: Vec<&str> = journal.lines().collect();
                let entries: Vec<JournalEntry> = lines
                    .iter()
                    .map(|line| serde_json::from_str(line).unwrap())
                    .collect();
                assert_eq!(
                    comparable(&replayed(&first, &entries)),
                    comparable(&ran.last),
                    "{case}: replay differs from the engine's state"
                );

                // Cut the journal after every entry, and inside the next one, and read it back
                // over the first snapshot.
                let mut draws = Draws(seed ^ u64::from(max_steps));
                std::fs::write(
                    ran.record.checkpoint_path(),
                    serde_json::to_vec(&first).unwrap(),
                )
                .unwrap();
                for kept in 0..=lines.len() {
                    let mut cut = lines[..kept].join("\n");
                    if kept > 0 {
                        cut.push('\n');
                    }
                    if let Some(next) = lines.get(kept) {
                        let at = draws.below(next.len());
                        let at = (0..=at).rev().find(|&c| next.is_char_boundary(c)).unwrap();
                        cut.push_str(&next[..at]);
                    }
                    std::fs::write(ran.record.journal_path(), cut).unwrap();
                    let read = ran.record.checkpoint().unwrap();
                    let expected = replayed(&first, &entries[..kept]);
                    assert_eq!(
                        comparable(&read),
                        comparable(&expected),
                        "{case}, journal cut after {kept} entries"
                    );
                    assert_eq!(read.stages, expected.stages, "{case}, cut after {kept}");
                    cuts += 1;
                }
            }
        }
    }
    assert!(cuts > 300, "only {cuts} cuts were checked");
}
