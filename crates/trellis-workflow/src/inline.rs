//! The source a run records: the workflow text with every `@file` reference (prompts, output schemas)
//! replaced by the file's content, so a resumed or re-examined run never depends on files that may
//! since have changed. Values are replaced in place, by span; nothing else in the text moves.

use std::path::Path;

use crate::SourceFormat;
use crate::node_kind::OutputSchema;
use crate::workflow::Workflow;

/// Quotes text as a string value of the workflow's format (DOT and YAML both read JSON-style escapes).
fn quoted(text: &str, format: SourceFormat) -> String {
    match format {
        SourceFormat::Dot => crate::graph_dot::quote(text),
        SourceFormat::Yaml => serde_json::to_string(text).unwrap_or_default(),
    }
}

/// `source` with the `@file` values of `workflow` inlined.
pub fn inline_file_references(source: &str, workflow: &Workflow) -> String {
    let mut replacements: Vec<(std::ops::Range<usize>, String)> = Vec::new();
    for node in &workflow.nodes {
        let Some(llm) = node.kind.llm() else { continue };
        if let (Some(path), Some(span)) = (&llm.prompt_file, node.attr_spans.get("prompt"))
            && let Ok(text) = trellis_syntax::read_text(Path::new(path))
        {
            replacements.push((span.range(), quoted(&text, workflow.format)));
        }
        if let (
            Some(OutputSchema::JsonSchema {
                path: Some(_),
                schema,
            }),
            Some(span),
        ) = (&llm.output_schema, node.attr_spans.get("output_schema"))
        {
            replacements.push((span.range(), quoted(&schema.to_string(), workflow.format)));
        }
    }
    // Node defaults share one value: replace each place once, from the end so earlier spans stay valid.
    replacements.sort_by_key(|(range, _)| std::cmp::Reverse(range.start));
    replacements.dedup_by(|a, b| a.0 == b.0);
    let mut text = source.to_owned();
    for (range, replacement) in replacements {
        if range.end <= text.len()
            && text.is_char_boundary(range.start)
            && text.is_char_boundary(range.end)
        {
            text.replace_range(range, &replacement);
        }
    }
    text
}
