//! Second lowering step: from the flat graph to the typed [`Workflow`]. Every attribute is read here,
//! once, into typed configuration — through the lowering rules, which report values that do not convert —
//! and the model stylesheet, `@file` prompts and their templates (`$goal`, inputs) are applied. Nothing after this reads attribute
//! text.

use crate::small_map::SmallMap;
use std::time::Duration;

use trellis_syntax::Diagnostic;
use trellis_syntax::ast::{SourceFormat, Value};
use trellis_syntax::stylesheet::Stylesheet;

use crate::flatten::{AttrMap, FlatEdge, FlatGraph, FlatNode};
use crate::node_kind::{
    Backend, CommandConfig, ErrorPolicy, FanInConfig, HandlerKind, HumanConfig, JoinPolicy,
    LlmConfig, NodeKind, OutputSchema, ParallelConfig, Permissions, ReasoningEffort, RetryPreset,
    SandboxPolicy, ScriptLanguage, SubWorkflowConfig, WaitConfig,
};
use crate::rules::attribute_value::{self, AttrReader};
use crate::rules::{
    command_script, condition_syntax, fidelity_value, file_reference, known_handler,
    stylesheet_property, stylesheet_syntax, sub_workflow, template_variable, unknown_attribute,
    wait_duration,
};
use crate::style;
use crate::workflow::{AttributeTexts, CommonConfig, Edge, GraphConfig, Node, Workflow};

/// Default `stall_timeout`.
const DEFAULT_STALL_TIMEOUT: Duration = Duration::from_mins(30);
/// Default retries for retryable failures (`default_max_retry`).
const DEFAULT_MAX_RETRIES: u32 = 3;
/// Default structured-output repair turns (`output_retries`).
const DEFAULT_OUTPUT_RETRIES: u32 = 2;
/// Default concurrent branches of a parallel node (`max_parallel`).
const DEFAULT_MAX_PARALLEL: u32 = 4;

pub(crate) struct Lowerer<'a> {
    pub files: &'a file_reference::FileScope,
    pub goal_override: Option<&'a str>,
    /// The run's inputs, which prompts may name.
    pub inputs: &'a std::collections::BTreeMap<String, String>,
    /// Replaces the graph's `model` (a run file's model).
    pub model_override: Option<&'a str>,
    /// The nodes' and edges' attributes as text, gathered when they are kept
    /// ([`Workflow::attribute_texts`]).
    pub texts: Option<AttributeTexts>,
    pub out: &'a mut Vec<Diagnostic>,
    /// The parsed model stylesheet and the attribute value it was read from (for spans).
    pub sheet: Option<(Stylesheet, Value)>,
}

/// A command node's settings.
fn command(r: &mut AttrReader<'_>, flat: &FlatNode, graph: &GraphConfig) -> CommandConfig {
    let script = command_script::require(&flat.id.name, r.string("script"), flat.id.span, r.out)
        .unwrap_or_default();
    CommandConfig {
        script,
        language: r
            .word("language", ScriptLanguage::WORDS)
            .unwrap_or(ScriptLanguage::Shell),
        pass_env: r
            .string("env")
            .map(|s| name_list(&s).into_boxed_slice())
            .unwrap_or_default(),
        capture_artifacts: r
            .bool("capture_artifacts")
            .unwrap_or(graph.capture_artifacts),
        sandbox: sandbox_policy(r, graph),
    }
}

/// The node's `sandbox` items applied over the graph's (whose problems the graph reports).
fn sandbox_policy(r: &mut AttrReader<'_>, graph: &GraphConfig) -> SandboxPolicy {
    let Some(text) = r.value("sandbox").map(|v| v.text.clone()) else {
        return graph.sandbox.clone();
    };
    graph.sandbox.clone().with(&text).unwrap_or_else(|_| {
        // Reported once, by the reader, with the reason.
        r.parsed::<SandboxPolicy>("sandbox", "network=on|off and write=PATH items")
            .unwrap_or_default()
    })
}

