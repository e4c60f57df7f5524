//! Opening a file, or making folders, by a path that was resolved (every link on its way followed,
//! `.` and `..` taken out) and then checked to lie where it may, so that what is opened or made is
//! there. The check and the open are two steps: a folder on the way swapped for a link in between
//! (by a command an agent left running, a parallel branch) would lead a plain open elsewhere. A
//! resolved path holds no link, so one found on the way is such a swap, and nothing here follows one.
//! And opening or writing a file of a run's record never through a link — at its name, or in place
//! of a folder on its way — which a command that may write the record could have planted there,
//! with the record's permissions ([`record_file_mode`]), whoever writes it: the store or a stage's
//! handler ([`open_record`]).

use std::fs::File;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;

use nix::fcntl::{OFlag, OpenHow, ResolveFlag};

/// Opens the resolved `path` for reading, or for writing when `write` (created when missing),
/// following no link on its way: one there is a folder swapped for a link since `path` was resolved,
/// and the open fails with `ELOOP` ([`led_elsewhere`]), having opened nothing. It opens without
/// waiting (a FIFO would wait for a writer forever), so the caller looks at what it opened (a
/// regular file?) before it reads or writes. Where the kernel cannot be asked so
/// ([`openat_following_no_link`]), a plain open that follows no link in the last name, and then the
/// place of the open file asked of the kernel (`/proc/self/fd`): anywhere but `path` fails the same
/// way, though then something elsewhere was opened before it was refused. It blocks as any open
/// does: off an async path, the caller's to see to.
#[allow(
    clippy::disallowed_methods,
    reason = "an open as its callers would make themselves, where they may block"
)]
pub fn open_resolved(path: &Path, write: bool) -> io::Result<File> {
    use std::os::fd::AsRawFd as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let flags = OFlag::O_NONBLOCK | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    let how = OpenHow::new().resolve(ResolveFlag::RESOLVE_NO_SYMLINKS);
    // A mode goes with `O_CREAT` only (the kernel refuses one otherwise).
    let how = if write {
        how.flags(flags | OFlag::O_WRONLY | OFlag::O_CREAT)
            .mode(nix::sys::stat::Mode::from_bits_truncate(0o666))
    } else {
        how.flags(flags | OFlag::O_RDONLY)
    };
    if let Some(opened) = openat_following_no_link(nix::fcntl::AT_FDCWD, path, how) {
        return Ok(File::from(opened?));
    }
    let file = std::fs::OpenOptions::new()
        .read(!write)
        .write(write)
        .create(write)
        .custom_flags((OFlag::O_NONBLOCK | OFlag::O_NOFOLLOW).bits())
        .open(path)?;
    match std::fs::read_link(format!("/proc/self/fd/{}", file.as_raw_fd())) {
        Ok(at) if at != path => Err(io::Error::from_raw_os_error(libc::ELOOP)),
        _ => Ok(file),
    }
}

/// Whether an open by [`open_resolved`], [`open_record`] (or [`openat_following_no_link`]) failed
/// because a link was found on the way: a folder swapped for a link since the path was resolved.
pub fn led_elsewhere(error: &io::Error) -> bool {
    error.raw_os_error() == Some(libc::ELOOP)
        || matches!(error.get_ref(), Some(inner) if inner.is::<LinkInTheWay>())
}

/// A file of a run's record not opened because a link was in its way.
#[derive(Debug)]
struct LinkInTheWay(std::path::PathBuf);

impl std::fmt::Display for LinkInTheWay {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "`{}` was not opened: a link is in its way (at its name, or in place of a folder of the run's record), and the record follows none",
            self.0.display()
        )
    }
}

impl std::error::Error for LinkInTheWay {}

/// `openat2` of `name` in the folder `at` as `how` says; none where the kernel cannot be asked
/// (`ENOSYS` before Linux 5.6, `EPERM` from a seccomp filter), for the caller to do without.
pub fn openat_following_no_link<Fd: AsFd>(
    at: Fd,
    name: &(impl nix::NixPath + ?Sized),
    how: OpenHow,
) -> Option<io::Result<OwnedFd>> {
    match nix::fcntl::openat2(at, name, how) {
        Err(nix::errno::Errno::ENOSYS | nix::errno::Errno::EPERM) => None,
        opened => Some(opened.map_err(io::Error::from)),
    }
}

