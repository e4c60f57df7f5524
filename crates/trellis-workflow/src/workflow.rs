//! The typed workflow IR that compile produces and the engine runs. Nodes carry a [`NodeKind`] with typed
//! configuration; edges carry compiled [`Condition`]s. Spans stay attached for diagnostics, and each node
//! and edge's resolved attributes are kept as text for display (`trellis graph`) only when asked
//! ([`crate::CompileOptions::attribute_texts`]), beside them ([`Workflow::attribute_texts`]).

use std::collections::HashMap;
use std::time::Duration;

use trellis_syntax::Span;
use trellis_syntax::ast::SourceFormat;

use crate::condition::Condition;
use crate::node_kind::{Fidelity, NodeKind, RetryPolicy, RetryPreset};
use crate::small_map::SmallMap;

/// Index of a node in [`Workflow::nodes`].
pub type NodeIndex = usize;

/// The hash a node's id is found by.
pub(crate) fn id_hash(id: &str) -> u64 {
    use std::hash::BuildHasher as _;
    rustc_hash::FxBuildHasher.hash_one(id)
}

/// A compiled workflow.
#[derive(Debug, Clone)]
pub struct Workflow {
    pub name: String,
    pub format: SourceFormat,
    pub graph: GraphConfig,
    pub nodes: Vec<Node>,
    pub edges: Vec<Edge>,
    /// The entry node (the start node in DOT; `start:` or the first node in YAML), when there is one.
    pub start: Option<NodeIndex>,
    /// Indexes into `nodes`, hashed by the node's id: the ids are not copied.
    by_id: hashbrown::HashTable<NodeIndex>,
    /// Edge indices by source and by target node, built once edges are final.
    out_edges: EdgeLists,
    in_edges: EdgeLists,
    /// Where whole-workflow diagnostics point.
    pub header_span: Span,
    /// Nodes whose handler could not be resolved (`known-handler` reported them): lowered as
    /// conditional nodes so the graph stays whole for the other rules, which do not judge their kind.
    pub(crate) unresolved: Vec<NodeIndex>,
    /// Every node's and edge's resolved attributes as text, for display only, when the workflow was
    /// compiled with [`crate::CompileOptions::attribute_texts`].
    pub attribute_texts: Option<AttributeTexts>,
}

/// Resolved attributes (explicit, defaults, stylesheet) as text, by node and by edge index: what
/// `trellis graph` prints besides the typed fields. The nodes' `type`, `shape` and classes are
/// their fields, not texts here.
#[derive(Debug, Clone, Default)]
pub struct AttributeTexts {
    pub nodes: Vec<SmallMap<String>>,
    pub edges: Vec<SmallMap<String>>,
}

/// The edges of each node, by index, in declaration order: one list per node, all in one vector
/// (a workflow of many nodes keeps two small vectors, not two per node).
#[derive(Debug, Clone, Default)]
struct EdgeLists {
    /// Where each node's list starts in `edges`; the last entry is where the last one ends.
    starts: Vec<usize>,
    edges: Vec<usize>,
}

impl EdgeLists {
    /// The lists of `nodes` nodes, edge `i` belonging to the node `owners` gives as its `i`th item.
    fn new(nodes: usize, owners: impl Iterator<Item = NodeIndex> + Clone) -> Self {
        let mut starts = vec![0; nodes + 1];
        for owner in owners.clone() {
            starts[owner + 1] += 1;
        }
        for n in 0..nodes {
            starts[n + 1] += starts[n];
        }
        let mut next = starts.clone();
        let mut edges = vec![0; starts[nodes]];
        for (edge, owner) in owners.enumerate() {
            edges[next[owner]] = edge;
            next[owner] += 1;
        }
        Self { starts, edges }
    }
}

impl std::ops::Index<NodeIndex> for EdgeLists {
    type Output = [usize];

    fn index(&self, node: NodeIndex) -> &[usize] {
        &self.edges[self.starts[node]..self.starts[node + 1]]
    }
}

/// A skill a workflow defines itself (SWEny's inline skills): its instructions, and the MCP server
/// it brings (`.mcp.json`'s entry shape: `command`/`args`/`env` or `url`/`headers`).
#[derive(Debug, Clone, PartialEq)]
pub struct InlineSkill {
    pub id: String,
    pub name: Option<String>,
    pub description: Option<String>,
    pub instruction: String,
    pub mcp: Option<serde_json::Value>,
}

