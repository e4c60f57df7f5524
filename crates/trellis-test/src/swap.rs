//! A race for code that checks a path and then opens it: two names swapped back and forth.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

/// Two names of a directory (a folder, a link) swapped back and forth on a thread, as fast as it
/// can, until this is dropped.
pub struct Swapping {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
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
    })
}

impl Drop for Swapping {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}
