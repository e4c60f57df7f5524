//! One run's directory: creating it, stage directories, atomic checkpoint snapshots and the checkpoint
//! journal, status writes, the event log, and `run.json`. Also finding runs again by id or path.

use std::fs::{self, File};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use trellis_engine::checkpoint::JournalEntry;
use trellis_engine::services::{BlobStore as _, RunStore};
use trellis_engine::status_file::StatusFile;
use trellis_engine::{Checkpoint, Event, RunStatus};
use trellis_process::files::{self, Access};

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("cannot {action} {path}: {source}")]
    Io {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{path} is not a valid {what}: {source}")]
    Corrupt {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("no run `{id}` in {runs_dir}")]
    NotFound { id: String, runs_dir: PathBuf },
    #[error("run {run_id} is in use by {}; wait for it to finish, or stop that process first", owner.map_or_else(|| "another process".to_owned(), |pid| format!("process {pid}")))]
    Busy { run_id: String, owner: Option<u32> },
    #[error("`{id}` is the start of {} runs in {runs_dir}: {}; give more of the id", candidates.len(), candidates.join(", "))]
    Ambiguous {
        id: String,
        runs_dir: PathBuf,
        candidates: Vec<String>,
    },
}

/// `run.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunMeta {
    pub run_id: String,
    pub workflow: String,
    pub goal: Option<String>,
    pub source_path: String,
    pub status: RunStatus,
    pub started_at: String,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    /// When the run last stopped: finished, cancelled or interrupted (none while it runs or waits
    /// for input).
    pub ended_at: Option<String>,
    pub settings: trellis_engine::Settings,
    /// The run file the run was started from (`trellis run run.toml`); its text is kept beside, as
    /// `run.toml`.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub run_file: Option<String>,
    /// The Temporal service the run was submitted to (`trellis run --temporal`): its workers run
    /// it, and it, not a local process, says whether the run is alive.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub temporal: Option<TemporalTarget>,
    /// Where a run on Temporal keeps its working tree when its workers do not share one
    /// (`trellis run --temporal --workspace git`).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub workspace: Option<GitWorkspace>,
    /// The node whose last response is the run's answer, printed when the run ends, resumed or not
    /// (`trellis exec`'s agent).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub answer_node: Option<String>,
}

/// A run's working tree kept on a git remote: each worker that runs the run checks it out from the
/// run's ref there (`refs/trellis/runs/<run id>`, which starts at `commit`) and pushes it back
/// before each step of the run is saved.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GitWorkspace {
    /// The remote, as the submitting repository's `origin` names it.
    pub remote: String,
    /// The commit the run started from.
    pub commit: String,
}

/// Where a run on Temporal lives: the service's address, the namespace and the shared task queue.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TemporalTarget {
    pub address: String,
    pub namespace: String,
    pub task_queue: String,
}

/// A new run id: a ULID, so ids sort by time.
/// Whether `name` is one plain name in a folder: not empty, `.` or `..`, and without a separator
/// (or a NUL): a name taken from a record or a request that cannot lead out of the folder.
pub fn plain_name(name: &str) -> bool {
    !name.is_empty() && name != "." && name != ".." && !name.contains(['/', '\\', '\0'])
}

pub fn new_run_id() -> String {
    ulid::Ulid::generate().to_string()
}

/// The runs directory to use: the one given, else the default, made absolute so that paths built from
/// it compare equal to paths found by walking the work directory.
pub fn resolve_runs_dir(given: Option<PathBuf>) -> PathBuf {
    let dir = given.unwrap_or_else(default_runs_dir);
    std::path::absolute(&dir).unwrap_or(dir)
}

/// `$TRELLIS_RUNS_DIR`, else `~/.trellis/runs`.
pub fn default_runs_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("TRELLIS_RUNS_DIR") {
        return PathBuf::from(dir);
    }
    std::env::var_os("HOME").map_or_else(
        || PathBuf::from(".trellis/runs"),
        |home| PathBuf::from(home).join(".trellis/runs"),
    )
}

/// Writes a file so that a crash leaves either the old or the new content, whole: temp file, fsync,
/// rename (DESIGN.md §4). The content is on disk before the name points at it.
pub fn write_atomically(path: &Path, bytes: &[u8]) -> io::Result<()> {
    write_atomically_with(path, |file| file.write_all(bytes))
}

/// [`write_atomically`], with the content written by `write` (so a large document can be
/// serialized straight into the file rather than built in memory first).
fn write_atomically_with(
    path: &Path,
    write: impl FnOnce(&mut io::BufWriter<File>) -> io::Result<()>,
) -> io::Result<()> {
    files::write_whole_with(path, true, write)
}

/// Writes a file so that a reader never sees part of it — temp file, rename — without waiting for
/// the disk: a kill leaves the old content or the new, whole; a crash of the machine may leave
/// neither (the caller syncs it later, see [`crate::FileBlobs`]).
pub(crate) use files::write_whole;

/// Creates a record directory (and its parents) with the record's permissions, following no link
/// on its way ([`files::create_folders`]: a record's paths are resolved, so one there was planted).
pub(crate) fn private_dir(path: &Path) -> io::Result<()> {
    files::create_folders(path, files::record_folder_mode())
}

