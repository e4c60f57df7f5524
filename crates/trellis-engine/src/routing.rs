//! Edge selection after a stage, in the order DESIGN.md §3 fixes. Edges whose `max_iterations` is spent
//! are dropped first. A YAML workflow then routes as the edges-and-routing page says (see
//! `natural_language`); a DOT workflow takes
//! 1. `condition` edges that match: highest weight, then the lexically first target;
//! 2. the outcome's preferred label, against edge labels (accelerators stripped, case ignored);
//! 3. the outcome's suggested next ids, in order;
//! 4. natural-language `when` edges, judged by a model — unconditional edges are offered as "none of the
//!    above" — except that a node with exactly one remaining unconditional edge never calls the model;
//! 5. unconditional edges: highest weight, then the lexically first target.

use std::collections::BTreeMap;

use trellis_workflow::label::normalize_label;
use trellis_workflow::{Edge, NodeIndex, SourceFormat, Workflow};

use crate::checkpoint::{Key, edge_key};
use crate::context::ConditionView;
use crate::outcome::Outcome;

/// What routing decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Route {
    /// Follow this edge (index into `Workflow::edges`).
    Edge(usize),
    /// Ask a model to pick among these `when` edges, falling back to `fallback` (an unconditional edge).
    AskModel {
        candidates: Vec<usize>,
        fallback: Option<usize>,
    },
    /// No edge remains at all: in YAML the node is terminal.
    NoEdges,
    /// Edges remain but none applies; `tried` lists the conditions that were evaluated.
    NoMatch { tried: Vec<String> },
}

/// How an edge's iteration count is keyed.
pub fn key_of(workflow: &Workflow, edge: &Edge) -> String {
    edge_key(
        &workflow.nodes[edge.from].id,
        &workflow.nodes[edge.to].id,
        edge.index,
    )
}

/// The best of `edges` by weight, then lexically first target id.
fn best<'a>(workflow: &Workflow, edges: impl Iterator<Item = &'a Edge>) -> Option<&'a Edge> {
    edges.min_by(|a, b| {
        b.weight
            .cmp(&a.weight)
            .then_with(|| workflow.nodes[a.to].id.cmp(&workflow.nodes[b.to].id))
    })
}

pub fn select(
    workflow: &Workflow,
    node: NodeIndex,
    outcome: &Outcome,
    view: &ConditionView<'_>,
    edge_counts: &BTreeMap<Key, u32>,
) -> Route {
    let remaining: Vec<&Edge> = workflow
        .outgoing(node)
        .filter(|e| {
            e.max_iterations.is_none_or(|max| {
                edge_counts
                    .get(key_of(workflow, e).as_str())
                    .copied()
                    .unwrap_or(0)
                    < max
            })
        })
        .collect();
    if remaining.is_empty() {
        return Route::NoEdges;
    }
    if workflow.format == SourceFormat::Yaml {
        return natural_language(workflow, &remaining);
    }
    // 1. Conditions.
    if let Some(edge) = best(
        workflow,
        remaining
            .iter()
            .copied()
            .filter(|e| e.condition.as_ref().is_some_and(|c| c.evaluate(view))),
    ) {
        return Route::Edge(edge.index);
    }
    let open: Vec<&Edge> = remaining
        .iter()
        .copied()
        .filter(|e| e.condition.is_none())
        .collect();
    // 2. Preferred label.
    if let Some(label) = outcome
        .preferred_label
        .as_deref()
        .map(normalize_label)
        .filter(|l| !l.is_empty())
        && let Some(edge) = open.iter().find(|e| {
            e.label
                .as_deref()
                .is_some_and(|l| normalize_label(l) == label)
        })
    {
        return Route::Edge(edge.index);
    }
    // 3. Suggested next ids.
    for id in &outcome.suggested_next_ids {
        if let Some(edge) = open.iter().find(|e| workflow.nodes[e.to].id == *id) {
            return Route::Edge(edge.index);
        }
    }
    let unconditional = || open.iter().copied().filter(|e| e.when.is_none());
    // 4. Natural-language edges (never for a lone unconditional edge).
    let when: Vec<usize> = open
        .iter()
        .filter(|e| e.when.is_some())
        .map(|e| e.index)
        .collect();
    if !when.is_empty() {
        return Route::AskModel {
            candidates: when,
            fallback: best(workflow, unconditional()).map(|e| e.index),
        };
    }
    // 5. Unconditional edges.
    if let Some(edge) = best(workflow, unconditional()) {
        return Route::Edge(edge.index);
    }
    Route::NoMatch {
        tried: remaining
            .iter()
            .filter_map(|e| {
                e.condition.as_ref().map(|c| {
                    format!(
                        "{} -> {}: {}",
                        workflow.nodes[e.from].id,
                        workflow.nodes[e.to].id,
                        c.source()
                    )
                })
            })
            .collect(),
    }
}

