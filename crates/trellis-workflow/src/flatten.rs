//! First lowering step: from the statement tree to a flat graph. Applies `node [...]`/`edge [...]`
//! defaults in scope order (a subgraph's defaults do not leak out), expands edge chains into pairwise
//! edges sharing their attributes, auto-creates nodes that edges mention, and turns subgraph `label`s and
//! `class` lists into classes on the nodes inside (`"Loop A"` → `loop-a`). Values stay untyped here.

use trellis_syntax::Span;
use trellis_syntax::ast::{Attr, DefaultsTarget, Document, Ident, SourceFormat, Stmt, Text};

/// Attributes by name; a later assignment replaces an earlier one.
pub(crate) type AttrMap = crate::small_map::SmallMap<Attr>;

pub(crate) struct FlatNode {
    pub id: Ident,
    pub attrs: AttrMap,
    /// Attributes written on the node itself (not inherited from `node [...]` defaults).
    pub explicit: crate::small_map::SmallMap<()>,
    pub classes: Vec<Text>,
    pub declared: bool,
}

pub(crate) struct FlatEdge {
    /// The nodes it joins, as indexes into [`FlatGraph::nodes`] (which lowering keeps).
    pub from: usize,
    pub to: usize,
    pub attrs: AttrMap,
    pub span: Span,
}

pub(crate) struct FlatGraph {
    pub name: Option<Ident>,
    pub format: SourceFormat,
    pub header_span: Span,
    pub graph_attrs: AttrMap,
    pub nodes: Vec<FlatNode>,
    pub edges: Vec<FlatEdge>,
}

#[derive(Clone, Default)]
struct Scope {
    node_defaults: AttrMap,
    edge_defaults: AttrMap,
    classes: Vec<Text>,
}

/// Turns a subgraph label into a class name: lower case, runs of other characters become `-`.
pub fn class_from_label(label: &str) -> String {
    let mut class = String::new();
    for c in label.trim().chars() {
        if c.is_alphanumeric() || c == '_' {
            class.extend(c.to_lowercase());
        } else if !class.ends_with('-') {
            class.push('-');
        }
    }
    class.trim_matches('-').to_owned()
}

/// Splits a `class` attribute (`"a, b"`) into class names.
pub fn split_classes(text: &str) -> impl Iterator<Item = Text> + '_ {
    text.split([',', ' ', '\t', '\n'])
        .map(str::trim)
        .filter(|c| !c.is_empty())
        .map(Text::from)
}

struct Flattener {
    graph: FlatGraph,
    /// The nodes by id: indexes into `graph.nodes`, hashed by the id they hold (not copied).
    index: hashbrown::HashTable<usize>,
}

/// Flattens the document, consuming it: each statement's attributes move into the flat graph, and
/// a statement is freed once flattened.
pub(crate) fn flatten(document: Document) -> FlatGraph {
    let (nodes, edges) = statement_counts(&document.body);
    let mut flattener = Flattener {
        graph: FlatGraph {
            name: document.name,
            format: document.format,
            header_span: document.header_span,
            graph_attrs: AttrMap::new(),
            nodes: Vec::with_capacity(nodes),
            edges: Vec::with_capacity(edges),
        },
        index: hashbrown::HashTable::with_capacity(nodes),
    };
    flattener.walk(document.body, &mut Scope::default(), true);
    flattener.graph
}

/// How many node statements and edges `stmts` holds, in subgraphs too: about as many nodes as the
/// graph will have, and as many edges.
fn statement_counts(stmts: &[Stmt]) -> (usize, usize) {
    stmts
        .iter()
        .fold((0, 0), |(nodes, edges), stmt| match stmt {
            Stmt::Node { .. } => (nodes + 1, edges),
            Stmt::Edge { chain, .. } => (nodes, edges + chain.len().saturating_sub(1)),
            Stmt::Subgraph { body, .. } => {
                let (n, e) = statement_counts(body);
                (nodes + n, edges + e)
            }
            _ => (nodes, edges),
        })
}