/// Creates the resolved folder `path` and the folders on its way, as `create_dir_all` does, but
/// following no link: a resolved path holds none, so one there now is a folder swapped for a link
/// since, which would have the folders made elsewhere (`ELOOP`, [`led_elsewhere`]). Folders made
/// get `mode` (less the umask). Where the kernel cannot be asked so ([`openat_following_no_link`]),
/// as `create_dir_all` does. A relative path, or one with `..`, is refused (`InvalidInput`): it
/// was not resolved.
#[allow(
    clippy::disallowed_methods,
    reason = "the fallback makes folders as its callers would themselves, where they may block"
)]
pub fn create_folders(path: &Path, mode: u32) -> io::Result<()> {
    use std::os::unix::fs::DirBuilderExt as _;
    use std::path::Component;
    if !path.is_absolute() || path.components().any(|c| c == Component::ParentDir) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("`{}` is not a resolved path", path.display()),
        ));
    }
    let how = OpenHow::new()
        .flags(OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC)
        .resolve(ResolveFlag::RESOLVE_NO_SYMLINKS);
    let names: Vec<&std::ffi::OsStr> = path
        .components()
        .filter_map(|c| match c {
            Component::Normal(name) => Some(name),
            _ => None,
        })
        .collect();
    // Most often the folders on the way are there (a stage's folder in its run's): they are
    // opened at once, and only the last one is made; else the way is made from the root.
    let way = path.parent().unwrap_or(path);
    let Some(opened) = openat_following_no_link(nix::fcntl::AT_FDCWD, way, how) else {
        return std::fs::DirBuilder::new()
            .recursive(true)
            .mode(mode)
            .create(path);
    };
    let (mut folder, to_make) = match (opened, names.split_last()) {
        (Ok(parent), Some((last, _))) => (parent, std::slice::from_ref(last)),
        (Err(error), _) if error.kind() == io::ErrorKind::NotFound => (
            nix::fcntl::openat2(nix::fcntl::AT_FDCWD, "/", how)?,
            names.as_slice(),
        ),
        (opened, _) => return opened.map(drop),
    };
    let mode = nix::sys::stat::Mode::from_bits_truncate(mode);
    let Some((last, before)) = to_make.split_last() else {
        return Ok(());
    };
    for name in before {
        let mut next = nix::fcntl::openat2(&folder, *name, how);
        if matches!(next, Err(nix::errno::Errno::ENOENT)) {
            next = match nix::sys::stat::mkdirat(&folder, *name, mode) {
                Ok(()) | Err(nix::errno::Errno::EEXIST) => nix::fcntl::openat2(&folder, *name, how),
                Err(errno) => Err(errno),
            };
        }
        folder = next?;
    }
    // The last folder is most often new (a stage's): made first, and looked at only when it was
    // there already (a link there fails the open).
    match nix::sys::stat::mkdirat(&folder, *last, mode) {
        Err(nix::errno::Errno::EEXIST) => nix::fcntl::openat2(&folder, *last, how).map(drop),
        other => other,
    }
    .map_err(io::Error::from)
}

/// Whether runs' records are kept from other users (see [`record_file_mode`]).
fn records_private() -> bool {
    std::env::var_os("TRELLIS_SHARED_RUNS").is_none_or(|v| v.is_empty() || v == "0")
}

/// The permissions of a file of a run's record, whoever writes it: `0600`, kept from other users
/// (prompts, responses and outputs can hold sensitive text), or `0644` when `TRELLIS_SHARED_RUNS=1`
/// makes records readable by others.
pub fn record_file_mode() -> u32 {
    if records_private() { 0o600 } else { 0o644 }
}

/// The permissions of a folder of a run's record: `0700`, or `0755` with `TRELLIS_SHARED_RUNS=1`
/// ([`record_file_mode`]).
pub fn record_folder_mode() -> u32 {
    if records_private() { 0o700 } else { 0o755 }
}

