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
