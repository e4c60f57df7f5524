//! `trellis serve`: the HTTP API and the web app (`trellis-server`).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use trellis_store::resolve_runs_dir;

#[derive(clap::Args)]
pub struct Args {
    /// The address to listen on; anything but loopback needs --token.
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
    /// Confine the commands and agent tools of its runs: `auto`, `bubblewrap` or `none`
    /// [default: the config file's `[sandbox] mode`, else auto].
    #[arg(long, value_name = "auto|bubblewrap|none")]
    sandbox: Option<trellis_run::SandboxChoice>,
}

pub fn run(args: &Args) -> anyhow::Result<ExitCode> {
    let token = args.token.clone().filter(|t| !t.is_empty());
    let config = trellis_server::Config {
        listen: args.listen,
        runs_dir: resolve_runs_dir(args.runs_dir.clone()),
        workflows_dir: args.workflows.clone(),
        work_dir: std::env::current_dir()?,
        token,
        sandbox: std::sync::Arc::new(trellis_run::sandbox(args.sandbox)?),
    };
    super::on_server_runtime(trellis_server::serve(config))??;
    Ok(ExitCode::SUCCESS)
}
