//! Byte spans into a source file. Every token, key and value carries one; line and column numbers are
//! computed only when a diagnostic is rendered (see [`crate::source::SourceFile::line_col`]).

use std::ops::Range;

/// A half-open byte range `start..end` into one source file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, PartialOrd, Ord, serde::Serialize)]
pub struct Span {
    pub start: u32,
    pub end: u32,
}

impl Span {
    pub const fn new(start: u32, end: u32) -> Self {
        Self { start, end }
    }

    /// A span from `usize` offsets. Sources are limited to `u32::MAX` bytes when loaded.
    pub fn from_range(range: Range<usize>) -> Self {
        Self::new(range.start as u32, range.end as u32)
    }

    /// The smallest span that covers both `self` and `other`.
    #[must_use]
    pub fn to(self, other: Span) -> Span {
        Span::new(self.start.min(other.start), self.end.max(other.end))
    }

    pub fn range(self) -> Range<usize> {
        self.start as usize..self.end as usize
    }

    pub fn len(self) -> u32 {
        self.end - self.start
    }

    pub fn is_empty(self) -> bool {
        self.start == self.end
    }
}

/// A value together with the span it was read from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Spanned<T> {
    pub value: T,
    pub span: Span,
}

impl<T> Spanned<T> {
    pub fn new(value: T, span: Span) -> Self {
        Self { value, span }
    }
}
