//! SWEny's node pre-conditions (`requires`), post-conditions (`verify`) and skill-tool filters
//! (`tools`), read from their JSON attribute values at lowering (every problem a diagnostic) and
//! checked when the node is about to run (`requires`) or when its agent has answered (`verify`).
//!
//! `requires: {output_required: [PATH...], output_matches: [{path, equals | in | matches}],
//! on_fail: fail | skip}` is checked against the workflow's input and the results so far, keyed by
//! node id (`{"input": ..., "triage": {...}}`). A PATH is dot-separated names (node ids may hold
//! `-`), a name followed by `[*]` stepping into each element of an array; `all:` (the default) asks
//! every value the path reaches, `any:` one of them. `output_required` wants the path present and not
//! null; `output_matches` compares what it reaches (`equals` and `in` by JSON equality, `matches` a
//! regular expression — Rust's `regex`, which runs in linear time, so a pattern cannot stall a run).
//!
//! `verify: {any_tool_called: [NAME...], all_tools_called: [NAME...], no_tool_called: [NAME...],
//! output_required: [PATH...], output_matches: [...]}` is checked when the node's agent has answered:
//! one of the `any_tool_called` tools (every one of `all_tools_called`) must have been called and
//! answered without an error, none of `no_tool_called` called at all, and the paths are looked up
//! in the node's own output (its structured output, else its response text). Every check must pass;
//! the node fails with every reason otherwise.
//!
//! `eval: [{name, kind: value | function | judge, rule | rubric, pass_when, model}]` is `verify`'s
//! successor in SWEny: named evaluators, run when the agent has answered, every one of which must
//! pass (`eval_policy: all_pass`, the one policy). A `value` or `function` evaluator's `rule` holds
//! `verify`'s checks; a `judge` asks a model whether the node's output and tool calls meet its
//! `rubric`, passing when its one-word verdict is `pass_when` (`yes`). `retry: {max, instruction}`
//! sends the agent back up to `max` times when a check fails, told what failed (and `instruction`'s
//! text, or `{reflect: ...}`'s question to think over first).
//!
//! `tools: {allow: [NAME...], deny: [NAME...]}` narrows the tools an agent's skills and MCP servers
//! give it (the built-in tools are narrowed by `allowed_tools`/`disallowed_tools`).

use serde_json::Value;

/// Checks of what paths reach: SWEny's `output_required` and `output_matches`, which `requires`
/// and `verify` share.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct OutputChecks {
    pub required: Vec<ValuePath>,
    pub matches: Vec<ValueMatch>,
}

/// SWEny's checks of an agent node.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Checks {
    /// Its pre-condition (`requires`), checked before the node runs.
    pub requires: Option<Requires>,
    /// Its post-condition (`verify`), checked when its agent has answered.
    pub verify: Option<Verify>,
    /// Its evaluators (`eval`), run when its agent has answered.
    pub evals: Vec<Evaluator>,
    /// The model of its `judge` evaluators (`judge_model`, over the graph's); the node's own model
    /// when neither says.
    pub judge_model: Option<String>,
    /// How often its agent is sent back when a post-condition fails (`retry`).
    pub retry: Option<Retry>,
}

impl Checks {
    /// Whether anything is checked when the agent has answered.
    pub fn after_answer(&self) -> bool {
        self.verify.is_some() || !self.evals.is_empty()
    }
}

/// A node's pre-condition.
#[derive(Debug, Clone, PartialEq)]
pub struct Requires {
    pub checks: OutputChecks,
    pub on_fail: OnFail,
}

/// A node's post-condition (`verify`).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Verify {
    /// One of these tools called without an error.
    pub any_tool_called: Vec<String>,
    /// Each of these tools called without an error.
    pub all_tools_called: Vec<String>,
    /// None of these tools called.
    pub no_tool_called: Vec<String>,
    /// Checks of the node's own output.
    pub output: OutputChecks,
}

