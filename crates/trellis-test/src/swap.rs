//! A race for code that checks a path and then opens it: two names swapped back and forth.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

/// Two names of a directory (a folder, a link) swapped back and forth on a thread, as fast as it
/// can, until this is dropped.
pub struct Swapping {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
    /// The folder outside that [`folder_swapped_for_a_link_out`] made, and a watch on what is
    /// opened in it.
    outside: Option<(tempfile::TempDir, nix::sys::inotify::Inotify)>,
}

/// Starts swapping `a` and `b` (each a file, folder or link; both must exist), each swap one atomic
/// step (`renameat2` with `RENAME_EXCHANGE`). None where the file system cannot swap names so.
pub fn swapping(a: &Path, b: &Path) -> Option<Swapping> {
    use nix::fcntl::{AT_FDCWD, RenameFlags, renameat2};
    let (a, b) = (a.to_owned(), b.to_owned());
    let swap = move || renameat2(AT_FDCWD, &a, AT_FDCWD, &b, RenameFlags::RENAME_EXCHANGE);
    swap().and_then(|()| swap()).ok()?;
    let stop = Arc::new(AtomicBool::new(false));
    let thread = {
        let stop = stop.clone();
        std::thread::spawn(move || while !stop.load(Ordering::Relaxed) && swap().is_ok() {})
    };
    Some(Swapping {
        stop,
        thread: Some(thread),
        outside: None,
    })
}

/// The race a path check must win: in `root`, `d/f` holds `mine`, and `d` is swapped back and forth
/// with `away`, a link to a folder elsewhere whose `f` holds `secret`. None where the file system
/// cannot swap names in one step, or where what is opened outside cannot be watched (`inotify`).
pub fn folder_swapped_for_a_link_out(root: &Path) -> Option<Swapping> {
    use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify};
    let outside = tempfile::tempdir().ok()?;
    std::fs::write(outside.path().join("f"), "secret").ok()?;
    std::fs::create_dir(root.join("d")).ok()?;
    std::fs::write(root.join("d/f"), "mine").ok()?;
    std::os::unix::fs::symlink(outside.path(), root.join("away")).ok()?;
    let watch = Inotify::init(InitFlags::IN_NONBLOCK | InitFlags::IN_CLOEXEC).ok()?;
    watch
        .add_watch(outside.path(), AddWatchFlags::IN_OPEN)
        .ok()?;
    let mut swapping = swapping(&root.join("d"), &root.join("away"))?;
    swapping.outside = Some((outside, watch));
    Some(swapping)
}

impl Swapping {
    /// The folder outside that [`folder_swapped_for_a_link_out`] made.
    pub fn outside(&self) -> Option<&Path> {
        self.outside.as_ref().map(|(dir, _)| dir.path())
    }

    /// How many times a file in the folder outside was opened since the last time this was asked
    /// (or since the race began): anything opened there at all, even if nothing was read from it
    /// (a FIFO or a device opened outside could already have done harm).
    pub fn opened_outside(&self) -> usize {
        let Some((_, watch)) = &self.outside else {
            return 0;
        };
        let mut opened = 0;
        while let Ok(events) = watch.read_events() {
            // An overflowed queue (too many to keep) says so with an event of its own.
            opened += events
                .iter()
                .filter(|event| {
                    event.name.is_some()
                        || event
                            .mask
                            .contains(nix::sys::inotify::AddWatchFlags::IN_Q_OVERFLOW)
                })
                .count();
        }
        opened
    }
}

impl Drop for Swapping {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}
