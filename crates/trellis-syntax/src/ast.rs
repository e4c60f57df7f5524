//! The syntax tree shared by the DOT parser and the YAML loader. It is faithful to what was written:
//! defaults are not yet applied, chains not yet expanded, and every key and value keeps its span.
//! `trellis-workflow` lowers it into the typed `Workflow`.

use std::time::Duration;

use crate::span::Span;

/// The text of a name or value: up to 24 bytes inline, longer on the heap.
pub type Text = compact_str::CompactString;

/// Which surface syntax a document was written in. Some rules differ between them (cycles, terminals).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SourceFormat {
    Dot,
    Yaml,
}

/// A parsed workflow file.
#[derive(Debug, Clone, PartialEq)]
pub struct Document {
    pub format: SourceFormat,
    /// The `digraph` keyword (or the YAML document start): where whole-workflow diagnostics point.
    pub header_span: Span,
    pub name: Option<Ident>,
    pub body: Vec<Stmt>,
}

/// A name as written, with its span.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ident {
    pub name: Text,
    pub span: Span,
}

/// What a `graph [...]`, `node [...]` or `edge [...]` statement sets defaults for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DefaultsTarget {
    Graph,
    Node,
    Edge,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Stmt {
    /// `key=value` at statement level: a graph attribute (or a subgraph attribute inside a subgraph).
    Attr(Attr),
    /// `graph [...]`, `node [...]`, `edge [...]`.
    Defaults {
        target: DefaultsTarget,
        attrs: Vec<Attr>,
        span: Span,
    },
    /// `id [attrs]`.
    Node { id: Ident, attrs: Vec<Attr> },
    /// `a -> b -> c [attrs]`: a chain of at least two node ids sharing the attributes.
    Edge {
        chain: Vec<Ident>,
        attrs: Vec<Attr>,
        span: Span,
    },
    /// `subgraph name { ... }` or an anonymous `{ ... }`.
    Subgraph {
        name: Option<Ident>,
        body: Vec<Stmt>,
        span: Span,
    },
}

/// `key=value`.
#[derive(Debug, Clone, PartialEq)]
pub struct Attr {
    pub key: Ident,
    pub value: Value,
}

impl Attr {
    pub fn span(&self) -> Span {
        self.key.span.to(self.value.span)
    }
}

/// How a value was written. Quoted strings may still hold numbers or durations ("900s"): the lowering
/// step converts by the type the attribute expects.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ValueKind {
    Quoted,
    Integer,
    Float,
    Boolean,
    Duration,
    /// An identifier or bare string such as `LR`, `box` or `claude-sonnet-4-5`.
    Bare,
}

/// An attribute value: its text (unescaped), how it was written, and where.
#[derive(Debug, Clone, PartialEq)]
pub struct Value {
    pub text: Text,
    pub kind: ValueKind,
    pub span: Span,
    /// For quoted strings: `(offset in text, offset in source)` after each escape, so spans inside the
    /// text (a bad condition clause, a stylesheet rule) map back to the exact source bytes.
    pub offset_map: Vec<(u32, u32)>,
}

impl Value {
    /// A value whose text starts at `span.start` (+1 when quoted) with no escapes.
    pub fn plain(text: impl Into<Text>, kind: ValueKind, span: Span) -> Self {
        Self {
            text: text.into(),
            kind,
            span,
            offset_map: Vec::new(),
        }
    }

    /// Maps a byte offset inside [`Value::text`] to the source offset it was read from.
    pub fn source_offset(&self, text_offset: u32) -> u32 {
        let content_start = self.span.start + u32::from(self.kind == ValueKind::Quoted);
        let (text_base, source_base) = self
            .offset_map
            .iter()
            .rev()
            .find(|(t, _)| *t <= text_offset)
            .copied()
            .unwrap_or((0, content_start));
        (source_base + (text_offset - text_base)).min(self.span.end)
    }

    /// Maps a span inside [`Value::text`] to a span in the source.
    pub fn source_span(&self, inner: Span) -> Span {
        Span::new(
            self.source_offset(inner.start),
            self.source_offset(inner.end)
                .max(self.source_offset(inner.start)),
        )
    }

    /// The value as a boolean, if it is one (`true`/`false`, quoted or not).
    pub fn as_bool(&self) -> Option<bool> {
        match self.text.as_str() {
            "true" => Some(true),
            "false" => Some(false),
            _ => None,
        }
    }

    /// The value as an integer, quoted or not.
    pub fn as_i64(&self) -> Option<i64> {
        self.text.trim().parse().ok()
    }

    /// The value as a number, quoted or not.
    pub fn as_f64(&self) -> Option<f64> {
        let text = self.text.trim();
        if text.is_empty() || text.ends_with('.') && text.len() == 1 {
            return None;
        }
        text.parse().ok().filter(|f: &f64| f.is_finite())
    }

    /// The value as a duration (`250ms`, `30s`, `15m`, `2h`, `1d`), quoted or not.
    pub fn as_duration(&self) -> Option<Duration> {
        parse_duration(self.text.trim())
    }
}

/// Parses `250ms`, `30s`, `15m`, `2h`, `1d`. A bare integer is not a duration: the unit is required.
pub fn parse_duration(text: &str) -> Option<Duration> {
    let digits_end = text.find(|c: char| !c.is_ascii_digit())?;
    if digits_end == 0 {
        return None;
    }
    let amount: u64 = text[..digits_end].parse().ok()?;
    let unit_ms: u64 = match &text[digits_end..] {
        "ms" => 1,
        "s" => 1000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        _ => return None,
    };
    amount.checked_mul(unit_ms).map(Duration::from_millis)
}

/// Whether `name` is a valid node id: `[A-Za-z_][A-Za-z0-9_]*`.
pub fn is_node_id(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_need_a_unit() {
        assert_eq!(parse_duration("250ms"), Some(Duration::from_millis(250)));
        assert_eq!(parse_duration("30s"), Some(Duration::from_secs(30)));
        assert_eq!(parse_duration("15m"), Some(Duration::from_mins(15)));
        assert_eq!(parse_duration("2h"), Some(Duration::from_hours(2)));
        assert_eq!(parse_duration("1d"), Some(Duration::from_hours(24)));
        assert_eq!(parse_duration("30"), None);
        assert_eq!(parse_duration("s"), None);
        assert_eq!(parse_duration("3x"), None);
        assert_eq!(parse_duration("99999999999999999999s"), None);
    }

    #[test]
    fn node_ids() {
        assert!(is_node_id("run_tests"));
        assert!(is_node_id("_private"));
        assert!(is_node_id("gate_1"));
        assert!(!is_node_id("1gate"));
        assert!(!is_node_id("claude-sonnet"));
        assert!(!is_node_id(""));
    }

    #[test]
    fn source_offsets_follow_escapes() {
        // Source: `"a\"b"` starting at 10: text `a"b`; the escape makes text offset 2 map to source 14.
        let value = Value {
            text: "a\"b".into(),
            kind: ValueKind::Quoted,
            span: Span::new(10, 16),
            offset_map: vec![(2, 14)],
        };
        assert_eq!(value.source_offset(0), 11);
        assert_eq!(value.source_offset(1), 12);
        assert_eq!(value.source_offset(2), 14);
    }
}
