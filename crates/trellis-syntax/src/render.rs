//! Renderers for diagnostics: source snippets for a terminal (plain or coloured, drawn by
//! `codespan-reporting`) and a JSON form for tools and the web UI. Both compute line and column here,
//! from byte spans, and nowhere else.

use std::io::{self, Write};

use codespan_reporting::diagnostic as cs;
use codespan_reporting::files::SimpleFile;
use codespan_reporting::term::{self, Config};

use crate::diagnostic::{Diagnostic, Severity};
use crate::source::SourceFile;

fn to_codespan(diagnostic: &Diagnostic) -> cs::Diagnostic<()> {
    let severity = match diagnostic.severity {
        Severity::Error => cs::Severity::Error,
        Severity::Warning => cs::Severity::Warning,
        Severity::Note => cs::Severity::Note,
    };
    let mut labels = vec![
        cs::Label::primary((), diagnostic.primary.span.range())
            .with_message(&diagnostic.primary.message),
    ];
    labels.extend(
        diagnostic
            .secondary
            .iter()
            .map(|l| cs::Label::secondary((), l.span.range()).with_message(&l.message)),
    );
    let notes = diagnostic
        .help
        .iter()
        .map(|h| format!("help: {h}"))
        .collect();
    cs::Diagnostic::new(severity)
        .with_code(diagnostic.code)
        .with_message(&diagnostic.message)
        .with_labels(labels)
        .with_notes(notes)
}

/// Renders one diagnostic as plain text with a source snippet (no colour): the form snapshot tests use.
pub fn render_plain(file: &SourceFile, diagnostic: &Diagnostic) -> String {
    let simple = SimpleFile::new(file.name(), file.text());
    term::emit_into_string(&Config::default(), &simple, &to_codespan(diagnostic)).unwrap_or_else(
        |e| {
            format!(
                "{}: {} (could not draw the snippet: {e})\n",
                diagnostic.code, diagnostic.message
            )
        },
    )
}

/// Writes diagnostics to standard error or output with colour when `color` is set.
pub fn render_terminal(
    out: &mut dyn Write,
    file: &SourceFile,
    diagnostics: &[Diagnostic],
    color: bool,
) -> io::Result<()> {
    if !color {
        for d in diagnostics {
            out.write_all(render_plain(file, d).as_bytes())?;
        }
        return Ok(());
    }
    let simple = SimpleFile::new(file.name(), file.text());
    let mut buffer = term::termcolor::Buffer::ansi();
    for d in diagnostics {
        term::emit_to_write_style(&mut buffer, &Config::default(), &simple, &to_codespan(d))
            .map_err(io::Error::other)?;
    }
    out.write_all(buffer.as_slice())
}

/// The JSON form of one diagnostic: rule, severity, message, file, 1-based line and column, byte span.
pub fn to_json(file: &SourceFile, diagnostic: &Diagnostic) -> serde_json::Value {
    let label_json = |span: crate::Span, message: &str| {
        let (line, column) = file.line_col(span.start);
        let (end_line, end_column) = file.line_col(span.end);
        serde_json::json!({
            "line": line, "column": column, "end_line": end_line, "end_column": end_column,
            "span": { "start": span.start, "end": span.end }, "message": message,
        })
    };
    let (line, column) = file.line_col(diagnostic.primary.span.start);
    serde_json::json!({
        "rule": diagnostic.code,
        "severity": diagnostic.severity.as_str(),
        "message": diagnostic.message,
        "file": file.name(),
        "line": line,
        "column": column,
        "span": { "start": diagnostic.primary.span.start, "end": diagnostic.primary.span.end },
        "label": diagnostic.primary.message,
        "secondary": diagnostic.secondary.iter().map(|l| label_json(l.span, &l.message)).collect::<Vec<_>>(),
        "help": diagnostic.help,
    })
}
