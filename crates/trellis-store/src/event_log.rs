//! A run's event log, `events.jsonl`. An event is queued as one line, without waiting on the file: a
//! writer thread appends what is queued at once when the event starts something that may take a
//! while (a stage, a model or tool call: what was running when a process died is in its log) or
//! comes after a quiet spell, and otherwise every few milliseconds; the engine, before every
//! checkpoint, appends what is still queued itself. So a checkpoint never names an event the file
//! lacks, and a run that finishes stages quickly pays for neither a thread switch per event nor a
//! round trip per checkpoint. Lines reach the file in order, whole lines in one `write`, so a kill
//! leaves at most one torn line (which readers skip). A write error is kept and reported by the next
//! flush (and by [`EventLog::close`]), never dropped.

use std::io::{self, Write};
use std::path::Path;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use parking_lot::{Condvar, Mutex};
use trellis_engine::Event;
use trellis_engine::services::EventSink;
use trellis_process::files::{Access, open_record};

/// How long a queued line may wait for the writer while events keep coming.
const TICK: Duration = Duration::from_millis(10);
/// Ticks without an event after which the writer sleeps until the next one.
const IDLE_TICKS: u32 = 10;

/// Lines not yet in the file, and the writer thread's state.
#[derive(Default)]
struct Queue {
    lines: Vec<u8>,
    /// The writer sleeps until told: the next line wakes it.
    idle: bool,
    closed: bool,
}

/// The file and what happened to it.
struct Sink {
    file: std::fs::File,
    /// The first write error.
    error: Option<String>,
    written: Option<Written>,
}

struct Shared {
    queue: Mutex<Queue>,
    wake: Condvar,
    /// Held while lines are taken from the queue and written, so they reach the file in order
    /// whoever writes them.
    sink: Mutex<Sink>,
}

impl Shared {
    /// Appends every queued line; then tells `written`. Returns the first write error, if any.
    fn write_queued(&self) -> io::Result<()> {
        let mut sink = self.sink.lock();
        let lines = std::mem::take(&mut self.queue.lock().lines);
        if !lines.is_empty() {
            if let Err(e) = sink.file.write_all(&lines)
                && sink.error.is_none()
            {
                sink.error = Some(e.to_string());
            }
            if let Some(written) = &sink.written {
                written();
            }
        }
        match &sink.error {
            Some(error) => Err(io::Error::other(format!(
                "cannot write the event log: {error}"
            ))),
            None => Ok(()),
        }
    }
}

