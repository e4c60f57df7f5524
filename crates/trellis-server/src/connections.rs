//! Accepting connections, with limits a slow or greedy client cannot wear down: a request's headers
//! must arrive within [`HEADER_TIMEOUT`] (a client that sends half a header is cut off, not kept open),
//! one client address holds at most [`MAX_PER_CLIENT`] connections at once (more are closed at once),
//! and shutting down stops accepting, lets open requests finish (event streams end on the server's
//! stop) and waits for them.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use parking_lot::Mutex;
use tokio::net::TcpListener;

/// How long a client may take to send a request's headers.
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// Connections one client address may hold open at once (a browser opens 6 per host, plus its event
/// streams; the server benchmark's 100 event-stream clients share one address).
pub const MAX_PER_CLIENT: usize = 128;

/// Open connections per client address.
#[derive(Default)]
struct Clients(Mutex<HashMap<IpAddr, usize>>);

/// One admitted connection; dropping it frees its place.
struct Slot {
    clients: Arc<Clients>,
    ip: IpAddr,
}

impl Clients {
    fn admit(self: &Arc<Self>, ip: IpAddr) -> Option<Slot> {
        let mut open = self.0.lock();
        let count = open.entry(ip).or_default();
        if *count >= MAX_PER_CLIENT {
            return None;
        }
        *count += 1;
        Some(Slot {
            clients: self.clone(),
            ip,
        })
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut open = self.clients.0.lock();
        if let Some(count) = open.get_mut(&self.ip) {
            *count -= 1;
            if *count == 0 {
                open.remove(&self.ip);
            }
        }
    }
}

/// Serves `app` on `listener` until `shutdown` completes, then waits for open connections to end.
pub async fn serve(
    listener: TcpListener,
    app: axum::Router,
    shutdown: impl std::future::Future<Output = ()>,
) {
    let clients = Arc::new(Clients::default());
    let graceful = GracefulShutdown::new();
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_TIMEOUT);
    tokio::pin!(shutdown);
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            () = &mut shutdown => break,
        };
        let Ok((stream, peer)) = accepted else {
            // Out of file descriptors and the like: wait a moment rather than spin.
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        let Some(slot) = clients.admit(peer.ip()) else {
            drop(stream);
            continue;
        };
        let _ = stream.set_nodelay(true);
        let service = TowerToHyperService::new(app.clone());
        let connection = graceful.watch(builder.serve_connection(TokioIo::new(stream), service));
        tokio::spawn(async move {
            let _ = connection.await;
            drop(slot);
        });
    }
    drop(listener);
    graceful.shutdown().await;
}
