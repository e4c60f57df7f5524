//! The one diagnostic model every phase reports with: a stable rule code, a severity, a message, a
//! primary labelled span, secondary spans and optional help. Problems in a user's workflow are data,
//! collected into a list, never an `Err`.

use crate::span::Span;

/// How serious a diagnostic is. Only errors make a workflow invalid.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    Error,
    Warning,
    Note,
}

impl Severity {
    pub fn as_str(self) -> &'static str {
        match self {
            Severity::Error => "error",
            Severity::Warning => "warning",
            Severity::Note => "note",
        }
    }
}

/// A span with a short message explaining its part in the diagnostic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Label {
    pub span: Span,
    pub message: String,
}

impl Label {
    pub fn new(span: Span, message: impl Into<String>) -> Self {
        Self {
            span,
            message: message.into(),
        }
    }
}

/// The most diagnostics kept for one file: past them, the rest are counted, not kept.
pub const MAX_DIAGNOSTICS: usize = 200;

/// One problem found in a workflow.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Diagnostic {
    /// Stable, kebab-case rule code (`syntax`, `start-node`, `condition-syntax`, ...).
    pub code: &'static str,
    pub severity: Severity,
    pub message: String,
    pub primary: Label,
    pub secondary: Vec<Label>,
    pub help: Option<String>,
}

impl Diagnostic {
    pub fn new(
        code: &'static str,
        severity: Severity,
        message: impl Into<String>,
        span: Span,
    ) -> Self {
        Self {
            code,
            severity,
            message: message.into(),
            primary: Label::new(span, ""),
            secondary: Vec::new(),
            help: None,
        }
    }

    pub fn error(code: &'static str, message: impl Into<String>, span: Span) -> Self {
        Self::new(code, Severity::Error, message, span)
    }

    pub fn warning(code: &'static str, message: impl Into<String>, span: Span) -> Self {
        Self::new(code, Severity::Warning, message, span)
    }

    /// Sets the text shown under the primary span.
    #[must_use]
    pub fn with_label(mut self, message: impl Into<String>) -> Self {
        self.primary.message = message.into();
        self
    }

    #[must_use]
    pub fn with_secondary(mut self, span: Span, message: impl Into<String>) -> Self {
        self.secondary.push(Label::new(span, message));
        self
    }

    #[must_use]
    pub fn with_help(mut self, help: impl Into<String>) -> Self {
        self.help = Some(help.into());
        self
    }

    pub fn is_error(&self) -> bool {
        self.severity == Severity::Error
    }
}

/// Counts of diagnostics by severity, for verdict lines.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Tally {
    pub errors: usize,
    pub warnings: usize,
}

impl Tally {
    pub fn of(diagnostics: &[Diagnostic]) -> Self {
        diagnostics.iter().fold(Self::default(), |mut tally, d| {
            match d.severity {
                Severity::Error => tally.errors += 1,
                Severity::Warning => tally.warnings += 1,
                Severity::Note => {}
            }
            tally
        })
    }
}
