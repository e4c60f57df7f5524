//! The YAML workflow loader: reads the natural-language-routing format (`nodes` keyed by id, `edges` with
//! `from`, `to`, `when`, `max_iterations`) into the same [`Document`] the DOT parser produces, with spans
//! pointing into the YAML text. The format:
//!
//! ```yaml
//! name: Triage                 # the workflow name (default: the file name)
//! goal: Triage new reports     # any other top-level scalar is a graph attribute
//! start: gather                # the entry node (default: the first node listed)
//! nodes:
//!   gather: { type: command, script: "./collect.sh" }
//!   investigate: { prompt: "Investigate the reports" }
//!   notify: { type: command, script: "./notify.sh" }
//! edges:
//!   - from: gather
//!     to: investigate
//!   - { from: investigate, to: notify, when: "novel_count is greater than 0", max_iterations: 3 }
//! ```
//!
//! Node fields are node attributes (`type`, `shape`, `prompt`, `script`, ...); an `output_schema` may be
//! written inline as a mapping and is kept as JSON text. Edge fields other than `from`/`to` are edge
//! attributes. Nodes with no outgoing edges are terminal.

use yaml_rust2::parser::{Event, MarkedEventReceiver, Parser};
use yaml_rust2::scanner::{Marker, TScalarStyle};

use crate::ast::{Attr, Document, Ident, SourceFormat, Stmt, Value, ValueKind};
use crate::diagnostic::Diagnostic;
use crate::dot::lexer::classify_word;
use crate::span::Span;

/// A YAML value with its span.
#[derive(Debug, Clone)]
enum Node {
    Scalar {
        text: String,
        quoted: bool,
        span: Span,
    },
    Map {
        entries: Vec<(Node, Node)>,
        span: Span,
    },
    Seq {
        items: Vec<Node>,
        span: Span,
    },
}

impl Node {
    fn span(&self) -> Span {
        match self {
            Node::Scalar { span, .. } | Node::Map { span, .. } | Node::Seq { span, .. } => *span,
        }
    }

    fn describe(&self) -> &'static str {
        match self {
            Node::Scalar { .. } => "a scalar",
            Node::Map { .. } => "a mapping",
            Node::Seq { .. } => "a list",
        }
    }

    fn to_json(&self) -> serde_json::Value {
        match self {
            Node::Scalar { text, quoted, .. } => {
                if *quoted {
                    return serde_json::Value::String(text.clone());
                }
                match text.as_str() {
                    "true" => true.into(),
                    "false" => false.into(),
                    "null" | "~" | "" => serde_json::Value::Null,
                    _ => text
                        .parse::<i64>()
                        .map(Into::into)
                        .or_else(|_| text.parse::<f64>().map(Into::into))
                        .unwrap_or_else(|_| text.clone().into()),
                }
            }
            Node::Map { entries, .. } => serde_json::Value::Object(
                entries
                    .iter()
                    .map(|(k, v)| (k.key_text().to_owned(), v.to_json()))
                    .collect(),
            ),
            Node::Seq { items, .. } => items.iter().map(Node::to_json).collect(),
        }
    }

    fn key_text(&self) -> &str {
        match self {
            Node::Scalar { text, .. } => text,
            _ => "",
        }
    }
}

/// Builds [`Node`]s from the parser's events.
struct TreeBuilder<'a> {
    text: &'a str,
    line_starts: Vec<usize>,
    stack: Vec<(Node, Option<Node>)>,
    root: Option<Node>,
}