/// How [`open_record`] opens a file of a run's record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    /// For reading.
    Read,
    /// For writing what is there.
    Write,
    /// For reading and writing what is there.
    ReadWrite,
    /// For reading and writing, created when missing.
    ReadWriteCreate,
    /// For appending, created when missing.
    Append,
    /// Emptied (created when missing) for writing.
    Replace,
    /// Created for writing; one already there is an error (`AlreadyExists`).
    New,
}

impl Access {
    fn flags(self) -> OFlag {
        match self {
            Self::Read => OFlag::O_RDONLY,
            Self::Write => OFlag::O_WRONLY,
            Self::ReadWrite => OFlag::O_RDWR,
            Self::ReadWriteCreate => OFlag::O_RDWR | OFlag::O_CREAT,
            Self::Append => OFlag::O_WRONLY | OFlag::O_APPEND | OFlag::O_CREAT,
            Self::Replace => OFlag::O_WRONLY | OFlag::O_TRUNC | OFlag::O_CREAT,
            Self::New => OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL,
        }
    }
}

/// Opens the file `path` of a run's record as `access` says (a file made gets the record's
/// permissions, [`record_file_mode`]), following no link anywhere on its way: a command that may
/// write the record (unconfined, or under Landlock with the runs directory inside its working tree)
/// could plant one at the file's name, or put one in place of a folder of the record — its own
/// stage's folder, while it runs — pointing at a file or folder it may not write itself, to have
/// Trellis write there. The open then fails ([`led_elsewhere`]; its message says so, and where);
/// nothing is written. A record's paths hold no link (the store resolves a run's folder when it
/// opens it), so none is followed. Where the kernel cannot be asked so
/// ([`openat_following_no_link`]), or the path is relative, only a link at the file's name is
/// refused. It blocks as any open does: off an async path, the caller's to see to.
///
/// It opens without waiting, and what it opened must be a regular file (`InvalidInput`
/// otherwise): a FIFO planted at the name would have an open for writing wait for a reader
/// forever.
pub fn open_record(path: &Path, access: Access) -> io::Result<File> {
    let file = open_record_unchecked(path, access).map_err(|error| {
        if led_elsewhere(&error) {
            io::Error::other(LinkInTheWay(path.to_owned()))
        } else {
            error
        }
    })?;
    // A file made afresh is a regular one.
    if access == Access::New || file.metadata()?.is_file() {
        Ok(file)
    } else {
        Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("`{}` is not a regular file", path.display()),
        ))
    }
}

/// [`open_record`], whatever it opens.
fn open_record_unchecked(path: &Path, access: Access) -> io::Result<File> {
    let flags = access.flags() | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC;
    let mode = nix::sys::stat::Mode::from_bits_truncate(record_file_mode());
    if path.is_absolute() {
        let how = OpenHow::new()
            .flags(flags)
            .resolve(ResolveFlag::RESOLVE_NO_SYMLINKS);
        // A mode goes with `O_CREAT` only (the kernel refuses one otherwise).
        let how = if flags.contains(OFlag::O_CREAT) {
            how.mode(mode)
        } else {
            how
        };
        if let Some(opened) = openat_following_no_link(nix::fcntl::AT_FDCWD, path, how) {
            return opened.map(File::from);
        }
    }
    Ok(File::from(nix::fcntl::open(path, flags, mode)?))
}

/// Creates (or empties) the record file `path` for writing: [`open_record`] with
/// [`Access::Replace`]. Stage logs and transcripts are made so.
pub fn create_no_link(path: &Path) -> io::Result<File> {
    open_record(path, Access::Replace)
}

/// [`create_no_link`] for an async path: the open on the blocking pool.
pub async fn create_no_link_async(path: &Path) -> io::Result<tokio::fs::File> {
    let path = path.to_owned();
    crate::task::blocking(move || create_no_link(&path))
        .await
        .map(tokio::fs::File::from_std)
}

/// Writes the record file `path` with `bytes` ([`write_whole_with`], not waiting for the disk).
pub fn write_whole(path: &Path, bytes: &[u8]) -> io::Result<()> {
    use std::io::Write as _;
    write_whole_with(path, false, |file| file.write_all(bytes))
}