impl InlineSkill {
    /// A workflow's `skills` value (JSON text: a map from id to `{name, description, instruction,
    /// mcp}`).
    pub fn parse_all(text: &str) -> Result<Vec<Self>, String> {
        let value: serde_json::Value =
            serde_json::from_str(text).map_err(|e| format!("`skills` is not valid JSON: {e}"))?;
        let serde_json::Value::Object(skills) = value else {
            return Err("`skills` must map each skill's id to its definition".into());
        };
        skills
            .into_iter()
            .map(|(id, definition)| {
                let serde_json::Value::Object(mut fields) = definition else {
                    return Err(format!(
                        "skill `{id}` must be a map (name, description, instruction, mcp)"
                    ));
                };
                let text = |fields: &mut serde_json::Map<String, serde_json::Value>, key: &str| {
                    fields
                        .remove(key)
                        .and_then(|v| v.as_str().map(str::to_owned))
                };
                let skill = InlineSkill {
                    name: text(&mut fields, "name"),
                    description: text(&mut fields, "description"),
                    instruction: text(&mut fields, "instruction")
                        .filter(|t| !t.trim().is_empty())
                        .ok_or_else(|| format!("skill `{id}` needs a non-empty `instruction`"))?,
                    mcp: fields.remove("mcp").filter(serde_json::Value::is_object),
                    id: id.clone(),
                };
                if let Some(key) = fields.keys().next() {
                    return Err(format!(
                        "unknown key `{key}` in skill `{id}` (name, description, instruction, mcp)"
                    ));
                }
                Ok(skill)
            })
            .collect()
    }
}

/// Graph-level settings.
#[derive(Debug, Clone, Default)]
pub struct GraphConfig {
    pub goal: Option<String>,
    /// The workflow's model (`model`, Fabro's `default_model`, a YAML workflow's top-level
    /// `model`): prompt and agent nodes that name none use it.
    pub model: Option<String>,
    /// The provider of a model the catalog does not place, when the run names none (Fabro's
    /// `default_provider`).
    pub provider: Option<String>,
    /// The model that judges `when` edges; the workflow's model when unset.
    pub router_model: Option<String>,
    /// The model of the `judge` evaluators of nodes that name none (SWEny's workflow `judge_model`).
    pub judge_model: Option<String>,
    pub label: Option<String>,
    pub model_stylesheet: Option<String>,
    /// Retries for retryable failures when a node sets none (`default_max_retry`/`default_max_retries`).
    pub default_max_retries: u32,
    pub retry_target: Option<String>,
    pub fallback_retry_target: Option<String>,
    pub default_fidelity: Option<Fidelity>,
    pub default_thread: Option<String>,
    /// Max visits per node across the run; `None` means unlimited.
    pub max_node_visits: Option<u32>,
    /// How often one failure may repeat before the run stops (Fabro's
    /// `loop_restart_signature_limit`): a stage failing the same way that many times in a run, its
    /// signature (node, class, reason with numbers masked) counted across loop restarts and never
    /// reset by a success. `None` (unset, or `0`) when off.
    pub failure_repeat_limit: Option<u32>,
    /// `None` when disabled (`stall_timeout=0`).
    pub stall_timeout: Option<Duration>,
    /// Commands capture test artifacts unless this is false (`capture_artifacts`).
    pub capture_artifacts: bool,
    /// The graph's `sandbox` attribute, which nodes' own apply over.
    pub sandbox: crate::node_kind::SandboxPolicy,
    /// The graph's `permissions`, for agent nodes that set none.
    pub permissions: Option<crate::node_kind::Permissions>,
    /// MCP servers for this workflow's agents (`mcp_servers="@servers.toml"`, or the text itself),
    /// in their file's order. A run file's servers follow (a later one wins a name).
    pub mcp_servers: Vec<(String, crate::mcp_config::ServerConfig)>,
    /// Skills the workflow defines itself (SWEny's inline `skills:` map).
    pub inline_skills: Vec<InlineSkill>,
    /// Every graph attribute as text, mirrored into the run context as `graph.<key>`.
    pub attributes: SmallMap<String>,
    /// Value spans of graph attributes, for diagnostics.
    pub attr_spans: SmallMap<Span>,
}