fn text_map(attrs: &AttrMap) -> SmallMap<String> {
    attrs.map_values(|a| a.value.text.as_str().to_owned())
}

/// The attributes' texts, moved out of them.
fn into_texts(attrs: AttrMap) -> SmallMap<String> {
    attrs.into_map_values(|a| a.value.text.into_string())
}

fn span_map(attrs: &AttrMap) -> SmallMap<trellis_syntax::Span> {
    attrs.map_values(|a| a.value.span)
}

impl Lowerer<'_> {
    fn reader<'r>(&'r mut self, attrs: &'r AttrMap) -> AttrReader<'r> {
        AttrReader {
            attrs,
            out: self.out,
        }
    }

    /// Lowers the flat graph, consuming it: each flat node and edge is freed once lowered, so a
    /// large workflow never holds both forms whole.
    pub fn lower(mut self, flat: FlatGraph) -> Workflow {
        let name = flat
            .name
            .as_ref()
            .map_or_else(|| "Workflow".to_owned(), |n| n.name.as_str().to_owned());
        let format = flat.format;
        let mut workflow = Workflow::new(name, format, flat.header_span);
        workflow.reserve_nodes(flat.nodes.len());
        workflow.graph = self.graph_config(&flat.graph_attrs);
        for node in flat.nodes {
            let (node, resolved) = self.node(node, &workflow.graph, format);
            let index = workflow.push_node(node);
            if !resolved {
                workflow.unresolved.push(index);
            }
        }
        // Reserved once the flat nodes are gone, so the two never take room at once.
        workflow.edges.reserve_exact(flat.edges.len());
        for (index, edge) in flat.edges.into_iter().enumerate() {
            let edge = self.edge(edge, index);
            workflow.edges.push(edge);
        }
        workflow.attribute_texts = self.texts.take();
        workflow.index_edges();
        workflow.resolve_control_flow();
        workflow.start = match format {
            SourceFormat::Dot => {
                // With several, the first: `start-node` reports the others, and the rules that
                // walk from the start still run (such a workflow never runs).
                workflow
                    .nodes
                    .iter()
                    .position(|n| matches!(n.kind, NodeKind::Start))
            }
            SourceFormat::Yaml => workflow
                .graph
                .attributes
                .get("start")
                .and_then(|name| workflow.node_index(name)),
        };
        workflow
    }

    fn graph_config(&mut self, attrs: &AttrMap) -> GraphConfig {
        for attr in attrs.values() {
            unknown_attribute::check_graph(attr, self.out);
        }
        if let Some(attr) = attrs.get("model_stylesheet") {
            let parsed = stylesheet_syntax::parse(&attr.value, self.out);
            stylesheet_property::check(&parsed, &attr.value, self.out);
            self.sheet = Some((parsed, attr.value.clone()));
        }
        let default_fidelity = attrs
            .get("default_fidelity")
            .and_then(|a| fidelity_value::parse("default_fidelity", &a.value, self.out));
        let goal_override = self.goal_override.map(str::to_owned);
        let model_override = self.model_override.map(str::to_owned);
        let mcp_servers = attrs
            .get("mcp_servers")
            .map(|attr| crate::rules::mcp_server::load(&attr.value, self.files, self.out))
            .unwrap_or_default();
        let inline_skills = self
            .json_attr(attrs, "skills", crate::workflow::InlineSkill::parse_all)
            .unwrap_or_default();
        let mut r = self.reader(attrs);
        let default_max_retries = r
            .count("default_max_retries", 0)
            .or_else(|| r.count("default_max_retry", 0))
            .unwrap_or(DEFAULT_MAX_RETRIES);
        let stall_timeout = r
            .duration("stall_timeout")
            .map_or(Some(DEFAULT_STALL_TIMEOUT), |d| {
                Some(d).filter(|d| !d.is_zero())
            });
        let mut attributes = text_map(attrs);
        if let Some(goal) = &goal_override {
            attributes.insert("goal", goal.clone());
        }
        GraphConfig {
            goal: goal_override.or_else(|| r.string("goal")),
            model: model_override
                .or_else(|| r.string("model"))
                .or_else(|| r.string("default_model")),
            provider: r.provider("default_provider"),
            router_model: r.string("router_model"),
            judge_model: r.string("judge_model"),
            label: r.string("label"),
            model_stylesheet: r.string("model_stylesheet"),
            default_max_retries,
            retry_target: r.string("retry_target"),
            fallback_retry_target: r.string("fallback_retry_target"),
            default_fidelity,
            default_thread: r.string("default_thread"),
            max_node_visits: r.count("max_node_visits", 0).filter(|&n| n > 0),
            failure_repeat_limit: r
                .count("loop_restart_signature_limit", 0)
                .filter(|&n| n > 0),
            stall_timeout,
            capture_artifacts: r.bool("capture_artifacts").unwrap_or(true),
            sandbox: r
                .parsed::<SandboxPolicy>("sandbox", "network=on|off and write=PATH items")
                .unwrap_or_default(),
            permissions: r.word("permissions", Permissions::WORDS),
            mcp_servers,
            inline_skills,
            attributes,
            attr_spans: span_map(attrs),
        }
    }

    /// The lowered node, and whether its handler was resolved.
    fn node(
        &mut self,
        mut flat: FlatNode,
        graph: &GraphConfig,
        format: SourceFormat,
    ) -> (Node, bool) {
        let resolved = known_handler::resolve(&flat, self.out);
        let (handler, shape) = resolved.clone().unwrap_or((
            HandlerKind::Conditional,
            std::borrow::Cow::Borrowed(HandlerKind::Conditional.spec().shape),
        ));
        // Applicability is judged only for nodes whose handler is known.
        for attr in flat.attrs.values() {
            let explicit = resolved.is_some() && flat.explicit.contains_key(&attr.key.name);
            unknown_attribute::check_node(attr, handler, explicit, format, self.out);
        }
        // The spans of what the node sets (the stylesheet's values, added below, are not its own).
        let attr_spans = span_map(&flat.attrs);
        let mut r = self.reader(&flat.attrs);
        let common = CommonConfig {
            timeout: r.duration("timeout"),
            max_visits: r.count("max_visits", 0).filter(|&n| n > 0),
            max_retries: r.count("max_retries", 0),
            retry_preset: r.word::<RetryPreset>("retry_policy", RetryPreset::WORDS),
            named_retry_targets: Some([
                r.string("retry_target"),
                r.string("fallback_retry_target"),
            ])
            .filter(|named| named.iter().any(Option::is_some))
            .map(Box::new),
            goal_gate: r.bool("goal_gate").unwrap_or(false),
            auto_status: r.bool("auto_status").unwrap_or(false),
            fail_soft: r.bool("fail_soft").unwrap_or(false),
            allow_partial: r.bool("allow_partial").unwrap_or(false),
        };
        let given_label = r.string("label").map(String::into_boxed_str);
        let kind = match handler {
            HandlerKind::Start => NodeKind::Start,
            HandlerKind::Exit => NodeKind::Exit,
            HandlerKind::Agent => NodeKind::Agent(Box::new(self.llm(&mut flat, graph, &shape))),
            HandlerKind::Prompt => NodeKind::Prompt(Box::new(self.llm(&mut flat, graph, &shape))),
            HandlerKind::FanIn => NodeKind::FanIn(FanInConfig {
                llm: flat
                    .attrs
                    .contains_key("prompt")
                    .then(|| Box::new(self.llm(&mut flat, graph, &shape))),
            }),
            HandlerKind::Command => NodeKind::Command(command(&mut r, &flat, graph)),
            HandlerKind::Human => NodeKind::Human(HumanConfig {
                default_choice: r.string("human.default_choice"),
            }),
            HandlerKind::Parallel => NodeKind::Parallel(ParallelConfig {
                join_policy: r
                    .parsed("join_policy", "a join policy")
                    .unwrap_or(JoinPolicy::WaitAll),
                error_policy: r
                    .word("error_policy", ErrorPolicy::WORDS)
                    .unwrap_or(ErrorPolicy::Continue),
                max_parallel: r.count("max_parallel", 1).unwrap_or(DEFAULT_MAX_PARALLEL),
                fan_in: None,
            }),
            HandlerKind::Wait => {
                let duration = if r.value("duration").is_some() {
                    r.duration("duration")
                } else {
                    wait_duration::report_missing(&flat.id.name, flat.id.span, r.out);
                    None
                };
                NodeKind::Wait(WaitConfig {
                    duration: duration.unwrap_or_default(),
                })
            }
            HandlerKind::SubWorkflow => {
                let value = flat.attrs.get("workflow").map(|a| &a.value);
                let workflow =
                    sub_workflow::require(&flat.id.name, value, self.files, flat.id.span, self.out)
                        .unwrap_or_default();
                NodeKind::SubWorkflow(SubWorkflowConfig { workflow })
            }
            HandlerKind::Conditional => NodeKind::Conditional,
        };
        let node = Node {
            id: flat.id.name.into_string(),
            given_label,
            shape,
            classes: flat.classes.into_boxed_slice(),
            kind,
            common,
            declared: flat.declared,
            span: flat.id.span,
            attr_spans,
            retry_targets: Box::default(),
        };
        if let Some(texts) = &mut self.texts {
            texts.nodes.push(into_texts(flat.attrs));
        }
        (node, resolved.is_some())
    }

    /// Settings of a model node: the node's own attributes first, then the stylesheet.
    /// A SWEny node's `rules` and `context` (lists of sources: text, or `@file`) prepended to its
    /// prompt under `## Rules` and `## Context`, the instruction after them under `## Task`.
    fn with_rules_and_context(&mut self, attrs: &AttrMap, prompt: String) -> String {
        let mut sections = Vec::new();
        for (key, heading) in [("rules", "Rules"), ("context", "Context")] {
            let Some(attr) = attrs.get(key) else { continue };
            let items: Vec<String> = serde_json::from_str(&attr.value.text)
                .unwrap_or_else(|_| vec![attr.value.text.as_str().to_owned()]);
            let texts: Vec<String> = items
                .into_iter()
                .filter_map(|item| {
                    let value = trellis_syntax::ast::Value::plain(
                        item,
                        trellis_syntax::ast::ValueKind::Quoted,
                        attr.value.span,
                    );
                    file_reference::load(key, &value, self.files, self.out)
                        .map(|(_, text)| text.trim().to_owned())
                })
                .filter(|text| !text.is_empty())
                .collect();
            if !texts.is_empty() {
                sections.push(format!("## {heading}\n\n{}", texts.join("\n\n")));
            }
        }
        if sections.is_empty() {
            return prompt;
        }
        sections.push(format!("## Task\n\n{prompt}"));
        sections.join("\n\n")
    }

    /// A model node's settings; the stylesheet's values for it join its attributes.
    fn llm(&mut self, flat: &mut FlatNode, graph: &GraphConfig, shape: &str) -> LlmConfig {
        let id = flat.id.name.as_str();
        // Stylesheet values become attribute values (spans inside the sheet) unless the node sets its own.
        if let Some((sheet, sheet_value)) = &self.sheet {
            for property in stylesheet_property::PROPERTIES {
                if flat.attrs.contains_key(*property) {
                    continue;
                }
                if let Some(found) = style::lookup(sheet, property, id, shape, &flat.classes) {
                    let value = style::as_value(sheet_value, found);
                    let key = trellis_syntax::ast::Ident {
                        name: (*property).into(),
                        span: value.span,
                    };
                    flat.attrs
                        .insert(*property, trellis_syntax::ast::Attr { key, value });
                }
            }
        }
        let attrs = &flat.attrs;
        // A node without a prompt is asked its label, as Fabro and Attractor do (`llm-prompt` warns).
        let (prompt_file, prompt) = match attrs.get("prompt").or_else(|| attrs.get("label")) {
            Some(attr) => match file_reference::load("prompt", &attr.value, self.files, self.out) {
                Some((file, text)) => {
                    let vars = template_variable::Vars {
                        goal: graph.goal.as_deref(),
                        inputs: self.inputs,
                    };
                    let expanded = template_variable::expand(
                        &text,
                        vars,
                        template_variable::Forms::Prompt,
                        attr.value.span,
                        &|| format!("node `{id}`"),
                        self.out,
                    );
                    (file, expanded)
                }
                // Reported; the reference stands in for the text, so no rule says the prompt is
                // missing (the workflow is invalid and never runs).
                None => (None, attr.value.text.as_str().to_owned()),
            },
            None => (None, String::new()),
        };
        let prompt = self.with_rules_and_context(attrs, prompt);
        let output_schema = attrs
            .get("output_schema")
            .and_then(|attr| self.output_schema(&attr.value));
        let checks = self.checks(attrs, graph);
        let tool_filter = self.json_attr(attrs, "tools", crate::requires::ToolFilter::parse);
        let fidelity = attrs
            .get("fidelity")
            .and_then(|a| fidelity_value::parse("fidelity", &a.value, self.out));
        let mut r = self.reader(attrs);
        let backend = r.word("backend", Backend::WORDS).unwrap_or_default();
        // A CLI's or an ACP agent's provider picks the agent (`cli-provider` checks it).
        let provider = match backend {
            Backend::Api => r.provider("provider"),
            Backend::Cli | Backend::Acp => r.string("provider"),
        };
        LlmConfig {
            prompt,
            prompt_file,
            model: r.string("model").or_else(|| graph.model.clone()),
            provider,
            reasoning_effort: r.word("reasoning_effort", ReasoningEffort::WORDS),
            max_tokens: r.count("max_tokens", 1),
            fidelity,
            thread_id: r
                .string("thread_id")
                .or_else(|| graph.default_thread.clone()),
            project_memory: r.bool("project_memory").unwrap_or(true),
            backend,
            acp_command: r.string("acp_command"),
            output_schema,
            output_retries: r
                .int("output_retries", i64::MIN)
                .map_or(DEFAULT_OUTPUT_RETRIES, |n| {
                    u32::try_from(n.max(0)).unwrap_or(u32::MAX)
                }),
            max_turns: r.count("max_turns", 1),
            allowed_tools: r.string("allowed_tools").map(|s| name_list(&s)),
            disallowed_tools: r
                .string("disallowed_tools")
                .map(|s| name_list(&s))
                .unwrap_or_default(),
            pass_env: r
                .string("env")
                .map(|s| name_list(&s).into_boxed_slice())
                .unwrap_or_default(),
            sandbox: sandbox_policy(&mut r, graph),
            permissions: r
                .word("permissions", Permissions::WORDS)
                .or(graph.permissions)
                .unwrap_or_default(),
            mcp: r.string("mcp").map(|s| name_list(&s)),
            skills: r.string("skills").map(|s| name_list(&s)),
            max_subagent_depth: r.count("max_subagent_depth", 0),
            checks,
            tool_filter,
        }
    }

    /// SWEny's checks of an agent node (`requires`, `verify`, `eval`, `eval_policy`, `judge_model`,
    /// `retry`).
    fn checks(&mut self, attrs: &AttrMap, graph: &GraphConfig) -> crate::requires::Checks {
        use crate::requires::{AllPass, Evaluator, Requires, Retry, Verify};
        let requires = self.json_attr(attrs, "requires", Requires::parse);
        let verify = self.json_attr(attrs, "verify", Verify::parse);
        let evals = self.json_attr(attrs, "eval", Evaluator::parse_list);
        let retry = self.json_attr(attrs, "retry", Retry::parse);
        let mut r = self.reader(attrs);
        let _: Option<AllPass> = r.word("eval_policy", &["all_pass"]);
        crate::requires::Checks {
            requires,
            verify,
            evals: evals.unwrap_or_default(),
            judge_model: r
                .string("judge_model")
                .or_else(|| graph.judge_model.clone()),
            retry,
        }
    }

    /// The JSON-valued attribute `key`, read by `parse`; its problem is an `attribute-value` error.
    fn json_attr<T>(
        &mut self,
        attrs: &AttrMap,
        key: &str,
        parse: impl Fn(&str) -> Result<T, String>,
    ) -> Option<T> {
        attrs
            .get(key)
            .and_then(|attr| self.json_value(&attr.value, parse))
    }

    /// A JSON-valued attribute read by `parse`; its problem is an `attribute-value` error.
    fn json_value<T>(
        &mut self,
        value: &Value,
        parse: impl Fn(&str) -> Result<T, String>,
    ) -> Option<T> {
        match parse(&value.text) {
            Ok(parsed) => Some(parsed),
            Err(problem) => {
                self.out.push(
                    attribute_value::RULE
                        .diagnostic(problem, value.span)
                        .with_label("this value"),
                );
                None
            }
        }
    }

    fn output_schema(&mut self, value: &Value) -> Option<OutputSchema> {
        if value.text.trim() == "routing" {
            return Some(OutputSchema::Routing);
        }
        let is_file = value.text.starts_with('@');
        if !is_file && !value.text.trim_start().starts_with('{') {
            self.out.push(
                attribute_value::RULE
                    .diagnostic(format!("`output_schema` expects `routing` or `@path/to/schema.json`, found `{}`", value.text), value.span)
                    .with_label("not a schema reference"),
            );
            return None;
        }
        let (path, text) = file_reference::load("output_schema", value, self.files, self.out)?;
        match serde_json::from_str::<serde_json::Value>(&text) {
            Ok(schema) if schema.is_object() => Some(OutputSchema::JsonSchema { path, schema }),
            Ok(_) => {
                self.out.push(
                    attribute_value::RULE
                        .diagnostic("the output schema must be a JSON object", value.span),
                );
                None
            }
            Err(error) => {
                self.out.push(
                    attribute_value::RULE
                        .diagnostic(
                            format!("the output schema is not valid JSON: {error}"),
                            value.span,
                        )
                        .with_label(path.map_or_else(
                            || "inline schema".to_owned(),
                            |p| p.display().to_string(),
                        )),
                );
                None
            }
        }
    }

    fn edge(&mut self, flat: FlatEdge, index: usize) -> Edge {
        for attr in flat.attrs.values() {
            unknown_attribute::check_edge(attr, self.out);
        }
        let condition = flat
            .attrs
            .get("condition")
            .and_then(|a| condition_syntax::compile(&a.value, self.out));
        let fidelity = flat
            .attrs
            .get("fidelity")
            .and_then(|a| fidelity_value::parse("fidelity", &a.value, self.out));
        let mut r = self.reader(&flat.attrs);
        let edge = Edge {
            // Nodes are lowered in their flat order: a flat index is the node's index.
            from: flat.from,
            to: flat.to,
            label: r.string("label"),
            condition: condition.map(Box::new),
            when: r.string("when").filter(|w| !w.trim().is_empty()),
            max_iterations: r.count("max_iterations", 1),
            weight: r.int("weight", i64::MIN).unwrap_or(0),
            fidelity,
            thread_id: r.string("thread_id"),
            loop_restart: r.bool("loop_restart").unwrap_or(false),
            freeform: r.bool("freeform").unwrap_or(false),
            index,
            span: flat.span,
        };
        if let Some(texts) = &mut self.texts {
            texts.edges.push(into_texts(flat.attrs));
        }
        edge
    }
}

/// A comma- or space-separated list of names.
fn name_list(text: &str) -> Vec<String> {
    text.split([',', ' '])
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect()
}
