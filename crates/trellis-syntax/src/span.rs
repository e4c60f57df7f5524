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

/// The end of the character that starts at byte `pos` of `text` (`pos` itself at the end of the text,
/// clamped to the text, rounded up to a character boundary).
pub fn char_end(text: &str, pos: usize) -> usize {
    let mut pos = pos.min(text.len());
    while !text.is_char_boundary(pos) {
        pos += 1;
    }
    pos + text[pos..].chars().next().map_or(0, char::len_utf8)
}

impl Span {
    /// Widens the span to character boundaries of `text` and clamps it to the text, so a span computed
    /// by byte arithmetic can always be sliced and rendered.
    #[must_use]
    pub fn snapped(self, text: &str) -> Span {
        let (mut start, mut end) = (
            (self.start as usize).min(text.len()),
            (self.end as usize).min(text.len()),
        );
        while !text.is_char_boundary(start) {
            start -= 1;
        }
        while !text.is_char_boundary(end) {
            end += 1;
        }
        Span::from_range(start..end.max(start))
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
