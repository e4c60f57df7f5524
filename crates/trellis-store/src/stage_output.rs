//! A stage's output as it is written: a command's `stdout.log` and `stderr.log`, an agent's
//! `transcript.jsonl`. [`StageOutput`] remembers how far it has read each file and returns what was
//! added since, in whole lines (a line still being written waits for its end, unless the stage is
//! over), so every follower — the server's live stream, `trellis logs --follow`, the terminal's live
//! line — reads the files the stage writes and nothing is copied into the event log.

use std::fmt;
use std::fs::File;
use std::io::{self, Read as _, Seek as _, SeekFrom};
use std::path::{Path, PathBuf};
use std::str::FromStr;

/// One of a stage's output files.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Stream {
    Stdout,
    Stderr,
    /// An agent's transcript: one JSON entry a line.
    Transcript,
}

impl Stream {
    pub const ALL: [Stream; 3] = [Stream::Stdout, Stream::Stderr, Stream::Transcript];

    /// The file the stage writes it to.
    pub fn file(self) -> &'static str {
        match self {
            Stream::Stdout => "stdout.log",
            Stream::Stderr => "stderr.log",
            Stream::Transcript => "transcript.jsonl",
        }
    }

    /// Its name in streams and messages: `stdout`, `stderr`, `transcript`.
    pub fn name(self) -> &'static str {
        match self {
            Stream::Stdout => "stdout",
            Stream::Stderr => "stderr",
            Stream::Transcript => "transcript",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// What was added to one file: whole lines, each ending in `\n` (except a last line the stage left
/// unfinished when it ended).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chunk {
    pub stream: Stream,
    pub text: String,
    /// Where a follower is once it has this chunk (and the ones before it).
    pub then: Position,
}

/// How far each file has been read: written `12.0.3400` (stdout, stderr, transcript), which is what
/// a live stream sends as an event's id and takes back as `Last-Event-ID`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Position([u64; 3]);

impl fmt::Display for Position {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let [out, err, transcript] = self.0;
        write!(f, "{out}.{err}.{transcript}")
    }
}

impl FromStr for Position {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let parts: Vec<&str> = text.trim().split('.').collect();
        let numbers: Option<Vec<u64>> = parts.iter().map(|p| p.parse().ok()).collect();
        match numbers.as_deref() {
            Some(&[out, err, transcript]) => Ok(Self([out, err, transcript])),
            _ => Err(format!(
                "`{text}` is not an output position (three byte offsets: `stdout.stderr.transcript`)"
            )),
        }
    }
}

/// Where a stage is, as a follower of its output sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StageState {
    /// No `status.json` yet, or one that says it waits for input.
    Running,
    /// Its `status.json` holds its outcome: everything it wrote is in its files.
    Ended,
}

/// Reads what a stage added to its output files since the last read.
#[derive(Debug, Clone)]
pub struct StageOutput {
    dir: PathBuf,
    at: Position,
}

