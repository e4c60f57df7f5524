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
    /// Workflow files (.fabro, .dot, .yaml, .yml), or run files (.toml) naming one.
    #[arg(required = true)]
    files: Vec<PathBuf>,
    /// An input templates name (`{{ inputs.KEY }}`, `$KEY` in prompts), over a run file's; repeat
    /// for several. `-V` is Fabro's spelling.
    #[arg(long = "input", short = 'V', value_name = "KEY=VALUE")]
    input: Vec<String>,
    /// Output format.
    #[arg(long, value_enum, default_value_t = OutputFormat::Text)]
    format: OutputFormat,
    /// Colour diagnostics.
    #[arg(long, value_enum, default_value_t = ColorChoice::Auto)]
    color: ColorChoice,
    /// Let `@file` and `workflow=` references read from this directory too; repeat for several.
    #[arg(long = "allow-dir", value_name = "DIR")]
    allow_dir: Vec<PathBuf>,
    /// Also check what a valid workflow needs from this machine, as `trellis run` does before its
    /// first stage (SWEny's pre-flight): the skills its agent nodes name and their variables, a
    /// `web_search` key. Exit 2 when something is missing.
    #[arg(long)]
    preflight: bool,
}

fn verdict(tally: Tally) -> String {
    let plural = |n: usize, word: &str| format!("{n} {word}{}", if n == 1 { "" } else { "s" });
    match (tally.errors, tally.warnings) {
        (0, 0) => "valid".to_owned(),
        (0, w) => format!("valid with {}", plural(w, "warning")),
        (e, w) => format!("invalid: {}, {}", plural(e, "error"), plural(w, "warning")),
    }
}

/// `--input KEY=VALUE` pairs as a map; `Err` holds a pair that is not one.
fn inputs(pairs: &[String]) -> Result<std::collections::BTreeMap<String, String>, &str> {
    pairs
        .iter()
        .map(|pair| {
            pair.split_once('=')
                .filter(|(k, _)| !k.trim().is_empty())
                .map(|(k, v)| (k.trim().to_owned(), v.to_owned()))
                .ok_or(pair.as_str())
        })
        .collect()
}

/// What `workflow` lacks on this machine, in the run file's working directory or this one.
fn preflight(
    workflow: &trellis_workflow::Workflow,
    run_file: Option<&trellis_run::RunFile>,
) -> anyhow::Result<Result<(), String>> {
    let work_dir = match run_file.and_then(|f| f.work_dir.clone()) {
        Some(dir) => dir,
        None => std::env::current_dir()?,
    };
    Ok(trellis_run::preflight(workflow, run_file, &work_dir))
}

/// The workflow's name and size, or that it could not be compiled.
fn write_outline(
    out: &mut impl Write,
    outline: Option<&trellis_workflow::Outline>,
    file_name: &str,
) -> std::io::Result<()> {
    match outline {
        Some(o) => writeln!(
            out,
            "Workflow: {} ({} nodes, {} edges)",
            super::printable(&o.name),
            o.nodes,
            o.edges
        ),
        None => writeln!(out, "Workflow: {file_name} (not compiled: syntax errors)"),
    }
}

/// The pre-flight's verdict on `name`: ready, or each problem on a line of its own.
fn write_ready(
    out: &mut impl Write,
    name: &str,
    ready: &Result<(), String>,
) -> std::io::Result<()> {
    match ready {
        Ok(()) => writeln!(out, "{name}: ready to run here"),
        Err(problems) => {
            writeln!(out, "{name}: cannot start here:")?;
            for problem in problems.lines() {
                writeln!(out, "  {problem}")?;
            }
            Ok(())
        }
    }
}

pub fn run(args: &Args) -> anyhow::Result<ExitCode> {
    super::huge_pages::start_again_for(&args.files);
    let color = args.color.for_stdout();
    let mut stdout = std::io::stdout().lock();
    let (mut any_invalid, mut any_unreadable, mut any_unready) = (false, false, false);
    let mut documents = Vec::new();
    let inputs = match inputs(&args.input) {
        Ok(inputs) => inputs,
        Err(pair) => {
            trellis_process::note!("error: --input expects KEY=VALUE, found `{pair}`");
            return Ok(ExitCode::from(EXIT_USAGE));
        }
    };
    for (i, path) in args.files.iter().enumerate() {
        let options = CompileOptions {
            allowed_dirs: args.allow_dir.clone(),
            inputs: inputs.clone(),
            ..CompileOptions::default()
        };
        let opened = match trellis_run::open_blocking(path, options) {
            Ok(opened) => opened,
            Err(error) => {
                let run_file = matches!(error, trellis_run::RunError::RunFile { .. });
                any_unreadable |= !run_file;
                any_invalid |= run_file;
                match args.format {
                    OutputFormat::Json => documents.push(
                        json!({ "file": path.display().to_string(), "valid": false, "error": error.to_string() }),
                    ),
                    OutputFormat::Text => trellis_process::note!("error: {error}"),
                }
                continue;
            }
        };
        let warnings: Vec<String> = opened.warnings.iter().map(ToString::to_string).collect();
        let (file, compiled) = (opened.loaded.file, opened.loaded.compiled);
        let Compiled {
            outline,
            diagnostics,
            ..
        } = &compiled;
        let tally = Tally::of(diagnostics);
        any_invalid |= tally.errors > 0;
        // Only a workflow with no errors is checked against the machine.
        let ready = match (&compiled.workflow, args.preflight && tally.errors == 0) {
            (Some(workflow), true) => Some(preflight(workflow, opened.run_file.as_ref())?),
            _ => None,
        };
        any_unready |= matches!(ready, Some(Err(_)));
        match args.format {
            OutputFormat::Json => {
                let mut report = trellis_workflow::report(&file, &compiled);
                if let Some(ready) = &ready {
                    report["preflight"] = json!({
                        "ready": ready.is_ok(),
                        "problems": ready.as_ref().err().map_or_else(Vec::new, |p| p.lines().collect()),
                    });
                }
                if let Some(file) = &opened.run_file {
                    report["run_file"] = json!({
                        "file": file.path.display().to_string(),
                        "warnings": warnings,
                    });
                }
                documents.push(report);
            }
            OutputFormat::Text => {
                if i > 0 {
                    writeln!(stdout)?;
                }
                if let Some(file) = &opened.run_file {
                    writeln!(stdout, "Run file: {}", file.path.display())?;
                    for warning in &warnings {
                        writeln!(stdout, "{warning}")?;
                    }
                }
                write_outline(&mut stdout, outline.as_ref(), file.name())?;
                render_terminal(&mut stdout, &file, diagnostics, color)?;
                writeln!(stdout, "{}: {}", file.name(), verdict(tally))?;
                if let Some(ready) = &ready {
                    write_ready(&mut stdout, file.name(), ready)?;
                }
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
    Ok(if any_unreadable || any_unready {
        ExitCode::from(EXIT_USAGE)
    } else if any_invalid {
        ExitCode::from(EXIT_INVALID)
    } else {
        ExitCode::SUCCESS
    })
}
