//! `trellis serve`: the HTTP API and the web app, in one process.
//!
//! The server sees every run under its runs directory, the ones `trellis run` started in a terminal
//! included (it reads their records: `run.json`, the checkpoint and journal, `events.jsonl`), and it
//! starts, resumes, answers and cancels runs itself through the run library (`trellis-run`), each run a
//! task of its own so a run that fails or panics never takes the server down. Live event streams tail
//! the run's event log, so a stream shows the same events whoever runs the run, and a client that
//! reconnects with `Last-Event-ID` gets exactly what it missed.
//!
//! Modules: [`runs`] (the server's live runs and its web interviewer), [`api`] (the JSON API and its
//! OpenAPI document), [`events`] (event streams), [`files`] (stage files, never anything outside the
//! run), [`guard`] (host names, token, cross-site requests, body size and time), [`connections`]
//! (accepting connections with header timeouts and a cap per client), [`graph`] (the workflow's
//! picture), [`web`] (the embedded app).

pub mod api;
pub mod connections;
pub mod events;
pub mod files;
pub mod graph;
pub mod guard;
pub mod runs;
pub mod web;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context as _, bail};

pub use runs::Server;

/// How `trellis serve` was asked to run.
#[derive(Debug, Clone)]
pub struct Config {
    pub listen: SocketAddr,
    pub runs_dir: PathBuf,
    /// Workflow files offered by the web app and runnable by path.
    pub workflows_dir: Option<PathBuf>,
    /// Where commands of the runs it starts run (the directory `trellis serve` was started in).
    pub work_dir: PathBuf,
    /// Required on every request when set; required to listen anywhere but loopback.
    pub token: Option<String>,
    /// Host names requests may carry besides the bind address and loopback's names (`--allow-host`).
    pub allow_hosts: Vec<String>,
    /// What the commands and agent tools of the runs it starts run in.
    pub sandbox: Arc<trellis_run::Sandbox>,
}

/// The shortest token accepted.
pub const MIN_TOKEN_CHARS: usize = 16;

/// Why a token cannot protect a server, if it cannot.
pub fn weak_token(token: &str) -> Option<String> {
    if token.chars().any(char::is_whitespace) {
        return Some("a token may not contain spaces or other whitespace".to_owned());
    }
    let length = token.chars().count();
    (length < MIN_TOKEN_CHARS).then(|| {
        format!("a token needs at least {MIN_TOKEN_CHARS} characters (this one has {length}); leave --token out to have one generated")
    })
}

impl Config {
    /// Refuses what must not start: a non-loopback address without a token, a weak token.
    pub fn check(&self) -> anyhow::Result<()> {
        if !self.listen.ip().is_loopback() && self.token.is_none() {
            bail!(
                "refusing to listen on {} without a token: anyone who can reach it could run commands on this machine; pass --token TOKEN (or set TRELLIS_SERVER_TOKEN), or listen on 127.0.0.1",
                self.listen
            );
        }
        if let Some(problem) = self.token.as_deref().and_then(weak_token) {
            bail!("refusing this token: {problem}");
        }
        if let Some(dir) = &self.workflows_dir
            && !dir.is_dir()
        {
            bail!("the workflows directory {} does not exist", dir.display());
        }
        Ok(())
    }
}

/// Binds, recovers runs that a previous server (or terminal) left running, prints where it listens, and
/// serves until Ctrl-C or SIGTERM; runs it is running are cancelled then (resumable).
pub async fn serve(config: Config) -> anyhow::Result<()> {
    config.check()?;
    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .with_context(|| format!("cannot listen on {}", config.listen))?;
    let address = listener.local_addr()?;
    let server = Server::new(&config);
    let recovered = trellis_run::mark_interrupted(&server.runs_dir).await;
    if recovered > 0 {
        trellis_process::note!(
            "{recovered} run(s) were left running by a process that is gone: marked interrupted (resume them from the app or the API)"
        );
    }
    let app = app(&server);
    let token_hint = if config.token.is_some() {
        "/?token=<your token>"
    } else {
        "/"
    };
    trellis_process::note!(
        "trellis serve: http://{address}{token_hint}  (runs: {})\n  sandbox: {}",
        config.runs_dir.display(),
        config.sandbox.describe()
    );
    let shutdown = {
        let server = server.clone();
        async move {
            shutdown_signal().await;
            trellis_process::note!(
                "trellis serve: stopping; cancelling the runs it is running (resume them later)"
            );
            server.stop();
        }
    };
    connections::serve(listener, app, shutdown).await;
    server.wait_for_runs().await;
    Ok(())
}

/// The whole application: API, event streams, files and the web app, behind the guard.
pub fn app(server: &Arc<Server>) -> axum::Router {
    let (api, _) = api::router(server.clone());
    api.merge(web::router())
        .layer(axum::middleware::from_fn_with_state(
            server.clone(),
            guard::check,
        ))
        .layer(axum::extract::DefaultBodyLimit::max(guard::MAX_BODY))
        .layer(axum::middleware::from_fn(api::errors_as_json))
        .layer(axum::middleware::from_fn(api::contain_panics))
}

async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let Ok(mut terminate) = signal(SignalKind::terminate()) else {
        let _ = tokio::signal::ctrl_c().await;
        return;
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = terminate.recv() => {}
    }
}
