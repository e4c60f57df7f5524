//! `known-handler` (error): every node resolves to a known handler type.
//!
//! A node's handler comes from `type` (which overrides the shape), else its `shape`, else its id
//! (`start`/`Start` are start nodes, `exit`/`Exit`/`end`/`End` exit nodes); the default shape `box` is an
//! agent. A shape or type outside the table would leave the engine nothing to run:
//!
//! ```dot
//! review [shape=ellipse, prompt="..."]   // error: `ellipse` is not a workflow shape
//! ```

use std::borrow::Cow;

use trellis_syntax::{Diagnostic, Severity};

use crate::flatten::FlatNode;
use crate::node_kind::{HandlerKind, KINDS, Shape};
use crate::rules::{Rule, closest};

pub const RULE: Rule = Rule {
    code: "known-handler",
    severity: Severity::Error,
    summary: "node shapes and types map to known handlers",
};

/// `text` as a [`Shape`], shared with the table of kinds when it names one of their shapes.
fn shape_name(text: &str) -> Shape {
    KINDS
        .iter()
        .find(|k| k.shape == text)
        .map_or_else(|| Cow::Owned(text.to_owned()), |k| Cow::Borrowed(k.shape))
}

/// The node's kind and resolved shape, or `None` (reported) when unknown.
pub(crate) fn resolve(node: &FlatNode, out: &mut Vec<Diagnostic>) -> Option<(HandlerKind, Shape)> {
    let shape_attr = node.attrs.get("shape");
    if let Some(type_attr) = node.attrs.get("type") {
        let name = type_attr.value.text.trim();
        if let Some(kind) = HandlerKind::from_type(name) {
            let shape = shape_attr.map_or(Cow::Borrowed(kind.spec().shape), |a| {
                shape_name(&a.value.text)
            });
            return Some((kind, shape));
        }
        let names = KINDS.iter().map(|k| k.type_name);
        let help = match closest(name, names.clone()) {
            Some(near) => format!("did you mean `{near}`?"),
            None => format!("known types: {}", names.collect::<Vec<_>>().join(", ")),
        };
        out.push(
            RULE.diagnostic(
                format!("unknown handler type `{name}` on node `{}`", node.id.name),
                type_attr.value.span,
            )
            .with_label("unknown type")
            .with_help(help),
        );
        return None;
    }
    let Some(shape_attr) = shape_attr else {
        let kind = match node.id.name.as_str() {
            "start" | "Start" => HandlerKind::Start,
            "exit" | "Exit" | "end" | "End" => HandlerKind::Exit,
            _ => HandlerKind::Agent,
        };
        return Some((kind, Cow::Borrowed(kind.spec().shape)));
    };
    let shape = shape_attr.value.text.trim();
    if let Some(kind) = HandlerKind::from_shape(shape) {
        return Some((kind, Cow::Borrowed(kind.spec().shape)));
    }
    let shapes = KINDS.iter().map(|k| k.shape);
    let near = closest(shape, shapes.clone())
        .or_else(|| shapes.clone().find(|s| s.eq_ignore_ascii_case(shape)));
    let help = match near {
        Some(near) => format!("did you mean `{near}`?"),
        None => format!("workflow shapes: {}", shapes.collect::<Vec<_>>().join(", ")),
    };
    out.push(
        RULE.diagnostic(
            format!(
                "`{shape}` is not a workflow shape (node `{}`)",
                node.id.name
            ),
            shape_attr.value.span,
        )
        .with_label("no handler for this shape")
        .with_help(help),
    );
    None
}
