//! `unknown-attribute` (warning): attributes are ones the engine knows, on nodes they affect.
//!
//! A misspelt attribute (`promt=`, `max_retires=`) is otherwise silently ignored, so unknown names are
//! reported with the closest known one. Attributes that exist but do nothing on this kind of node
//! (`script` on a prompt node) are reported too, when written on the node itself (defaults from
//! `node [...]` are not). Graphviz layout attributes (`color`, `style`, `fontsize`, ...) are accepted
//! everywhere and ignored.
//!
//! ```dot
//! plan [shape=tab, promt="Plan the work"]   // warning: unknown attribute `promt`; did you mean `prompt`?
//! ```

use trellis_syntax::ast::{Attr, SourceFormat};
use trellis_syntax::{Diagnostic, Severity};

use crate::node_kind::{COMMON_ATTRIBUTES, HandlerKind, KINDS};
use crate::rules::{Rule, closest};

pub const RULE: Rule = Rule {
    code: "unknown-attribute",
    severity: Severity::Warning,
    summary: "attributes are known, and used by the node they are on",
};

/// Graph attributes.
pub const GRAPH: &[&str] = &[
    "goal",
    "label",
    "rankdir",
    "model_stylesheet",
    "default_max_retry",
    "default_max_retries",
    "retry_target",
    "fallback_retry_target",
    "default_fidelity",
    "default_thread",
    "max_node_visits",
    "loop_restart_signature_limit",
    "stall_timeout",
    "start",
    "capture_artifacts",
    "sandbox",
    "permissions",
    "mcp_servers",
    "skills",
    "model",
    "default_model",
    "default_provider",
    "router_model",
    "judge_model",
    "inputs",
    "workflow_type",
];

/// Edge attributes.
pub const EDGE: &[&str] = &[
    "label",
    "condition",
    "weight",
    "fidelity",
    "thread_id",
    "loop_restart",
    "when",
    "max_iterations",
    "freeform",
];

/// Graphviz layout attributes: accepted anywhere, no effect on execution.
pub const LAYOUT: &[&str] = &[
    "color",
    "fillcolor",
    "fontcolor",
    "fontname",
    "fontsize",
    "style",
    "penwidth",
    "width",
    "height",
    "fixedsize",
    "margin",
    "pad",
    "tooltip",
    "xlabel",
    "peripheries",
    "group",
    "splines",
    "nodesep",
    "ranksep",
    "compound",
    "size",
    "ratio",
    "concentrate",
    "newrank",
    "labelloc",
    "labeljust",
    "bgcolor",
    "dpi",
    "ordering",
    "arrowhead",
    "arrowtail",
    "arrowsize",
    "dir",
    "constraint",
    "minlen",
    "headlabel",
    "taillabel",
    "lhead",
    "ltail",
    "headport",
    "tailport",
    "rank",
    "URL",
    "href",
    "target",
    "id",
    "comment",
    "sides",
    "skew",
    "distortion",
    "orientation",
    "image",
    "labelfontsize",
    "decorate",
];

fn unknown(what: &str, attr: &Attr, known: &[&str]) -> Diagnostic {
    let near = closest(&attr.key.name, known.iter().chain(LAYOUT).copied());
    ignored(attr, &format!("{what} attribute"), near, || {
        format!("known {what} attributes: {}", known.join(", "))
    })
}

/// The warning for `attr`, an unknown `thing` (`node attribute`, `node field`): the name it is
/// near, else the names there are.
fn ignored(
    attr: &Attr,
    thing: &str,
    near: Option<&str>,
    names: impl FnOnce() -> String,
) -> Diagnostic {
    let help = near.map_or_else(names, |near| format!("did you mean `{near}`?"));
    let word = thing.rsplit(' ').next().unwrap_or(thing);
    RULE.diagnostic(
        format!("unknown {thing} `{}` is ignored", attr.key.name),
        attr.key.span,
    )
    .with_label(format!("unknown {word}"))
    .with_help(help)
}

pub(crate) fn check_graph(attr: &Attr, out: &mut Vec<Diagnostic>) {
    if !GRAPH.contains(&attr.key.name.as_str()) && !LAYOUT.contains(&attr.key.name.as_str()) {
        out.push(unknown("graph", attr, GRAPH));
    }
}