/// Settings every node has.
#[derive(Debug, Clone, Default, PartialEq)]
#[allow(
    clippy::struct_excessive_bools,
    reason = "each is an attribute of its own, read where it applies; they pack into a node's padding"
)]
pub struct CommonConfig {
    pub timeout: Option<Duration>,
    pub max_visits: Option<u32>,
    pub max_retries: Option<u32>,
    /// `retry_policy`, a preset: its figures are [`RetryPolicy::preset`]'s.
    pub retry_preset: Option<RetryPreset>,
    /// `retry_target` and `fallback_retry_target`, in that order. Rarely set, so kept out of line:
    /// a node stays small.
    pub(crate) named_retry_targets: Option<Box<[Option<String>; 2]>>,
    pub goal_gate: bool,
    pub auto_status: bool,
    /// A failed node routes on instead of ending the run (what YAML workflows do without it).
    pub fail_soft: bool,
    /// A retryable failure that used up its retries ends the stage `partially_succeeded` rather
    /// than `failed` (Fabro's `allow_partial`).
    pub allow_partial: bool,
}

impl CommonConfig {
    /// The `retry_policy` preset's figures, when the node names one.
    pub fn retry_policy(&self) -> Option<RetryPolicy> {
        self.retry_preset.map(RetryPolicy::preset)
    }

    /// The node's `retry_target`.
    pub fn retry_target(&self) -> Option<&str> {
        self.named_retry_targets.as_ref()?[0].as_deref()
    }

    /// The node's `fallback_retry_target`.
    pub fn fallback_retry_target(&self) -> Option<&str> {
        self.named_retry_targets.as_ref()?[1].as_deref()
    }
}

/// One stage.
#[derive(Debug, Clone)]
pub struct Node {
    pub id: String,
    /// The `label` attribute, when given; [`Node::label`] is what shows.
    pub given_label: Option<Box<str>>,
    /// The resolved shape (explicit, or the kind's); a kind's shape is shared, not copied.
    pub shape: crate::node_kind::Shape,
    pub classes: Box<[trellis_syntax::ast::Text]>,
    pub kind: NodeKind,
    pub common: CommonConfig,
    /// Declared by a node statement (or in YAML `nodes`), not only mentioned by an edge.
    pub declared: bool,
    /// The first place the node was mentioned.
    pub span: Span,
    /// Value spans by attribute name, for diagnostics.
    pub attr_spans: SmallMap<Span>,
    /// Where a failure with nowhere to go (or an unmet goal gate) sends the run, in order: the node's
    /// `retry_target`, its `fallback_retry_target`, then the graph's two; only nodes that exist.
    pub retry_targets: Box<[NodeIndex]>,
}

impl Node {
    /// Where the value of attribute `key` is written, else the node's first mention: where a
    /// diagnostic about that attribute points.
    pub fn span_of(&self, key: &str) -> Span {
        self.attr_spans.get(key).copied().unwrap_or(self.span)
    }

    /// What the node is called where it shows: its `label`, else its id.
    pub fn label(&self) -> &str {
        self.given_label.as_deref().unwrap_or(&self.id)
    }
}

/// Progress of the fan-in search for one node.
#[derive(Debug, Clone, Copy)]
enum FanInState {
    Unknown,
    InProgress,
    Done(Option<NodeIndex>),
}

/// One transition.
#[derive(Debug, Clone)]
pub struct Edge {
    pub from: NodeIndex,
    pub to: NodeIndex,
    pub label: Option<String>,
    pub condition: Option<Box<Condition>>,
    /// A natural-language condition judged by a model.
    pub when: Option<String>,
    pub max_iterations: Option<u32>,
    pub weight: i64,
    pub fidelity: Option<Fidelity>,
    pub thread_id: Option<String>,
    pub loop_restart: bool,
    /// The free-text option of a human gate.
    pub freeform: bool,
    /// Position among all edges in declaration order; with `from`/`to` it keys iteration counts.
    pub index: usize,
    pub span: Span,
}