/// One of a node's evaluators (`eval`).
#[derive(Debug, Clone, PartialEq)]
pub struct Evaluator {
    pub name: String,
    pub check: EvalCheck,
}

/// What an evaluator checks.
#[derive(Debug, Clone, PartialEq)]
pub enum EvalCheck {
    /// `kind: value` (the node's output) or `kind: function` (its tool calls): a rule as `verify`'s.
    Rule { function: bool, rule: Verify },
    /// `kind: judge`: a model's verdict on the rubric.
    Judge {
        rubric: String,
        /// The verdict that passes (`pass_when`, `yes` by default), lower case.
        pass_when: String,
        /// The judge's model (`model`), over the node's `judge_model`.
        model: Option<String>,
    },
}

impl Evaluator {
    /// The evaluator's kind as SWEny names it.
    pub fn kind(&self) -> &'static str {
        match self.check {
            EvalCheck::Rule {
                function: false, ..
            } => "value",
            EvalCheck::Rule { function: true, .. } => "function",
            EvalCheck::Judge { .. } => "judge",
        }
    }

    /// Reads an `eval` value (JSON text): the list of evaluators.
    pub fn parse_list(text: &str) -> Result<Vec<Self>, String> {
        let value: Value =
            serde_json::from_str(text).map_err(|e| format!("`eval` is not valid JSON: {e}"))?;
        let items = value
            .as_array()
            .filter(|items| !items.is_empty())
            .ok_or("`eval` must be a non-empty list of evaluators")?;
        let mut evaluators: Vec<Self> = Vec::with_capacity(items.len());
        for item in items {
            let evaluator = Self::parse(item)?;
            if evaluators.iter().any(|e| e.name == evaluator.name) {
                return Err(format!("two evaluators are named `{}`", evaluator.name));
            }
            evaluators.push(evaluator);
        }
        Ok(evaluators)
    }

    fn parse(item: &Value) -> Result<Self, String> {
        let Value::Object(fields) = item else {
            return Err(format!("each `eval` entry must be an object, found {item}"));
        };
        let text = |key: &str| -> Result<Option<String>, String> {
            match fields.get(key) {
                None => Ok(None),
                Some(Value::String(s)) if !s.trim().is_empty() => Ok(Some(s.clone())),
                Some(other) => Err(format!("`{key}` must be non-empty text, found {other}")),
            }
        };
        let name = text("name")?.ok_or("an `eval` entry needs a `name`")?;
        let kind = text("kind")?
            .ok_or_else(|| format!("evaluator `{name}` needs a `kind` (value, function, judge)"))?;
        for key in fields.keys() {
            if !["name", "kind", "rule", "rubric", "pass_when", "model"].contains(&key.as_str()) {
                return Err(format!(
                    "unknown key `{key}` in evaluator `{name}` (name, kind, rule, rubric, pass_when, model)"
                ));
            }
        }
        let judge_only = ["rubric", "pass_when", "model"]
            .into_iter()
            .filter(|key| fields.contains_key(*key))
            .collect::<Vec<_>>();
        let check = match kind.as_str() {
            "value" | "function" => {
                if !judge_only.is_empty() {
                    return Err(format!(
                        "evaluator `{name}` ({kind}) takes a `rule`, not {}",
                        judge_only.join(", ")
                    ));
                }
                let rule = fields
                    .get("rule")
                    .ok_or_else(|| format!("evaluator `{name}` ({kind}) needs a `rule`"))?;
                EvalCheck::Rule {
                    function: kind == "function",
                    rule: object_value(rule.clone(), "rule")
                        .and_then(|fields| Verify::read(fields, "rule"))
                        .map_err(|e| format!("evaluator `{name}`: {e}"))?,
                }
            }
            "judge" => {
                if fields.contains_key("rule") {
                    return Err(format!(
                        "evaluator `{name}` (judge) takes a `rubric`, not a `rule`"
                    ));
                }
                let pass_when = text("pass_when")?.unwrap_or_else(|| "yes".to_owned());
                if pass_when.contains(char::is_whitespace) {
                    return Err(format!(
                        "evaluator `{name}`: `pass_when` must be one word, got `{pass_when}`"
                    ));
                }
                EvalCheck::Judge {
                    rubric: text("rubric")?
                        .ok_or_else(|| format!("evaluator `{name}` (judge) needs a `rubric`"))?,
                    pass_when: pass_when.to_lowercase(),
                    model: text("model")?,
                }
            }
            other => {
                return Err(format!(
                    "evaluator `{name}` has kind `{other}` (value, function or judge)"
                ));
            }
        };
        Ok(Self { name, check })
    }
}

