//! `trellis-workflow` turns a parsed workflow into a typed, validated [`Workflow`]: it flattens defaults
//! and subgraphs, lowers attributes into typed node configurations ([`NodeKind`]), compiles edge
//! conditions, applies the model stylesheet, loads `@file` prompts, expands `$goal`, and runs the
//! validation [`rules`]. It sits between `trellis-syntax` (which parses) and the engine (which runs).

#![allow(
    clippy::disallowed_methods,
    reason = "compiling is synchronous (it reads `@file` prompts and schemas); async callers compile on the blocking pool"
)]

pub mod condition;
mod flatten;
pub mod graph_dot;
pub mod inline;
pub mod inputs;
pub mod label;
mod lower;
pub mod mcp_config;
pub mod node_kind;
pub mod outcome;
pub mod requires;
pub mod rules;
pub mod small_map;
mod style;
pub mod workflow;

use std::path::{Path, PathBuf};

use trellis_syntax::{Diagnostic, Parsed, Severity, SourceError, SourceFile};

pub use condition::{Condition, ConditionScope};
pub use flatten::class_from_label;
pub use node_kind::NodeKind;
pub use outcome::StageStatus;
pub use trellis_syntax::ast::SourceFormat;
pub use workflow::{AttributeTexts, Edge, Node, NodeIndex, Workflow};

/// Settings that come from outside the file.
#[derive(Debug, Clone, Default)]
pub struct CompileOptions {
    /// Replaces the workflow's `goal` (`trellis run --goal`).
    pub goal: Option<String>,
    /// Where `@file` references resolve; defaults to the workflow file's directory.
    pub base_dir: Option<PathBuf>,
    /// Directories references may reach besides the workflow's own and its git repository
    /// (`--allow-dir`).
    pub allowed_dirs: Vec<PathBuf>,
    /// The run's inputs, which templates name (`{{ inputs.NAME }}`, `$NAME` in prompts):
    /// `--input NAME=VALUE`, a run file's `[run.inputs]`.
    pub inputs: std::collections::BTreeMap<String, String>,
    /// Replaces the graph's default model (a run file's `[run.model] name`): nodes and stylesheet
    /// rules that name a model keep theirs.
    pub model: Option<String>,
    /// Keep every node's and edge's resolved attributes as text ([`Workflow::attribute_texts`]),
    /// to print the workflow back (`trellis graph`). Off, they are not made: a large workflow
    /// compiles in less time and memory, and nothing else reads them.
    pub attribute_texts: bool,
}

/// The result of compiling: the workflow when there were no errors, and every diagnostic.
#[derive(Debug, Clone)]
pub struct Compiled {
    pub workflow: Option<Workflow>,
    /// Name and size of what was read, even when there were errors (absent after syntax errors).
    pub outline: Option<Outline>,
    pub diagnostics: Vec<Diagnostic>,
}

/// A workflow's name and size, for summaries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outline {
    pub name: String,
    pub nodes: usize,
    pub edges: usize,
}

impl Compiled {
    pub fn has_errors(&self) -> bool {
        self.diagnostics.iter().any(Diagnostic::is_error)
    }
}

/// One file's entry in the machine-readable validation report (`trellis validate --format json`,
/// the server's `/api/validate` and its `422` answers): its outline, verdict and diagnostics with
/// line and column.
pub fn report(file: &SourceFile, compiled: &Compiled) -> serde_json::Value {
    let tally = trellis_syntax::Tally::of(&compiled.diagnostics);
    serde_json::json!({
        "file": file.name(),
        "workflow": compiled.outline.as_ref().map(|o| serde_json::json!({ "name": o.name, "nodes": o.nodes, "edges": o.edges })),
        "valid": tally.errors == 0,
        "errors": tally.errors,
        "warnings": tally.warnings,
        "needs_inputs": rules::template_variable::needs_inputs(&compiled.diagnostics),
        "diagnostics": compiled.diagnostics.iter().map(|d| trellis_syntax::render::to_json(file, d)).collect::<Vec<_>>(),
    })
}

/// The report document around file entries: valid when every file is (an entry with an `error`, a
/// file that could not be read, is not).
pub fn report_document(files: Vec<serde_json::Value>) -> serde_json::Value {
    let valid = files.iter().all(|f| f["valid"] == true);
    serde_json::json!({ "valid": valid, "files": serde_json::Value::Array(files) })
}

