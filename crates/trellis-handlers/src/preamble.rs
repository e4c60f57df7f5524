//! The preamble a prompt node gets before its own prompt (the context document): the goal, the stages
//! finished so far with their handler-specific details, and the context values not shown with them.
//! Its detail follows the node's fidelity: `compact` (the default) is a nested bullet list,
//! `summary:high` a per-stage Markdown report, `summary:medium` and `summary:low` shorter summaries,
//! `truncate` only the goal and run id, and `full` none at all (the conversation itself carries the
//! context). A large value is not inlined whole: the preamble gives the blob's file and the value's
//! first and last lines.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde_json::Value;
use trellis_agent::{Keep, Limit};
use trellis_engine::services::{BLOB_PREFIX, BlobStore};
pub use trellis_engine::text::clip;
use trellis_engine::{StageRecord, keys};
use trellis_workflow::node_kind::Fidelity;
use trellis_workflow::{NodeKind, Workflow};

/// What a preamble is built from.
pub struct PreambleSource<'a> {
    pub workflow: &'a Workflow,
    pub run_id: &'a str,
    pub history: &'a [StageRecord],
    pub context: &'a BTreeMap<String, Value>,
    pub blobs: &'a dyn BlobStore,
}

/// The workflow's input and every prior node's result (its structured output, else its response),
/// keyed by node id, as one JSON object: what a YAML (SWEny) node is shown, and what its `requires`
/// is checked against.
pub(crate) fn results_by_node(
    workflow: &Workflow,
    context: &BTreeMap<String, Value>,
    blobs: &dyn BlobStore,
) -> Value {
    let resolve = |value: &Value| trellis_engine::context::resolve_blob(value.clone(), blobs);
    let mut shown = serde_json::Map::new();
    shown.insert(
        "input".into(),
        context
            .get(keys::INPUT)
            .map_or_else(|| Value::Object(serde_json::Map::new()), resolve),
    );
    for node in &workflow.nodes {
        let result = context
            .get(&keys::output_of(&node.id))
            .or_else(|| context.get(&keys::response_of(&node.id)));
        if let Some(result) = result {
            let mut result = resolve(result);
            // Its evaluators' verdicts, as `<node>.evals` (unless its output has a field so named).
            if let (Value::Object(fields), Some(evals)) =
                (&mut result, context.get(&keys::evals_of(&node.id)))
            {
                fields.entry("evals").or_insert_with(|| evals.clone());
            }
            shown.insert(node.id.clone(), result);
        }
    }
    Value::Object(shown)
}

/// A YAML (SWEny) node sees [`results_by_node`], long text cut with a marker.
fn sweny_context(out: &mut String, source: &PreambleSource<'_>) {
    let shown = trellis_engine::route_view::cut(results_by_node(
        source.workflow,
        source.context,
        source.blobs,
    ));
    let _ = write!(
        out,
        "## Workflow input and results so far\n```json\n{}\n```\n",
        serde_json::to_string_pretty(&shown).unwrap_or_default()
    );
}

/// How much of each thing a fidelity level shows, in characters.
struct Limits {
    response: usize,
    output: usize,
    /// The whole preamble's budget (the token targets of the context document, at ~4 chars a token).
    total: usize,
    details: bool,
    context: bool,
    /// `summary:high` writes a section per stage instead of bullets.
    report: bool,
}

fn limits(fidelity: Fidelity) -> Option<Limits> {
    let limits = match fidelity {
        Fidelity::Full | Fidelity::Truncate => return None,
        Fidelity::Compact => Limits {
            response: 2_000,
            output: 1_000,
            total: 24_000,
            details: true,
            context: true,
            report: false,
        },
        Fidelity::SummaryHigh => Limits {
            response: 12_000,
            output: 4_000,
            total: 64_000,
            details: true,
            context: true,
            report: true,
        },
        Fidelity::SummaryMedium => Limits {
            response: 600,
            output: 300,
            total: 6_000,
            details: true,
            context: true,
            report: false,
        },
        Fidelity::SummaryLow => Limits {
            response: 0,
            output: 0,
            total: 2_400,
            details: false,
            context: false,
            report: false,
        },
    };
    Some(limits)
}

