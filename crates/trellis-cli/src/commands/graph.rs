//! `trellis graph FILE`: prints the compiled workflow as normalized DOT (or, `--format svg`, its picture) (resolved attributes, handler
//! types, classes, stylesheet models, expanded prompts). An invalid workflow prints its diagnostics to
//! standard error instead and exits 1.

use std::path::PathBuf;
use std::process::ExitCode;

use trellis_syntax::render::render_terminal;
use trellis_workflow::CompileOptions;

use super::{ColorChoice, EXIT_INVALID, EXIT_USAGE};

#[derive(clap::Args)]
pub struct Args {
    /// The workflow file.
    file: PathBuf,
    /// Replace the workflow's goal, as `trellis run --goal` would.
    #[arg(long)]
    goal: Option<String>,
    /// `dot`: the normalized workflow (what the engine runs); `svg`: its picture, laid out by Graphviz's
    /// `dot` when installed, else by a built-in layout engine.
    #[arg(long, value_enum, default_value_t = GraphFormat::Dot)]
    format: GraphFormat,
    /// Colour diagnostics.
    #[arg(long, value_enum, default_value_t = ColorChoice::Auto)]
    color: ColorChoice,
    /// Let `@file` and `workflow=` references read from this directory too; repeat for several.
    #[arg(long = "allow-dir", value_name = "DIR")]
    allow_dir: Vec<std::path::PathBuf>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum GraphFormat {
    Dot,
    Svg,
}

pub fn run(args: &Args) -> anyhow::Result<ExitCode> {
    let options = CompileOptions {
        goal: args.goal.clone(),
        allowed_dirs: args.allow_dir.clone(),
        attribute_texts: true,
        ..CompileOptions::default()
    };
    let (file, compiled) = match trellis_workflow::load(&args.file, &options) {
        Ok(loaded) => loaded,
        Err(error) => {
            trellis_process::note!("error: {error}");
            return Ok(ExitCode::from(EXIT_USAGE));
        }
    };
    let Some(workflow) = &compiled.workflow else {
        render_terminal(
            &mut std::io::stderr().lock(),
            &file,
            &compiled.diagnostics,
            args.color.for_stderr(),
        )?;
        trellis_process::note!("error: {} is not valid; fix the errors above", file.name());
        return Ok(ExitCode::from(EXIT_INVALID));
    };
    match args.format {
        GraphFormat::Dot => print!("{}", trellis_workflow::graph_dot::to_dot(workflow)),
        GraphFormat::Svg => {
            let picture = trellis_workflow::graph_dot::picture(workflow);
            match trellis_server::graph::render_svg(&picture) {
                Ok((svg, _)) => print!("{svg}"),
                Err(error) => {
                    trellis_process::note!("error: {error}");
                    return Ok(ExitCode::from(EXIT_USAGE));
                }
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}