impl Workflow {
    pub(crate) fn new(name: String, format: SourceFormat, header_span: Span) -> Self {
        Self {
            name,
            format,
            graph: GraphConfig::default(),
            nodes: Vec::new(),
            edges: Vec::new(),
            start: None,
            by_id: hashbrown::HashTable::new(),
            out_edges: EdgeLists::default(),
            in_edges: EdgeLists::default(),
            header_span,
            unresolved: Vec::new(),
            attribute_texts: None,
        }
    }

    /// Room for `additional` more nodes, in the list and in the index by id.
    pub(crate) fn reserve_nodes(&mut self, additional: usize) {
        self.nodes.reserve_exact(additional);
        let nodes = &self.nodes;
        self.by_id.reserve(additional, |&i| id_hash(&nodes[i].id));
    }

    pub(crate) fn push_node(&mut self, node: Node) -> NodeIndex {
        let index = self.nodes.len();
        let hash = id_hash(&node.id);
        self.nodes.push(node);
        let nodes = &self.nodes;
        // A later node of the same id takes its place, as a map's insert does.
        match self.by_id.entry(
            hash,
            |&i| nodes[i].id == nodes[index].id,
            |&i| id_hash(&nodes[i].id),
        ) {
            hashbrown::hash_table::Entry::Occupied(mut entry) => *entry.get_mut() = index,
            hashbrown::hash_table::Entry::Vacant(entry) => {
                entry.insert(index);
            }
        }
        index
    }

    pub fn node_index(&self, id: &str) -> Option<NodeIndex> {
        self.by_id
            .find(id_hash(id), |&i| self.nodes[i].id == id)
            .copied()
    }

    pub fn node(&self, id: &str) -> Option<&Node> {
        self.node_index(id).map(|i| &self.nodes[i])
    }

    /// Indexes edges by node; called once after the last edge is added.
    pub(crate) fn index_edges(&mut self) {
        let nodes = self.nodes.len();
        self.out_edges = EdgeLists::new(nodes, self.edges.iter().map(|e| e.from));
        self.in_edges = EdgeLists::new(nodes, self.edges.iter().map(|e| e.to));
    }

    /// Outgoing edges of a node, in declaration order.
    pub fn outgoing(&self, node: NodeIndex) -> impl Iterator<Item = &Edge> {
        self.out_edges[node].iter().map(|&i| &self.edges[i])
    }

    /// Incoming edges of a node, in declaration order.
    pub fn incoming(&self, node: NodeIndex) -> impl Iterator<Item = &Edge> {
        self.in_edges[node].iter().map(|&i| &self.edges[i])
    }

    /// Resolves what the engine would otherwise search for at run time: each fan-out's fan-in and each
    /// node's retry-target chain. Called once, after the last edge is indexed.
    pub(crate) fn resolve_control_flow(&mut self) {
        let fan_ins = self.fan_ins();
        let graph_targets = [
            self.graph.retry_target.clone(),
            self.graph.fallback_retry_target.clone(),
        ];
        for (index, fan_in) in fan_ins.into_iter().enumerate() {
            let node = &self.nodes[index];
            let chain: Box<[NodeIndex]> = [
                node.common.retry_target(),
                node.common.fallback_retry_target(),
            ]
            .into_iter()
            .chain(graph_targets.iter().map(Option::as_deref))
            .flatten()
            .filter_map(|id| self.node_index(id))
            .collect();
            let node = &mut self.nodes[index];
            if let NodeKind::Parallel(config) = &mut node.kind {
                config.fan_in = fan_in;
            }
            node.retry_targets = chain;
        }
    }

    /// The fan-in of every fan-out node (`None` for other nodes, and for fan-outs whose branches never
    /// meet). A branch may hold a fan-out of its own: the walk steps over that nested fan-out to its
    /// fan-in, so the outer branches still meet at the outer fan-in.
    fn fan_ins(&self) -> Vec<Option<NodeIndex>> {
        let mut memo: Vec<FanInState> = vec![FanInState::Unknown; self.nodes.len()];
        for index in 0..self.nodes.len() {
            if matches!(self.nodes[index].kind, NodeKind::Parallel(_)) {
                self.fan_in_of(index, &mut memo, 0);
            }
        }
        memo.into_iter()
            .map(|state| match state {
                FanInState::Done(found) => found,
                FanInState::Unknown | FanInState::InProgress => None,
            })
            .collect()
    }

