//! Opening a file, or making folders, by a path that was resolved (every link on its way followed,
//! `.` and `..` taken out) and then checked to lie where it may, so that what is opened or made is
//! there. The check and the open are two steps: a folder on the way swapped for a link in between
//! (by a command an agent left running, a parallel branch) would lead a plain open elsewhere. A
//! resolved path holds no link, so one found on the way is such a swap, and nothing here follows one.
//! And opening or writing a file of a run's record never through a link at its name, which a command
//! that may write the record could have planted there.

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

/// Whether an open by [`open_resolved`] (or [`openat_following_no_link`]) failed because a link was
/// found on the way: a folder swapped for a link since the path was resolved.
pub fn led_elsewhere(error: &io::Error) -> bool {
    error.raw_os_error() == Some(libc::ELOOP)
}

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
/// since, which would have the folders made elsewhere (`ELOOP`, [`led_elsewhere`]). Where the kernel
/// cannot be asked so ([`openat_following_no_link`]), as `create_dir_all` does. A relative path is
/// refused (`InvalidInput`): it was not resolved.
#[allow(
    clippy::disallowed_methods,
    reason = "the fallback makes folders as its callers would themselves, where they may block"
)]
pub fn create_folders(path: &Path) -> io::Result<()> {
    if !path.is_absolute() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("`{}` is not a resolved path", path.display()),
        ));
    }
    let how = OpenHow::new()
        .flags(OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC)
        .resolve(ResolveFlag::RESOLVE_NO_SYMLINKS);
    let Some(root) = openat_following_no_link(nix::fcntl::AT_FDCWD, "/", how) else {
        return std::fs::create_dir_all(path);
    };
    let mut folder = root?;
    for name in path.components().filter_map(|c| match c {
        std::path::Component::Normal(name) => Some(name),
        _ => None,
    }) {
        let mut next = nix::fcntl::openat2(&folder, name, how);
        if matches!(next, Err(nix::errno::Errno::ENOENT)) {
            let mode = nix::sys::stat::Mode::from_bits_truncate(0o777);
            next = match nix::sys::stat::mkdirat(&folder, name, mode) {
                Ok(()) | Err(nix::errno::Errno::EEXIST) => nix::fcntl::openat2(&folder, name, how),
                Err(errno) => Err(errno),
            };
        }
        folder = next?;
    }
    Ok(())
}

/// Creates (or empties) `path` for writing, never through a link at its name: a command that may
/// write its stage's folder (unconfined, or confined with the runs directory inside its working
/// tree) could plant one there, pointing at a file it may not write itself, and have Trellis write
/// its output through it. The open then fails; nothing is written. It blocks as any open does: off
/// an async path, the caller's to see to.
#[allow(
    clippy::disallowed_methods,
    reason = "an open as its callers would make themselves, where they may block"
)]
pub fn create_no_link(path: &Path) -> io::Result<File> {
    no_link_options()
        .write(true)
        .create(true)
        .truncate(true)
        .open(path)
}

/// Options that open a file never through a link at its name (`O_NOFOLLOW`): one there fails the
/// open with `ELOOP`. For the files of a run's record, which a command may be able to write.
pub fn no_link_options() -> std::fs::OpenOptions {
    use std::os::unix::fs::OpenOptionsExt as _;
    let mut options = std::fs::OpenOptions::new();
    options.custom_flags(OFlag::O_NOFOLLOW.bits());
    options
}

/// [`create_no_link`] for an async path: the open on the blocking pool.
pub async fn create_no_link_async(path: &Path) -> io::Result<tokio::fs::File> {
    let path = path.to_owned();
    crate::task::blocking(move || create_no_link(&path))
        .await
        .map(tokio::fs::File::from_std)
}

/// Writes `bytes` to `path` so that no reader, and no run resumed after a kill, sees part of them:
/// written to a new hidden file beside it (`.name.tmp-<pid>-<n>`, made afresh, so a link planted
/// under that name is not followed), then renamed over `path`. A kill leaves the old content or the
/// new, whole, and at most a stray hidden file; it does not wait for the disk (a crash of the
/// machine may lose both). It blocks: off an async path, the caller's to see to.
#[allow(
    clippy::disallowed_methods,
    reason = "a write as its callers would make themselves, where they may block"
)]
pub fn write_whole(path: &Path, bytes: &[u8]) -> io::Result<()> {
    use std::io::Write as _;
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
    let written = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&temporary)
        .and_then(|mut file| file.write_all(bytes))
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
        assert_eq!(refused.raw_os_error(), Some(libc::ELOOP), "{refused}");
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
        create_folders(&root.join("d/a/b")).unwrap();
        assert!(root.join("d/a/b").is_dir());
        let refused = create_folders(&root.join("link/c/d")).unwrap_err();
        assert!(led_elsewhere(&refused), "{refused}");
        assert!(!root.join("d/c").exists());
        let relative = create_folders(Path::new("d/e")).unwrap_err();
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