/// Run directories under `runs_dir`, newest first.
pub fn list_runs(runs_dir: &Path) -> Vec<PathBuf> {
    let mut runs: Vec<PathBuf> = fs::read_dir(runs_dir)
        .map(|entries| {
            entries
                .filter_map(Result::ok)
                .map(|e| e.path())
                .filter(|p| p.join("run.json").is_file())
                .collect()
        })
        .unwrap_or_default();
    runs.sort();
    runs.reverse();
    runs
}

/// The on-disk record of one run.
pub struct RunDir {
    /// The run's folder, resolved (no link on its way, nor `.` or `..`): the record's files are
    /// opened following no link ([`files::open_record`]), as a command may plant one in it.
    root: PathBuf,
    /// `journal.jsonl`, open for appending once the first entry is written.
    journal: parking_lot::Mutex<Option<std::sync::Arc<File>>>,
}

fn io_error(action: &'static str, path: &Path) -> impl FnOnce(io::Error) -> StoreError {
    let path = path.to_path_buf();
    move |source| StoreError::Io {
        action,
        path,
        source,
    }
}

impl RunDir {
    /// Creates `<runs_dir>/<run_id>/` with the workflow source and `run.json`, owned by this process
    /// (see [`Self::claim`]) before `run.json` makes it a run: a reader never sees a new run without
    /// its owner and takes it for an interrupted one.
    pub fn create(
        runs_dir: &Path,
        meta: &RunMeta,
        source: &str,
        source_name: &str,
    ) -> Result<(Self, crate::Owner), StoreError> {
        fs::create_dir_all(runs_dir).map_err(io_error("create", runs_dir))?;
        let root = fs::canonicalize(runs_dir)
            .map_err(io_error("resolve", runs_dir))?
            .join(&meta.run_id);
        private_dir(&root.join("stages")).map_err(io_error("create", &root))?;
        let workflow_file = root.join(source_name);
        files::create_no_link(&workflow_file)
            .and_then(|mut file| file.write_all(source.as_bytes()))
            .map_err(io_error("write", &workflow_file))?;
        let dir = Self::resolved(root);
        let owner = dir.claim(&meta.run_id)?;
        dir.write_meta(meta)?;
        Ok((dir, owner))
    }

    /// The record at `root`, resolved (see [`Self::root`]; as given when it cannot be: a record
    /// that is not there fails on its first read).
    fn open_dir(root: PathBuf) -> Self {
        Self::resolved(fs::canonicalize(&root).unwrap_or(root))
    }

    /// The record at `root`, resolved already (made below a resolved folder).
    fn resolved(root: PathBuf) -> Self {
        Self {
            root,
            journal: parking_lot::Mutex::new(None),
        }
    }

    /// Opens an existing run by directory path, or by id (or unique id prefix) under `runs_dir`.
    pub fn open(reference: &str, runs_dir: &Path) -> Result<Self, StoreError> {
        let as_path = Path::new(reference);
        if as_path.join("run.json").is_file() {
            return Ok(Self::open_dir(as_path.to_path_buf()));
        }
        let direct = runs_dir.join(reference);
        if direct.join("run.json").is_file() {
            return Ok(Self::open_dir(direct));
        }
        let matches: Vec<PathBuf> = list_runs(runs_dir)
            .into_iter()
            .filter(|p| {
                p.file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with(reference))
            })
            .collect();
        match matches.as_slice() {
            [only] if !reference.is_empty() => Ok(Self::open_dir(only.clone())),
            [_, _, ..] if !reference.is_empty() => Err(StoreError::Ambiguous {
                id: reference.to_owned(),
                runs_dir: runs_dir.to_path_buf(),
                candidates: matches
                    .iter()
                    .filter_map(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
                    .collect(),
            }),
            _ => Err(StoreError::NotFound {
                id: reference.to_owned(),
                runs_dir: runs_dir.to_path_buf(),
            }),
        }
    }

    /// The run's folder, resolved.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Follows the output of the stage whose directory is `stages/<name>` from `at`; `None` when
    /// `name` is not a plain directory name of this run or the directory is not there.
    pub fn stage_output(&self, name: &str, at: crate::Position) -> Option<crate::StageOutput> {
        let dir = self.root.join("stages").join(name);
        let is_dir = fs::symlink_metadata(&dir).is_ok_and(|m| m.is_dir());
        (plain_name(name) && is_dir).then(|| crate::StageOutput::new(dir, at))
    }

    /// The text of the file `file` (`response.md`, ...) of the stage whose directory is
    /// `stages/<name>`, read following no link; `None` when either is not a plain name or the file
    /// cannot be read as text.
    pub fn stage_text(&self, name: &str, file: &str) -> Option<String> {
        use std::io::Read as _;
        if !plain_name(name) || !plain_name(file) {
            return None;
        }
        let path = self.root.join("stages").join(name).join(file);
        let mut text = String::new();
        files::open_record(&path, Access::Read)
            .and_then(|mut opened| opened.read_to_string(&mut text))
            .ok()
            .map(|_| text)
    }

    pub fn blobs_dir(&self) -> PathBuf {
        self.root.join("blobs")
    }

    pub fn events_path(&self) -> PathBuf {
        self.root.join("events.jsonl")
    }

    /// Opens the run's event log for appending (its writer thread starts now).
    pub fn event_log(&self, written: Option<crate::Written>) -> io::Result<crate::EventLog> {
        crate::EventLog::open_with(&self.events_path(), written)
    }

    pub fn checkpoint_path(&self) -> PathBuf {
        self.root.join("checkpoint.json")
    }

