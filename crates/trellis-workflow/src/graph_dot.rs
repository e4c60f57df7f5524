//! `trellis graph`: the compiled workflow printed back as normalized DOT — one graph attribute block, one
//! line per node with its resolved attributes (handler type, shape, classes, stylesheet models, expanded
//! prompts), one line per edge — so users see exactly what the engine will run.

use std::fmt::Write;

use crate::small_map::SmallMap;
use crate::workflow::Workflow;

/// Quotes a DOT string, escaping `"`, `\` and line breaks.
pub(crate) fn quote(text: &str) -> String {
    let mut quoted = String::with_capacity(text.len() + 2);
    quoted.push('"');
    for c in text.chars() {
        match c {
            '"' => quoted.push_str("\\\""),
            '\\' => quoted.push_str("\\\\"),
            '\n' => quoted.push_str("\\n"),
            '\t' => quoted.push_str("\\t"),
            _ => quoted.push(c),
        }
    }
    quoted.push('"');
    quoted
}

fn attr_list<'a>(
    attributes: impl IntoIterator<Item = (&'a str, &'a String)>,
    first: &[&str],
) -> String {
    let attributes: Vec<(&str, &String)> = attributes.into_iter().collect();
    let ordered = first
        .iter()
        .filter_map(|k| attributes.iter().find(|(name, _)| name == k).copied())
        .chain(
            attributes
                .iter()
                .copied()
                .filter(|(k, _)| !first.contains(k)),
        );
    let parts: Vec<String> = ordered
        .map(|(k, v)| format!("{}={}", quote_key(k), quote(v)))
        .collect();
    if parts.is_empty() {
        String::new()
    } else {
        format!(" [{}]", parts.join(", "))
    }
}

fn quote_key(key: &str) -> String {
    if trellis_syntax::ast::is_node_id(key) {
        key.to_owned()
    } else {
        quote(key)
    }
}

/// Renders the workflow as normalized DOT: its attributes as text when it was compiled with
/// [`crate::CompileOptions::attribute_texts`], else only what its nodes' and edges' fields hold.
pub fn to_dot(workflow: &Workflow) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "digraph {} {{", quote_key(&workflow.name));
    if !workflow.graph.attributes.is_empty() {
        let _ = writeln!(
            out,
            "    graph{}",
            attr_list(&workflow.graph.attributes, &["goal"])
        );
    }
    let texts = workflow.attribute_texts.as_ref();
    let none = SmallMap::new();
    for (index, node) in workflow.nodes.iter().enumerate() {
        let mut attributes = texts.map_or_else(SmallMap::new, |t| t.nodes[index].clone());
        attributes.insert("type", node.kind.type_name().to_owned());
        attributes.insert("shape", node.shape.to_string());
        if !node.classes.is_empty() {
            attributes.insert("class", node.classes.join(","));
        }
        if let Some(llm) = node.kind.llm() {
            attributes.insert("prompt", llm.prompt.clone());
        }
        if !attributes.contains_key("label") {
            attributes.insert("label", node.label().to_owned());
        }
        let _ = writeln!(
            out,
            "    {}{}",
            node.id,
            attr_list(&attributes, &["type", "shape", "label", "class"])
        );
    }
    for edge in &workflow.edges {
        let _ = writeln!(
            out,
            "    {} -> {}{}",
            workflow.nodes[edge.from].id,
            workflow.nodes[edge.to].id,
            attr_list(
                texts.map_or(&none, |t| &t.edges[edge.index]),
                &["label", "condition", "when", "weight"]
            )
        );
    }
    out.push_str("}\n");
    out
}

/// Shapes Graphviz draws that a workflow's picture keeps; any other shape is drawn as a box.
const PICTURE_SHAPES: &[&str] = &[
    "box",
    "rect",
    "rectangle",
    "square",
    "ellipse",
    "oval",
    "circle",
    "doublecircle",
    "diamond",
    "Mdiamond",
    "Msquare",
    "hexagon",
    "octagon",
    "parallelogram",
    "component",
    "house",
    "invhouse",
    "tab",
    "folder",
    "note",
    "cylinder",
    "trapezium",
    "invtrapezium",
    "point",
    "plaintext",
];