    /// The nearest fan-in every branch of `fan_out` reaches: fewest steps from the farthest branch,
    /// then the lexically first id.
    fn fan_in_of(
        &self,
        fan_out: NodeIndex,
        memo: &mut Vec<FanInState>,
        depth: usize,
    ) -> Option<NodeIndex> {
        /// Deeper nesting than this is treated as branches that never meet.
        const MAX_NESTING: usize = 64;
        match memo[fan_out] {
            FanInState::Done(found) => return found,
            FanInState::InProgress => return None,
            FanInState::Unknown if depth > MAX_NESTING => return None,
            FanInState::Unknown => {}
        }
        memo[fan_out] = FanInState::InProgress;
        let starts: Vec<NodeIndex> = self.outgoing(fan_out).map(|e| e.to).collect();
        // Per fan-in: the longest distance from any branch start, and how many branches reach it.
        let mut reached: HashMap<NodeIndex, (usize, usize)> = HashMap::new();
        for &start in &starts {
            let mut distance = vec![usize::MAX; self.nodes.len()];
            let mut queue = std::collections::VecDeque::from([start]);
            distance[start] = 0;
            while let Some(n) = queue.pop_front() {
                let next: Vec<NodeIndex> = match &self.nodes[n].kind {
                    NodeKind::FanIn(_) => {
                        let entry = reached.entry(n).or_insert((0, 0));
                        entry.0 = entry.0.max(distance[n]);
                        entry.1 += 1;
                        continue;
                    }
                    // A nested fan-out's branches run inside this branch: continue after its fan-in.
                    NodeKind::Parallel(_) if n != fan_out => {
                        match self.fan_in_of(n, memo, depth + 1) {
                            Some(inner) => self.outgoing(inner).map(|e| e.to).collect(),
                            None => Vec::new(),
                        }
                    }
                    _ => self.outgoing(n).map(|e| e.to).collect(),
                };
                for to in next {
                    if distance[to] == usize::MAX {
                        distance[to] = distance[n] + 1;
                        queue.push_back(to);
                    }
                }
            }
        }
        let found = reached
            .into_iter()
            .filter(|(_, (_, count))| !starts.is_empty() && *count == starts.len())
            .min_by(|(a, (da, _)), (b, (db, _))| {
                da.cmp(db)
                    .then_with(|| self.nodes[*a].id.cmp(&self.nodes[*b].id))
            })
            .map(|(n, _)| n);
        memo[fan_out] = FanInState::Done(found);
        found
    }

