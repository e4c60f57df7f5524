//! The YAML workflow loader: SWEny's workflow format (the edges-and-routing page), read into the same
//! [`Document`] the DOT parser produces, with spans pointing into the YAML text.
//!
//! ```yaml
//! id: bug-triage                     # names the workflow (`name` is then its label)
//! name: Bug triage
//! entry: read-bug-report             # required: the node the run starts at
//! inputs:                            # typed, checked against `--input` / `--inputs`
//!   repo: { type: string, required: true }
//! rules: [./rules/team.md]           # workflow-wide Sources, cascading into every node
//! nodes:
//!   read-bug-report:                 # any non-empty id; none is special
//!     name: Read the report          # the node's label
//!     instruction: ./prompts/read.md # text, ./file, {file: ...} or {inline: ...}: an agent node
//!     output: { type: object, properties: { severity: { type: string } } }
//!   file-issue: { instruction: File the issue., max_turns: 4, disallowed_tools: [shell] }
//! edges:
//!   - from: read-bug-report
//!     to: file-issue
//!     when: severity is high         # judged by a model
//!     max_iterations: 3
//! ```
//!
//! Node fields become node attributes: `name` → `label`, `instruction` → `prompt` (a file as an `@file`
//! reference), `output` → `output_schema` (as JSON text), `rules` and `context` → JSON lists of sources
//! that lowering prepends to the prompt, lists such as `disallowed_tools` → comma-separated text, and a
//! node with neither `type` nor `shape` is an agent. Trellis's own fields (`type`, `script`, `prompt`,
//! `shape`, ...) work as in DOT. `inputs` and `workflow_type` are checked here (every problem reported);
//! marketplace metadata is accepted; a node's `skills` list becomes its `skills` attribute, its
//! `requires`, `verify`, `eval`, `retry` and `tools` their attributes (as JSON text), its `on_fail:
//! continue` `fail_soft`, and the workflow's inline `skills` map a graph attribute (JSON text);
//! `judge_budget`, not implemented, is accepted with an `ignored-field` warning. Any other
//! top-level scalar is a
//! graph attribute (`goal`, `model`, `router_model`). Nodes with no outgoing edges are terminal.

use yaml_rust2::parser::{Event, MarkedEventReceiver, Parser};
use yaml_rust2::scanner::{Marker, TScalarStyle};

use crate::ast::{Attr, Document, Ident, SourceFormat, Stmt, Text, Value, ValueKind};
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
        cascade: Cascade::default(),
        ignored: Vec::new(),
    };
    lowering.top_level(&entries, &mut document);
    if document.name.is_none() {
        document.name = Some(Ident {
            name: Text::from(default_name),
            span: header_span,
        });
    }
    document.body = lowering.stmts;
    document
}

struct YamlLowering<'d> {
    diagnostics: &'d mut Vec<Diagnostic>,
    stmts: Vec<Stmt>,
    /// The workflow-wide `rules` and `context`, prepended to every node's own.
    cascade: Cascade,
    /// Fields accepted but not implemented, in order of first appearance: the field, where it first
    /// appears, and the nodes that use it.
    ignored: Vec<(String, Span, Vec<String>)>,
}

#[derive(Default)]
struct Cascade {
    rules: Vec<String>,
    context: Vec<String>,
}

/// Marketplace metadata at the top of a SWEny workflow: accepted, with no effect on a run.
const METADATA: &[&str] = &[
    "description",
    "author",
    "category",
    "tags",
    "icon",
    "color",
    "version",
    "sweny_version",
    "variables",
];

/// SWEny fields Trellis accepts but does not implement yet, and what is therefore left out.
fn ignored_field(field: &str) -> Option<&'static str> {
    Some(match field {
        "judge_budget" => "judge calls are neither counted nor capped",
        _ => return None,
    })
}

/// The SWEny workflow types (SWEny's `WORKFLOW_TYPES`); SWEny adds types, so another value is a
/// warning.
pub const WORKFLOW_TYPES: &[&str] = &[
    "pr_review",
    "e2e_test",
    "content_generation",
    "monitor",
    "data_sync",
    "generic",
];

/// The input types a SWEny workflow declares.
pub const INPUT_TYPES: &[&str] = &["string", "number", "boolean", "string[]"];