/// The classes a subgraph gives every node mentioned inside it: its `label` (as a class name) and its
/// `class` list, from `key=value` statements or `graph [...]`.
fn subgraph_classes(stmts: &[Stmt]) -> Vec<Text> {
    let mut classes = Vec::new();
    for attr in stmts.iter().flat_map(|stmt| match stmt {
        Stmt::Attr(attr) => std::slice::from_ref(attr),
        Stmt::Defaults {
            target: DefaultsTarget::Graph,
            attrs,
            ..
        } => attrs.as_slice(),
        _ => &[],
    }) {
        match attr.key.name.as_str() {
            "label" => classes.push(class_from_label(&attr.value.text).into()),
            "class" => classes.extend(split_classes(&attr.value.text)),
            _ => {}
        }
    }
    classes.retain(|c| !c.is_empty());
    classes
}

impl Flattener {
    fn walk(&mut self, stmts: Vec<Stmt>, scope: &mut Scope, top_level: bool) {
        if !top_level {
            scope.classes.extend(subgraph_classes(&stmts));
        }
        for stmt in stmts {
            match stmt {
                Stmt::Attr(attr) if top_level => {
                    self.graph.graph_attrs.insert_keyed(attr, |a| &a.key.name);
                }
                Stmt::Defaults {
                    target: DefaultsTarget::Graph,
                    attrs,
                    ..
                } if top_level => {
                    for attr in attrs {
                        self.graph.graph_attrs.insert_keyed(attr, |a| &a.key.name);
                    }
                }
                // Subgraph attributes other than label/class are layout hints.
                Stmt::Attr(_)
                | Stmt::Defaults {
                    target: DefaultsTarget::Graph,
                    ..
                } => {}
                Stmt::Defaults {
                    target: DefaultsTarget::Node,
                    attrs,
                    ..
                } => {
                    for attr in attrs {
                        scope.node_defaults.insert_keyed(attr, |a| &a.key.name);
                    }
                }
                Stmt::Defaults {
                    target: DefaultsTarget::Edge,
                    attrs,
                    ..
                } => {
                    for attr in attrs {
                        scope.edge_defaults.insert_keyed(attr, |a| &a.key.name);
                    }
                }
                Stmt::Node { id, attrs } => {
                    let span = id.span;
                    let node = self.mention(id, scope, attrs.len());
                    let node = &mut self.graph.nodes[node];
                    node.explicit.reserve(attrs.len());
                    node.attrs.reserve(attrs.len());
                    // Diagnostics about a node point at its first declaration, not an earlier edge.
                    if !node.declared {
                        node.id.span = span;
                    }
                    node.declared = true;
                    for attr in attrs {
                        if attr.key.name == "class" {
                            node.classes.extend(split_classes(&attr.value.text));
                        }
                        node.explicit.insert_str(&attr.key.name, ());
                        node.attrs.insert_keyed(attr, |a| &a.key.name);
                    }
                }
                Stmt::Edge { chain, attrs, span } => {
                    let mut edge_attrs = scope.edge_defaults.clone();
                    edge_attrs.reserve(attrs.len());
                    for attr in attrs {
                        edge_attrs.insert_keyed(attr, |a| &a.key.name);
                    }
                    let edges = chain.len() - 1;
                    self.graph.edges.reserve(edges);
                    // Each node in the chain's order, then the edge that reaches it; the last edge
                    // takes the attributes, the others copies.
                    let mut ids = chain.into_iter();
                    let Some(first) = ids.next() else { continue };
                    let mut previous = first.span;
                    let mut from = self.mention(first, scope, 0);
                    for (i, id) in ids.enumerate() {
                        let hop = previous.to(id.span);
                        previous = id.span;
                        let to = self.mention(id, scope, 0);
                        let attrs = if i + 1 == edges {
                            std::mem::take(&mut edge_attrs)
                        } else {
                            edge_attrs.clone()
                        };
                        self.graph.edges.push(FlatEdge {
                            from,
                            to,
                            attrs,
                            span: if edges == 1 { span } else { hop },
                        });
                        from = to;
                    }
                }
                Stmt::Subgraph { body, .. } => self.walk(body, &mut scope.clone(), false),
            }
        }
    }