/// A node's retries when its checks fail (`retry`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Retry {
    /// How many times the agent is sent back (1 – 10).
    pub max: u32,
    pub guidance: RetryGuidance,
}

/// What the agent is told besides what failed, when it is sent back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RetryGuidance {
    /// Nothing more (no `instruction`, or `{auto: true}`).
    Failures,
    /// The author's text (`instruction: TEXT`).
    Text(String),
    /// A question to think over before it answers again (`instruction: {reflect: TEXT}`).
    Reflect(String),
}

impl Retry {
    /// The most retries a node may ask for: each one is a whole new answer.
    pub const MAX: u32 = 10;

    /// Reads a `retry` value (JSON text).
    pub fn parse(text: &str) -> Result<Self, String> {
        let fields = object(text, "retry")?;
        let mut max = None;
        let mut guidance = RetryGuidance::Failures;
        for (key, value) in fields {
            match key.as_str() {
                "max" => {
                    max = value
                        .as_u64()
                        .and_then(|n| u32::try_from(n).ok())
                        .filter(|n| (1..=Self::MAX).contains(n));
                    if max.is_none() {
                        return Err(format!(
                            "`max` must be a whole number from 1 to {}, got {value}",
                            Self::MAX
                        ));
                    }
                }
                "instruction" => {
                    guidance = match value {
                        Value::String(text) if !text.trim().is_empty() => RetryGuidance::Text(text),
                        Value::Object(fields) if fields.len() == 1 => {
                            match fields.into_iter().next() {
                                Some((key, Value::Bool(true))) if key == "auto" => {
                                    RetryGuidance::Failures
                                }
                                Some((key, Value::String(text)))
                                    if key == "reflect" && !text.trim().is_empty() =>
                                {
                                    RetryGuidance::Reflect(text)
                                }
                                _ => return Err(RETRY_INSTRUCTION.into()),
                            }
                        }
                        _ => return Err(RETRY_INSTRUCTION.into()),
                    };
                }
                other => {
                    return Err(format!(
                        "unknown key `{other}` in `retry` (max, instruction)"
                    ));
                }
            }
        }
        Ok(Self {
            max: max.ok_or("`retry` needs `max`")?,
            guidance,
        })
    }
}

/// How a node's evaluators' verdicts combine (`eval_policy`): every one must pass, SWEny's one
/// implemented policy (it reserves `any_pass` and `weighted`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AllPass;

impl std::str::FromStr for AllPass {
    type Err = ();

    fn from_str(text: &str) -> Result<Self, ()> {
        (text == "all_pass").then_some(AllPass).ok_or(())
    }
}

const RETRY_INSTRUCTION: &str =
    "`instruction` of `retry` must be text, `{auto: true}` or `{reflect: TEXT}`";

/// A tool call as `verify` judges it: the tool's name as the model saw it, and whether it answered
/// without an error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolCall {
    pub tool: String,
    pub succeeded: bool,
}

/// What a node whose pre-condition fails does: fail, or be skipped (the run goes on).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OnFail {
    #[default]
    Fail,
    Skip,
}

