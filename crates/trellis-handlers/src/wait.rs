//! Wait nodes pause for their `duration` (not in a dry run). The wait is durable: its end is written
//! to the stage directory (`wait.json`) as it starts, and a wait run again after the run was
//! interrupted (a killed process, a lost Temporal worker) ends when the first one would have,
//! instead of starting over. On the main track of a run whose pacer keeps time (Temporal: a
//! durable timer) a wait of a second or more parks the run instead, and ends when run again at
//! its end.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use trellis_engine::services::stage_dir_name;
use trellis_engine::{Attempt, Handler, Outcome, Stage};
use trellis_process::task::blocking;
use trellis_workflow::NodeKind;

/// The file a wait's end is kept in.
const WAIT_FILE: &str = "wait.json";

pub struct WaitHandler;

impl WaitHandler {
    /// Pauses until the wait's end, or hands the time to the run's pacer.
    async fn outcome(&self, stage: &Stage<'_>) -> Attempt {
        if let NodeKind::Wait(config) = &stage.node.kind
            && !stage.settings.dry_run()
        {
            let now = stage.services.clock.now();
            let (dir, node, visit) = (stage.dir.to_path_buf(), stage.node.id.clone(), stage.visit);
            let last = SystemTime::UNIX_EPOCH + LAST_KEPT_END;
            let fresh = now
                .checked_add(config.duration)
                .map_or(last, |end| end.min(last));
            let until = blocking(move || wait_until(&dir, &node, visit, fresh)).await;
            let left = until.duration_since(now).unwrap_or(Duration::ZERO);
            // A pacer with timers of its own (Temporal) keeps a wait's time: the run parks.
            if left >= KEPT_FROM
                && stage
                    .pacer
                    .is_some_and(|pacer| pacer.keeps_time(&stage.node.id, until))
            {
                return Attempt::Parked;
            }
            tokio::time::sleep(left).await;
        }
        Outcome::success().into()
    }
}

/// The latest end a wait keeps (after the epoch): the last moment an RFC 3339 time can write,
/// 9999-12-31T23:59:59Z. A wait meant to end later (`duration="9999999999h"`) ends then, which is
/// as good as never.
const LAST_KEPT_END: Duration = Duration::from_secs(253_402_300_799);

/// The shortest wait a pacer is offered: a shorter one is slept here.
const KEPT_FROM: Duration = Duration::from_secs(1);

#[async_trait]
impl Handler for WaitHandler {
    async fn execute(&self, stage: &Stage<'_>) -> Attempt {
        self.outcome(stage).await
    }
}

/// When this wait ends: when an interrupted earlier attempt at the same visit of the node said it
/// would (its stage directory beside this one), else at `fresh`; written to this attempt's
/// directory either way.
#[allow(
    clippy::disallowed_methods,
    reason = "runs on the blocking pool (WaitHandler::outcome)"
)]
fn wait_until(dir: &Path, node: &str, visit: u32, fresh: SystemTime) -> SystemTime {
    let earlier = dir
        .parent()
        .and_then(|stages| earlier_attempts(stages, dir, node, visit))
        .and_then(|dirs| {
            dirs.iter()
                .rev()
                .find_map(|d| read_until(&d.join(WAIT_FILE)))
        });
    let until = earlier.unwrap_or(fresh);
    let text = serde_json::json!({ "until": humantime::format_rfc3339_millis(until).to_string() });
    // Whole or not at all: a run killed as this is written must find the end on resume, or none.
    // A wait whose end cannot be recorded still waits; it only starts over if interrupted.
    let _ = trellis_process::files::write_whole(&dir.join(WAIT_FILE), text.to_string().as_bytes());
    until
}

/// The stage directories beside `dir` of the same node and visit, in rank order, `dir` excluded:
/// those of earlier ranks, and those the store set aside as interrupted (`003-pause@1.interrupted-1`).
#[allow(
    clippy::disallowed_methods,
    reason = "runs on the blocking pool (WaitHandler::outcome)"
)]
fn earlier_attempts(stages: &Path, dir: &Path, node: &str, visit: u32) -> Option<Vec<PathBuf>> {
    // `000-node@1` less its rank: what every directory of this node and visit ends with.
    let name = stage_dir_name(0, node, visit);
    let suffix = name.trim_start_matches('0');
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(stages)
        .ok()?
        .filter_map(Result::ok)
        .map(|entry| entry.path())
        .filter(|path| path != dir)
        .filter(|path| {
            path.file_name()
                .and_then(|n| n.to_str())
                .and_then(|n| n.split_once('-'))
                .is_some_and(|(rank, rest)| {
                    let rest = rest
                        .rsplit_once(".interrupted-")
                        .map_or(rest, |(attempt, _)| attempt);
                    rank.chars().all(|c| c.is_ascii_digit())
                        && suffix.strip_prefix('-') == Some(rest)
                })
        })
        .collect();
    dirs.sort();
    Some(dirs)
}

#[allow(
    clippy::disallowed_methods,
    reason = "runs on the blocking pool (WaitHandler::outcome)"
)]
fn read_until(path: &Path) -> Option<SystemTime> {
    let text = std::fs::read_to_string(path).ok()?;
    let value: serde_json::Value = serde_json::from_str(&text).ok()?;
    humantime::parse_rfc3339(value["until"].as_str()?).ok()
}

#[cfg(test)]
#[allow(
    clippy::disallowed_methods,
    reason = "a test sets up stage directories"
)]
mod tests {
    use super::*;

    #[test]
    fn a_wait_run_again_ends_when_the_interrupted_one_would_have() {
        let stages = tempfile::tempdir().unwrap();
        let first = stages.path().join("003-pause@1.interrupted-1");
        let other_visit = stages.path().join("005-pause@2");
        let other_node = stages.path().join("006-pause2@1");
        let again = stages.path().join("003-pause@1");
        for dir in [&first, &other_visit, &other_node, &again] {
            std::fs::create_dir(dir).unwrap();
        }
        let start = humantime::parse_rfc3339("2026-11-26T10:00:00Z").unwrap();
        let until = wait_until(&first, "pause", 1, start + Duration::from_secs(5));
        assert_eq!(until, start + Duration::from_secs(5));
        // Other visits and other nodes say other things; they do not count.
        wait_until(&other_visit, "pause", 2, start + Duration::from_secs(100));
        wait_until(&other_node, "pause2", 1, start + Duration::from_secs(100));
        let later = start + Duration::from_secs(3);
        assert_eq!(
            wait_until(&again, "pause", 1, later + Duration::from_secs(5)),
            start + Duration::from_secs(5)
        );
        // A first wait of a visit starts afresh.
        let fresh = stages.path().join("008-pause@3");
        std::fs::create_dir(&fresh).unwrap();
        assert_eq!(
            wait_until(&fresh, "pause", 3, later + Duration::from_secs(5)),
            later + Duration::from_secs(5)
        );
    }
}
