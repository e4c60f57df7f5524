//! A run's event log, `events.jsonl`: one writer thread appends every event, fed by a channel, so the
//! engine's async workers never wait on the file. Each event is one `write` of one line, so a kill
//! leaves at most one torn line (which readers skip). The engine flushes the log before every
//! checkpoint; a write error is kept and reported by that flush (and by [`EventLog::close`]), never
//! dropped.

use std::fs::OpenOptions;
use std::io::{self, Write};
use std::path::Path;
use std::sync::mpsc::{Receiver, Sender, SyncSender, channel, sync_channel};
use std::sync::{Mutex, PoisonError};
use std::thread::JoinHandle;

use trellis_engine::Event;
use trellis_engine::services::EventSink;

enum Message {
    Line(Vec<u8>),
    /// Answers once every line sent before it is written: `Ok`, or the first write error.
    Flush(SyncSender<Result<(), String>>),
}

/// Cuts a log back to its last complete line.
fn repair_tail(path: &Path) -> io::Result<()> {
    use std::io::{Read as _, Seek as _, SeekFrom};
    let Ok(mut file) = OpenOptions::new().read(true).write(true).open(path) else {
        return Ok(());
    };
    let length = file.metadata()?.len();
    if length == 0 {
        return Ok(());
    }
    let mut last = [0u8];
    file.seek(SeekFrom::Start(length - 1))?;
    file.read_exact(&mut last)?;
    if last[0] == b'\n' {
        return Ok(());
    }
    // Find the last line break, reading backwards in blocks.
    let mut end = length;
    let mut block = vec![0u8; 64 * 1024];
    while end > 0 {
        let start = end.saturating_sub(block.len() as u64);
        let chunk = &mut block[..usize::try_from(end - start).unwrap_or(0)];
        file.seek(SeekFrom::Start(start))?;
        file.read_exact(chunk)?;
        if let Some(at) = chunk.iter().rposition(|b| *b == b'\n') {
            return file.set_len(start + at as u64 + 1);
        }
        end = start;
    }
    file.set_len(0)
}

/// The writer of one `events.jsonl`.
pub struct EventLog {
    sender: Mutex<Option<Sender<Message>>>,
    writer: Mutex<Option<JoinHandle<()>>>,
}

impl EventLog {
    /// Opens (or creates) the log at `path` for appending and starts its writer. A torn last line
    /// (the previous process died mid-write) is cut off first, so the next event starts a line.
    pub fn open(path: &Path) -> io::Result<Self> {
        Self::open_with(path, None)
    }

    /// Like [`EventLog::open`]; `written` is called (on the writer thread) each time the lines queued so
    /// far are in the file, so a reader tailing the log learns of them at once.
    pub fn open_with(path: &Path, written: Option<Written>) -> io::Result<Self> {
        repair_tail(path)?;
        let file = {
            use std::os::unix::fs::OpenOptionsExt as _;
            OpenOptions::new()
                .create(true)
                .append(true)
                .mode(crate::run_dir::file_mode())
                .open(path)?
        };
        let (sender, receiver) = channel();
        let writer = std::thread::Builder::new()
            .name("trellis-events".into())
            .spawn(move || write_lines(file, &receiver, written.as_deref()))?;
        Ok(Self {
            sender: Mutex::new(Some(sender)),
            writer: Mutex::new(Some(writer)),
        })
    }

    fn send(&self, message: Message) -> bool {
        self.sender
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .as_ref()
            .is_some_and(|s| s.send(message).is_ok())
    }

    /// Writes what is queued, stops the writer, and reports the first write error, if any.
    pub fn close(&self) -> io::Result<()> {
        let flushed = self.flush();
        self.sender
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(writer) = self
            .writer
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
        {
            let _ = writer.join();
        }
        flushed
    }
}

/// Told when lines are in the file.
pub type Written = std::sync::Arc<dyn Fn() + Send + Sync>;

/// The writer thread: appends lines until every sender is gone, keeping the first error; after
/// writing what was queued, tells `written`.
fn write_lines(
    mut file: std::fs::File,
    receiver: &Receiver<Message>,
    written: Option<&(dyn Fn() + Send + Sync)>,
) {
    let mut error: Option<String> = None;
    let mut unannounced = false;
    loop {
        let message = match receiver.try_recv() {
            Ok(message) => message,
            Err(std::sync::mpsc::TryRecvError::Empty) => {
                if unannounced && let Some(written) = written {
                    written();
                }
                unannounced = false;
                match receiver.recv() {
                    Ok(message) => message,
                    Err(_) => return,
                }
            }
            Err(std::sync::mpsc::TryRecvError::Disconnected) => break,
        };
        match message {
            Message::Line(line) => {
                if let Err(e) = file.write_all(&line)
                    && error.is_none()
                {
                    error = Some(e.to_string());
                }
                unannounced = true;
            }
            Message::Flush(answer) => {
                let _ = answer.send(error.clone().map_or(Ok(()), Err));
            }
        }
    }
    if unannounced && let Some(written) = written {
        written();
    }
}

impl EventSink for EventLog {
    fn emit(&self, event: &Event) {
        if event.kind.is_live_only() {
            return;
        }
        if let Ok(mut line) = serde_json::to_vec(event) {
            line.push(b'\n');
            self.send(Message::Line(line));
        }
    }

    fn flush(&self) -> io::Result<()> {
        let (answer, answered) = sync_channel(1);
        if !self.send(Message::Flush(answer)) {
            return Err(io::Error::other("the event log is closed"));
        }
        match answered.recv() {
            Ok(Ok(())) => Ok(()),
            Ok(Err(error)) => Err(io::Error::other(format!(
                "cannot write the event log: {error}"
            ))),
            Err(_) => Err(io::Error::other("the event log's writer stopped")),
        }
    }
}

impl Drop for EventLog {
    fn drop(&mut self) {
        let _ = self.close();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use trellis_engine::event::EventKind;

    fn event(seq: u64) -> Event {
        Event {
            seq,
            ts: "t".into(),
            run_id: "R".into(),
            node_id: None,
            kind: EventKind::CheckpointSaved { next_node: None },
        }
    }

    #[test]
    fn a_flush_returns_once_every_event_before_it_is_written() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("events.jsonl");
        let log = EventLog::open(&path).unwrap();
        for seq in 1..=100 {
            log.emit(&event(seq));
        }
        log.flush().unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(text.lines().count(), 100);
        log.close().unwrap();
        assert!(log.flush().is_err(), "a closed log says so");
    }

    #[test]
    fn write_errors_are_reported_by_the_next_flush() {
        // /dev/full accepts the open and fails every write with "no space left on device".
        let log = EventLog::open(Path::new("/dev/full")).unwrap();
        log.emit(&event(1));
        let error = log.flush().unwrap_err().to_string();
        assert!(error.contains("cannot write the event log"), "{error}");
    }
}