/// A path into JSON values.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ValuePath {
    pub text: String,
    any: bool,
    /// Each name, and whether it steps into an array's elements (`[*]`).
    segments: Vec<(String, bool)>,
}

/// A comparison of what a path reaches.
#[derive(Debug, Clone, PartialEq)]
pub struct ValueMatch {
    pub path: ValuePath,
    pub test: Test,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Test {
    Equals(Value),
    In(Vec<Value>),
    /// A regular expression, compiled when checked (it compiled when read).
    Matches(String),
}

/// A skill-tool filter.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ToolFilter {
    /// Only these, when given.
    pub allow: Option<Vec<String>>,
    /// Never these (after `allow`).
    pub deny: Vec<String>,
}

impl ToolFilter {
    /// Whether the tool `name` (as the model sees it, `mcp__server__tool`) passes: a listed name may
    /// be that, or the server's own name for the tool.
    pub fn keeps(&self, name: &str) -> bool {
        let own = name.rsplit("__").next().unwrap_or(name);
        let listed = |names: &[String]| names.iter().any(|n| n == name || n == own);
        self.allow.as_deref().is_none_or(listed) && !listed(&self.deny)
    }
}

impl ValuePath {
    pub fn parse(text: &str) -> Result<Self, String> {
        let (any, body) = match text.split_once(':') {
            Some(("any", body)) => (true, body),
            Some(("all", body)) => (false, body),
            Some((prefix, _)) => {
                return Err(format!(
                    "unknown prefix `{prefix}:` in `{text}` (`all:` or `any:`)"
                ));
            }
            None => (false, text),
        };
        if body.is_empty() {
            return Err(format!("`{text}` names no path"));
        }
        let segments = body
            .split('.')
            .map(|part| {
                let (name, wildcard) = match part.strip_suffix("[*]") {
                    Some(name) => (name, true),
                    None => (part, false),
                };
                let valid = name
                    .chars()
                    .next()
                    .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
                    && name
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
                if valid {
                    Ok((name.to_owned(), wildcard))
                } else {
                    Err(format!(
                        "`{part}` in `{text}` is not a name (or a name with `[*]`)"
                    ))
                }
            })
            .collect::<Result<_, _>>()?;
        Ok(Self {
            text: text.to_owned(),
            any,
            segments,
        })
    }

    /// The values the path reaches in `root`, or why it reaches none.
    fn resolve<'a>(&self, root: &'a Value) -> Result<Vec<&'a Value>, String> {
        let mut current = vec![root];
        for (name, wildcard) in &self.segments {
            let mut next = Vec::new();
            for value in current {
                let Value::Object(fields) = value else {
                    return Err(format!(
                        "`{name}` is looked up in {}, not an object",
                        kind(value)
                    ));
                };
                let child = fields
                    .get(name)
                    .ok_or_else(|| format!("`{name}` is missing"))?;
                if *wildcard {
                    let Value::Array(items) = child else {
                        return Err(format!("`{name}` is {}, not an array", kind(child)));
                    };
                    next.extend(items);
                } else {
                    next.push(child);
                }
            }
            current = next;
        }
        Ok(current)
    }
}

fn kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

impl Test {
    fn passes(&self, value: &Value) -> bool {
        match self {
            Test::Equals(wanted) => value == wanted,
            Test::In(allowed) => allowed.contains(value),
            Test::Matches(pattern) => {
                let text = match value {
                    Value::String(text) => text.clone(),
                    other => other.to_string(),
                };
                regex::Regex::new(pattern).is_ok_and(|re| re.is_match(&text))
            }
        }
    }

    fn describe(&self) -> String {
        match self {
            Test::Equals(wanted) => format!("equals {wanted}"),
            Test::In(allowed) => format!("in {}", Value::Array(allowed.clone())),
            Test::Matches(pattern) => format!("matches /{pattern}/"),
        }
    }
}

impl OutputChecks {
    fn is_empty(&self) -> bool {
        self.required.is_empty() && self.matches.is_empty()
    }