pub(crate) fn check_edge(attr: &Attr, out: &mut Vec<Diagnostic>) {
    if !EDGE.contains(&attr.key.name.as_str()) && !LAYOUT.contains(&attr.key.name.as_str()) {
        out.push(unknown("edge", attr, EDGE));
    }
}

/// Every node attribute name: those all nodes take, then each kind's, once each.
fn node_attributes() -> Vec<&'static str> {
    let mut names: Vec<&str> = COMMON_ATTRIBUTES.to_vec();
    for name in KINDS.iter().flat_map(|k| k.attributes) {
        if !names.contains(name) {
            names.push(name);
        }
    }
    names
}

/// Every attribute name this rule knows (graph, edge, node and layout), by itself: one hash of a
/// name finds the static copy of it.
pub(crate) static KNOWN_NAMES: std::sync::LazyLock<rustc_hash::FxHashSet<&'static str>> =
    std::sync::LazyLock::new(|| {
        GRAPH
            .iter()
            .chain(EDGE)
            .chain(LAYOUT)
            .copied()
            .chain(node_attributes())
            .collect()
    });

/// A YAML node's fields: the node attributes, under the names SWEny files give three of them.
fn yaml_node_fields() -> Vec<&'static str> {
    node_attributes()
        .into_iter()
        .map(|name| match name {
            "label" => "name",
            "prompt" => "instruction",
            "output_schema" => "output",
            other => other,
        })
        .collect()
}

/// An unknown field of a YAML node, with the YAML fields to choose from (no Graphviz layout names).
fn unknown_yaml_field(attr: &Attr) -> Diagnostic {
    let fields = yaml_node_fields();
    let near = closest(&attr.key.name, fields.iter().copied());
    ignored(attr, "node field", near, || {
        format!("node fields: {}", fields.join(", "))
    })
}

/// Checks one node attribute of a `kind` node; `explicit` says it was written on the node rather than
/// inherited. What applies where comes from the table of kinds ([`KINDS`]).
pub(crate) fn check_node(
    attr: &Attr,
    kind: HandlerKind,
    explicit: bool,
    format: SourceFormat,
    out: &mut Vec<Diagnostic>,
) {
    let name = attr.key.name.as_str();
    let Some(taking) = kinds_taking(name) else {
        out.push(if format == SourceFormat::Yaml {
            unknown_yaml_field(attr)
        } else {
            unknown("node", attr, &node_attributes())
        });
        return;
    };
    if explicit && taking & kind_bit(kind) == 0 {
        let applies: Vec<&str> = KINDS
            .iter()
            .filter(|k| taking & kind_bit(k.kind) != 0)
            .map(|k| k.type_name)
            .collect();
        out.push(
            RULE.diagnostic(
                format!(
                    "`{name}` has no effect on {} node",
                    super::with_article(kind.type_name())
                ),
                attr.key.span,
            )
            .with_label("ignored here")
            .with_help(format!("`{name}` applies to {} nodes", applies.join(", "))),
        );
    }
}

/// `kind`'s bit in the sets [`kinds_taking`] returns.
fn kind_bit(kind: HandlerKind) -> u32 {
    KINDS
        .iter()
        .position(|k| k.kind == kind)
        .map_or(0, |at| 1 << at)
}

/// The kinds of node an attribute applies to, as a set of [`kind_bit`]s (every kind for the
/// attributes all nodes take and Graphviz's layout ones); `None` when it is no node attribute.
fn kinds_taking(name: &str) -> Option<u32> {
    /// Each node attribute name with its kinds, sorted by name: a binary search per attribute read.
    static TABLE: std::sync::LazyLock<Vec<(&'static str, u32)>> = std::sync::LazyLock::new(|| {
        let mut table: Vec<(&'static str, u32)> = COMMON_ATTRIBUTES
            .iter()
            .chain(LAYOUT)
            .map(|&name| (name, u32::MAX))
            .collect();
        for spec in KINDS {
            for &name in spec.attributes {
                table.push((name, kind_bit(spec.kind)));
            }
        }
        table.sort_unstable_by_key(|&(name, _)| name);
        table.dedup_by(|later, kept| {
            let same = later.0 == kept.0;
            if same {
                kept.1 |= later.1;
            }
            same
        });
        table
    });
    let at = TABLE.binary_search_by_key(&name, |&(name, _)| name).ok()?;
    Some(TABLE[at].1)
}