/// Clips a label for the picture (the run page shows the whole text on click).
fn clip(text: &str, max: usize) -> String {
    let text = text.trim();
    if text.chars().count() <= max {
        return text.to_owned();
    }
    let mut clipped: String = text.chars().take(max - 1).collect();
    clipped.push('…');
    clipped
}

/// The workflow as a picture for a layout engine (`trellis graph --format svg`, the web app): one box
/// per node with its label and shape, one arrow per edge with its label or condition. Nodes and edges
/// carry ids (`node:<id>`, `edge:<index>`) that the SVG keeps, so the run page can colour them.
pub fn picture(workflow: &Workflow) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "digraph {} {{", quote(&workflow.name));
    out.push_str(
        "    graph [fontname=\"Helvetica\", bgcolor=\"transparent\", nodesep=0.35, ranksep=0.45]\n",
    );
    out.push_str("    node [fontname=\"Helvetica\", fontsize=11, shape=box, style=\"rounded,filled\", fillcolor=\"#f4f4f5\", color=\"#71717a\"]\n");
    out.push_str(
        "    edge [fontname=\"Helvetica\", fontsize=9, color=\"#71717a\", fontcolor=\"#52525b\"]\n",
    );
    for node in &workflow.nodes {
        let shape = Some(node.shape.as_ref())
            .filter(|s| PICTURE_SHAPES.contains(s))
            .unwrap_or("box");
        let label = if node.label().trim().is_empty() {
            node.id.as_str()
        } else {
            node.label()
        };
        let _ = writeln!(
            out,
            "    {} [id={}, label={}, shape={shape}]",
            quote(&node.id),
            quote(&format!("node:{}", node.id)),
            quote(&clip(label, 40)),
        );
    }
    for edge in &workflow.edges {
        let label = edge
            .label
            .clone()
            .or_else(|| edge.condition.as_ref().map(|c| c.source().to_owned()))
            .or_else(|| edge.when.clone())
            .unwrap_or_default();
        let _ = writeln!(
            out,
            "    {} -> {} [id={}, label={}]",
            quote(&workflow.nodes[edge.from].id),
            quote(&workflow.nodes[edge.to].id),
            quote(&format!("edge:{}", edge.index)),
            quote(&clip(&label, 32)),
        );
    }
    out.push_str("}\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn compiled(text: &str, attribute_texts: bool) -> Workflow {
        let file = trellis_syntax::SourceFile::new("t.fabro", text.to_owned());
        let options = crate::CompileOptions {
            attribute_texts,
            ..crate::CompileOptions::default()
        };
        let compiled = crate::compile(&file, trellis_syntax::parse(&file), &options);
        let workflow = compiled.workflow;
        workflow.unwrap_or_else(|| panic!("{:?}", compiled.diagnostics))
    }

    const GATED: &str = "digraph G {\n  start [shape=Mdiamond]\n  exit [shape=Msquare]\n  \
        check [shape=parallelogram, script=\"true\", timeout=\"5s\"]\n  start -> check\n  \
        check -> exit [condition=\"outcome=success\"]\n  \
        check -> check [label=\"again\", condition=\"outcome=fail\"]\n}\n";

    #[test]
    fn the_picture_labels_edges_by_label_or_condition_without_attribute_texts() {
        let workflow = compiled(GATED, false);
        assert!(workflow.attribute_texts.is_none());
        let picture = picture(&workflow);
        assert!(picture.contains("label=\"outcome=success\""), "{picture}");
        assert!(picture.contains("label=\"again\""), "{picture}");
    }

    #[test]
    fn dot_prints_the_attributes_only_when_kept() {
        let kept = to_dot(&compiled(GATED, true));
        assert!(kept.contains("timeout=\"5s\""), "{kept}");
        assert!(kept.contains("condition=\"outcome=success\""), "{kept}");
        let bare = to_dot(&compiled(GATED, false));
        assert!(!bare.contains("timeout"), "{bare}");
    }
}
