//! `trellis validate FILE...`: compiles each file and prints its outline, every diagnostic with a source
//! snippet, and a verdict — or, with `--format json`, one JSON document for all files.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use serde_json::json;
use trellis_syntax::Tally;
use trellis_syntax::render::render_terminal;
use trellis_workflow::{CompileOptions, Compiled};

use super::{ColorChoice, EXIT_INVALID, EXIT_USAGE, OutputFormat};

#[derive(clap::Args)]
pub struct Args {
    /// Workflow files (.fabro, .dot, .yaml, .yml).
    #[arg(required = true)]
    files: Vec<PathBuf>,
    /// Output format.
    #[arg(long, value_enum, default_value_t = OutputFormat::Text)]
    format: OutputFormat,
    /// Colour diagnostics.
    #[arg(long, value_enum, default_value_t = ColorChoice::Auto)]
    color: ColorChoice,
    /// Let `@file` and `workflow=` references read from this directory too; repeat for several.
    #[arg(long = "allow-dir", value_name = "DIR")]
    allow_dir: Vec<PathBuf>,
}

fn verdict(tally: Tally) -> String {
    let plural = |n: usize, word: &str| format!("{n} {word}{}", if n == 1 { "" } else { "s" });
    match (tally.errors, tally.warnings) {
        (0, 0) => "valid".to_owned(),
        (0, w) => format!("valid with {}", plural(w, "warning")),
        (e, w) => format!("invalid: {}, {}", plural(e, "error"), plural(w, "warning")),
    }
}

pub fn run(args: &Args) -> anyhow::Result<ExitCode> {
    let color = args.color.for_stdout();
    let mut stdout = std::io::stdout().lock();
    let (mut any_invalid, mut any_unreadable) = (false, false);
    let mut documents = Vec::new();
    for (i, path) in args.files.iter().enumerate() {
        let options = CompileOptions {
            allowed_dirs: args.allow_dir.clone(),
            ..CompileOptions::default()
        };
        let (file, compiled) = match trellis_workflow::load(path, &options) {
            Ok(loaded) => loaded,
            Err(error) => {
                any_unreadable = true;
                match args.format {
                    OutputFormat::Json => documents.push(
                        json!({ "file": path.display().to_string(), "error": error.to_string() }),
                    ),
                    OutputFormat::Text => eprintln!("error: {error}"),
                }
                continue;
            }
        };
        let Compiled {
            outline,
            diagnostics,
            ..
        } = &compiled;
        let tally = Tally::of(diagnostics);
        any_invalid |= tally.errors > 0;
        match args.format {
            OutputFormat::Json => documents.push(trellis_workflow::report(&file, &compiled)),
            OutputFormat::Text => {
                if i > 0 {
                    writeln!(stdout)?;
                }
                match outline {
                    Some(o) => writeln!(
                        stdout,
                        "Workflow: {} ({} nodes, {} edges)",
                        o.name, o.nodes, o.edges
                    )?,
                    None => writeln!(
                        stdout,
                        "Workflow: {} (not compiled: syntax errors)",
                        file.name()
                    )?,
                }
                render_terminal(&mut stdout, &file, diagnostics, color)?;
                writeln!(stdout, "{}: {}", file.name(), verdict(tally))?;
            }
        }
        if i + 1 == args.files.len() {
            // The process ends next: freeing a large workflow node by node would only add to the
            // time `validate` takes (a tenth of it for 10,000 nodes).
            std::mem::forget(compiled);
        }
    }
    if args.format == OutputFormat::Json {
        let document = trellis_workflow::report_document(documents);
        writeln!(stdout, "{}", serde_json::to_string_pretty(&document)?)?;
    }
    Ok(if any_unreadable {
        ExitCode::from(EXIT_USAGE)
    } else if any_invalid {
        ExitCode::from(EXIT_INVALID)
    } else {
        ExitCode::SUCCESS
    })
}