    /// Reads `key` when it is `output_required` or `output_matches` (`Ok(false)` for another key).
    fn read(&mut self, key: &str, value: Value) -> Result<bool, String> {
        match key {
            "output_required" => {
                for path in strings(&value, "output_required")? {
                    self.required.push(ValuePath::parse(&path)?);
                }
            }
            "output_matches" => {
                let Value::Array(items) = value else {
                    return Err("`output_matches` must be a list".into());
                };
                for item in items {
                    self.matches.push(value_match(item)?);
                }
            }
            _ => return Ok(false),
        }
        Ok(true)
    }

    /// Checks what the paths reach in `root`: `Err` with every failure, one per line.
    pub fn check(&self, root: &Value) -> Result<(), String> {
        let failures = self.failures(root);
        if failures.is_empty() {
            Ok(())
        } else {
            Err(failures.join("\n"))
        }
    }

    fn failures(&self, root: &Value) -> Vec<String> {
        let mut failures = Vec::new();
        for path in &self.required {
            let reason = match path.resolve(root) {
                Err(reason) => Some(reason),
                Ok(values) if path.any && !values.iter().any(|v| !v.is_null()) => {
                    Some("no value it reaches is set".to_owned())
                }
                Ok(values) if !path.any && values.iter().any(|v| v.is_null()) => {
                    Some("it reaches null".to_owned())
                }
                Ok(_) => None,
            };
            if let Some(reason) = reason {
                failures.push(format!("output_required `{}`: {reason}", path.text));
            }
        }
        for check in &self.matches {
            let path = &check.path;
            let reason = match path.resolve(root) {
                Err(reason) => Some(reason),
                Ok(values) if path.any => (!values.iter().any(|v| check.test.passes(v)))
                    .then(|| format!("no value it reaches {}", check.test.describe())),
                Ok(values) => {
                    let offenders: Vec<String> = values
                        .iter()
                        .filter(|v| !check.test.passes(v))
                        .map(ToString::to_string)
                        .collect();
                    (!offenders.is_empty()).then(|| {
                        format!(
                            "wanted {}, got {}",
                            check.test.describe(),
                            offenders.join(", ")
                        )
                    })
                }
            };
            if let Some(reason) = reason {
                failures.push(format!("output_matches `{}`: {reason}", path.text));
            }
        }
        failures
    }
}

/// The fields of the JSON object `text` holds, a value named `what`.
fn object(text: &str, what: &str) -> Result<serde_json::Map<String, Value>, String> {
    let value: Value =
        serde_json::from_str(text).map_err(|e| format!("`{what}` is not valid JSON: {e}"))?;
    object_value(value, what)
}

/// The fields of `value`, a JSON object named `what`.
fn object_value(value: Value, what: &str) -> Result<serde_json::Map<String, Value>, String> {
    match value {
        Value::Object(fields) => Ok(fields),
        _ => Err(format!("`{what}` must be an object")),
    }
}

impl Requires {
    /// Reads a `requires` value (JSON text).
    pub fn parse(text: &str) -> Result<Self, String> {
        let mut requires = Requires {
            checks: OutputChecks::default(),
            on_fail: OnFail::Fail,
        };
        for (key, value) in object(text, "requires")? {
            if key == "on_fail" {
                requires.on_fail = match value.as_str() {
                    Some("fail") => OnFail::Fail,
                    Some("skip") => OnFail::Skip,
                    _ => {
                        return Err(format!("`on_fail` must be `fail` or `skip`, got {value}"));
                    }
                };
            } else if !requires.checks.read(&key, value)? {
                return Err(format!(
                    "unknown key `{key}` in `requires` (output_required, output_matches, on_fail)"
                ));
            }
        }
        if requires.checks.is_empty() {
            return Err("`requires` declares no check (output_required or output_matches)".into());
        }
        Ok(requires)
    }

