//! `trellis serve`: the HTTP API and the web app (`trellis-server`).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;
use trellis_store::resolve_runs_dir;

#[derive(clap::Args)]
pub struct Args {
    /// The address to listen on; beyond loopback, every request needs the token (generated when
    /// none is given).
    #[arg(long, default_value = "127.0.0.1:7777", value_name = "ADDR")]
    listen: SocketAddr,
    /// Where run records live [default: `$TRELLIS_RUNS_DIR` or `~/.trellis/runs`].
    #[arg(long, value_name = "DIR")]
    runs_dir: Option<PathBuf>,
    /// Workflow files the app offers and the API runs by path.
    #[arg(long, value_name = "DIR")]
    workflows: Option<PathBuf>,
    /// Require this token on every request.
    #[arg(
        long,
        value_name = "TOKEN",
        env = "TRELLIS_SERVER_TOKEN",
        hide_env_values = true
    )]
    token: Option<String>,
    /// Read the token from this file (its first line).
    #[arg(long, value_name = "FILE", conflicts_with = "token")]
    token_file: Option<PathBuf>,
    /// Also answer requests that name this host (the server answers only to its bind address,
    /// `localhost`, `127.0.0.1` and `[::1]` otherwise); repeat for several.
    #[arg(long = "allow-host", value_name = "NAME")]
    allow_host: Vec<String>,
    /// Confine the commands and agent tools of its runs: `auto`, `bubblewrap`, `landlock` or
    /// `none` [default: the config file's `[sandbox] mode`, else auto].
    #[arg(long, value_name = "MODE", env = "TRELLIS_SANDBOX")]
    sandbox: Option<trellis_run::SandboxChoice>,
}

/// The token: given, read from a file, or — for an address beyond loopback without one — generated
/// and printed once.
fn token(args: &Args) -> anyhow::Result<Option<String>> {
    if let Some(path) = &args.token_file {
        let text = trellis_syntax::read_text(path)
            .with_context(|| format!("cannot read the token file {}", path.display()))?;
        return Ok(Some(text.lines().next().unwrap_or_default().to_owned()));
    }
    if let Some(token) = &args.token {
        return Ok(Some(token.clone()));
    }
    if args.listen.ip().is_loopback() {
        return Ok(None);
    }
    let token = trellis_process::secrets::random_token()
        .context("cannot read /dev/urandom to generate a token")?;
    trellis_process::note!(
        "trellis serve: no token was given for {}, so this one was generated (it is shown only now):\n  {token}\n  open http://{}/?token={token}",
        args.listen,
        args.listen
    );
    Ok(Some(token))
}

pub fn run(args: &Args) -> anyhow::Result<ExitCode> {
    let token = token(args)?;
    let config = trellis_server::Config {
        listen: args.listen,
        runs_dir: resolve_runs_dir(args.runs_dir.clone()),
        workflows_dir: args.workflows.clone(),
        work_dir: std::env::current_dir()?,
        token,
        allow_hosts: args.allow_host.clone(),
        sandbox: super::sandbox(args.sandbox)?,
    };
    super::on_server_runtime(trellis_server::serve(config))??;
    Ok(ExitCode::SUCCESS)
}