    pub fn journal_path(&self) -> PathBuf {
        self.root.join("journal.jsonl")
    }

    fn owner_path(&self) -> PathBuf {
        self.root.join("owner")
    }

    /// Makes this process the run's one owner until the returned [`crate::Owner`] is dropped (or the process
    /// dies); a run another live process owns is [`StoreError::Busy`].
    pub fn claim(&self, run_id: &str) -> Result<crate::Owner, StoreError> {
        let path = self.owner_path();
        crate::owner::claim(&path).map_err(|claim| match claim {
            crate::owner::Claim::Busy(owner) => StoreError::Busy {
                run_id: run_id.to_owned(),
                owner,
            },
            crate::owner::Claim::Io(source) => io_error("lock", &path)(source),
        })
    }

    /// The run's status as a reader should see it: `run.json`'s, except that a run recorded as
    /// `running` whose owner is gone (killed, or the machine restarted) is `interrupted`. A run on
    /// Temporal has no local owner between its stages: its record says how it stands.
    pub fn status(&self, meta: &RunMeta) -> RunStatus {
        if meta.status == RunStatus::Running && meta.temporal.is_none() && !self.has_live_owner() {
            return RunStatus::Interrupted;
        }
        meta.status
    }

    /// The pid of the process that owns (or last owned) the run; check [`Self::has_live_owner`] too.
    pub fn owner_pid(&self) -> Option<u32> {
        crate::owner::pid(&self.owner_path())
    }

    /// Whether a live process owns the run.
    pub fn has_live_owner(&self) -> bool {
        crate::owner::is_owned(&self.owner_path())
    }

    pub fn meta(&self) -> Result<RunMeta, StoreError> {
        let path = self.root.join("run.json");
        let text = fs::read_to_string(&path).map_err(io_error("read", &path))?;
        serde_json::from_str(&text).map_err(|source| StoreError::Corrupt {
            what: "run.json",
            path,
            source,
        })
    }

    pub fn write_meta(&self, meta: &RunMeta) -> Result<(), StoreError> {
        let path = self.root.join("run.json");
        let text = serde_json::to_vec_pretty(meta).unwrap_or_default();
        write_atomically(&path, &text).map_err(io_error("write", &path))
    }

    /// The checkpoint as of the last finished stage: the last snapshot with the journal entries
    /// after it replayed. A damaged `checkpoint.json` (or one missing because the process died
    /// between keeping the previous snapshot and writing the new one) gives way to the previous one,
    /// kept as `checkpoint.prev.json`, and the journal brings it up to date.
    /// The finished stages are collected from every entry (a snapshot does not hold them).
    pub fn checkpoint(&self) -> Result<Checkpoint, StoreError> {
        Ok(brought_up_to_date(self.snapshot()?, self.journal()))
    }

    /// The checkpoint a resume continues from: [`Self::checkpoint`], once the journal is cut before
    /// the first entry past the snapshot that names a blob which is missing or not what its name
    /// says (the blob removed). Blobs are synced with the journal, not when written (see
    /// [`crate::FileBlobs`]): after a crash of the machine an entry may have reached the disk and a
    /// blob it names not; the stage of that entry then runs again, as one whose entry was lost does.
    pub fn checkpoint_to_resume(&self) -> Result<Checkpoint, StoreError> {
        let snapshot = self.snapshot()?;
        let path = self.journal_path();
        let text = match read_journal(&path) {
            Ok(Some((text, _))) => text,
            Ok(None) => String::new(),
            Err(e) => return Err(io_error("read", &path)(e)),
        };
        let (mut entries, readable) = readable_entries(&text);
        let blobs = crate::FileBlobs::new(self.blobs_dir());
        let mut whole = std::collections::HashSet::new();
        let mut offset = 0;
        for (index, line) in text[..readable].split_inclusive('\n').enumerate() {
            // The snapshot was saved after a sync of the blobs its entries name.
            let past_snapshot = index as u64 >= snapshot.journal;
            let damaged = blob_references(line)
                .filter(|_| past_snapshot)
                .find(|&reference| !whole.contains(reference) && blobs.is_damaged(reference));
            if let Some(reference) = damaged {
                if let Some(file) = blobs.path_of(reference) {
                    match fs::remove_file(&file) {
                        // A blob the crash lost whole is damaged too, and already gone.
                        Err(e) if e.kind() != io::ErrorKind::NotFound => {
                            return Err(io_error("remove", &file)(e));
                        }
                        _ => {}
                    }
                }
                files::open_record(&path, Access::Write)
                    .and_then(|journal| journal.set_len(offset as u64))
                    .map_err(io_error("cut", &path))?;
                entries.truncate(index);
                break;
            }
            whole.extend(blob_references(line));
            offset += line.len();
        }
        Ok(brought_up_to_date(snapshot, entries))
    }

    /// The journal's entries, in order. Reading stops at the first line that is not an entry (a
    /// torn last line, damage) or an entry out of order: what follows it cannot be applied.
    fn journal(&self) -> Vec<JournalEntry> {
        let Ok(Some((text, _))) = read_journal(&self.journal_path()) else {
            return Vec::new();
        };
        readable_entries(&text).0
    }

