//! Steering: a message a person sends a running agent stage (`trellis steer`, the API, the page),
//! delivered to its model before the next call. A built-in agent stage takes messages while its
//! `inbox/` directory exists in its stage directory: a sender writes one file per message there
//! (a temporary name, then renamed, so the agent never reads half a message); the agent takes them
//! in the order sent before each model call. When the stage ends it renames the directory away
//! (`inbox.closed`) and reports what came too late as undelivered: a message is delivered, or said
//! to be undelivered, or refused to its sender — never dropped without a word.

#![allow(
    clippy::disallowed_methods,
    reason = "a stage's inbox is read and written on the blocking pool, or by a synchronous sender"
)]

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use serde::{Deserialize, Serialize};

/// The directory of a stage's messages, while it takes them.
pub const INBOX: &str = "inbox";
/// What the directory becomes when the stage ends.
const CLOSED: &str = "inbox.closed";

/// One message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Message {
    pub text: String,
    /// When it was sent (RFC 3339).
    pub sent_at: String,
}

/// Whether the stage in `stage_dir` takes messages now.
pub fn takes_messages(stage_dir: &Path) -> bool {
    fs::symlink_metadata(stage_dir.join(INBOX)).is_ok_and(|m| m.is_dir())
}

/// Why a message was not sent.
#[derive(Debug, thiserror::Error)]
pub enum SendError {
    #[error("the stage takes no messages (it has ended, or it is not a built-in agent stage)")]
    NotTaking,
    #[error("cannot write the message: {0}")]
    Io(#[from] io::Error),
}

/// Sends `text` to the stage in `stage_dir`.
pub fn send(stage_dir: &Path, text: &str, sent_at: String) -> Result<(), SendError> {
    static SENT: AtomicU64 = AtomicU64::new(0);
    let inbox = stage_dir.join(INBOX);
    if !takes_messages(stage_dir) {
        return Err(SendError::NotTaking);
    }
    // Names sort in the order sent: the time, then this process and its count.
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let name = format!(
        "{nanos:024}-{}-{:06}.json",
        std::process::id(),
        SENT.fetch_add(1, Ordering::Relaxed)
    );
    let message = Message {
        text: text.to_owned(),
        sent_at,
    };
    let written = serde_json::to_vec(&message)
        .map_err(io::Error::other)
        .and_then(|bytes| trellis_process::files::write_whole(&inbox.join(&name), &bytes));
    match written {
        Ok(()) => Ok(()),
        // The stage closed its inbox meanwhile: the message went nowhere.
        Err(e) if e.kind() == io::ErrorKind::NotFound => Err(SendError::NotTaking),
        Err(e) => Err(e.into()),
    }
}

/// A stage's inbox, open while the stage runs. Dropped without [`Inbox::close`] (the stage was
/// cancelled), it stops taking messages and leaves those not taken in `inbox.closed`.
#[derive(Debug)]
pub struct Inbox {
    stage_dir: PathBuf,
    closed: bool,
}

impl Inbox {
    /// Opens the inbox of the stage in `stage_dir`: it takes messages from now on.
    pub fn open(stage_dir: &Path) -> io::Result<Self> {
        fs::create_dir(stage_dir.join(INBOX))?;
        Ok(Self {
            stage_dir: stage_dir.to_path_buf(),
            closed: false,
        })
    }

    /// The messages sent since the last look, oldest first; each is taken out of the inbox.
    pub fn take(&self) -> Vec<Message> {
        take_from(&self.stage_dir.join(INBOX))
    }

    /// Stops taking messages; returns those that came after the last [`Self::take`].
    pub fn close(mut self) -> Vec<Message> {
        self.closed = true;
        let closed = self.stage_dir.join(CLOSED);
        if fs::rename(self.stage_dir.join(INBOX), &closed).is_err() {
            return Vec::new();
        }
        let late = take_from(&closed);
        let _ = fs::remove_dir_all(&closed);
        late
    }
}

impl Drop for Inbox {
    fn drop(&mut self) {
        if !self.closed {
            let _ = fs::rename(self.stage_dir.join(INBOX), self.stage_dir.join(CLOSED));
        }
    }
}

fn take_from(dir: &Path) -> Vec<Message> {
    let Ok(entries) = fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut names: Vec<PathBuf> = entries
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| !n.starts_with('.'))
        })
        .collect();
    names.sort();
    names
        .into_iter()
        .filter_map(|path| {
            let bytes = fs::read(&path).ok();
            let _ = fs::remove_file(&path);
            serde_json::from_slice(&bytes?).ok()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at() -> String {
        "2026-11-26T00:00:00Z".to_owned()
    }

    #[test]
    fn messages_arrive_in_order_once_and_late_ones_are_handed_back() {
        let stage = tempfile::tempdir().unwrap();
        assert!(matches!(
            send(stage.path(), "too early", at()),
            Err(SendError::NotTaking)
        ));
        let inbox = Inbox::open(stage.path()).unwrap();
        assert!(takes_messages(stage.path()));
        send(stage.path(), "first", at()).unwrap();
        send(stage.path(), "second", at()).unwrap();
        let texts: Vec<String> = inbox.take().into_iter().map(|m| m.text).collect();
        assert_eq!(texts, ["first", "second"]);
        assert_eq!(inbox.take(), [] as [Message; 0]);
        send(stage.path(), "late", at()).unwrap();
        let late: Vec<String> = inbox.close().into_iter().map(|m| m.text).collect();
        assert_eq!(late, ["late"]);
        assert!(!takes_messages(stage.path()));
        assert!(matches!(
            send(stage.path(), "after", at()),
            Err(SendError::NotTaking)
        ));
        assert!(!stage.path().join(CLOSED).exists());
    }
}