/// Context keys the preamble's context list leaves out: the engine's own keys, and values already shown
/// with their stage (responses, command output, branch results).
fn hidden(key: &str) -> bool {
    const SHOWN_WITH_STAGE: &[&str] = &["response.", "command.", "thread."];
    const KEYS: &[&str] = &[
        keys::LAST_RESPONSE,
        keys::LAST_STAGE,
        keys::PARALLEL_RESULTS,
    ];
    keys::is_engine_key(key)
        || SHOWN_WITH_STAGE.iter().any(|p| key.starts_with(p))
        || KEYS.contains(&key)
}

/// The preamble for `fidelity`; empty for `full`.
pub fn build(source: &PreambleSource<'_>, fidelity: Fidelity) -> String {
    let mut out = String::new();
    if fidelity == Fidelity::Full {
        return out;
    }
    if let Some(goal) = &source.workflow.graph.goal {
        let _ = writeln!(out, "Goal: {goal}");
    }
    if source.workflow.format == trellis_workflow::SourceFormat::Yaml {
        sweny_context(&mut out, source);
        return out;
    }
    let Some(limits) = limits(fidelity) else {
        let _ = writeln!(out, "Run: {}", source.run_id);
        return out;
    };
    let stages: Vec<&StageRecord> = source
        .history
        .iter()
        .filter(|r| {
            source.workflow.node(&r.node_id).is_some_and(|n| {
                !matches!(
                    n.kind,
                    NodeKind::Start | NodeKind::Exit | NodeKind::Conditional
                )
            })
        })
        .collect();
    if !stages.is_empty() {
        out.push_str(if out.is_empty() {
            "## Completed stages\n"
        } else {
            "\n## Completed stages\n"
        });
        for record in stages {
            render_stage(&mut out, source, record, &limits);
        }
    }
    if limits.context {
        let shown: Vec<(&String, &Value)> =
            source.context.iter().filter(|(k, _)| !hidden(k)).collect();
        if !shown.is_empty() {
            out.push_str("\n## Context\n");
            for (key, value) in shown {
                let text = match value {
                    Value::String(s) => resolve(source, s, 200),
                    other => clip(&other.to_string(), 200),
                };
                let _ = writeln!(out, "- {key}: {text}");
            }
        }
    }
    if out.len() > limits.total {
        let cut = floor_char_boundary(&out, limits.total);
        out.truncate(cut);
        out.push_str("\n… (preamble shortened)\n");
    }
    out
}

fn render_stage(
    out: &mut String,
    source: &PreambleSource<'_>,
    record: &StageRecord,
    limits: &Limits,
) {
    let status = record.status.as_str();
    if limits.report {
        let _ = writeln!(out, "\n### {} ({status})", record.node_id);
    } else {
        let _ = writeln!(out, "- **{}**: {status}", record.node_id);
    }
    let bullet = if limits.report { "- " } else { "  - " };
    if let Some(reason) = &record.failure_reason {
        let _ = writeln!(out, "{bullet}Failure: {}", clip(reason, 300));
    }
    if !limits.details {
        return;
    }
    let details = &record.details;
    if let Some(model) = &details.model {
        let _ = writeln!(
            out,
            "{bullet}Model: {}, {} tokens in / {} out",
            model.model,
            tokens(model.usage.input_tokens),
            tokens(model.usage.output_tokens)
        );
    }
    if !record.files_touched.is_empty() {
        let _ = writeln!(out, "{bullet}Files: {}", record.files_touched.join(", "));
    }
    if let Some(script) = &details.script {
        let _ = writeln!(out, "{bullet}Script: `{}`", clip(script.trim(), 300));
    }
    for (reference, label) in [(&details.stdout, "Stdout"), (&details.stderr, "Stderr")] {
        if let Some(reference) = reference {
            let text = resolve(source, reference, limits.output);
            block(out, bullet, label, &text);
        }
    }
    if details.model.is_some() && limits.response > 0 {
        let key = keys::response_of(&record.node_id);
        if let Some(Value::String(response)) = source.context.get(&key) {
            let text = resolve(source, response, limits.response);
            block(out, bullet, "Response", &text);
        }
    }
}