/// Writes the record file `path` ([`record_file_mode`]) so that no reader, and no run resumed
/// after a kill, sees part of it: `write` fills a new hidden file beside it
/// (`.name.tmp-<pid>-<n>`, made afresh by [`open_record`]: no link on its way is followed), which
/// is then renamed over `path` (a link at `path` is replaced, not written through). A kill leaves
/// the old content or the new, whole, and at most a stray hidden file. With `sync`, the new
/// content is on disk before the name points at it (a crash of the machine too leaves the old or
/// the new); without, the caller syncs it later if it must. It blocks: off an async path, the
/// caller's to see to.
#[allow(
    clippy::disallowed_methods,
    reason = "a rename as its callers would make themselves, where they may block"
)]
pub fn write_whole_with(
    path: &Path,
    sync: bool,
    write: impl FnOnce(&mut io::BufWriter<File>) -> io::Result<()>,
) -> io::Result<()> {
    // Unique per write: two writers never share a temporary file.
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let name = path.file_name().ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("`{}` names no file", path.display()),
        )
    })?;
    let mut hidden = std::ffi::OsString::from(".");
    hidden.push(name);
    hidden.push(format!(".tmp-{}-{n}", std::process::id()));
    let temporary = path.with_file_name(hidden);
    let written = open_record(&temporary, Access::New)
        .and_then(|file| {
            let mut file = io::BufWriter::new(file);
            write(&mut file)?;
            let file = file.into_inner().map_err(io::IntoInnerError::into_error)?;
            if sync { file.sync_all() } else { Ok(()) }
        })
        .and_then(|()| std::fs::rename(&temporary, path));
    if written.is_err() {
        let _ = std::fs::remove_file(&temporary);
    }
    written
}

#[cfg(test)]
#[allow(clippy::disallowed_methods, reason = "the tests set up files")]
mod tests {
    use super::*;

