//! `trellis models`: which providers are configured (never showing a key), the local model's state,
//! the default model a prompt node without `model` gets, which coding-agent CLIs (`backend="cli"`) are
//! installed and their versions, and with `--catalog` every known model.
//! Exits 1 with setup instructions when no model at all is available.

use std::process::ExitCode;

use serde_json::json;
use trellis_handlers::cli_agent::{FoundCli, find_clis};
use trellis_llm::catalog::MODELS;
use trellis_llm::config::{HOSTED, setup_variable};
use trellis_llm::local::{LocalState, SETUP_HELP};
use trellis_llm::{Client, Config};

#[derive(clap::Args)]
pub struct Args {
    /// Also list every model in the catalog.
    #[arg(long)]
    catalog: bool,
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
}

fn local_words(state: &LocalState) -> (&'static str, String) {
    match state {
        LocalState::Ready { server, model } => (
            "ready",
            format!("{} with {}", server.display(), model.display()),
        ),
        LocalState::MissingServer(path) => ("missing", format!("no server at {}", path.display())),
        LocalState::MissingModel(path) => ("missing", format!("no model at {}", path.display())),
        LocalState::NotConfigured => ("missing", "no cache directory (HOME is not set)".to_owned()),
    }
}

fn clis_json(clis: &[FoundCli]) -> Vec<serde_json::Value> {
    clis.iter()
        .map(|c| {
            json!({
                "name": c.cli.as_str(),
                "product": c.cli.product(),
                "provider": c.cli.provider(),
                "path": c.path.as_ref().map(|p| p.display().to_string()),
                "version": c.version,
            })
        })
        .collect()
}

fn print_clis(clis: &[FoundCli]) {
    println!("\nAgent CLIs (backend=\"cli\")");
    for found in clis {
        let line = match (&found.path, &found.version) {
            (Some(path), Some(version)) => format!("{version} ({})", path.display()),
            (Some(path), None) => {
                format!("found, but `--version` did not answer ({})", path.display())
            }
            (None, _) => "not found on PATH".to_owned(),
        };
        let name = format!("{} ({})", found.cli, found.cli.provider());
        println!("  {name:<18} {line}");
    }
}

pub fn run(args: &Args) -> anyhow::Result<ExitCode> {
    let config = Config::load()?;
    let configured = config.configured();
    let local = trellis_llm::local::state(&config.local);
    let (local_state, local_detail) = local_words(&local);
    let client = Client::from_config(&config, None);
    let default = client.resolve(None, None).ok();
    let usable = !configured.is_empty() || matches!(local, LocalState::Ready { .. });
    let clis = find_clis();
    if args.json {
        let providers: Vec<_> = HOSTED
            .iter()
            .map(|name| {
                let settings = config.providers.get(*name);
                json!({
                    "name": name,
                    "configured": configured.contains(name),
                    "base_url": settings.and_then(|s| s.base_url.clone()),
                })
            })
            .collect();
        let catalog: Vec<_> = MODELS
            .iter()
            .map(|m| json!({ "id": m.id, "aliases": m.aliases, "provider": m.provider, "context_window": m.context_window, "max_output": m.max_output, "tools": m.tools, "reasoning": m.reasoning }))
            .collect();
        let report = json!({
            "providers": providers,
            "local": { "state": local_state, "detail": local_detail, "in_use": configured.is_empty() },
            "usable": usable,
            "default_model": default.as_ref().map(|d| json!({ "model": d.model, "provider": d.provider })),
            "config_file": config.file.as_ref().map(|f| f.display().to_string()),
            "clis": clis_json(&clis),
            "catalog": if args.catalog { json!(catalog) } else { json!(null) },
        });
        println!("{}", serde_json::to_string_pretty(&report)?);
        return Ok(ExitCode::SUCCESS);
    }
    println!("Providers");
    for name in HOSTED {
        let line = if configured.contains(name) {
            let url = config
                .providers
                .get(*name)
                .and_then(|s| s.base_url.clone())
                .unwrap_or_else(|| "default address".to_owned());
            format!("configured ({url})")
        } else {
            format!("not configured (set {})", setup_variable(name))
        };
        println!("  {name:<18} {line}");
    }
    println!("\nLocal model");
    let use_note = if configured.is_empty() {
        "in use: no provider key is set"
    } else {
        "used for model=\"local\""
    };
    println!("  {:<18} {local_state}: {local_detail}", "llama-server");
    if matches!(local, LocalState::Ready { .. }) {
        println!("  {:<18} {use_note}", "");
    }
    print_clis(&clis);
    if let Some(file) = &config.file {
        println!("\nConfig file: {}", file.display());
    }
    match &default {
        Some(d) if usable => println!("\nDefault model: {} ({})", d.model, d.provider),
        _ => {}
    }
    if args.catalog {
        println!(
            "\n{:<28} {:<18} {:>10} {:>10}  {:<5} {:<9} aliases",
            "model", "provider", "context", "output", "tools", "reasoning"
        );
        for m in MODELS {
            println!(
                "{:<28} {:<18} {:>10} {:>10}  {:<5} {:<9} {}",
                m.id,
                m.provider,
                m.context_window,
                m.max_output,
                if m.tools { "yes" } else { "no" },
                if m.reasoning { "yes" } else { "no" },
                m.aliases.join(", ")
            );
        }
    }
    // A report, not a check: it succeeds whatever it finds (`--json` says `"usable"`).
    if !usable {
        println!("\nNo model is available yet: {SETUP_HELP}");
    }
    Ok(ExitCode::SUCCESS)
}