    /// The last snapshot (or the one before it, when the last is damaged).
    fn snapshot(&self) -> Result<Checkpoint, StoreError> {
        let path = self.checkpoint_path();
        let read = |path: &Path| -> Result<Checkpoint, StoreError> {
            let text = fs::read_to_string(path).map_err(io_error("read", path))?;
            serde_json::from_str(&text).map_err(|source| StoreError::Corrupt {
                what: "checkpoint",
                path: path.to_path_buf(),
                source,
            })
        };
        read(&path).or_else(|error| read(&self.previous_checkpoint_path()).map_err(|_| error))
    }

    fn previous_checkpoint_path(&self) -> PathBuf {
        self.root.join("checkpoint.prev.json")
    }

    /// Removes temporary files a write left behind (a process killed, or a full disk, between
    /// writing one and renaming it into place); returns how many.
    pub fn remove_temporary_files(&self) -> usize {
        let is_temporary = |p: &Path| {
            p.extension()
                .and_then(|e| e.to_str())
                .is_some_and(|e| e.starts_with("tmp-"))
        };
        // Stage folders only: a link planted among them leads elsewhere.
        let dirs = [self.root.clone(), self.blobs_dir()].into_iter().chain(
            fs::read_dir(self.root.join("stages"))
                .into_iter()
                .flatten()
                .filter_map(Result::ok)
                .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                .map(|e| e.path()),
        );
        dirs.flat_map(|dir| {
            fs::read_dir(dir)
                .into_iter()
                .flatten()
                .filter_map(Result::ok)
        })
        .map(|e| e.path())
        .filter(|p| is_temporary(p) && fs::remove_file(p).is_ok())
        .count()
    }

    /// Every event recorded so far. A torn last line (the process died mid-write) is skipped.
    pub fn events(&self) -> Result<Vec<Event>, StoreError> {
        Ok(self.events_checked()?.0)
    }

    /// Every event recorded so far, and the (1-based) numbers of the lines that are not events —
    /// damage, or a torn last line.
    pub fn events_checked(&self) -> Result<(Vec<Event>, Vec<usize>), StoreError> {
        let path = self.events_path();
        let bytes = match fs::read(&path) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == io::ErrorKind::NotFound => Vec::new(),
            Err(e) => return Err(io_error("read", &path)(e)),
        };
        let mut events = Vec::new();
        let mut bad = Vec::new();
        read_event_lines(&bytes, &mut 0, &mut events, &mut bad);
        Ok((events, bad))
    }

    /// A reader of the event log as it grows (`--follow`s).
    pub fn event_tail(&self) -> EventTail {
        EventTail {
            path: self.events_path(),
            offset: 0,
            lines: 0,
        }
    }

    /// The workflow source file kept with the run.
    pub fn source_file(&self) -> Option<PathBuf> {
        fs::read_dir(&self.root)
            .ok()?
            .filter_map(Result::ok)
            .map(|e| e.path())
            .find(|p| p.file_stem().is_some_and(|s| s == "workflow") && p.is_file())
    }
}

/// `checkpoint`, a snapshot, brought up to date by the journal's `entries`: those past the snapshot
/// replayed, and the finished stages of every one collected (a snapshot does not hold them).
fn brought_up_to_date(mut checkpoint: Checkpoint, entries: Vec<JournalEntry>) -> Checkpoint {
    // Records written before the journal existed keep their stages in the snapshot.
    checkpoint.recount();
    let snapshot_holds = checkpoint.journal;
    for entry in entries {
        if entry.n > snapshot_holds {
            checkpoint.replay(&entry);
            continue;
        }
        for change in &entry.changes {
            if matches!(change, trellis_engine::checkpoint::Change::Stage(_)) {
                checkpoint.apply(change);
            }
        }
    }
    checkpoint
}

/// The blob references a journal line holds: JSON strings that are one and nothing else, as the
/// context holds them (a text that mentions one is no reference).
fn blob_references(line: &str) -> impl Iterator<Item = &str> {
    line.match_indices(trellis_engine::services::BLOB_PREFIX)
        .filter(|&(at, _)| at > 0 && line.as_bytes()[at - 1] == b'"')
        .filter_map(|(at, _)| line[at..].split('"').next())
}

/// The journal at `path` as far as it is UTF-8 text (a line cut short inside a character ends
/// it there: no entry past it is read), and its whole length in bytes; `None` when there is none.
fn read_journal(path: &Path) -> io::Result<Option<(String, usize)>> {
    use std::io::Read as _;
    let mut bytes = Vec::new();
    match files::open_record(path, Access::Read).and_then(|mut file| file.read_to_end(&mut bytes)) {
        Ok(_) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    }
    let length = bytes.len();
    let text = String::from_utf8(bytes).unwrap_or_else(|cut| {
        let valid = cut.utf8_error().valid_up_to();
        let mut bytes = cut.into_bytes();
        bytes.truncate(valid);
        String::from_utf8(bytes).expect("cut to its valid prefix")
    });
    Ok(Some((text, length)))
}

/// The journal's entries up to the first line that is not the next entry (a torn last line, damage,
/// an entry out of order), and the length of the text they take.
fn readable_entries(text: &str) -> (Vec<JournalEntry>, usize) {
    let mut entries = Vec::new();
    let mut length = 0;
    for line in text.split_inclusive('\n') {
        if !line.ends_with('\n') {
            break;
        }
        match serde_json::from_str::<JournalEntry>(line) {
            Ok(entry) if entry.n == entries.len() as u64 + 1 => entries.push(entry),
            _ => break,
        }
        length += line.len();
    }
    (entries, length)
}