impl StageOutput {
    /// Follows the stage whose directory is `dir` from `at` (the start: [`Position::default`]).
    pub fn new(dir: impl Into<PathBuf>, at: Position) -> Self {
        Self {
            dir: dir.into(),
            at,
        }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// How far it has read.
    pub fn position(&self) -> Position {
        self.at
    }

    /// Moves to the last `bytes` of each file (where the latest line is), skipping what comes
    /// before; files that do not exist yet are read from their start.
    pub fn skip_to_last(&mut self, bytes: u64) {
        for stream in Stream::ALL {
            let len = std::fs::metadata(self.dir.join(stream.file())).map_or(0, |m| m.len());
            let at = &mut self.at.0[stream.index()];
            *at = (*at).max(len.saturating_sub(bytes));
        }
    }

    /// Whether the stage has ended (its outcome is in `status.json`).
    pub fn state(&self) -> StageState {
        let Ok(text) = std::fs::read_to_string(self.dir.join("status.json")) else {
            return StageState::Running;
        };
        match serde_json::from_str::<trellis_engine::status_file::StatusFile>(&text) {
            Ok(status) if !status.waiting_for_input => StageState::Ended,
            _ => StageState::Running,
        }
    }

    /// What was added to each file since the last read, at most about `limit` bytes of each.
    /// With `whole`, a last line without its newline is returned too (the stage is over and will
    /// not finish it); otherwise it waits for its end — unless it alone fills `limit`.
    pub fn read(&mut self, limit: u64, whole: bool) -> io::Result<Vec<Chunk>> {
        let mut chunks = Vec::new();
        for stream in Stream::ALL {
            let at = self.at.0[stream.index()];
            let Some(bytes) = read_from(&self.dir.join(stream.file()), at, limit)? else {
                continue;
            };
            let full = bytes.len() as u64 >= limit;
            let end = match bytes.iter().rposition(|&b| b == b'\n') {
                _ if whole => bytes.len(),
                Some(newline) => newline + 1,
                None if full => bytes.len(),
                None => 0,
            };
            if end == 0 {
                continue;
            }
            self.at.0[stream.index()] = at + end as u64;
            chunks.push(Chunk {
                stream,
                text: String::from_utf8_lossy(&bytes[..end]).into_owned(),
                then: self.at,
            });
        }
        Ok(chunks)
    }
}

/// Up to `limit` bytes of `path` from `offset`; `None` when the file does not exist (yet) or has
/// nothing past `offset`.
fn read_from(path: &Path, offset: u64, limit: u64) -> io::Result<Option<Vec<u8>>> {
    let mut file = match File::open(path) {
        Ok(file) => file,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    if file.metadata()?.len() <= offset {
        return Ok(None);
    }
    file.seek(SeekFrom::Start(offset))?;
    let mut bytes = Vec::new();
    file.take(limit).read_to_end(&mut bytes)?;
    Ok((!bytes.is_empty()).then_some(bytes))
}

/// The last non-empty line of `text`, without its newline (what a one-line display shows).
pub fn last_line(text: &str) -> Option<&str> {
    text.lines()
        .rev()
        .map(str::trim_end)
        .find(|l| !l.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write as _;

    fn append(dir: &Path, file: &str, text: &str) {
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join(file))
            .unwrap();
        f.write_all(text.as_bytes()).unwrap();
    }

    #[test]
    fn it_returns_whole_lines_once_and_resumes_from_a_position() {
        let dir = tempfile::tempdir().unwrap();
        let mut output = StageOutput::new(dir.path(), Position::default());
        assert_eq!(output.read(1 << 20, false).unwrap(), [] as [Chunk; 0]);
        append(dir.path(), "stdout.log", "one\ntw");
        append(dir.path(), "stderr.log", "warn\n");
        let chunks = output.read(1 << 20, false).unwrap();
        assert_eq!(
            chunks,
            vec![
                Chunk {
                    stream: Stream::Stdout,
                    text: "one\n".into(),
                    then: Position([4, 0, 0]),
                },
                Chunk {
                    stream: Stream::Stderr,
                    text: "warn\n".into(),
                    then: Position([4, 5, 0]),
                }
            ]
        );
        let position = output.position();
        assert_eq!(position.to_string(), "4.5.0");
        assert_eq!(position.to_string().parse::<Position>(), Ok(position));
        append(dir.path(), "stdout.log", "o\nthree");
        let mut resumed = StageOutput::new(dir.path(), position);
        assert_eq!(resumed.read(1 << 20, false).unwrap()[0].text, "two\n");
        // The stage is over: its unfinished last line comes too.
        assert_eq!(resumed.read(1 << 20, true).unwrap()[0].text, "three");
        assert_eq!(resumed.read(1 << 20, true).unwrap(), [] as [Chunk; 0]);
    }

    #[test]
    fn a_line_longer_than_the_limit_still_comes_and_skipping_finds_the_latest_line() {
        let dir = tempfile::tempdir().unwrap();
        append(dir.path(), "stdout.log", &"x".repeat(100));
        let mut output = StageOutput::new(dir.path(), Position::default());
        assert_eq!(output.read(40, false).unwrap()[0].text.len(), 40);
        append(dir.path(), "stdout.log", "\nfirst\nlatest\n");
        let mut tail = StageOutput::new(dir.path(), Position::default());
        tail.skip_to_last(8);
        let text = &tail.read(1 << 20, false).unwrap()[0].text;
        assert_eq!(last_line(text), Some("latest"));
    }

    #[test]
    fn positions_that_are_not_three_offsets_are_refused() {
        assert!("1.2".parse::<Position>().is_err());
        assert!("a.b.c".parse::<Position>().is_err());
        assert_eq!("1.2.3".parse::<Position>().unwrap(), Position([1, 2, 3]));
    }

    #[test]
    fn a_stage_ends_with_an_outcome_not_while_it_waits() {
        let dir = tempfile::tempdir().unwrap();
        let output = StageOutput::new(dir.path(), Position::default());
        assert_eq!(output.state(), StageState::Running);
        let waiting = trellis_engine::status_file::StatusFile::waiting("gate", 1, 1, 5);
        std::fs::write(
            dir.path().join("status.json"),
            serde_json::to_string(&waiting).unwrap(),
        )
        .unwrap();
        assert_eq!(output.state(), StageState::Running);
        let done = trellis_engine::status_file::StatusFile::finished(
            &trellis_engine::Outcome::success(),
            "gate",
            1,
            1,
            5,
        );
        std::fs::write(
            dir.path().join("status.json"),
            serde_json::to_string(&done).unwrap(),
        )
        .unwrap();
        assert_eq!(output.state(), StageState::Ended);
    }
}