    /// Checks the pre-condition against `root` (the input and results by node id): `Err` with every
    /// failure, one per line.
    pub fn check(&self, root: &Value) -> Result<(), String> {
        self.checks.check(root)
    }
}

impl Verify {
    /// Reads a `verify` value (JSON text).
    pub fn parse(text: &str) -> Result<Self, String> {
        Self::read(object(text, "verify")?, "verify")
    }

    /// Reads the `fields` of a `verify` value or an evaluator's rule (`what`, for messages).
    fn read(fields: serde_json::Map<String, Value>, what: &str) -> Result<Self, String> {
        let mut verify = Verify::default();
        for (key, value) in fields {
            match key.as_str() {
                "any_tool_called" => verify.any_tool_called = strings(&value, &key)?,
                "all_tools_called" => verify.all_tools_called = strings(&value, &key)?,
                "no_tool_called" => verify.no_tool_called = strings(&value, &key)?,
                _ if verify.output.read(&key, value)? => {}
                other => {
                    return Err(format!(
                        "unknown key `{other}` in `{what}` (any_tool_called, all_tools_called, \
                         no_tool_called, output_required, output_matches)"
                    ));
                }
            }
        }
        if verify.any_tool_called.is_empty()
            && verify.all_tools_called.is_empty()
            && verify.no_tool_called.is_empty()
            && verify.output.is_empty()
        {
            return Err(format!("`{what}` declares no check"));
        }
        Ok(verify)
    }

    /// Checks the post-condition against the agent's tool `calls` and the node's `output`;
    /// `is_call(listed, called)` says whether a call of the tool `called` (as the model saw its name)
    /// is a call of `listed` (a name in a list here). `Err` with every failure, one per line.
    pub fn check(
        &self,
        calls: &[ToolCall],
        output: &Value,
        is_call: impl Fn(&str, &str) -> bool,
    ) -> Result<(), String> {
        let succeeded = |listed: &str| {
            calls
                .iter()
                .any(|call| call.succeeded && is_call(listed, &call.tool))
        };
        let called = || {
            if calls.is_empty() {
                "no tool was called".to_owned()
            } else {
                let names: Vec<&str> = calls.iter().map(|c| c.tool.as_str()).collect();
                format!("called: {}", names.join(", "))
            }
        };
        let mut failures = Vec::new();
        if !self.any_tool_called.is_empty() && !self.any_tool_called.iter().any(|t| succeeded(t)) {
            failures.push(format!(
                "any_tool_called: none of {} answered without an error ({})",
                self.any_tool_called.join(", "),
                called()
            ));
        }
        let missing: Vec<&str> = self
            .all_tools_called
            .iter()
            .filter(|t| !succeeded(t))
            .map(String::as_str)
            .collect();
        if !missing.is_empty() {
            failures.push(format!(
                "all_tools_called: no call of {} answered without an error ({})",
                missing.join(", "),
                called()
            ));
        }
        let forbidden: Vec<&str> = self
            .no_tool_called
            .iter()
            .filter(|t| calls.iter().any(|call| is_call(t, &call.tool)))
            .map(String::as_str)
            .collect();
        if !forbidden.is_empty() {
            failures.push(format!("no_tool_called: {} called", forbidden.join(", ")));
        }
        failures.extend(self.output.failures(output));
        if failures.is_empty() {
            Ok(())
        } else {
            Err(failures.join("\n"))
        }
    }
}

impl ToolFilter {
    /// Reads a `tools` value (JSON text).
    pub fn parse(text: &str) -> Result<Self, String> {
        let value: Value =
            serde_json::from_str(text).map_err(|e| format!("`tools` is not valid JSON: {e}"))?;
        let Value::Object(fields) = value else {
            return Err("`tools` must be an object with `allow` and/or `deny`".into());
        };
        let mut filter = ToolFilter::default();
        for (key, value) in fields {
            match key.as_str() {
                "allow" => filter.allow = Some(strings(&value, "allow")?),
                "deny" => filter.deny = strings(&value, "deny")?,
                other => return Err(format!("unknown key `{other}` in `tools` (allow, deny)")),
            }
        }
        if filter.allow.is_none() && filter.deny.is_empty() {
            return Err("`tools` declares neither `allow` nor `deny`".into());
        }
        Ok(filter)
    }
}