impl RunStore for RunDir {
    fn stage_dir(&self, rank: u32, node: &str, visit: u32) -> io::Result<PathBuf> {
        let dir = self
            .root
            .join("stages")
            .join(trellis_engine::services::stage_dir_name(rank, node, visit));
        if dir.exists() {
            // An attempt the process was killed in: keep what it wrote, out of the way.
            let mut n = 1;
            while dir.with_extension(format!("interrupted-{n}")).exists() {
                n += 1;
            }
            let aside = dir.with_extension(format!("interrupted-{n}"));
            fs::rename(&dir, &aside)?;
            // A kill between creating `status.json` and writing it leaves it empty: that attempt
            // has no status, and an empty file would only mislead a reader.
            let status = aside.join("status.json");
            if fs::metadata(&status).is_ok_and(|m| m.len() == 0) {
                fs::remove_file(&status)?;
            }
        }
        private_dir(&dir)?;
        Ok(dir)
    }

    fn write_status(&self, stage_dir: &Path, status: &StatusFile) -> io::Result<()> {
        // The journal is the durable truth, written after this: a stage whose status a kill cut
        // short is not in it, so it runs again in a directory of its own.
        files::create_no_link(&stage_dir.join("status.json"))?
            .write_all(&serde_json::to_vec_pretty(status).unwrap_or_default())
    }

