//! Blocking work off the async workers: the one way the workspace runs file and process work that
//! would stall a runtime thread (DESIGN.md §5), and the lasting threads sandboxed processes start
//! from (a process that dies with its parent thread must not have a pool thread for a parent).

/// Runs `work` on tokio's blocking pool and returns what it returns; a panic in it continues in the
/// caller, as if the work had run there.
pub async fn blocking<T: Send + 'static>(work: impl FnOnce() -> T + Send + 'static) -> T {
    match tokio::task::spawn_blocking(work).await {
        Ok(value) => value,
        Err(error) => std::panic::resume_unwind(error.into_panic()),
    }
}

/// Starts `work` on tokio's blocking pool and goes on without waiting: the handle gives its result
/// (or its panic) when awaited.
pub fn start_blocking<T: Send + 'static>(
    work: impl FnOnce() -> T + Send + 'static,
) -> tokio::task::JoinHandle<T> {
    tokio::task::spawn_blocking(work)
}

/// Runs blocking work that lasts as long as a stage (a transcript written as the stage goes, a person
/// typing an answer) on a thread of its own, so it never holds one of the blocking pool's threads,
/// which short file work shares. The future gives its result (`None` if the thread could not start
/// or panicked); dropping it leaves the work running to its end.
pub fn own_thread<T: Send + 'static>(
    name: &str,
    work: impl FnOnce() -> T + Send + 'static,
) -> impl Future<Output = Option<T>> + Send + 'static {
    let (sender, receiver) = tokio::sync::oneshot::channel();
    let started = std::thread::Builder::new()
        .name(name.to_owned())
        .spawn(move || {
            let _ = sender.send(work());
        });
    async move {
        match started {
            Ok(_) => receiver.await.ok(),
            Err(_) => None,
        }
    }
}

/// How many threads start processes for [`on_lasting_thread`].
const LAUNCHERS: usize = 4;

type Launch = Box<dyn FnOnce() + Send>;

/// Runs `start` — a process start — on one of a few threads that live as long as this process,
/// and waits for it. A child that asks to die with its parent (`bwrap --die-with-parent`, which
/// sets the parent-death signal) is killed when the *thread* that started it exits, and the
/// runtime's blocking threads exit once they have idled ten seconds: a command started on one
/// would die in the middle of its stage.
pub fn on_lasting_thread<T: Send + 'static>(start: impl FnOnce() -> T + Send + 'static) -> T {
    static QUEUE: std::sync::OnceLock<Option<std::sync::mpsc::Sender<Launch>>> =
        std::sync::OnceLock::new();
    let queue = QUEUE.get_or_init(|| {
        let (sender, receiver) = std::sync::mpsc::channel::<Launch>();
        let receiver = std::sync::Arc::new(parking_lot::Mutex::new(receiver));
        let mut started = 0;
        for n in 0..LAUNCHERS {
            let receiver = receiver.clone();
            let launcher = std::thread::Builder::new()
                .name(format!("trellis-launch-{n}"))
                .spawn(move || {
                    loop {
                        let next = receiver.lock().recv();
                        match next {
                            Ok(launch) => launch(),
                            Err(_) => return,
                        }
                    }
                });
            started += usize::from(launcher.is_ok());
        }
        (started > 0).then_some(sender)
    });
    let (done, result) = std::sync::mpsc::sync_channel(1);
    let launch: Launch = Box::new(move || {
        let started = std::panic::catch_unwind(std::panic::AssertUnwindSafe(start));
        let _ = done.send(started);
    });
    // Without a launcher (none could be started), the start runs here.
    let unsent = match queue {
        Some(queue) => queue.send(launch).err().map(|unsent| unsent.0),
        None => Some(launch),
    };
    if let Some(launch) = unsent {
        launch();
    }
    match result.recv() {
        Ok(Ok(value)) => value,
        Ok(Err(panic)) => std::panic::resume_unwind(panic),
        Err(_) => unreachable!("a start always answers"),
    }
}
