//! Renderers for diagnostics: source snippets for a terminal (plain or coloured, drawn by
//! `codespan-reporting`) and a JSON form for tools and the web UI. Both compute line and column here,
//! from byte spans, and nowhere else. What a file holds that would act on the terminal
//! ([`acts_on_terminal`]) is drawn visible.

use std::fmt::Write as _;
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

/// Source lines longer than this are not drawn whole: the snippet shows the part around the span.
const LONG_LINE: usize = 240;
/// Characters shown on each side of a span on a long line.
const CONTEXT_CHARS: usize = 60;

/// Whether `c` would act on a terminal rather than show on it: a control character other than a
/// tab or a line break, or a mark that turns text right to left (and can hide what follows).
/// Text from a file or a run that holds one is shown with it replaced or escaped.
pub fn acts_on_terminal(c: char) -> bool {
    (c.is_control() && !matches!(c, '\t' | '\n'))
        || matches!(c, '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

/// Renders one diagnostic as plain text with a source snippet (no colour): the form snapshot tests use.
pub fn render_plain(file: &SourceFile, diagnostic: &Diagnostic) -> String {
    let mended = shown(file, std::slice::from_ref(diagnostic));
    let (file, diagnostic) = match &mended {
        Some((file, diagnostics)) => (file, &diagnostics[0]),
        None => (file, diagnostic),
    };
    let simple = SimpleFile::new(file.name(), file.text());
    plain(&simple, file, diagnostic)
}

/// `text` with each character that [acts on a terminal](acts_on_terminal) (but the `\r` of
/// a `\r\n`) replaced by as many bytes of visible text (`?`, or `�` for a three-byte one), so
/// spans still point where they did; `None` when there is none.
fn visible(text: &str) -> Option<String> {
    let acts = |(at, c): (usize, char)| {
        acts_on_terminal(c) && !(c == '\r' && text[at + 1..].starts_with('\n'))
    };
    if !text.char_indices().any(acts) {
        return None;
    }
    let mut shown = String::with_capacity(text.len());
    for (at, c) in text.char_indices() {
        match c.len_utf8() {
            _ if !acts((at, c)) => shown.push(c),
            3 => shown.push('\u{fffd}'),
            n => shown.extend(std::iter::repeat_n('?', n)),
        }
    }
    Some(shown)
}

/// A workflow (a file from anywhere) may hold characters that act on the terminal the snippet is
/// drawn on: the file and the diagnostics (whose messages quote it) with them made [`visible`],
/// when there are any.
fn shown(file: &SourceFile, diagnostics: &[Diagnostic]) -> Option<(SourceFile, Vec<Diagnostic>)> {
    let text = visible(file.text());
    let quotes = |d: &Diagnostic| {
        std::iter::once(&d.message)
            .chain(std::iter::once(&d.primary.message))
            .chain(d.secondary.iter().map(|l| &l.message))
            .chain(&d.help)
            .any(|m| visible(m).is_some())
    };
    if text.is_none() && !diagnostics.iter().any(quotes) {
        return None;
    }
    let mend = |m: &mut String| {
        if let Some(v) = visible(m) {
            *m = v;
        }
    };
    let diagnostics = diagnostics
        .iter()
        .cloned()
        .map(|mut d| {
            mend(&mut d.message);
            mend(&mut d.primary.message);
            d.secondary.iter_mut().for_each(|l| mend(&mut l.message));
            d.help.as_mut().map(mend);
            d
        })
        .collect();
    let file = SourceFile::new(file.name(), text.unwrap_or_else(|| file.text().to_owned()));
    Some((file, diagnostics))
}

fn plain(simple: &SimpleFile<&str, &str>, file: &SourceFile, diagnostic: &Diagnostic) -> String {
    if on_long_line(file, diagnostic) {
        return clipped(file, diagnostic);
    }
    term::emit_into_string(&Config::default(), simple, &to_codespan(diagnostic)).unwrap_or_else(
        |e| {
            format!(
                "{}: {} (could not draw the snippet: {e})\n",
                diagnostic.code, diagnostic.message
            )
        },
    )
}

/// Whether a label of the diagnostic sits on a line too long to draw whole.
fn on_long_line(file: &SourceFile, diagnostic: &Diagnostic) -> bool {
    std::iter::once(&diagnostic.primary)
        .chain(&diagnostic.secondary)
        .any(|label| file.line_text(label.span.start).len() > LONG_LINE)
}

/// A diagnostic on a long line, drawn like the others but with only the part of the line around the
/// primary span.
fn clipped(file: &SourceFile, diagnostic: &Diagnostic) -> String {
    let span = diagnostic.primary.span;
    let (line, column) = file.line_col(span.start);
    let text = file.line_text(span.start);
    let line_start = span.start as usize - file.line_offset(span.start);
    let (from, to) = (
        span.start as usize - line_start,
        (span.end as usize - line_start).min(text.len()),
    );
    let before: String = text[..from]
        .chars()
        .rev()
        .take(CONTEXT_CHARS)
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .collect();
    let marked = &text[from..to.max(from)];
    let marked: String = marked.chars().take(CONTEXT_CHARS).collect();
    let after: String = text[to.max(from)..].chars().take(CONTEXT_CHARS).collect();
    let (lead, trail) = (
        if before.len() < from { "…" } else { "" },
        if to + after.len() < text.len() {
            "…"
        } else {
            ""
        },
    );
    let gutter = " ".repeat(line.to_string().len());
    let pad = " ".repeat(lead.chars().count() + before.chars().count());
    let carets = "^".repeat(marked.chars().count().max(1));
    let mut out = format!(
        "{}[{}]: {}\n{gutter} ┌─ {}:{line}:{column}\n{gutter} │\n{line} │ {lead}{before}{marked}{after}{trail}\n{gutter} │ {pad}{carets} {}\n",
        diagnostic.severity.as_str(),
        diagnostic.code,
        diagnostic.message,
        file.name(),
        diagnostic.primary.message,
    );
    if let Some(help) = &diagnostic.help {
        let _ = write!(out, "{gutter} │\n{gutter} = help: {help}\n");
    }
    out.push('\n');
    out
}

/// Writes diagnostics to standard error or output with colour when `color` is set.
pub fn render_terminal(
    out: &mut dyn Write,
    file: &SourceFile,
    diagnostics: &[Diagnostic],
    color: bool,
) -> io::Result<()> {
    if diagnostics.is_empty() {
        return Ok(());
    }
    let mended = shown(file, diagnostics);
    let (file, diagnostics) = match &mended {
        Some((file, diagnostics)) => (file, diagnostics.as_slice()),
        None => (file, diagnostics),
    };
    // One line index for the file, however many diagnostics there are.
    let simple = SimpleFile::new(file.name(), file.text());
    if !color {
        for d in diagnostics {
            out.write_all(plain(&simple, file, d).as_bytes())?;
        }
        return Ok(());
    }
    let mut buffer = term::termcolor::Buffer::ansi();
    for d in diagnostics {
        if on_long_line(file, d) {
            buffer.write_all(clipped(file, d).as_bytes())?;
            continue;
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A workflow from anywhere may hold escape sequences: its snippet shows them as `?`, with the
    /// carets under what they mark, and a CRLF file is drawn as it always was.
    #[test]
    fn characters_that_act_on_a_terminal_are_drawn_visible() {
        let file = SourceFile::new("e.fabro", "a [label=\"\x1b]0;pwned\x07\u{202e}\"] ->\r\n");
        let at = file.text().find("->").unwrap() as u32;
        let diagnostic = Diagnostic::new(
            "syntax",
            Severity::Error,
            "found `\x1b[2J`",
            crate::Span::new(at, at + 2),
        );
        let shown = render_plain(&file, &diagnostic);
        assert!(!shown.contains(acts_on_terminal), "{shown:?}");
        assert!(shown.contains("found `?[2J`"), "{shown}");
        let lines: Vec<&str> = shown.lines().collect();
        let snippet = lines.iter().find(|l| l.contains("pwned")).unwrap();
        assert!(
            snippet.ends_with("a [label=\"?]0;pwned?\u{fffd}\"] ->"),
            "{snippet:?}"
        );
        let carets = lines.iter().find(|l| l.contains('^')).unwrap();
        let column = |line: &str, at: usize| line[..at].chars().count();
        assert_eq!(
            column(carets, carets.find('^').unwrap()),
            column(snippet, snippet.find("->").unwrap()),
            "{shown}"
        );
        let crlf = SourceFile::new("c.fabro", "a ->\r\n");
        let diagnostic = Diagnostic::new("syntax", Severity::Error, "m", crate::Span::new(2, 4));
        assert!(!render_plain(&crlf, &diagnostic).contains('?'));
        // A message quoting a line break as written is drawn as it is (the fuzz test found it).
        let quoting = Diagnostic::new("syntax", Severity::Error, "`\r\n`", crate::Span::new(2, 4));
        assert!(render_plain(&crlf, &quoting).contains("`\r\n`"));
    }
}