impl TreeBuilder<'_> {
    fn offset(&self, mark: &Marker) -> usize {
        let line_start = self
            .line_starts
            .get(mark.line().saturating_sub(1))
            .copied()
            .unwrap_or(self.text.len());
        self.text[line_start..]
            .char_indices()
            .nth(mark.col())
            .map_or(self.text.len(), |(i, _)| line_start + i)
    }

    fn scalar_end(&self, start: usize, text: &str, style: TScalarStyle) -> usize {
        let line_end = self.text[start..]
            .find('\n')
            .map_or(self.text.len(), |i| start + i);
        let guess = match style {
            TScalarStyle::SingleQuoted | TScalarStyle::DoubleQuoted => text.len() + 2,
            _ => text.len(),
        };
        (start + guess.max(1))
            .min(line_end.max(start + 1))
            .min(self.text.len())
    }

    fn push_value(&mut self, node: Node) {
        match self.stack.last_mut() {
            None => self.root = Some(node),
            Some((Node::Seq { items, .. }, _)) => items.push(node),
            Some((Node::Map { entries, .. }, pending)) => match pending.take() {
                None => *pending = Some(node),
                Some(key) => entries.push((key, node)),
            },
            Some((Node::Scalar { .. }, _)) => {}
        }
    }
}

impl MarkedEventReceiver for TreeBuilder<'_> {
    fn on_event(&mut self, event: Event, mark: Marker) {
        let at = self.offset(&mark);
        match event {
            Event::Scalar(text, style, _, _) => {
                let end = self.scalar_end(at, &text, style);
                let quoted = style != TScalarStyle::Plain;
                self.push_value(Node::Scalar {
                    text,
                    quoted,
                    span: Span::from_range(at..end),
                });
            }
            Event::MappingStart(..) => {
                self.stack.push((
                    Node::Map {
                        entries: Vec::new(),
                        span: Span::from_range(at..at),
                    },
                    None,
                ));
            }
            Event::SequenceStart(..) => {
                self.stack.push((
                    Node::Seq {
                        items: Vec::new(),
                        span: Span::from_range(at..at),
                    },
                    None,
                ));
            }
            Event::MappingEnd | Event::SequenceEnd => {
                if let Some((mut node, _)) = self.stack.pop() {
                    // A collection ends where its last child ends (the end event sits at the next token).
                    let last_child_end = match &node {
                        Node::Map { entries, .. } => entries.last().map(|(_, v)| v.span().end),
                        Node::Seq { items, .. } => items.last().map(|i| i.span().end),
                        Node::Scalar { .. } => None,
                    };
                    let flow_end = self.text[..at.min(self.text.len())].ends_with([']', '}']);
                    if let Node::Map { span, .. } | Node::Seq { span, .. } = &mut node {
                        span.end = match last_child_end {
                            Some(end) if !flow_end => end,
                            _ => at as u32,
                        }
                        .max(span.start);
                    }
                    self.push_value(node);
                }
            }
            _ => {}
        }
    }
}

