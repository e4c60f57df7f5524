//! `trellis graph`: the compiled workflow printed back as normalized DOT — one graph attribute block, one
//! line per node with its resolved attributes (handler type, shape, classes, stylesheet models, expanded
//! prompts), one line per edge — so users see exactly what the engine will run.

use std::fmt::Write;

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
    attributes: impl IntoIterator<Item = (&'a String, &'a String)>,
    first: &[&str],
) -> String {
    let attributes: Vec<(&String, &String)> = attributes.into_iter().collect();
    let ordered = first
        .iter()
        .filter_map(|k| attributes.iter().find(|(name, _)| name == k).copied())
        .chain(
            attributes
                .iter()
                .copied()
                .filter(|(k, _)| !first.contains(&k.as_str())),
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

/// Renders the workflow as normalized DOT.
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
    for node in &workflow.nodes {
        let mut attributes = node.attributes.clone();
        if let Some(llm) = node.kind.llm() {
            attributes.insert("prompt".into(), llm.prompt.clone());
        }
        if !attributes.contains_key("label") {
            attributes.insert("label".into(), node.label.clone());
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
            attr_list(&edge.attributes, &["label", "condition", "when", "weight"])
        );
    }
    out.push_str("}\n");
    out
}