    fn read_status(&self, stage_dir: &Path) -> io::Result<Option<StatusFile>> {
        let path = stage_dir.join("status.json");
        match fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes).map(Some).map_err(|error| {
                io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("{}: {error}", path.display()),
                )
            }),
            Err(error) if error.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(error) => Err(error),
        }
    }

    fn finished_stages(&self) -> io::Result<Vec<trellis_engine::StageRecord>> {
        self.checkpoint()
            .map(|c| c.stages)
            .map_err(|e| io::Error::other(e.to_string()))
    }

    fn append_journal(&self, entries: &[JournalEntry]) -> io::Result<()> {
        let mut lines = Vec::new();
        for entry in entries {
            serde_json::to_writer(&mut lines, entry)?;
            lines.push(b'\n');
        }
        let mut journal = self.journal.lock();
        if journal.is_none() {
            let path = self.journal_path();
            // What a reader cannot use (a torn last line, damage) is cut off first, so the entries
            // appended now follow the last one readers see.
            let created = match read_journal(&path)? {
                Some((text, length)) => {
                    let (_, readable) = readable_entries(&text);
                    if readable < length {
                        files::open_record(&path, Access::Write)?.set_len(readable as u64)?;
                    }
                    false
                }
                None => true,
            };
            let file = files::open_record(&path, Access::Append)?;
            if created {
                // The new file's name must be as durable as its entries.
                File::open(&self.root)?.sync_all()?;
            }
            *journal = Some(std::sync::Arc::new(file));
        }
        let file: &File = journal.as_ref().expect("opened above");
        { file }.write_all(&lines)
    }

    fn sync_journal(&self) -> io::Result<()> {
        // Out of the lock: the next append need not wait for the disk.
        let file = self.journal.lock().clone();
        file.map_or(Ok(()), |file| file.sync_data())
    }

    fn save_checkpoint(&self, checkpoint: &Checkpoint) -> io::Result<()> {
        let path = self.checkpoint_path();
        let previous = self.previous_checkpoint_path();
        // The previous snapshot stays until the new one is durable; the first is kept twice, so
        // there is always one to fall back on (with the journal, it gives the same state).
        let first = match fs::rename(&path, &previous) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => true,
            Err(e) => return Err(e),
            Ok(()) => false,
        };
        write_atomically_with(&path, |file| {
            serde_json::to_writer_pretty(&mut *file, checkpoint)?;
            Ok(())
        })?;
        if first {
            // Written anew, not copied: a copy would write through a link planted under the name.
            write_whole(&previous, &fs::read(&path)?)?;
        }
        Ok(())
    }

    fn child(&self, stage_dir: &Path) -> io::Result<std::sync::Arc<dyn RunStore>> {
        let root = stage_dir.join("child");
        private_dir(&root.join("stages"))?;
        Ok(std::sync::Arc::new(Self::resolved(root)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A new run record under `runs`, owned by this process.
    fn new_record(runs: &Path) -> (RunDir, crate::Owner) {
        let meta = RunMeta {
            run_id: "R".into(),
            workflow: "w".into(),
            goal: None,
            source_path: "w.fabro".into(),
            status: RunStatus::Running,
            started_at: "t".into(),
            ended_at: None,
            settings: trellis_engine::Settings::default(),
            run_file: None,
            temporal: None,
            workspace: None,
            answer_node: None,
        };
        RunDir::create(runs, &meta, "digraph {}", "workflow.fabro").unwrap()
    }

    /// The snapshot a run starts with.
    fn first_snapshot(record: &RunDir) {
        let checkpoint = Checkpoint::new("R", "start", std::collections::BTreeMap::new());
        record.save_checkpoint(&checkpoint).unwrap();
    }

    /// The nodes of the stages the checkpoint holds.
    fn stage_nodes(record: &RunDir) -> Vec<String> {
        let stages = record.checkpoint().unwrap().stages;
        stages.into_iter().map(|s| s.node_id).collect()
    }

    fn entry(n: u64) -> JournalEntry {
        JournalEntry {
            n,
            rank: u32::try_from(n).unwrap(),
            steps: 0,
            seq: 0,
            changes: vec![trellis_engine::checkpoint::Change::Stage(Box::new(
                serde_json::from_value(serde_json::json!({
                    "rank": n, "node_id": format!("s{n}"), "visit": 1, "attempt": 1,
                    "status": "succeeded", "duration_ms": 0, "dir": format!("{n:03}-s{n}@1"),
                }))
                .unwrap(),
            ))],
        }
    }

    #[test]
    fn a_status_planted_as_a_symlink_is_not_written_through() {
        let runs = tempfile::tempdir().unwrap();
        let (record, _owner) = new_record(runs.path());
        let stage = record.stage_dir(1, "probe", 1).unwrap();
        let outside = runs.path().join("outside.txt");
        fs::write(&outside, "keep").unwrap();
        std::os::unix::fs::symlink(&outside, stage.join("status.json")).unwrap();
        let status = StatusFile::waiting("probe", 1, 1, 0);
        assert!(record.write_status(&stage, &status).is_err());
        assert_eq!(fs::read_to_string(&outside).unwrap(), "keep");
    }

    #[test]
    fn a_stage_text_is_read_only_from_a_plain_stage_folder_and_through_no_link() {
        let runs = tempfile::tempdir().unwrap();
        let (record, _owner) = new_record(runs.path());
        let stage = record.stage_dir(1, "agent", 1).unwrap();
        let name = stage.file_name().unwrap().to_str().unwrap();
        fs::write(stage.join("response.md"), "the answer").unwrap();
        assert_eq!(
            record.stage_text(name, "response.md").as_deref(),
            Some("the answer")
        );
        let outside = runs.path().join("response.md");
        fs::write(&outside, "a secret").unwrap();
        // A name from the record that leads out of it, or a link planted at the file's name.
        assert_eq!(record.stage_text("../..", "response.md"), None);
        assert_eq!(record.stage_text(name, "../../../response.md"), None);
        fs::remove_file(stage.join("response.md")).unwrap();
        std::os::unix::fs::symlink(&outside, stage.join("response.md")).unwrap();
        assert_eq!(record.stage_text(name, "response.md"), None);
    }

    #[test]
    fn a_journal_or_event_log_planted_as_a_symlink_is_neither_cut_nor_appended_to() {
        let runs = tempfile::tempdir().unwrap();
        let (record, _owner) = new_record(runs.path());
        first_snapshot(&record);
        let outside = runs.path().join("outside.txt");
        // Not journal lines: a reader would cut them off before appending.
        fs::write(&outside, "keep\nthis").unwrap();
        std::os::unix::fs::symlink(&outside, record.journal_path()).unwrap();
        assert!(record.append_journal(&[entry(1)]).is_err());
        let events = record.root().join("events.jsonl");
        let _ = fs::remove_file(&events);
        std::os::unix::fs::symlink(&outside, &events).unwrap();
        assert!(crate::EventLog::open_with(&events, None).is_err());
        assert_eq!(fs::read_to_string(&outside).unwrap(), "keep\nthis");
    }

    #[test]
    fn readers_stop_at_damage_and_the_next_append_cuts_it_off() {
        let runs = tempfile::tempdir().unwrap();
        let (record, _owner) = new_record(runs.path());
        first_snapshot(&record);
        record.append_journal(&[entry(1), entry(2)]).unwrap();
        // Damage: a line that is not an entry, an entry after it, and a torn line.
        let mut text = fs::read_to_string(record.journal_path()).unwrap();
        text.push_str("garbage\n");
        text.push_str(&serde_json::to_string(&entry(3)).unwrap());
        text.push_str("\n{\"n\":4,\"ra");
        fs::write(record.journal_path(), text).unwrap();
        assert_eq!(stage_nodes(&record), ["s1", "s2"]);
        let reopened = RunDir::open(&record.root().display().to_string(), runs.path()).unwrap();
        reopened.append_journal(&[entry(3)]).unwrap();
        assert_eq!(stage_nodes(&reopened), ["s1", "s2", "s3"]);
        assert_eq!(reopened.checkpoint().unwrap().journal, 3);
    }

    #[test]
    fn a_line_cut_short_inside_a_character_is_damage_like_any_torn_line() {
        let runs = tempfile::tempdir().unwrap();
        let (record, _owner) = new_record(runs.path());
        first_snapshot(&record);
        record.append_journal(&[entry(1), entry(2)]).unwrap();
        let mut bytes = fs::read(record.journal_path()).unwrap();
        bytes.extend_from_slice(b"{\"n\":3,\"note\":\"caf\xc3");
        fs::write(record.journal_path(), &bytes).unwrap();
        assert_eq!(stage_nodes(&record), ["s1", "s2"]);
        let reopened = RunDir::open(&record.root().display().to_string(), runs.path()).unwrap();
        assert_eq!(reopened.checkpoint_to_resume().unwrap().journal, 2);
        reopened.append_journal(&[entry(3)]).unwrap();
        assert_eq!(stage_nodes(&reopened), ["s1", "s2", "s3"]);
        assert!(std::str::from_utf8(&fs::read(record.journal_path()).unwrap()).is_ok());
    }

    /// Entry `n` (see [`entry`]) setting `command.output` to `blob` as well.
    fn entry_naming(n: u64, blob: &str) -> JournalEntry {
        let mut entry = entry(n);
        let context = [("command.output".to_owned(), serde_json::json!(blob))].into();
        let change = trellis_engine::checkpoint::TrackChange::take(
            &[],
            &mut trellis_engine::checkpoint::Track::default(),
            context,
        );
        entry
            .changes
            .push(trellis_engine::checkpoint::Change::Track(Box::new(change)));
        entry
    }

    #[test]
    fn a_resume_cuts_the_journal_before_an_entry_naming_a_blob_a_crash_damaged() {
        use trellis_engine::blob::BlobStore as _;
        let runs = tempfile::tempdir().unwrap();
        let (record, _owner) = new_record(runs.path());
        let blobs = crate::FileBlobs::new(record.blobs_dir());
        let (whole, torn) = (blobs.put(b"whole").unwrap(), blobs.put(b"torn").unwrap());
        let torn_file = record
            .blobs_dir()
            .join(torn.strip_prefix("blob://sha256/").unwrap());
        first_snapshot(&record);
        let entries = [
            entry(1),
            entry_naming(2, &whole),
            entry_naming(3, &torn),
            entry_naming(4, &whole),
        ];
        record.append_journal(&entries).unwrap();
        let journal = fs::read_to_string(record.journal_path()).unwrap();

        // Intact blobs: nothing goes.
        assert_eq!(record.checkpoint_to_resume().unwrap().journal, 4);
        assert_eq!(fs::read_to_string(record.journal_path()).unwrap(), journal);

        // As a crash leaves a blob whose name reached the disk before its content.
        fs::write(&torn_file, "").unwrap();
        let reopened = RunDir::open(&record.root().display().to_string(), runs.path()).unwrap();
        assert_eq!(reopened.checkpoint_to_resume().unwrap().journal, 2);
        assert_eq!(stage_nodes(&reopened), ["s1", "s2"]);
        assert!(!torn_file.exists(), "the damaged blob is removed");
        // The stage runs again and its output is stored whole.
        assert_eq!(blobs.put(b"torn").unwrap(), torn);
        assert_eq!(fs::read(&torn_file).unwrap(), b"torn");
        reopened.append_journal(&[entry_naming(3, &torn)]).unwrap();
        assert_eq!(reopened.checkpoint().unwrap().journal, 3);

        // As a crash leaves an entry whose blob never reached the disk at all.
        fs::remove_file(&torn_file).unwrap();
        let again = RunDir::open(&record.root().display().to_string(), runs.path()).unwrap();
        assert_eq!(again.checkpoint_to_resume().unwrap().journal, 2);
        assert_eq!(stage_nodes(&again), ["s1", "s2"]);
    }

    #[test]
    fn a_line_names_the_blobs_its_strings_are_and_not_those_its_texts_mention() {
        let hex = "ab".repeat(32);
        let line = format!(
            r#"{{"a":"blob://sha256/{hex}","b":"see blob://sha256/{hex}","c":"blob://sha256/{hex}x","d":"blob://sha256/{}"}}"#,
            "zz".repeat(32)
        );
        let whole = format!("blob://sha256/{hex}");
        let found: Vec<&str> = blob_references(&line).collect();
        let (longer, not_hex) = (
            format!("{whole}x"),
            format!("blob://sha256/{}", "zz".repeat(32)),
        );
        assert_eq!(found, [whole.as_str(), &longer, &not_hex]);
        // A blob that is not stored is damaged; a text that only looks like a reference is not.
        let dir = tempfile::tempdir().unwrap();
        let blobs = crate::FileBlobs::new(dir.path());
        assert!(blobs.is_damaged(&whole));
        assert!(!blobs.is_damaged(&longer) && !blobs.is_damaged(&not_hex));
    }

    #[test]
    fn a_blob_a_crash_cut_short_is_written_again_and_synced_with_the_journal() {
        use trellis_engine::blob::BlobStore as _;
        let dir = tempfile::tempdir().unwrap();
        let blobs = crate::FileBlobs::new(dir.path().join("blobs"));
        let reference = blobs.put(b"output").unwrap();
        let file = blobs.path_of(&reference).unwrap();
        blobs.sync().unwrap();
        fs::write(&file, "out").unwrap();
        assert_eq!(blobs.put(b"output").unwrap(), reference);
        assert_eq!(fs::read(&file).unwrap(), b"output");
        blobs.sync().unwrap();
        // Nothing new: nothing to sync.
        assert!(blobs.unsynced_is_empty());
    }

    /// Regression: a kill between creating `status.json` and writing it left an empty one in the
    /// attempt's `*.interrupted-N` directory.
    #[test]
    fn regression_an_interrupted_attempt_keeps_no_empty_status() {
        let runs = tempfile::tempdir().unwrap();
        let (record, _owner) = new_record(runs.path());
        let first = record.stage_dir(2, "build", 1).unwrap();
        fs::write(first.join("status.json"), "").unwrap();
        fs::write(first.join("stdout.log"), "half\n").unwrap();
        let again = record.stage_dir(2, "build", 1).unwrap();
        assert_eq!(again, first);
        let aside = record.root().join("stages/002-build@1.interrupted-1");
        assert!(!aside.join("status.json").exists());
        assert_eq!(
            fs::read_to_string(aside.join("stdout.log")).unwrap(),
            "half\n"
        );
        // A node id that would leave the record names a directory inside it.
        let odd = record.stage_dir(3, "../../x", 1).unwrap();
        assert!(
            odd.starts_with(record.root().join("stages")),
            "{}",
            odd.display()
        );
    }

    /// Regression: a relative `--runs-dir` never matched the absolute paths of the artifact walk, so every
    /// command stage rescanned the whole runs directory.
    #[test]
    fn regression_runs_dirs_are_absolute() {
        assert!(resolve_runs_dir(Some(PathBuf::from("runs"))).is_absolute());
        assert!(resolve_runs_dir(None).is_absolute());
    }
}

/// Reads a run's event log as it grows: each read returns the events on the whole lines written
/// since the last one (a line still being written waits for its end), so following a long run costs
/// what it adds, not the whole log again.
#[derive(Debug)]
pub struct EventTail {
    path: PathBuf,
    offset: u64,
    /// Lines read so far.
    lines: usize,
}

impl EventTail {
    /// The new events, and the numbers (from 1) of new lines that are not events.
    pub fn read(&mut self) -> Result<(Vec<Event>, Vec<usize>), StoreError> {
        let (bytes, next) = read_whole_lines(&self.path, self.offset, u64::MAX)
            .map_err(io_error("read", &self.path))?;
        self.offset = next;
        let mut events = Vec::new();
        let mut bad = Vec::new();
        read_event_lines(&bytes, &mut self.lines, &mut events, &mut bad);
        Ok((events, bad))
    }
}

/// The whole lines of the file at `path` from byte `offset` — about `limit` bytes of them, or the
/// first one whole when it is longer — and the offset after the last. A line still being written
/// (no line break yet) is left for the next read; a file not written yet has none.
pub fn read_whole_lines(path: &Path, offset: u64, limit: u64) -> io::Result<(Vec<u8>, u64)> {
    use std::io::{BufRead as _, Read as _, Seek as _};
    let mut file = match File::open(path) {
        Ok(file) => file,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok((Vec::new(), offset)),
        Err(e) => return Err(e),
    };
    file.seek(io::SeekFrom::Start(offset))?;
    let mut reader = io::BufReader::new(file);
    let mut bytes = Vec::new();
    (&mut reader).take(limit).read_to_end(&mut bytes)?;
    if bytes.len() as u64 == limit && !bytes.contains(&b'\n') {
        reader.read_until(b'\n', &mut bytes)?;
    }
    let complete = bytes.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
    bytes.truncate(complete);
    Ok((bytes, offset + complete as u64))
}

/// Reads the lines of an event log's `bytes` into `events`, numbering them on from `lines`; the
/// numbers of lines that are not events go to `bad`. Lines are read as bytes: one cut short inside a
/// character (a process that died mid-write, a full disk) is one damaged line, not an unreadable log.
fn read_event_lines(
    bytes: &[u8],
    lines: &mut usize,
    events: &mut Vec<Event>,
    bad: &mut Vec<usize>,
) {
    if bytes.is_empty() {
        return;
    }
    let text = bytes.strip_suffix(b"\n").unwrap_or(bytes);
    for line in text.split(|&b| b == b'\n') {
        *lines += 1;
        match serde_json::from_slice(line) {
            Ok(event) => events.push(event),
            Err(_) if line.iter().all(u8::is_ascii_whitespace) => {}
            Err(_) => bad.push(*lines),
        }
    }
}

#[cfg(test)]
mod tail_tests {
    use super::*;

    #[test]
    fn a_tail_reads_each_whole_line_once_and_numbers_the_damaged_ones() {
        let dir = tempfile::tempdir().unwrap();
        let mut tail = EventTail {
            path: dir.path().join("events.jsonl"),
            offset: 0,
            lines: 0,
        };
        assert_eq!(tail.read().unwrap().0.len(), 0);
        let event = r#"{"seq":1,"ts":"t","run_id":"r","event":"CheckpointSaved","next_node":null}"#;
        let mut file = File::create(dir.path().join("events.jsonl")).unwrap();
        write!(file, "{event}\nnot an event\n{}", &event[..20]).unwrap();
        let (events, bad) = tail.read().unwrap();
        assert_eq!((events.len(), bad), (1, vec![2]));
        // The torn line waits for its end, then counts as line 3.
        writeln!(file, "{}", &event[20..]).unwrap();
        let (events, bad) = tail.read().unwrap();
        assert_eq!((events.len(), bad.len()), (1, 0));
        assert_eq!(tail.lines, 3);
        assert_eq!(tail.read().unwrap().0.len(), 0);
    }

    #[test]
    fn whole_lines_are_read_in_about_the_limit_and_a_longer_line_whole() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("log");
        assert_eq!(read_whole_lines(&path, 7, 10).unwrap(), (Vec::new(), 7));
        std::fs::write(&path, format!("ab\ncd\n{}\nef", "x".repeat(30))).unwrap();
        assert_eq!(
            read_whole_lines(&path, 0, 5).unwrap(),
            (b"ab\n".to_vec(), 3)
        );
        assert_eq!(
            read_whole_lines(&path, 0, 6).unwrap(),
            (b"ab\ncd\n".to_vec(), 6)
        );
        // A line longer than the limit is read whole rather than never.
        let (long, next) = read_whole_lines(&path, 6, 10).unwrap();
        assert_eq!((long.len(), next), (31, 37));
        // The line still being written waits.
        assert_eq!(read_whole_lines(&path, 37, 10).unwrap(), (Vec::new(), 37));
    }
}
