//! `trellis-syntax` reads workflow files. It owns source files and byte spans, the one [`Diagnostic`]
//! model with its terminal and JSON renderers, and the recovering parsers for the DOT subset, the edge
//! condition language and the model stylesheet, plus the YAML workflow loader. It gives nothing a meaning:
//! that is `trellis-workflow`'s job, which lowers the [`ast::Document`] produced here.

#![allow(
    clippy::disallowed_methods,
    reason = "loading a source file is synchronous; async callers load on the blocking pool"
)]

pub mod ast;
pub mod condition;
pub mod diagnostic;
pub mod dot;
pub mod render;
pub mod source;
pub mod span;
pub mod stylesheet;
pub mod yaml;

pub use diagnostic::{Diagnostic, Label, Severity, Tally};
pub use render::acts_on_terminal;
pub use source::{SourceError, SourceFile, read_found_text, read_text, without_byte_order_mark};
pub use span::{Span, Spanned};

/// The result of parsing: the document (as much as could be read) and every problem found.
#[derive(Debug, Clone)]
pub struct Parsed {
    pub document: ast::Document,
    pub diagnostics: Vec<Diagnostic>,
}

/// Parses a workflow file, choosing DOT or YAML by the file name. Never fails.
pub fn parse(file: &SourceFile) -> Parsed {
    let mut diagnostics = Vec::new();
    let document = if file.is_yaml() {
        let stem = std::path::Path::new(file.name())
            .file_stem()
            .and_then(|s| s.to_str())
            .unwrap_or("workflow");
        yaml::parse_yaml(file.text(), stem, &mut diagnostics)
    } else {
        dot::parser::parse_dot(file.text(), &mut diagnostics)
    };
    Parsed {
        document,
        diagnostics,
    }
}
