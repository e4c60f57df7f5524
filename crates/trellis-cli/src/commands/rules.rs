//! `trellis rules`: lists every validation rule with its code, severity and summary.

use std::process::ExitCode;

#[derive(clap::Args)]
pub struct Args {}

pub fn run(_args: &Args) -> ExitCode {
    let width = trellis_workflow::rules::ALL
        .iter()
        .map(|r| r.code.len())
        .max()
        .unwrap_or(0);
    for rule in trellis_workflow::rules::ALL {
        println!(
            "{:width$}  {:7}  {}",
            rule.code,
            rule.severity.as_str(),
            rule.summary
        );
    }
    ExitCode::SUCCESS
}
