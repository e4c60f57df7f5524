//! `sub-workflow` (error): sub-workflow nodes name a child workflow file, and no chain of them comes
//! back to a file already on it.
//!
//! A `house` node runs another workflow file, given by `workflow` (or `stack.child_workflow`), relative
//! to this one. Without one there is nothing to run; a file that does not exist is reported by
//! `file-reference`. A workflow that includes itself, directly or through other files, would nest
//! runs without end (a fan-out of such nodes multiplies them at every level):
//!
//! ```dot
//! build [shape=house, workflow="build.fabro"]
//! again [shape=house, workflow="this-file.fabro"]   // error: leads back to itself
//! ```

use std::path::PathBuf;

use trellis_syntax::ast::Value;
use trellis_syntax::{Diagnostic, Severity, Span};

use crate::rules::{Rule, file_reference};

pub const RULE: Rule = Rule {
    code: "sub-workflow",
    severity: Severity::Error,
    summary: "sub-workflow nodes name a child workflow file, and no workflow includes itself",
};

/// The child workflow's path, or `None` (reported) when missing.
pub(crate) fn require(
    node: &str,
    value: Option<&Value>,
    files: &file_reference::FileScope,
    span: Span,
    out: &mut Vec<Diagnostic>,
) -> Option<PathBuf> {
    let Some(value) = value.filter(|v| !v.text.trim().is_empty()) else {
        out.push(
            RULE.diagnostic(
                format!("sub-workflow node `{node}` names no workflow"),
                span,
            )
            .with_label("needs `workflow`")
            .with_help("add `workflow=\"child.fabro\"` (relative to this file)"),
        );
        return None;
    };
    file_reference::check_exists(
        "workflow",
        value,
        value.text.trim_start_matches('@'),
        files,
        out,
    )
}

/// Files a chain of sub-workflows may pass through before the search gives up (each is read once).
const MAX_FILES: usize = 256;

/// Reports each sub-workflow node of the file at `own` whose child leads back to a file already on
/// the way there — `own` itself, directly or through other files. Such a run nests sub-workflows
/// until the depth limit stops it, so it is refused before it starts.
pub(crate) fn check_includes(
    workflow: &crate::Workflow,
    own: &std::path::Path,
    out: &mut Vec<Diagnostic>,
) {
    let Ok(own) = std::fs::canonicalize(own) else {
        return;
    };
    for node in &workflow.nodes {
        let crate::NodeKind::SubWorkflow(config) = &node.kind else {
            continue;
        };
        let Ok(child) = std::fs::canonicalize(&config.workflow) else {
            continue;
        };
        let mut chain = vec![own.clone()];
        let mut explored = std::collections::HashSet::new();
        if let Some(cycle) = cycle_from(child, &mut chain, &mut explored) {
            let names: Vec<String> = cycle
                .iter()
                .map(|p| {
                    p.file_name().map_or_else(
                        || p.display().to_string(),
                        |n| n.to_string_lossy().into_owned(),
                    )
                })
                .collect();
            let span = node.span_of("workflow");
            out.push(
                RULE.diagnostic(
                    format!(
                        "sub-workflow node `{}` leads into workflows that include themselves: {}",
                        node.id,
                        names.join(" → ")
                    ),
                    span,
                )
                .with_label("never ends")
                .with_help("a run of it would nest sub-workflows without end; break the cycle"),
            );
        }
    }
}

/// The chain of files from `chain`'s start through `path` back to a file on the chain, if there is one.
fn cycle_from(
    path: PathBuf,
    chain: &mut Vec<PathBuf>,
    explored: &mut std::collections::HashSet<PathBuf>,
) -> Option<Vec<PathBuf>> {
    if let Some(at) = chain.iter().position(|p| *p == path) {
        let mut cycle = chain[at..].to_vec();
        cycle.push(path);
        return Some(cycle);
    }
    if explored.len() >= MAX_FILES || !explored.insert(path.clone()) {
        return None;
    }
    chain.push(path.clone());
    for child in children(&path) {
        if let Some(cycle) = cycle_from(child, chain, explored) {
            return Some(cycle);
        }
    }
    chain.pop();
    None
}

/// The canonical paths of the sub-workflows `path` names (a file that does not load names none: its
/// own validation reports it).
fn children(path: &std::path::Path) -> Vec<PathBuf> {
    let Ok(file) = trellis_syntax::SourceFile::load(path) else {
        return Vec::new();
    };
    let parsed = trellis_syntax::parse(&file);
    let mut flat = crate::flatten::flatten(parsed.document);
    crate::rules::attribute_alias::apply(&mut flat, &mut Vec::new());
    let base = path.parent().unwrap_or(std::path::Path::new("."));
    flat.nodes
        .iter()
        .filter_map(|node| node.attrs.get("workflow"))
        .filter_map(|attr| {
            let reference = attr.value.text.trim().trim_start_matches('@');
            std::fs::canonicalize(file_reference::resolve_path(reference, base)).ok()
        })
        .collect()
}