    /// A new node's classes: its `node [class=...]` default's, with room for the subgraphs' that
    /// [`Self::mention`] adds (sized to fit: the list is kept as it is).
    fn first_classes(scope: &Scope) -> Vec<Text> {
        let defaults = scope.node_defaults.get("class").map(|a| &a.value.text);
        let mut classes = Vec::with_capacity(
            defaults.map_or(0, |text| split_classes(text).count()) + scope.classes.len(),
        );
        classes.extend(defaults.into_iter().flat_map(|text| split_classes(text)));
        classes
    }

    /// Finds or creates a node; a new node takes the current defaults (with room for `own` more
    /// attributes, the statement's that declares it), and every mention inside a subgraph adds its
    /// classes.
    fn mention(&mut self, id: Ident, scope: &Scope, own: usize) -> usize {
        let hash = crate::workflow::id_hash(&id.name);
        let nodes = &self.graph.nodes;
        let index = if let Some(&index) = self.index.find(hash, |&i| nodes[i].id.name == id.name) {
            index
        } else {
            self.graph.nodes.push(FlatNode {
                id,
                attrs: scope.node_defaults.clone_with_room(own),
                explicit: crate::small_map::SmallMap::new(),
                classes: Self::first_classes(scope),
                declared: false,
            });
            let index = self.graph.nodes.len() - 1;
            let nodes = &self.graph.nodes;
            self.index.insert_unique(hash, index, |&i| {
                crate::workflow::id_hash(&nodes[i].id.name)
            });
            index
        };
        let node = &mut self.graph.nodes[index];
        for class in &scope.classes {
            if !node.classes.contains(class) {
                node.classes.push(class.clone());
            }
        }
        index
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_become_classes() {
        assert_eq!(class_from_label("Loop A"), "loop-a");
        assert_eq!(class_from_label("Implementation"), "implementation");
        assert_eq!(class_from_label("  Fast & Cheap! "), "fast-cheap");
    }

    fn flat(text: &str) -> FlatGraph {
        let mut diagnostics = Vec::new();
        let document = trellis_syntax::dot::parser::parse_dot(text, &mut diagnostics);
        assert!(diagnostics.is_empty(), "{diagnostics:?}");
        flatten(document)
    }

    #[test]
    fn defaults_are_scoped_and_chains_expand() {
        let graph = flat(
            "digraph G { node [shape=box] a; subgraph s { label=\"Loop A\"; node [shape=tab] b; a -> c } d; a -> b -> d [weight=2] }",
        );
        let shape = |i: usize| graph.nodes[i].attrs["shape"].value.text.clone();
        let ids: Vec<_> = graph.nodes.iter().map(|n| n.id.name.as_str()).collect();
        assert_eq!(ids, ["a", "b", "c", "d"]);
        assert_eq!(
            [shape(0), shape(1), shape(2), shape(3)],
            ["box", "tab", "tab", "box"]
        );
        assert_eq!(graph.nodes[0].classes, ["loop-a"]);
        assert_eq!(graph.nodes[3].classes, Vec::<String>::new());
        assert_eq!(graph.edges.len(), 3);
        // A chain's attributes reach each of its edges (copied to the first, moved to the last).
        assert_eq!(graph.edges[1].attrs["weight"].value.text, "2");
        assert_eq!(graph.edges[2].attrs["weight"].value.text, "2");
        assert_eq!((graph.edges[1].from, graph.edges[1].to), (0, 1));
        assert_eq!((graph.edges[2].from, graph.edges[2].to), (1, 3));
        assert!(graph.edges[0].attrs.is_empty());
        assert!(!graph.nodes[2].declared);
    }
}