fn block(out: &mut String, bullet: &str, label: &str, text: &str) {
    if text.trim().is_empty() {
        let _ = writeln!(out, "{bullet}{label}: (empty)");
    } else if text.starts_with("See: ") || !text.contains('\n') {
        let _ = writeln!(out, "{bullet}{label}: {}", text.trim_end());
    } else {
        let _ = writeln!(out, "{bullet}{label}:\n{}", text.trim_end());
    }
}

/// A context value as the preamble shows it: text is clipped to `limit`; a blob longer than `limit`
/// becomes its file's path followed by its start and end, `limit` characters in all (a command's
/// first lines say what ran and its last how it ended; a model cannot always open the file).
fn resolve(source: &PreambleSource<'_>, value: &str, limit: usize) -> String {
    if !value.starts_with(BLOB_PREFIX) {
        return clip(value, limit);
    }
    let content = source
        .blobs
        .get(value)
        .ok()
        .map(|b| String::from_utf8_lossy(&b).into_owned());
    let path = source.blobs.path_of(value);
    match (content, path) {
        (Some(text), _) if text.chars().count() <= limit => text,
        (Some(text), path) if limit > 0 => {
            let ends = Limit {
                chars: limit,
                lines: usize::MAX,
                keep: Keep::HeadAndTail,
            };
            let size = text.chars().count();
            let place = path.map_or_else(String::new, |p| format!("See: {} — ", p.display()));
            format!(
                "{place}{size} characters; its start and end:\n{}",
                ends.apply(&text)
            )
        }
        (_, Some(path)) => format!("See: {}", path.display()),
        (_, None) => "(stored as a blob)".to_owned(),
    }
}

fn tokens(n: u64) -> String {
    if n >= 1000 {
        #[allow(
            clippy::cast_precision_loss,
            reason = "a display rounding of token counts"
        )]
        let k = n as f64 / 1000.0;
        format!("{k:.1}k")
    } else {
        n.to_string()
    }
}