/// The edges-and-routing page's algorithm, for YAML workflows (after exhausted edges are dropped): one
/// edge left without `when` is followed without a model; otherwise the model judges the `when` edges,
/// with an unconditional edge as "none of the above". Nothing is evaluated programmatically.
fn natural_language(workflow: &Workflow, remaining: &[&Edge]) -> Route {
    if let [only] = remaining
        && only.when.is_none()
    {
        return Route::Edge(only.index);
    }
    let unconditional = || remaining.iter().copied().filter(|e| e.when.is_none());
    let when: Vec<usize> = remaining
        .iter()
        .filter(|e| e.when.is_some())
        .map(|e| e.index)
        .collect();
    if when.is_empty() {
        // Several unconditional edges (AMBIGUOUS_EDGES, refused by validation): the first declared.
        return Route::Edge(remaining[0].index);
    }
    Route::AskModel {
        candidates: when,
        fallback: best(workflow, unconditional()).map(|e| e.index),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use trellis_workflow::{CompileOptions, StageStatus, Workflow, compile_text};

    use super::*;
    use crate::context::{ConditionView, RunContext};
    use crate::services::memory::MemoryBlobs;

    fn workflow(edges: &str) -> Workflow {
        let text = format!(
            "digraph R {{ start [shape=Mdiamond]\n exit [shape=Msquare]\n n [shape=parallelogram, script=\"true\"]\n a [shape=parallelogram, script=\"true\"]\n b [shape=parallelogram, script=\"true\"]\n c [shape=parallelogram, script=\"true\"]\n start -> n\n a -> exit\n b -> exit\n c -> exit\n {edges} }}"
        );
        let (_, compiled) = compile_text("r.fabro", text, &CompileOptions::default());
        compiled
            .workflow
            .unwrap_or_else(|| panic!("{:?}", compiled.diagnostics))
    }

    fn route(workflow: &Workflow, outcome: &Outcome, counts: &BTreeMap<Key, u32>) -> String {
        let blobs = MemoryBlobs::default();
        let context = RunContext::default();
        let view = ConditionView {
            context: &context,
            outcome: Some(outcome.status),
            preferred_label: outcome.preferred_label.as_deref(),
            blobs: &blobs,
        };
        let node = workflow.node_index("n").unwrap();
        match select(workflow, node, outcome, &view, counts) {
            Route::Edge(e) => workflow.nodes[workflow.edges[e].to].id.clone(),
            other => format!("{other:?}"),
        }
    }

    #[test]
    fn conditions_beat_labels_beat_suggestions_beat_fallbacks() {
        let w =
            workflow("n -> a [label=\"Fix\"]\n n -> b [condition=\"outcome=success\"]\n n -> c");
        let mut outcome = Outcome::success();
        outcome.preferred_label = Some("fix".into());
        assert_eq!(
            route(&w, &outcome, &BTreeMap::new()),
            "b",
            "a matching condition wins"
        );
        let mut failed = Outcome::failed(crate::outcome::FailureClass::StageFailed, "x");
        failed.preferred_label = Some("[F] Fix".into());
        failed.suggested_next_ids = vec!["c".into()];
        assert_eq!(
            route(&w, &failed, &BTreeMap::new()),
            "a",
            "then the preferred label"
        );
        failed.preferred_label = None;
        assert_eq!(
            route(&w, &failed, &BTreeMap::new()),
            "c",
            "then suggested ids"
        );
        failed.suggested_next_ids = vec!["nowhere".into(), "a".into()];
        assert_eq!(
            route(&w, &failed, &BTreeMap::new()),
            "a",
            "suggestions in order"
        );
        failed.suggested_next_ids.clear();
        assert_eq!(
            route(&w, &failed, &BTreeMap::new()),
            "a",
            "then the lexically first fallback"
        );
    }

    #[test]
    fn exhausted_edges_drop_out_and_when_edges_ask_a_model() {
        let w = workflow("n -> a [max_iterations=1]\n n -> b [when=\"it went well\"]\n n -> c");
        let outcome = Outcome::new(StageStatus::Succeeded);
        let asked = route(&w, &outcome, &BTreeMap::new());
        assert!(asked.starts_with("AskModel"), "{asked}");
        let w = workflow(
            "n -> a [max_iterations=1]\n n -> b [condition=\"outcome=fail\"]\n n -> c [condition=\"outcome=fail\"]",
        );
        let counts = BTreeMap::from([(Key::from("n->a#4"), 1)]);
        assert_eq!(route(&w, &outcome, &BTreeMap::new()), "a");
        let exhausted = route(&w, &outcome, &counts);
        assert!(exhausted.starts_with("NoMatch"), "{exhausted}");
    }
}