fn strings(value: &Value, key: &str) -> Result<Vec<String>, String> {
    let list = value
        .as_array()
        .filter(|items| !items.is_empty())
        .ok_or_else(|| format!("`{key}` must be a non-empty list of names"))?;
    list.iter()
        .map(|item| {
            item.as_str()
                .filter(|s| !s.is_empty())
                .map(str::to_owned)
                .ok_or_else(|| format!("`{key}` must list names, found {item}"))
        })
        .collect()
}

fn value_match(item: Value) -> Result<ValueMatch, String> {
    let Value::Object(mut fields) = item else {
        return Err("each `output_matches` entry must be an object".into());
    };
    let path = fields
        .remove("path")
        .and_then(|p| p.as_str().map(str::to_owned))
        .ok_or("an `output_matches` entry needs `path`")?;
    let path = ValuePath::parse(&path)?;
    let mut tests = Vec::new();
    for (key, value) in fields {
        tests.push(match key.as_str() {
            "equals" => Test::Equals(value),
            "in" => match value {
                Value::Array(items) => Test::In(items),
                _ => return Err(format!("`in` of `{}` must be a list", path.text)),
            },
            "matches" => {
                let pattern = value
                    .as_str()
                    .ok_or_else(|| format!("`matches` of `{}` must be a string", path.text))?;
                regex::Regex::new(pattern).map_err(|e| {
                    format!(
                        "`matches` of `{}` is not a regular expression: {e}",
                        path.text
                    )
                })?;
                Test::Matches(pattern.to_owned())
            }
            other => {
                return Err(format!(
                    "unknown key `{other}` in the `output_matches` entry of `{}`",
                    path.text
                ));
            }
        });
    }
    match <[Test; 1]>::try_from(tests) {
        Ok([test]) => Ok(ValueMatch { path, test }),
        Err(_) => Err(format!(
            "the `output_matches` entry of `{}` needs exactly one of equals, in, matches",
            path.text
        )),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn paths_and_checks_say_what_failed() {
        let root = json!({
            "input": { "repo": "acme/api", "empty": null },
            "scan": { "findings": [{ "severity": "low" }, { "severity": "high" }] },
            "read-bug": { "recommendation": "skip" },
        });
        let ok = Requires::parse(
            r#"{"output_required": ["input.repo", "any:scan.findings[*].severity"],
                "output_matches": [{"path": "any:scan.findings[*].severity", "equals": "high"}]}"#,
        )
        .unwrap();
        assert_eq!(ok.check(&root), Ok(()));
        let failing = Requires::parse(
            r#"{"output_required": ["input.missing", "input.empty", "triage.x"],
                "output_matches": [{"path": "read-bug.recommendation", "in": ["implement", "fix"]},
                                   {"path": "scan.findings[*].severity", "matches": "^(low|medium)$"}],
                "on_fail": "skip"}"#,
        )
        .unwrap();
        assert_eq!(failing.on_fail, OnFail::Skip);
        assert_eq!(
            failing.check(&root).unwrap_err(),
            "output_required `input.missing`: `missing` is missing\n\
             output_required `input.empty`: it reaches null\n\
             output_required `triage.x`: `triage` is missing\n\
             output_matches `read-bug.recommendation`: wanted in [\"implement\",\"fix\"], got \"skip\"\n\
             output_matches `scan.findings[*].severity`: wanted matches /^(low|medium)$/, got \"high\""
        );
    }

    #[test]
    fn malformed_values_are_refused_with_the_reason() {
        for (text, problem) in [
            ("[]", "must be an object"),
            ("{}", "declares no check"),
            (r#"{"output_required": ["a..b"]}"#, "is not a name"),
            (
                r#"{"output_required": ["some:a"]}"#,
                "unknown prefix `some:`",
            ),
            (
                r#"{"output_matches": [{"path": "a", "equals": 1, "in": [1]}]}"#,
                "exactly one of",
            ),
            (
                r#"{"output_matches": [{"path": "a", "matches": "("}]}"#,
                "not a regular expression",
            ),
            (
                r#"{"output_required": ["a"], "on_fail": "retry"}"#,
                "`fail` or `skip`",
            ),
            (
                r#"{"output_required": ["a"], "verify": 1}"#,
                "unknown key `verify`",
            ),
        ] {
            let error = Requires::parse(text).unwrap_err();
            assert!(error.contains(problem), "{text}: {error}");
        }
        assert!(ToolFilter::parse("{}").is_err());
        assert!(ToolFilter::parse(r#"{"allow": []}"#).is_err());
    }

    #[test]
    fn a_tool_filter_matches_exposed_and_own_names() {
        let filter = ToolFilter::parse(
            r#"{"allow": ["read_text_file", "mcp__git__git_log"], "deny": ["git_log"]}"#,
        )
        .unwrap();
        assert!(filter.keeps("mcp__files__read_text_file"));
        assert!(!filter.keeps("mcp__files__write_file"));
        assert!(!filter.keeps("mcp__git__git_log"));
        let deny = ToolFilter::parse(r#"{"deny": ["delete_issue"]}"#).unwrap();
        assert!(deny.keeps("mcp__linear__create_issue"));
        assert!(!deny.keeps("mcp__linear__delete_issue"));
    }

    #[test]
    fn verify_judges_the_calls_and_the_nodes_own_output() {
        let verify = Verify::parse(
            r#"{"any_tool_called": ["search_a", "search_b"], "all_tools_called": ["write"],
                "no_tool_called": ["delete"], "output_required": ["id"],
                "output_matches": [{"path": "id", "matches": "^[A-Z]+-[0-9]+$"}]}"#,
        )
        .unwrap();
        let same = |listed: &str, called: &str| listed == called;
        let call = |tool: &str, succeeded| ToolCall {
            tool: tool.to_owned(),
            succeeded,
        };
        let good = [call("search_b", true), call("write", true)];
        assert_eq!(verify.check(&good, &json!({"id": "OFF-12"}), same), Ok(()));
        // A call that answered with an error does not count; a forbidden call counts however it
        // ended; the output is looked up in the node's own output.
        let bad = [
            call("search_a", false),
            call("write", false),
            call("delete", false),
        ];
        assert_eq!(
            verify
                .check(&bad, &json!({"id": "off-12"}), same)
                .unwrap_err(),
            "any_tool_called: none of search_a, search_b answered without an error (called: search_a, write, delete)\n\
             all_tools_called: no call of write answered without an error (called: search_a, write, delete)\n\
             no_tool_called: delete called\n\
             output_matches `id`: wanted matches /^[A-Z]+-[0-9]+$/, got \"off-12\""
        );
        assert_eq!(
            Verify::parse(r#"{"any_tool_called": ["x"]}"#)
                .unwrap()
                .check(&[], &json!("text"), same)
                .unwrap_err(),
            "any_tool_called: none of x answered without an error (no tool was called)"
        );
        for (text, problem) in [
            ("{}", "declares no check"),
            (r#"{"any_tool_called": []}"#, "non-empty list"),
            (r#"{"any_tool_called": "x"}"#, "non-empty list"),
            (
                r#"{"on_fail": "skip"}"#,
                "unknown key `on_fail` in `verify`",
            ),
            ("[1]", "`verify` must be an object"),
        ] {
            let error = Verify::parse(text).unwrap_err();
            assert!(error.contains(problem), "{text}: {error}");
        }
    }
}