fn floor_char_boundary(text: &str, at: usize) -> usize {
    (0..=at.min(text.len()))
        .rev()
        .find(|&i| text.is_char_boundary(i))
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use trellis_engine::services::memory::MemoryBlobs;
    use trellis_workflow::{CompileOptions, StageStatus, compile_text};

    fn workflow() -> Workflow {
        let source = r#"digraph W {
            graph [goal="Add a /health endpoint"]
            start [shape=Mdiamond]; exit [shape=Msquare]
            plan [shape=tab, prompt="Plan it"]
            test [shape=parallelogram, script="cargo test"]
            implement [shape=tab, prompt="Do it"]
            start -> plan -> test -> implement -> exit
        }"#;
        compile_text("w.fabro", source, &CompileOptions::default())
            .1
            .workflow
            .expect("valid workflow")
    }

    fn record(node: &str, details: Value, files: &[&str]) -> StageRecord {
        StageRecord {
            rank: 1,
            node_id: node.into(),
            visit: 1,
            attempt: 1,
            status: StageStatus::Succeeded,
            duration_ms: 5,
            failure_reason: None,
            dir: String::new(),
            details: serde_json::from_value(details).unwrap(),
            files_touched: files.iter().map(|f| (*f).to_owned()).collect(),
        }
    }

    #[test]
    fn compact_preamble_lists_stages_with_their_details_and_the_context() {
        let workflow = workflow();
        let blobs = MemoryBlobs::default();
        let stdout = blobs
            .put(b"running 42 tests ... 41 passed, 1 failed")
            .unwrap();
        let stderr = blobs.put(b"").unwrap();
        let history = vec![
            record("start", json!({}), &[]),
            record(
                "plan",
                json!({ "model": "claude-sonnet-4-5", "usage": { "input_tokens": 12_400, "output_tokens": 3_200 } }),
                &["docs/plan.md"],
            ),
            record(
                "test",
                json!({ "script": "cargo test 2>&1 || true", "stdout": stdout, "stderr": stderr }),
                &[],
            ),
        ];
        let context: BTreeMap<String, Value> = [
            ("response.plan", json!("1. add the route\n2. test it")),
            ("tests_passed", json!(false)),
            ("internal.run_id", json!("R1")),
            ("graph.goal", json!("Add a /health endpoint")),
            ("last_response", json!("1. add")),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect();
        let source = PreambleSource {
            workflow: &workflow,
            run_id: "R1",
            history: &history,
            context: &context,
            blobs: &blobs,
        };
        let preamble = build(&source, Fidelity::Compact);
        assert_eq!(
            preamble,
            "Goal: Add a /health endpoint\n\n## Completed stages\n\
             - **plan**: succeeded\n  - Model: claude-sonnet-4-5, 12.4k tokens in / 3.2k out\n  - Files: docs/plan.md\n\
             \x20 - Response:\n1. add the route\n2. test it\n\
             - **test**: succeeded\n  - Script: `cargo test 2>&1 || true`\n\
             \x20 - Stdout: running 42 tests ... 41 passed, 1 failed\n  - Stderr: (empty)\n\
             \n## Context\n- tests_passed: false\n"
        );
        assert_eq!(
            build(&source, Fidelity::Truncate),
            "Goal: Add a /health endpoint\nRun: R1\n"
        );
        assert_eq!(build(&source, Fidelity::Full), "");
        let low = build(&source, Fidelity::SummaryLow);
        assert!(
            low.contains("- **plan**: succeeded\n- **test**: succeeded\n")
                && !low.contains("Model"),
            "{low}"
        );
        let high = build(&source, Fidelity::SummaryHigh);
        assert!(
            high.contains("### plan (succeeded)\n- Model: claude-sonnet-4-5"),
            "{high}"
        );
    }

    /// Regression: user keys starting with `current` (like `current_plan`) vanished from preambles.
    #[test]
    fn regression_user_keys_starting_with_current_are_shown() {
        assert!(!hidden("current_plan"));
        assert!(hidden("current_node") && hidden("internal.run_id") && hidden("response.plan"));
    }

    #[test]
    fn large_outputs_show_their_start_and_end_and_say_how_much_was_cut() {
        let workflow = workflow();
        let blobs = MemoryBlobs::default();
        let middle = "backtrace frame\n".repeat(300);
        let big = format!("running 1 test\nleft: 7 right: 12\n{middle}test result: FAILED\n");
        let stdout = blobs.put(big.as_bytes()).unwrap();
        let history = vec![record(
            "test",
            json!({ "script": "make", "stdout": stdout }),
            &[],
        )];
        let context = BTreeMap::new();
        let source = PreambleSource {
            workflow: &workflow,
            run_id: "R1",
            history: &history,
            context: &context,
            blobs: &blobs,
        };
        let preamble = build(&source, Fidelity::Compact);
        let size = big.chars().count();
        assert!(
            preamble.contains(&format!(
                "Stdout:\n{size} characters; its start and end:\nrunning 1 test\nleft: 7 right: 12\n"
            )),
            "{preamble}"
        );
        assert!(preamble.contains(" characters cut …]\n"), "{preamble}");
        // Whole lines only: none is cut in the middle.
        let excerpt = &preamble[preamble.find("running 1 test").unwrap()..];
        for line in excerpt.lines() {
            assert!(
                [
                    "running 1 test",
                    "left: 7 right: 12",
                    "backtrace frame",
                    "test result: FAILED"
                ]
                .contains(&line)
                    || line.ends_with("characters cut …]"),
                "a line cut: {line:?}\n{preamble}"
            );
        }
        assert!(preamble.contains("test result: FAILED"), "{preamble}");
        assert!(preamble.len() < 1_500, "{preamble}");
        // Where a level shows no output, nothing of it is shown.
        let low = build(&source, Fidelity::SummaryLow);
        assert!(!low.contains("backtrace"), "{low}");
    }
}