/// Cuts a log back to its last complete line.
fn repair_tail(path: &Path) -> io::Result<()> {
    use std::io::{Read as _, Seek as _, SeekFrom};
    let Ok(mut file) = open_record(path, Access::ReadWrite) else {
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
    shared: Arc<Shared>,
    writer: Mutex<Option<JoinHandle<()>>>,
}

impl EventLog {
    /// Opens (or creates) the log at `path` for appending and starts its writer. A torn last line
    /// (the previous process died mid-write) is cut off first, so the next event starts a line.
    pub fn open(path: &Path) -> io::Result<Self> {
        Self::open_with(path, None)
    }

    /// Like [`EventLog::open`]; `written` is called each time queued lines are in the file, so a
    /// reader tailing the log learns of them at once.
    pub fn open_with(path: &Path, written: Option<Written>) -> io::Result<Self> {
        repair_tail(path)?;
        Self::appending_to(open_record(path, Access::Append)?, written)
    }

    /// The log written to `file`, open for appending, and its writer started.
    fn appending_to(file: std::fs::File, written: Option<Written>) -> io::Result<Self> {
        let shared = Arc::new(Shared {
            queue: Mutex::default(),
            wake: Condvar::new(),
            sink: Mutex::new(Sink {
                file,
                error: None,
                written,
            }),
        });
        let writer = {
            let shared = shared.clone();
            std::thread::Builder::new()
                .name("trellis-events".into())
                .spawn(move || write_lines(&shared))?
        };
        Ok(Self {
            shared,
            writer: Mutex::new(Some(writer)),
        })
    }

    /// Stops taking events and the writer, writes what is queued, and reports the first write
    /// error, if any.
    pub fn close(&self) -> io::Result<()> {
        self.shared.queue.lock().closed = true;
        self.shared.wake.notify_one();
        if let Some(writer) = self.writer.lock().take() {
            let _ = writer.join();
        }
        self.shared.write_queued()
    }
}

/// Told when lines are in the file.
pub type Written = std::sync::Arc<dyn Fn() + Send + Sync>;

/// The writer thread: appends what is queued when woken (see [`EventSink::emit`] for
/// [`EventLog`]) and every [`TICK`] while events come, sleeps once they stop, and ends when the log
/// is closed.
fn write_lines(shared: &Shared) {
    // Idle until the first event, which is then written at once.
    let mut quiet_ticks = IDLE_TICKS;
    loop {
        {
            let mut queue = shared.queue.lock();
            while queue.lines.is_empty() && !queue.closed {
                if quiet_ticks >= IDLE_TICKS {
                    queue.idle = true;
                    shared.wake.wait(&mut queue);
                    queue.idle = false;
                } else {
                    shared.wake.wait_for(&mut queue, TICK);
                    quiet_ticks += 1;
                }
            }
            if queue.closed {
                // What is still queued, `close` writes.
                return;
            }
        }
        quiet_ticks = 0;
        let _ = shared.write_queued();
    }
}

impl EventSink for EventLog {
    fn emit(&self, event: &Event) {
        if event.kind.is_live_only() {
            return;
        }
        let Ok(line) = serde_json::to_vec(event) else {
            return;
        };
        let mut queue = self.shared.queue.lock();
        if queue.closed {
            return;
        }
        queue.lines.extend_from_slice(&line);
        queue.lines.push(b'\n');
        if queue.idle || event.kind.starts_work() {
            queue.idle = false;
            self.shared.wake.notify_one();
        }
    }

    /// Appends what is queued, on the calling thread (the engine calls it from its blocking pool).
    fn flush(&self) -> io::Result<()> {
        if self.shared.queue.lock().closed {
            return Err(io::Error::other("the event log is closed"));
        }
        self.shared.write_queued()
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
            agent_id: None,
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

    /// Waits (up to five seconds) until the log at `path` holds `lines` lines.
    fn wait_for_lines(path: &Path, lines: usize) -> usize {
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        loop {
            let found = std::fs::read_to_string(path).map_or(0, |t| t.lines().count());
            if found >= lines || std::time::Instant::now() > deadline {
                return found;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    #[test]
    fn the_writer_appends_events_without_a_flush_and_wakes_from_idle() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("events.jsonl");
        let log = EventLog::open(&path).unwrap();
        log.emit(&event(1));
        log.emit(&event(2));
        assert_eq!(
            wait_for_lines(&path, 2),
            2,
            "a busy run's events reach the file"
        );
        // Long enough without events for the writer to sleep until the next one.
        std::thread::sleep(TICK * (IDLE_TICKS + 5));
        log.emit(&event(3));
        assert_eq!(
            wait_for_lines(&path, 3),
            3,
            "the next event wakes the writer"
        );
        // Queued just before the log closes: the close writes it.
        log.emit(&event(4));
        log.close().unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        let seqs: Vec<u64> = text
            .lines()
            .map(|l| {
                serde_json::from_str::<serde_json::Value>(l).unwrap()["seq"]
                    .as_u64()
                    .unwrap()
            })
            .collect();
        assert_eq!(seqs, [1, 2, 3, 4]);
    }

    #[test]
    fn write_errors_are_reported_by_the_next_flush() {
        // /dev/full accepts the open and fails every write with "no space left on device" (a
        // record's file must be a regular one: the device is given as the log's file).
        let full = std::fs::OpenOptions::new()
            .append(true)
            .open("/dev/full")
            .unwrap();
        let log = EventLog::appending_to(full, None).unwrap();
        log.emit(&event(1));
        let error = log.flush().unwrap_err().to_string();
        assert!(error.contains("cannot write the event log"), "{error}");
    }
}