/// Lowers and validates a parsed workflow.
///
/// Syntax errors stop compilation (the partial tree would only produce echoes of them). Structural
/// rules run once every node and edge lowered into its shape, so one mistake is not reported three
/// times; a bad attribute *value* leaves the shape intact, so it never hides the other problems.
/// Diagnostics come back in source order.
pub fn compile(file: &SourceFile, parsed: Parsed, options: &CompileOptions) -> Compiled {
    let mut diagnostics = parsed.diagnostics;
    // Only a syntax error leaves nothing to compile: the parser's other errors (a YAML workflow's
    // `inputs` or `workflow_type`) are about values, and every rule still runs past them.
    let workflow = if diagnostics
        .iter()
        .any(|d| d.is_error() && d.code == rules::SYNTAX.code)
    {
        None
    } else {
        let base_dir = options
            .base_dir
            .clone()
            .or_else(|| file.path().and_then(Path::parent).map(Path::to_path_buf))
            .unwrap_or_else(|| PathBuf::from("."));
        // Each form consumes the one before it: a large workflow never holds its syntax tree, flat
        // graph and lowered form at once.
        let mut flat = flatten::flatten(parsed.document);
        rules::attribute_alias::apply(&mut flat, &mut diagnostics);
        rules::template_variable::expand_attributes(
            &mut flat,
            &options.inputs,
            options.goal.as_deref(),
            &mut diagnostics,
        );
        let files = rules::file_reference::FileScope::new(&base_dir, &options.allowed_dirs);
        let lowerer = lower::Lowerer {
            files: &files,
            goal_override: options.goal.as_deref(),
            inputs: &options.inputs,
            model_override: options.model.as_deref(),
            texts: options.attribute_texts.then(AttributeTexts::default),
            out: &mut diagnostics,
            sheet: None,
        };
        let workflow = lowerer.lower(flat);
        {
            for check in rules::GRAPH_CHECKS {
                check(&workflow, &mut diagnostics);
            }
            // Text held in memory stands for a file of its name in `base_dir`.
            let own = file.path().map_or_else(
                || base_dir.join(Path::new(file.name()).file_name().unwrap_or_default()),
                Path::to_path_buf,
            );
            rules::sub_workflow::check_includes(&workflow, &own, &mut diagnostics);
        }
        Some(workflow)
    };
    // Spans computed inside strings (conditions, stylesheets, YAML scalars) are approximate where the
    // text was unescaped or folded; every span handed out lies on character boundaries of the file.
    for diagnostic in &mut diagnostics {
        diagnostic.primary.span = diagnostic.primary.span.snapped(file.text());
        for label in &mut diagnostic.secondary {
            label.span = label.span.snapped(file.text());
        }
    }
    diagnostics.sort_by_key(|d| (d.primary.span.start, d.severity != Severity::Error));
    diagnostics.dedup_by(|a, b| {
        a.code == b.code && a.primary.span == b.primary.span && a.message == b.message
    });
    let outline = workflow.as_ref().map(|w| Outline {
        name: w.name.clone(),
        nodes: w.nodes.len(),
        edges: w.edges.len(),
    });
    let workflow = workflow.filter(|_| !diagnostics.iter().any(Diagnostic::is_error));
    // A file with thousands of problems shows the first ones and counts the rest.
    if diagnostics
        .iter()
        .skip(trellis_syntax::diagnostic::MAX_DIAGNOSTICS)
        .any(|d| d.severity != Severity::Note)
    {
        let rest = diagnostics.split_off(trellis_syntax::diagnostic::MAX_DIAGNOSTICS);
        let errors = rest.iter().filter(|d| d.is_error()).count();
        let counted = rest.iter().filter(|d| d.severity != Severity::Note).count();
        let end = trellis_syntax::Span::from_range(file.text().len()..file.text().len());
        // Still an error when errors were cut, so the verdict stays right.
        let severity = if errors > 0 {
            Severity::Error
        } else {
            Severity::Note
        };
        diagnostics.push(Diagnostic::new(
            "more",
            severity,
            format!("{counted} more problems ({errors} errors) are not shown; fix these first"),
            end,
        ));
    }
    Compiled {
        workflow,
        outline,
        diagnostics,
    }
}

/// Reads, parses and compiles a workflow file.
pub fn load(path: &Path, options: &CompileOptions) -> Result<(SourceFile, Compiled), SourceError> {
    Ok(parse_and_compile(SourceFile::load(path)?, options))
}

/// Parses and compiles a source file: a DOT file's structure filled in with its inputs first (see
/// [`rules::template_variable`]); an input it names that is not given stops there.
fn parse_and_compile(file: SourceFile, options: &CompileOptions) -> (SourceFile, Compiled) {
    let dot = !file.is_yaml();
    let mut problems = Vec::new();
    let filled = dot
        .then(|| {
            rules::template_variable::expand_structure(file.text(), &options.inputs, &mut problems)
        })
        .flatten();
    if !problems.is_empty() {
        let compiled = Compiled {
            workflow: None,
            outline: None,
            diagnostics: problems,
        };
        return (file, compiled);
    }
    let file = match filled {
        Some(text) => file.with_text(text),
        None => file,
    };
    let compiled = compile(&file, trellis_syntax::parse(&file), options);
    (file, compiled)
}

/// Parses and compiles source text held in memory, named `name` for diagnostics (its extension picks
/// DOT or YAML): a workflow pasted into the web app, or a test's.
pub fn compile_text(
    name: impl Into<String>,
    text: impl Into<String>,
    options: &CompileOptions,
) -> (SourceFile, Compiled) {
    parse_and_compile(SourceFile::new(name, text), options)
}