/// Parses a YAML workflow. Never fails: problems are reported in `diagnostics`. `default_name` names the
/// workflow when the file has no `name`.
pub fn parse_yaml(text: &str, default_name: &str, diagnostics: &mut Vec<Diagnostic>) -> Document {
    let line_starts = std::iter::once(0)
        .chain(text.match_indices('\n').map(|(i, _)| i + 1))
        .collect();
    let mut builder = TreeBuilder {
        text,
        line_starts,
        stack: Vec::new(),
        root: None,
    };
    let header_span = Span::new(0, text.find('\n').unwrap_or(text.len()) as u32);
    let mut document = Document {
        format: SourceFormat::Yaml,
        header_span,
        name: None,
        body: Vec::new(),
    };
    if let Err(error) = Parser::new_from_str(text).load(&mut builder, false) {
        let at = builder.offset(error.marker());
        let end = (at
            + text[at.min(text.len())..]
                .chars()
                .next()
                .map_or(0, char::len_utf8))
        .min(text.len());
        diagnostics.push(
            Diagnostic::error(
                "syntax",
                format!("invalid YAML: {}", error.info()),
                Span::from_range(at..end.max(at)),
            )
            .with_label("here"),
        );
        return document;
    }
    let Some(root) = builder.root else {
        diagnostics.push(
            Diagnostic::error("syntax", "the workflow file is empty", header_span)
                .with_help("a YAML workflow has `nodes:` and `edges:`"),
        );
        return document;
    };
    let Node::Map { entries, .. } = root else {
        diagnostics.push(Diagnostic::error(
            "syntax",
            format!(
                "a YAML workflow must be a mapping, found {}",
                root.describe()
            ),
            root.span(),
        ));
        return document;
    };
    let mut lowering = YamlLowering {
        diagnostics,
        stmts: Vec::new(),
    };
    let mut entry = None;
    for (key, value) in &entries {
        match key.key_text() {
            "name" => {
                document.name = lowering
                    .scalar(value, "name")
                    .map(|(name, span)| Ident { name, span });
            }
            "start" | "entry" => {
                entry = lowering
                    .scalar(value, "entry")
                    .map(|(name, span)| Ident { name, span });
            }
            "nodes" => lowering.nodes(value),
            "edges" => lowering.edges(value),
            _ => {
                if let Some(attr) = lowering.attr(key, value) {
                    lowering.stmts.insert(0, Stmt::Attr(attr));
                }
            }
        }
    }
    if document.name.is_none() {
        document.name = Some(Ident {
            name: default_name.to_owned(),
            span: header_span,
        });
    }
    let mut stmts = lowering.stmts;
    if let Some(entry) = entry {
        stmts.insert(
            0,
            Stmt::Attr(Attr {
                key: Ident {
                    name: "start".into(),
                    span: entry.span,
                },
                value: Value::plain(entry.name, ValueKind::Bare, entry.span),
            }),
        );
    }
    document.body = stmts;
    document
}

struct YamlLowering<'d> {
    diagnostics: &'d mut Vec<Diagnostic>,
    stmts: Vec<Stmt>,
}