/// An attribute the loader writes itself: `key` (at `key_span`) = `text` (a value of `kind` at `span`).
fn made(key: &str, key_span: Span, text: impl Into<Text>, kind: ValueKind, span: Span) -> Attr {
    Attr {
        key: Ident {
            name: Text::from(key),
            span: key_span,
        },
        value: Value::plain(text, kind, span),
    }
}

/// Whether `value` has the input type `kind` (one of [`INPUT_TYPES`]).
pub fn has_input_type(value: &serde_json::Value, kind: &str) -> bool {
    match kind {
        "string" => value.is_string(),
        "number" => value.is_number(),
        "boolean" => value.is_boolean(),
        "string[]" => value
            .as_array()
            .is_some_and(|items| items.iter().all(serde_json::Value::is_string)),
        _ => false,
    }
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
            name: name.into(),
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
            Node::Map { span, .. } | Node::Seq { span, .. }
                if matches!(
                    key.name.as_str(),
                    "output_schema" | "requires" | "verify" | "eval" | "retry" | "tools" | "skills"
                ) =>
            {
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

    /// The top-level fields: `id`, `name`, `entry`, `nodes`, `edges`, `inputs`, `workflow_type`, the
    /// workflow-wide `rules` and `context`, marketplace metadata, fields not implemented, and any other
    /// scalar as a graph attribute.
    fn top_level(&mut self, entries: &[(Node, Node)], document: &mut Document) {
        // Workflow-wide rules and context cascade into every node, so they are read first.
        for (key, value) in entries {
            match key.key_text() {
                "rules" => self.cascade.rules = self.sources(value, "rules"),
                "context" => self.cascade.context = self.sources(value, "context"),
                _ => {}
            }
        }
        let mut entry = None;
        let (mut id, mut name) = (None, None);
        for (key, value) in entries {
            match key.key_text() {
                "id" => id = self.scalar(value, "id"),
                "name" => name = self.scalar(value, "name"),
                "start" | "entry" => {
                    entry = self.scalar(value, "entry").map(|(name, span)| Ident {
                        name: name.into(),
                        span,
                    });
                }
                "nodes" => self.nodes(value),
                "edges" => self.edges(value),
                // Inline skills, as JSON text for lowering to read.
                "skills" => {
                    if let Some(attr) = self.attr(key, value) {
                        self.stmts.insert(0, Stmt::Attr(attr));
                    }
                }
                "rules" | "context" => {}
                "inputs" => {
                    if let Some(attr) = self.inputs(key, value) {
                        self.stmts.insert(0, Stmt::Attr(attr));
                    }
                }
                "workflow_type" => {
                    if let Some(attr) = self.workflow_type(key, value) {
                        self.stmts.insert(0, Stmt::Attr(attr));
                    }
                }
                field if METADATA.contains(&field) => {}
                field if ignored_field(field).is_some() => self.ignore(key, None),
                _ => {
                    if let Some(attr) = self.attr(key, value) {
                        self.stmts.insert(0, Stmt::Attr(attr));
                    }
                }
            }
        }
        self.report_ignored();
        // `id` names the workflow; `name` is then its label. A file with only `name` is named by it.
        match (id, name) {
            (Some((id, span)), name) => {
                document.name = Some(Ident {
                    name: id.into(),
                    span,
                });
                if let Some((label, span)) = name {
                    self.stmts.insert(
                        0,
                        Stmt::Attr(made("label", span, label, ValueKind::Quoted, span)),
                    );
                }
            }
            (None, Some((name, span))) => {
                document.name = Some(Ident {
                    name: name.into(),
                    span,
                });
            }
            (None, None) => {}
        }
        if let Some(entry) = entry {
            self.stmts.insert(
                0,
                Stmt::Attr(made(
                    "start",
                    entry.span,
                    entry.name,
                    ValueKind::Bare,
                    entry.span,
                )),
            );
        }
    }

    /// A node's fields as attributes: SWEny's (`name`, `instruction`, `output`, `rules`, `context`,
    /// `disallowed_tools`) read into Trellis's, the rest as they are. A node that names neither a
    /// `type` nor a `shape` is an agent node.
    fn node_fields(&mut self, node: &str, id_span: Span, entries: &[(Node, Node)]) -> Vec<Attr> {
        let mut attrs = Vec::new();
        let (mut rules, mut context) = (None, None);
        let mut typed = false;
        for (key, value) in entries {
            let field = key.key_text();
            let renamed = |name: &str| Node::Scalar {
                text: name.to_owned(),
                quoted: false,
                span: key.span(),
            };
            match field {
                "type" | "shape" => {
                    typed = true;
                    attrs.extend(self.attr(key, value));
                }
                "name" => attrs.extend(self.attr(&renamed("label"), value)),
                "instruction" => {
                    if let Some(text) = self.source(value, "instruction") {
                        attrs.push(made(
                            "prompt",
                            key.span(),
                            text,
                            ValueKind::Quoted,
                            value.span(),
                        ));
                    }
                }
                "output" => attrs.extend(self.attr(&renamed("output_schema"), value)),
                "rules" => rules = Some((key.span(), self.node_sources(value, "rules"))),
                "context" => context = Some((key.span(), self.node_sources(value, "context"))),
                "disallowed_tools" | "allowed_tools" | "skills" => {
                    attrs.extend(self.list(key, value));
                }
                "on_fail" => attrs.extend(self.on_fail(key, value)),
                _ if ignored_field(field).is_some() => self.ignore(key, Some(node)),
                _ => attrs.extend(self.attr(key, value)),
            }
        }
        for (name, own, inherited) in [
            ("rules", rules, &self.cascade.rules),
            ("context", context, &self.cascade.context),
        ] {
            let (span, (only, own)) = match own {
                Some(found) => found,
                None => (id_span, (false, Vec::new())),
            };
            let mut all: Vec<String> = if only { Vec::new() } else { inherited.clone() };
            all.extend(own);
            if !all.is_empty() {
                let list = serde_json::Value::from(all).to_string();
                attrs.push(made(name, span, list, ValueKind::Quoted, span));
            }
        }
        if !typed {
            attrs.push(made("type", id_span, "agent", ValueKind::Bare, id_span));
        }
        attrs
    }

    /// A Source: inline text, a `./file` path (or `{file: ...}`) read as an `@file` reference, or
    /// `{inline: ...}`. URLs are not fetched.
    fn source(&mut self, node: &Node, what: &str) -> Option<String> {
        let problem = |this: &mut Self, message: String, span: Span| {
            this.diagnostics
                .push(Diagnostic::error("syntax", message, span).with_help(
                    "a source is text, a `./file` path, `{file: path}` or `{inline: text}`",
                ));
            None
        };
        match node {
            Node::Scalar { text, .. } => {
                let trimmed = text.trim();
                if trimmed.is_empty() {
                    return problem(self, format!("`{what}` is empty"), node.span());
                }
                if trimmed.starts_with("http://") || trimmed.starts_with("https://") {
                    return problem(
                        self,
                        format!(
                            "`{what}` is a URL, and Trellis does not fetch sources: save it to a file and give `./file`"
                        ),
                        node.span(),
                    );
                }
                if ["./", "../", "/"].iter().any(|p| trimmed.starts_with(p)) {
                    return Some(format!("@{trimmed}"));
                }
                Some(text.clone())
            }
            Node::Map { entries, .. } => match entries.as_slice() {
                [(key, value)] if key.key_text() == "inline" => {
                    self.scalar(value, "inline").map(|(text, _)| text)
                }
                [(key, value)] if key.key_text() == "file" => self
                    .scalar(value, "file")
                    .map(|(path, _)| format!("@{}", path.trim())),
                [(key, _), ..] if key.key_text() == "url" => problem(
                    self,
                    format!(
                        "`{what}` is a URL, and Trellis does not fetch sources: save it to a file and give `{{file: ...}}`"
                    ),
                    node.span(),
                ),
                _ => problem(self, format!("`{what}` is not a source"), node.span()),
            },
            Node::Seq { .. } => problem(
                self,
                format!("`{what}` must be one source, found a list"),
                node.span(),
            ),
        }
    }

    /// A list of Sources (`rules`, `context`).
    fn sources(&mut self, node: &Node, what: &str) -> Vec<String> {
        match node {
            Node::Seq { items, .. } => items
                .iter()
                .filter_map(|item| self.source(item, what))
                .collect(),
            other => self.source(other, what).into_iter().collect(),
        }
    }

    /// A node's `rules` or `context`: a list of Sources, or `{only: true, sources: [...]}` to leave out
    /// the workflow's. Returns whether only the node's own count, and them.
    fn node_sources(&mut self, node: &Node, what: &str) -> (bool, Vec<String>) {
        if let Node::Map { entries, .. } = node
            && entries.iter().any(|(k, _)| k.key_text() == "sources")
        {
            let only = entries
                .iter()
                .any(|(k, v)| k.key_text() == "only" && v.key_text() == "true");
            let sources = entries
                .iter()
                .find(|(k, _)| k.key_text() == "sources")
                .map(|(_, v)| self.sources(v, what))
                .unwrap_or_default();
            return (only, sources);
        }
        (false, self.sources(node, what))
    }

    /// A list of names as one comma-separated attribute (`disallowed_tools`).
    fn list(&mut self, key: &Node, value: &Node) -> Option<Attr> {
        let Node::Seq { items, span } = value else {
            return self.attr(key, value);
        };
        let names: Vec<String> = items
            .iter()
            .filter_map(|item| self.scalar(item, key.key_text()))
            .map(|(name, _)| name)
            .collect();
        Some(made(
            key.key_text(),
            key.span(),
            names.join(","),
            ValueKind::Quoted,
            *span,
        ))
    }

    /// A node's `on_fail`: `halt` (a failed node stops the run, the default) or `continue` (routing
    /// goes on from it: Trellis's `fail_soft`).
    fn on_fail(&mut self, key: &Node, value: &Node) -> Option<Attr> {
        let (text, span) = self.scalar(value, "on_fail")?;
        match text.as_str() {
            "halt" => None,
            "continue" => Some(made("fail_soft", key.span(), "true", ValueKind::Bare, span)),
            other => {
                self.diagnostics.push(
                    Diagnostic::error(
                        "attribute-value",
                        format!("`on_fail` must be `halt` or `continue`, found `{other}`"),
                        span,
                    )
                    .with_secondary(key.span(), "for this field"),
                );
                None
            }
        }
    }

    /// Notes a field that is accepted but not implemented (reported once per field).
    fn ignore(&mut self, key: &Node, node: Option<&str>) {
        let field = key.key_text().to_owned();
        match self.ignored.iter_mut().find(|(f, _, _)| *f == field) {
            Some((_, _, nodes)) => nodes.extend(node.map(str::to_owned)),
            None => self.ignored.push((
                field,
                key.span(),
                node.map(str::to_owned).into_iter().collect(),
            )),
        }
    }

    fn report_ignored(&mut self) {
        for (field, span, nodes) in std::mem::take(&mut self.ignored) {
            let why = ignored_field(&field).unwrap_or("it is not implemented");
            let place = match nodes.as_slice() {
                [] => String::new(),
                [one] => format!(" (node `{one}`)"),
                several => format!(
                    " (nodes {})",
                    several
                        .iter()
                        .map(|n| format!("`{n}`"))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            };
            self.diagnostics.push(
                Diagnostic::warning(
                    "ignored-field",
                    format!("`{field}` is accepted but ignored{place}: {why}"),
                    span,
                )
                .with_label("ignored"),
            );
        }
    }

    /// `workflow_type`: one of SWEny's types (another is a warning).
    fn workflow_type(&mut self, key: &Node, value: &Node) -> Option<Attr> {
        let (text, span) = self.scalar(value, "workflow_type")?;
        if !WORKFLOW_TYPES.contains(&text.as_str()) {
            self.diagnostics.push(
                Diagnostic::warning(
                    "workflow-type",
                    format!("unknown workflow_type `{text}`"),
                    span,
                )
                .with_label("not one of SWEny's types")
                .with_help(format!(
                    "SWEny's workflow types: {}; the type only describes the workflow, it runs the same",
                    WORKFLOW_TYPES.join(", ")
                )),
            );
        }
        self.attr(key, value)
    }

    /// One declared input: its type, `required` with a `default`, the default's and the enum's types.
    fn input_field(&mut self, name: &Node, field: &Node) {
        let input = name.key_text();
        let Node::Map { entries: parts, .. } = field else {
            self.diagnostics.push(Diagnostic::error(
                "inputs",
                format!("input `{input}` must be a mapping with a `type`"),
                field.span(),
            ));
            return;
        };
        let get = |k: &str| {
            parts
                .iter()
                .find(|(p, _)| p.key_text() == k)
                .map(|(_, v)| v)
        };
        for (part, _) in parts {
            if !["type", "description", "required", "default", "enum"].contains(&part.key_text()) {
                self.diagnostics.push(
                    Diagnostic::error(
                        "inputs",
                        format!("input `{input}` has an unknown field `{}`", part.key_text()),
                        part.span(),
                    )
                    .with_help(
                        "an input has `type`, `description`, `required`, `default` and `enum`",
                    ),
                );
            }
        }
        let kind = get("type").map(Node::key_text).unwrap_or_default();
        if !INPUT_TYPES.contains(&kind) {
            let span = get("type").map_or(name.span(), Node::span);
            self.diagnostics.push(
                Diagnostic::error(
                    "inputs",
                    if kind.is_empty() {
                        format!("input `{input}` has no `type`")
                    } else {
                        format!("input `{input}` has an unknown type `{kind}`")
                    },
                    span,
                )
                .with_help(format!("input types: {}", INPUT_TYPES.join(", "))),
            );
            return;
        }
        if let (Some(required), Some(default)) = (get("required"), get("default"))
            && required.key_text() == "true"
        {
            self.diagnostics.push(
                Diagnostic::error(
                    "inputs",
                    format!("input `{input}` is `required` and has a `default`"),
                    default.span(),
                )
                .with_secondary(required.span(), "required here")
                .with_help("pick one: a default makes the input optional"),
            );
        }
        if let Some(default) = get("default")
            && !has_input_type(&default.to_json(), kind)
        {
            self.diagnostics.push(Diagnostic::error(
                "inputs",
                format!("the default of input `{input}` is not a {kind}"),
                default.span(),
            ));
        }
        if let Some(allowed) = get("enum") {
            match allowed {
                Node::Seq { items, .. } if !items.is_empty() => {
                    for item in items {
                        if !has_input_type(&item.to_json(), kind) {
                            self.diagnostics.push(Diagnostic::error(
                                "inputs",
                                format!("an `enum` value of input `{input}` is not a {kind}"),
                                item.span(),
                            ));
                        }
                    }
                }
                other => self.diagnostics.push(Diagnostic::error(
                    "inputs",
                    format!("the `enum` of input `{input}` must be a non-empty list"),
                    other.span(),
                )),
            }
        }
    }

    /// `inputs`: each field's `type`, `description`, `required`, `default` and `enum`, checked (every
    /// problem reported) and kept as one JSON attribute for runs to check their input against.
    fn inputs(&mut self, key: &Node, value: &Node) -> Option<Attr> {
        let Node::Map { entries, span } = value else {
            self.diagnostics.push(Diagnostic::error(
                "inputs",
                format!(
                    "`inputs` must map input names to their declarations, found {}",
                    value.describe()
                ),
                value.span(),
            ));
            return None;
        };
        let before = self.diagnostics.len();
        for (name, field) in entries {
            self.input_field(name, field);
        }
        if self.diagnostics.len() > before {
            return None;
        }
        let declared = value.to_json().to_string();
        Some(made(
            "inputs",
            key.span(),
            declared,
            ValueKind::Quoted,
            *span,
        ))
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
            // Any non-empty id names a node (`read-bug-report` included); none is special.
            if name.trim().is_empty() {
                self.diagnostics.push(
                    Diagnostic::error("syntax", "a node id is empty", span)
                        .with_help("give the node a name under `nodes:`"),
                );
                continue;
            }
            let attrs = match fields {
                Node::Map { entries, .. } => self.node_fields(&name, span, entries),
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
                id: Ident {
                    name: name.into(),
                    span,
                },
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
                            name: from.into(),
                            span: from_span,
                        },
                        Ident {
                            name: to.into(),
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
