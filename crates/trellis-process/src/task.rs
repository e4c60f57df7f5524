//! Blocking work off the async workers: the one way the workspace runs file and process work that
//! would stall a runtime thread (DESIGN.md §5).

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