impl YamlLowering<'_> {
    fn scalar(&mut self, node: &Node, what: &str) -> Option<(String, Span)> {
        if let Node::Scalar { text, span, .. } = node {
            Some((text.clone(), *span))
        } else {
            self.diagnostics.push(Diagnostic::error(
                "syntax",
                format!("`{what}` must be a scalar, found {}", node.describe()),
                node.span(),
            ));
            None
        }
    }

    fn attr(&mut self, key: &Node, value: &Node) -> Option<Attr> {
        let (name, key_span) = self.scalar(key, "a key")?;
        let key = Ident {
            name,
            span: key_span,
        };
        let value = match value {
            Node::Scalar {
                text,
                quoted: true,
                span,
            } => Value::plain(text.clone(), ValueKind::Quoted, *span),
            Node::Scalar {
                text,
                quoted: false,
                span,
            } => {
                let kind = if text.contains(char::is_whitespace) {
                    ValueKind::Bare
                } else {
                    classify_word(text)
                };
                Value::plain(text.clone(), kind, *span)
            }
            Node::Map { span, .. } | Node::Seq { span, .. } if key.name == "output_schema" => {
                Value::plain(value.to_json().to_string(), ValueKind::Quoted, *span)
            }
            _ => {
                self.diagnostics.push(
                    Diagnostic::error(
                        "syntax",
                        format!(
                            "`{}` must be a scalar, found {}",
                            key.name,
                            value.describe()
                        ),
                        value.span(),
                    )
                    .with_secondary(key.span, "for this attribute"),
                );
                return None;
            }
        };
        Some(Attr { key, value })
    }

    fn nodes(&mut self, value: &Node) {
        let Node::Map { entries, .. } = value else {
            self.diagnostics.push(Diagnostic::error(
                "syntax",
                format!(
                    "`nodes` must be a mapping from node id to its fields, found {}",
                    value.describe()
                ),
                value.span(),
            ));
            return;
        };
        for (key, fields) in entries {
            let Some((name, span)) = self.scalar(key, "a node id") else {
                continue;
            };
            if !crate::ast::is_node_id(&name) {
                self.diagnostics.push(
                    Diagnostic::error("syntax", format!("invalid node id `{name}`"), span)
                        .with_help("node ids start with a letter or `_` and contain only letters, digits and `_`"),
                );
            }
            let attrs = match fields {
                Node::Map { entries, .. } => entries
                    .iter()
                    .filter_map(|(k, v)| self.attr(k, v))
                    .collect(),
                Node::Scalar { text, .. } if text.is_empty() => Vec::new(),
                _ => {
                    self.diagnostics.push(Diagnostic::error(
                        "syntax",
                        format!(
                            "node `{name}` must be a mapping of its fields, found {}",
                            fields.describe()
                        ),
                        fields.span(),
                    ));
                    Vec::new()
                }
            };
            self.stmts.push(Stmt::Node {
                id: Ident { name, span },
                attrs,
            });
        }
    }

    fn edges(&mut self, value: &Node) {
        let Node::Seq { items, .. } = value else {
            self.diagnostics.push(Diagnostic::error(
                "syntax",
                format!("`edges` must be a list, found {}", value.describe()),
                value.span(),
            ));
            return;
        };
        for item in items {
            let Node::Map { entries, span } = item else {
                self.diagnostics.push(Diagnostic::error(
                    "syntax",
                    format!(
                        "an edge must be a mapping with `from` and `to`, found {}",
                        item.describe()
                    ),
                    item.span(),
                ));
                continue;
            };
            let (mut from, mut to, mut attrs) = (None, None, Vec::new());
            for (key, value) in entries {
                match key.key_text() {
                    "from" => from = self.scalar(value, "from"),
                    "to" => to = self.scalar(value, "to"),
                    _ => attrs.extend(self.attr(key, value)),
                }
            }
            let edge_span = Span::new(span.start, span.end.max(span.start + 1));
            match (from, to) {
                (Some((from, from_span)), Some((to, to_span))) => self.stmts.push(Stmt::Edge {
                    chain: vec![
                        Ident {
                            name: from,
                            span: from_span,
                        },
                        Ident {
                            name: to,
                            span: to_span,
                        },
                    ],
                    attrs,
                    span: from_span.to(to_span),
                }),
                (from, _) => {
                    let missing = if from.is_none() { "from" } else { "to" };
                    self.diagnostics.push(
                        Diagnostic::error(
                            "syntax",
                            format!("this edge has no `{missing}`"),
                            edge_span,
                        )
                        .with_help("every edge needs `from` and `to` node ids"),
                    );
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loads_nodes_edges_and_attributes() {
        let text = "name: T\ngoal: ship it\nnodes:\n  a: { type: command, script: \"true\" }\n  b:\n    prompt: hi\nedges:\n  - from: a\n    to: b\n    when: things look good\n    max_iterations: 3\n";
        let mut diagnostics = Vec::new();
        let doc = parse_yaml(text, "t", &mut diagnostics);
        assert!(diagnostics.is_empty(), "{diagnostics:?}");
        assert_eq!(doc.name.unwrap().name, "T");
        assert_eq!(doc.body.len(), 4);
        let Stmt::Edge { chain, attrs, .. } = &doc.body[3] else {
            panic!("{:?}", doc.body[3])
        };
        assert_eq!(chain[1].name, "b");
        assert_eq!(&text[chain[1].span.range()], "b");
        assert_eq!(attrs[0].value.text, "things look good");
        assert_eq!(attrs[1].value.kind, ValueKind::Integer);
    }

    #[test]
    fn reports_bad_yaml_with_a_location() {
        let mut diagnostics = Vec::new();
        parse_yaml("nodes: [a, b\n", "t", &mut diagnostics);
        assert_eq!(diagnostics.len(), 1);
        assert!(diagnostics[0].message.starts_with("invalid YAML"));
    }
}