    /// Nodes whose handler is `exit`.
    pub fn exit_nodes(&self) -> impl Iterator<Item = NodeIndex> + '_ {
        self.nodes
            .iter()
            .enumerate()
            .filter(|(_, n)| matches!(n.kind, NodeKind::Exit))
            .map(|(i, _)| i)
    }

    /// How many edges each node is from the nearest end of the run — an exit node, or a node with no
    /// outgoing edges — or `None` when it cannot get there.
    pub fn steps_to_end(&self) -> Vec<Option<usize>> {
        let mut steps = vec![None; self.nodes.len()];
        let mut queue: std::collections::VecDeque<NodeIndex> = (0..self.nodes.len())
            .filter(|&n| {
                matches!(self.nodes[n].kind, NodeKind::Exit) || self.out_edges[n].is_empty()
            })
            .collect();
        for &n in &queue {
            steps[n] = Some(0);
        }
        while let Some(n) = queue.pop_front() {
            let next = steps[n].map(|s| s + 1);
            for &e in &self.in_edges[n] {
                let from = self.edges[e].from;
                if steps[from].is_none() {
                    steps[from] = next;
                    queue.push_back(from);
                }
            }
        }
        steps
    }

    /// Nodes reachable from any of `roots` (including them), as a membership vector: along edges, and
    /// along the jumps a run takes to a node's retry targets (a failed stage with nowhere to go, a goal
    /// gate unmet at the exit). With `reverse`, nodes from which a root is reachable along edges only —
    /// a node that reaches the exit only by failing is still a dead end when it succeeds.
    pub fn reachable(
        &self,
        roots: impl IntoIterator<Item = NodeIndex>,
        reverse: bool,
    ) -> Vec<bool> {
        let mut seen = vec![false; self.nodes.len()];
        let mut stack: Vec<NodeIndex> = roots.into_iter().collect();
        while let Some(n) = stack.pop() {
            if std::mem::replace(&mut seen[n], true) {
                continue;
            }
            let edges = if reverse {
                &self.in_edges[n]
            } else {
                &self.out_edges[n]
            };
            for &e in edges {
                let next = if reverse {
                    self.edges[e].from
                } else {
                    self.edges[e].to
                };
                if !seen[next] {
                    stack.push(next);
                }
            }
            if !reverse {
                stack.extend(self.nodes[n].retry_targets.iter().filter(|&&t| !seen[t]));
            }
        }
        seen
    }

    /// For each node, whether it is on a loop no edge bounds: a cycle none of whose edges has
    /// `max_iterations` (a self-loop without it included).
    pub fn on_unbounded_loop(&self) -> Vec<bool> {
        let unbounded = |e: &Edge| e.max_iterations.is_none();
        let mut on = vec![false; self.nodes.len()];
        for component in self.strongly_connected_components(unbounded) {
            if component.len() > 1 {
                for n in component {
                    on[n] = true;
                }
            }
        }
        for edge in self.edges.iter().filter(|e| e.from == e.to && unbounded(e)) {
            on[edge.from] = true;
        }
        on
    }

    /// Strongly connected components over the edges `keep` accepts (Tarjan's algorithm, iterative so
    /// deep graphs cannot overflow the stack). Components come in reverse topological order.
    pub fn strongly_connected_components(
        &self,
        keep: impl Fn(&Edge) -> bool,
    ) -> Vec<Vec<NodeIndex>> {
        const UNVISITED: usize = usize::MAX;
        let n = self.nodes.len();
        let successors: Vec<Vec<NodeIndex>> = (0..n)
            .map(|v| {
                self.out_edges[v]
                    .iter()
                    .map(|&e| &self.edges[e])
                    .filter(|e| keep(e))
                    .map(|e| e.to)
                    .collect()
            })
            .collect();
        let (mut index, mut low, mut on_stack) = (vec![UNVISITED; n], vec![0; n], vec![false; n]);
        let (mut next_index, mut stack, mut components) = (0, Vec::new(), Vec::new());
        for root in 0..n {
            if index[root] != UNVISITED {
                continue;
            }
            let mut call_stack = vec![(root, 0usize)];
            while let Some(&mut (v, ref mut child)) = call_stack.last_mut() {
                if *child == 0 && index[v] == UNVISITED {
                    index[v] = next_index;
                    low[v] = next_index;
                    next_index += 1;
                    stack.push(v);
                    on_stack[v] = true;
                }
                if let Some(&w) = successors[v].get(*child) {
                    *child += 1;
                    if index[w] == UNVISITED {
                        call_stack.push((w, 0));
                    } else if on_stack[w] {
                        low[v] = low[v].min(index[w]);
                    }
                    continue;
                }
                call_stack.pop();
                if let Some(&(parent, _)) = call_stack.last() {
                    low[parent] = low[parent].min(low[v]);
                }
                if low[v] == index[v] {
                    let mut component = Vec::new();
                    while let Some(w) = stack.pop() {
                        on_stack[w] = false;
                        component.push(w);
                        if w == v {
                            break;
                        }
                    }
                    components.push(component);
                }
            }
        }
        components
    }
}

#[cfg(all(test, target_pointer_width = "64"))]
mod tests {
    /// A workflow's node list is the largest thing a large run holds (2.5 MB of a 10,000-stage
    /// chain's 24.5 MB): what a node rarely sets is kept out of line, or where it applies (a fan-out's
    /// fan-in in its `ParallelConfig`), so a node stays within 256 bytes.
    #[test]
    fn a_node_stays_within_256_bytes() {
        assert!(
            std::mem::size_of::<super::Node>() <= 256,
            "{}",
            std::mem::size_of::<super::Node>()
        );
    }
}