    #[test]
    fn a_whole_write_replaces_the_file_and_leaves_nothing_beside_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("wait.json");
        std::fs::write(&path, "old").unwrap();
        write_whole(&path, b"new").unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "new");
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["wait.json"]);
        // Into a folder that is gone: an error, and nothing made.
        assert!(write_whole(&dir.path().join("gone/wait.json"), b"x").is_err());
        assert!(write_whole(Path::new("/"), b"x").is_err());
    }

    #[test]
    fn a_link_at_a_record_s_name_is_neither_written_through_nor_followed() {
        use std::io::Write as _;
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("target.txt");
        std::fs::write(&target, "untouched").unwrap();
        let log = dir.path().join("stdout.log");
        std::os::unix::fs::symlink(&target, &log).unwrap();
        let refused = create_no_link(&log).unwrap_err();
        assert!(led_elsewhere(&refused), "{refused}");
        assert!(
            refused
                .to_string()
                .contains("stdout.log` was not opened: a link is in its way"),
            "{refused}"
        );
        // A whole write replaces the link itself.
        let prompt = dir.path().join("prompt.md");
        std::os::unix::fs::symlink(&target, &prompt).unwrap();
        write_whole(&prompt, b"the prompt").unwrap();
        assert!(!std::fs::symlink_metadata(&prompt).unwrap().is_symlink());
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "untouched");
        // An ordinary file is emptied and written.
        let plain = dir.path().join("stderr.log");
        std::fs::write(&plain, "old text").unwrap();
        create_no_link(&plain).unwrap().write_all(b"new").unwrap();
        assert_eq!(std::fs::read_to_string(&plain).unwrap(), "new");
    }

    #[test]
    fn a_folder_of_the_record_swapped_for_a_link_is_not_written_through() {
        let dir = tempfile::tempdir().unwrap();
        let root = std::fs::canonicalize(dir.path()).unwrap();
        let elsewhere = root.join("elsewhere");
        std::fs::create_dir(&elsewhere).unwrap();
        // A stage's folder, swapped while its command ran.
        std::os::unix::fs::symlink(&elsewhere, root.join("stage")).unwrap();
        for access in [Access::Replace, Access::Append, Access::New] {
            let refused = open_record(&root.join("stage/status.json"), access).unwrap_err();
            assert!(led_elsewhere(&refused), "{access:?}: {refused}");
        }
        assert!(write_whole(&root.join("stage/prompt.md"), b"x").is_err());
        let refused = create_folders(&root.join("stage/artifacts"), 0o700).unwrap_err();
        assert!(led_elsewhere(&refused), "{refused}");
        assert_eq!(std::fs::read_dir(&elsewhere).unwrap().count(), 0);
        // A path that was not resolved is refused, not made somewhere else.
        let parent = create_folders(&root.join("elsewhere/../made"), 0o700).unwrap_err();
        assert_eq!(parent.kind(), io::ErrorKind::InvalidInput);
        assert!(!root.join("made").exists());
        // A FIFO planted at a log's name neither holds the open nor is taken for the log.
        nix::unistd::mkfifo(&root.join("stdout.log"), nix::sys::stat::Mode::S_IRWXU).unwrap();
        assert!(create_no_link(&root.join("stdout.log")).is_err());
        let read = open_record(&root.join("stdout.log"), Access::Read).unwrap_err();
        assert_eq!(read.kind(), io::ErrorKind::InvalidInput, "{read}");
    }

    #[test]
    fn record_files_and_folders_get_the_record_s_permissions() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().unwrap();
        let root = std::fs::canonicalize(dir.path()).unwrap();
        let mode = |path: &Path| std::fs::metadata(path).unwrap().permissions().mode() & 0o777;
        // Kept from other users unless the user shares runs (not in the test's environment).
        let private = std::env::var_os("TRELLIS_SHARED_RUNS").is_none();
        assert!(!private || (record_file_mode(), record_folder_mode()) == (0o600, 0o700));
        create_no_link(&root.join("stdout.log")).unwrap();
        write_whole(&root.join("prompt.md"), b"a prompt").unwrap();
        write_whole_with(&root.join("checkpoint.json"), true, |file| {
            use std::io::Write as _;
            file.write_all(b"{}")
        })
        .unwrap();
        for name in ["stdout.log", "prompt.md", "checkpoint.json"] {
            assert_eq!(mode(&root.join(name)), record_file_mode(), "{name}");
        }
        create_folders(&root.join("artifacts/node"), record_folder_mode()).unwrap();
        assert_eq!(mode(&root.join("artifacts")), record_folder_mode());
        assert_eq!(mode(&root.join("artifacts/node")), record_folder_mode());
    }

    #[test]
    fn a_resolved_path_opens_and_a_link_on_its_way_does_not() {
        let dir = tempfile::tempdir().unwrap();
        let root = std::fs::canonicalize(dir.path()).unwrap();
        std::fs::create_dir(root.join("d")).unwrap();
        std::fs::write(root.join("d/f"), "mine").unwrap();
        std::os::unix::fs::symlink(root.join("d"), root.join("link")).unwrap();
        assert_eq!(
            std::io::read_to_string(open_resolved(&root.join("d/f"), false).unwrap()).unwrap(),
            "mine"
        );
        let refused = open_resolved(&root.join("link/f"), false).unwrap_err();
        assert!(led_elsewhere(&refused), "{refused}");
        // Writing creates the file, and the same link refuses a write too.
        open_resolved(&root.join("d/new"), true).unwrap();
        assert!(root.join("d/new").is_file());
        let refused = open_resolved(&root.join("link/other"), true).unwrap_err();
        assert!(led_elsewhere(&refused), "{refused}");
        assert!(!root.join("d/other").exists());
        // Folders are made one by one, and not through the link either.
        create_folders(&root.join("d/a/b"), 0o777).unwrap();
        assert!(root.join("d/a/b").is_dir());
        let refused = create_folders(&root.join("link/c/d"), 0o777).unwrap_err();
        assert!(led_elsewhere(&refused), "{refused}");
        assert!(!root.join("d/c").exists());
        let relative = create_folders(Path::new("d/e"), 0o777).unwrap_err();
        assert_eq!(relative.kind(), io::ErrorKind::InvalidInput);
    }

    #[test]
    fn a_fifo_opens_without_waiting() {
        use std::os::unix::fs::FileTypeExt as _;
        let dir = tempfile::tempdir().unwrap();
        let root = std::fs::canonicalize(dir.path()).unwrap();
        nix::unistd::mkfifo(&root.join("pipe"), nix::sys::stat::Mode::S_IRWXU).unwrap();
        let file = open_resolved(&root.join("pipe"), false).unwrap();
        assert!(file.metadata().unwrap().file_type().is_fifo());
    }
}
