//! Skills (the Agent Skills format Fabro, SWEny and Claude Code share): a directory holding a
//! `SKILL.md` whose YAML front matter names the skill (`name`, `description`, `category`, `config`,
//! `mcp`) and whose Markdown body is its instructions. They are found in `~/.fabro/skills/`, then
//! the project's `.fabro/skills/`, `skills/`, `.gemini/skills/`, `.agents/skills/`,
//! `.claude/skills/` and `.sweny/skills/` (the project is the working directory's git root, or the
//! working directory), one level deep; a later directory's skill replaces an earlier one of the
//! same name. A node may also name an MCP server or one of SWEny's built-in skill ids
//! ([`Skills::for_node`]).
//!
//! A built-in agent sees them three ways: a `use_skill` tool listed with every skill in its system
//! prompt; `/skill-name rest of the request` in its prompt, expanded to the skill's instructions
//! (`{{user_input}}` in them becomes the rest); and a node's `skills="a,b"` (SWEny's `skills:`),
//! whose instructions become part of its prompt. A skill's `config` names the environment variables
//! it needs: a node naming a skill whose required variable is not set does not start, and the
//! message lists every missing name with the skill that needs it.

#![allow(
    clippy::disallowed_methods,
    reason = "skill files are read on the blocking pool"
)]

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use async_trait::async_trait;
use serde_json::{Value, json};
use trellis_agent::{ExternalTools, ToolOutput};
use trellis_llm::ToolDef;
use trellis_workflow::workflow::GraphConfig;
use yaml_rust2::{Yaml, YamlLoader};

use crate::mcp::{Endpoint, ServerConfig};

/// One skill.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Skill {
    pub name: String,
    pub description: String,
    /// Its instructions (the body of `SKILL.md`).
    pub body: String,
    /// Environment variables it needs set (`config` entries with `required: true`).
    pub required: Vec<String>,
    /// SWEny's category (`git`, `observability`, `tasks`, `notification`, `data`, `general`).
    pub category: String,
    /// The MCP server it brings (its `mcp` block), for the nodes that name it.
    pub mcp: Option<SkillServer>,
    /// Where it came from, for messages: its file, or the workflow that defines it.
    pub source: String,
    /// Found in the user's own directory (`~/.fabro/skills`), not the project's.
    pub users_own: bool,
}

/// A skill's `mcp` block: a program to start (`command`, `args`), or a URL (`url`, `headers`);
/// `env` names the variables passed on to the program (their values are descriptions).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SkillServer {
    Stdio {
        command: Vec<String>,
        env: Vec<String>,
    },
    Http {
        url: String,
        headers: BTreeMap<String, String>,
    },
}

/// What lets a project's skill start the program its `mcp` block names (SWEny's switch): a skill
/// file that arrived with a change or a dependency could otherwise run anything.
pub const ALLOW_STDIO_VAR: &str = "SWENY_ALLOW_SKILL_STDIO_COMMAND";

/// SWEny's built-in skills: the id, its category, the variables it needs, and the maintained MCP
/// server Trellis starts for it when they are set (`None`: the user configures one by that name).
struct BuiltIn {
    id: &'static str,
    category: &'static str,
    /// Each inner list is one way to configure it (any one suffices).
    needs: &'static [&'static [&'static str]],
    server: Option<DefaultServer>,
    /// What to configure when there is no default server.
    hint: &'static str,
    /// SWEny's names for tools of the skill (as `verify` lists them) whose tools on the skill's MCP
    /// server are named otherwise: (SWEny's name, the server's names). A SWEny name
    /// `<skill>_<tool>` needs no entry for the server's `<tool>`.
    aliases: &'static [(&'static str, &'static [&'static str])],
}

/// A default server: the command, and its variables from the user's (`(its name, ours)`).
struct DefaultServer {
    command: &'static [&'static str],
    env: &'static [(&'static str, &'static str)],
}

const BUILT_INS: &[BuiltIn] = &[
    BuiltIn {
        id: "github",
        category: "git",
        needs: &[&["GITHUB_TOKEN"]],
        // GitHub's own server (the `github-mcp-server` program on PATH).
        server: Some(DefaultServer {
            command: &["github-mcp-server", "stdio"],
            env: &[("GITHUB_PERSONAL_ACCESS_TOKEN", "GITHUB_TOKEN")],
        }),
        hint: "",
        aliases: &[
            ("github_create_pr", &["create_pull_request"]),
            ("github_add_comment", &["add_issue_comment"]),
        ],
    },
    BuiltIn {
        id: "sentry",
        category: "observability",
        needs: &[&["SENTRY_AUTH_TOKEN", "SENTRY_ORG"]],
        // Sentry's own server, from npm.
        server: Some(DefaultServer {
            command: &["npx", "-y", "@sentry/mcp-server@latest"],
            env: &[("SENTRY_ACCESS_TOKEN", "SENTRY_AUTH_TOKEN")],
        }),
        hint: "",
        aliases: &[],
    },
    BuiltIn {
        id: "linear",
        category: "tasks",
        needs: &[&["LINEAR_API_KEY"]],
        server: None,
        hint: "Linear's own server is https://mcp.linear.app/mcp (type = \"http\", your key in an Authorization header)",
        aliases: &[
            ("linear_create_issue", &["save_issue"]),
            ("linear_update_issue", &["save_issue"]),
            ("linear_add_comment", &["save_comment", "create_comment"]),
            ("linear_search_issues", &["list_issues"]),
        ],
    },
    BuiltIn {
        id: "datadog",
        category: "observability",
        needs: &[&["DD_API_KEY", "DD_APP_KEY"]],
        server: None,
        hint: "there is no maintained stdio server for Datadog: configure one you trust",
        aliases: &[],
    },
    BuiltIn {
        id: "betterstack",
        category: "observability",
        needs: &[&[
            "BETTERSTACK_API_TOKEN",
            "BETTERSTACK_QUERY_ENDPOINT",
            "BETTERSTACK_QUERY_USERNAME",
            "BETTERSTACK_QUERY_PASSWORD",
        ]],
        server: None,
        hint: "there is no maintained stdio server for Better Stack: configure one you trust",
        aliases: &[],
    },
    BuiltIn {
        id: "supabase",
        category: "general",
        needs: &[&["SUPABASE_URL", "SUPABASE_SERVICE_ROLE_KEY"]],
        server: None,
        hint: "Supabase's server (`npx -y @supabase/mcp-server-supabase`) takes a personal access token: configure it",
        aliases: &[],
    },
    BuiltIn {
        id: "slack",
        category: "notification",
        needs: &[&["SLACK_WEBHOOK_URL"], &["SLACK_BOT_TOKEN"]],
        server: None,
        hint: "there is no maintained stdio server for Slack: configure one you trust",
        aliases: &[],
    },
    BuiltIn {
        id: "notification",
        category: "notification",
        needs: &[
            &["DISCORD_WEBHOOK_URL"],
            &["TEAMS_WEBHOOK_URL"],
            &["NOTIFICATION_WEBHOOK_URL"],
            &["SMTP_URL"],
        ],
        server: None,
        hint: "Trellis sends no notifications itself: configure a server that does",
        aliases: &[],
    },
];

/// Whether a call of the tool `called` (its name as the model saw it) is a call of `listed`, a name
/// in a node's `verify` (SWEny's post-condition): the same name; or, for an MCP server's tool
/// (`mcp__<server>__<tool>`), the tool's own name, `<server>_<tool>` (SWEny's names for its skills'
/// tools), or a name the built-in skill of the server's name gives that tool. A prefixed name is met
/// only by its own server's tools: `linear_create_issue` never by GitHub's `create_issue`.
pub fn is_call(listed: &str, called: &str) -> bool {
    if listed == called {
        return true;
    }
    let Some((server, tool)) = called
        .strip_prefix("mcp__")
        .and_then(|rest| rest.split_once("__"))
    else {
        return false;
    };
    listed == tool
        || listed
            .strip_prefix(server)
            .and_then(|rest| rest.strip_prefix('_'))
            == Some(tool)
        || BUILT_INS
            .iter()
            .filter(|b| b.id == server)
            .flat_map(|b| b.aliases)
            .any(|(name, tools)| *name == listed && tools.contains(&tool))
}

/// What the skills a node names come to.
#[derive(Debug, Default)]
pub struct NodeSkills {
    /// The instructions of those available, for the node's prompt.
    pub instructions: String,
    /// Servers the node's skills bring (a skill's `mcp` block, a built-in's default server).
    pub servers: Vec<(String, ServerConfig)>,
    /// Configured servers that stand for a skill of the node (named as the skill).
    pub configured: Vec<String>,
    /// What keeps the node from starting.
    pub errors: Vec<String>,
    /// What it starts without (a notification skill, a server it may not start).
    pub warnings: Vec<String>,
}

/// The skills found for a working directory, by name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Skills {
    by_name: BTreeMap<String, Skill>,
}

/// The project's skill directories, in order (later ones win): Fabro's, then those SWEny reads in
/// its order of priority (`.sweny/skills` highest).
const PROJECT_DIRECTORIES: [&str; 6] = [
    ".fabro/skills",
    "skills",
    ".gemini/skills",
    ".agents/skills",
    ".claude/skills",
    ".sweny/skills",
];

/// A directory skills are looked for in, and the folder its skills must lie in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SkillDir {
    pub path: PathBuf,
    /// The user's own directory may lead anywhere the user chose; a project's (a cloned
    /// repository's) must stay inside the project, links and all.
    pub within: PathBuf,
}

/// The directories searched, in order (later ones win).
pub fn directories(work_dir: &Path, home: Option<&Path>) -> Vec<SkillDir> {
    let project = work_dir
        .ancestors()
        .find(|dir| dir.join(".git").exists())
        .unwrap_or(work_dir);
    let users = home.map(|home| {
        let path = home.join(".fabro/skills");
        SkillDir {
            within: path.clone(),
            path,
        }
    });
    users
        .into_iter()
        .chain(PROJECT_DIRECTORIES.iter().map(|dir| SkillDir {
            path: project.join(dir),
            within: project.to_owned(),
        }))
        .collect()
}

impl Skills {
    /// The skills in `dirs` (the first one the user's own when `users_first`); a `SKILL.md` that
    /// cannot be read, or lies outside its directory's `within` (a project's skill folder that is
    /// a link out of the project), is skipped.
    pub fn discover(dirs: &[SkillDir], users_first: bool) -> Self {
        let mut by_name = BTreeMap::new();
        for (index, SkillDir { path: dir, within }) in dirs.iter().enumerate() {
            let Ok(entries) = std::fs::read_dir(dir) else {
                continue;
            };
            // A skill is a real directory with a real file: a link could point anywhere.
            let real = |path: &Path, dir: bool| {
                std::fs::symlink_metadata(path)
                    .is_ok_and(|m| if dir { m.is_dir() } else { m.is_file() })
            };
            let mut paths: Vec<PathBuf> = entries
                .filter_map(Result::ok)
                .map(|e| e.path())
                .filter(|dir| real(dir, true))
                .map(|dir| dir.join("SKILL.md"))
                .filter(|file| real(file, false))
                .collect();
            paths.sort();
            for path in paths {
                if let Some(mut skill) = trellis_syntax::read_found_text(&path, within)
                    .ok()
                    .and_then(|text| parse(&text, &path))
                {
                    skill.users_own = users_first && index == 0;
                    by_name.insert(skill.name.clone(), skill);
                }
            }
        }
        Self { by_name }
    }

    /// The skills of a run in `work_dir` of a workflow with `graph`'s: those found (with the user's
    /// home from `HOME`), then the workflow's inline ones, which win.
    pub fn for_run(work_dir: &Path, graph: &GraphConfig) -> Self {
        let mut skills = Self::for_work_dir(work_dir);
        for inline in &graph.inline_skills {
            skills.by_name.insert(
                inline.id.clone(),
                Skill {
                    name: inline.id.clone(),
                    description: inline
                        .description
                        .clone()
                        .or_else(|| inline.name.clone())
                        .unwrap_or_else(|| format!("Custom skill: {}", inline.id)),
                    body: inline.instruction.trim().to_owned(),
                    required: Vec::new(),
                    category: "general".to_owned(),
                    mcp: inline.mcp.as_ref().and_then(skill_server),
                    source: "the workflow's skills".to_owned(),
                    users_own: false,
                },
            );
        }
        skills
    }

    /// The skills for a run in `work_dir`, with the user's home from `HOME`.
    pub fn for_work_dir(work_dir: &Path) -> Self {
        let home = std::env::var_os("HOME").map(PathBuf::from);
        Self::discover(&directories(work_dir, home.as_deref()), home.is_some())
    }

    pub fn is_empty(&self) -> bool {
        self.by_name.is_empty()
    }

    pub fn get(&self, name: &str) -> Option<&Skill> {
        self.by_name.get(name)
    }

    /// The system prompt's list of skills.
    pub fn listing(&self) -> String {
        let mut text = String::from(
            "# Available Skills\nWhen the request matches a skill below, call the `use_skill` tool to load its instructions, then follow them.",
        );
        for skill in self.by_name.values() {
            let _ = write!(text, "\n- `{}`: {}", skill.name, skill.description);
        }
        text
    }

    /// `prompt` with its one `/skill-name` reference (at the start or after whitespace, a known
    /// skill's name) replaced by the skill's instructions, the rest of the prompt standing for
    /// `{{user_input}}` (or following the instructions, when they have no such place).
    pub fn expand(&self, prompt: &str) -> String {
        for (at, _) in prompt.match_indices('/') {
            if at > 0 && !prompt[..at].ends_with(char::is_whitespace) {
                continue;
            }
            let rest = &prompt[at + 1..];
            let end = rest.find(char::is_whitespace).unwrap_or(rest.len());
            let name = &rest[..end];
            if !name.starts_with(|c: char| c.is_ascii_lowercase()) || name.contains('/') {
                continue;
            }
            let Some(skill) = self.get(name) else {
                continue;
            };
            let user_input = format!("{}{}", &prompt[..at], &rest[end..])
                .trim()
                .to_owned();
            return if skill.body.contains("{{user_input}}") {
                skill.body.replace("{{user_input}}", &user_input)
            } else if user_input.is_empty() {
                skill.body.clone()
            } else {
                format!("{}\n\n{user_input}", skill.body)
            };
        }
        prompt.to_owned()
    }

    /// What the skills `names` give a node: each is a skill file, a configured MCP server of that
    /// name (`configured`), or one of SWEny's built-in ids (with its default server when there is
    /// one), or a mix (a skill file adds instructions to a server). As SWEny checks it: grouped by
    /// category, each category needs one skill available (its variables set, its server there);
    /// a notification category without one is a warning, any other an error naming what to set or
    /// configure. A name that is none of these is an error. `env` looks a variable up.
    pub fn for_node(
        &self,
        names: &[String],
        env: &dyn Fn(&str) -> Option<String>,
        configured: &dyn Fn(&str) -> bool,
    ) -> NodeSkills {
        let set = |var: &str| env(var).is_some_and(|v| !v.trim().is_empty());
        let mut out = NodeSkills::default();
        let mut unknown = Vec::new();
        // Per category: whether one is available, and why each of the others is not.
        let mut categories: BTreeMap<String, (bool, Vec<String>)> = BTreeMap::new();
        for name in names {
            let skill = self.get(name);
            let built_in = BUILT_INS.iter().find(|b| b.id == name);
            let is_configured = configured(name);
            if skill.is_none() && built_in.is_none() && !is_configured {
                unknown.push(name.clone());
                continue;
            }
            let category = skill
                .map(|s| s.category.clone())
                .or_else(|| built_in.map(|b| b.category.to_owned()))
                .unwrap_or_else(|| "general".to_owned());
            let entry = categories.entry(category).or_default();
            match Self::resolve(name, (skill, built_in, is_configured), &set, env) {
                Ok(resolved) => {
                    entry.0 = true;
                    if let Some(skill) = skill {
                        let _ = write!(
                            out.instructions,
                            "## Skill: {name}\n\n{}\n\n",
                            skill.body.trim()
                        );
                    }
                    match resolved {
                        Tools::Configured => out.configured.push(name.clone()),
                        Tools::Started(config) => out.servers.push((name.clone(), *config)),
                        Tools::None => {}
                        Tools::Refused(why) => out.warnings.push(why),
                    }
                }
                Err(why) => entry.1.push(format!("`{name}` {why}")),
            }
        }
        if !unknown.is_empty() {
            let known: Vec<&str> = self.by_name.keys().map(String::as_str).collect();
            out.errors.push(format!(
                "no skill named {} was found (in ~/.fabro/skills or the project's {}; found: {}), and no MCP server of that name is configured",
                unknown.iter().map(|n| format!("`{n}`")).collect::<Vec<_>>().join(", "),
                PROJECT_DIRECTORIES.join(", "),
                if known.is_empty() { "none".to_owned() } else { known.join(", ") }
            ));
        }
        for (category, (available, reasons)) in categories {
            if available || reasons.is_empty() {
                continue;
            }
            let message = format!("no {category} skill is available: {}", reasons.join("; "));
            if category == "notification" {
                out.warnings.push(message);
            } else {
                out.errors.push(message);
            }
        }
        let trimmed = out.instructions.trim_end().len();
        out.instructions.truncate(trimmed);
        out
    }

    /// Where the named skill's tools come from, or why it is not available.
    fn resolve(
        name: &str,
        (skill, built_in, configured): (Option<&Skill>, Option<&BuiltIn>, bool),
        set: &dyn Fn(&str) -> bool,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Tools, String> {
        if let Some(skill) = skill {
            let missing: Vec<&str> = skill
                .required
                .iter()
                .map(String::as_str)
                .filter(|var| !set(var))
                .collect();
            if !missing.is_empty() {
                return Err(format!(
                    "needs environment variables that are not set: {}",
                    missing.join(", ")
                ));
            }
        }
        if configured {
            return Ok(Tools::Configured);
        }
        if let Some(server) = skill.and_then(|s| s.mcp.as_ref()) {
            let skill = skill.expect("a server comes with its skill");
            return Ok(match server {
                SkillServer::Stdio { .. } if !skill.users_own && !set(ALLOW_STDIO_VAR) => {
                    Tools::Refused(format!(
                        "skill `{name}` ({}) names a program to start as its MCP server; a project's skill may start one only when {ALLOW_STDIO_VAR}=1 is set, so its tools are not offered",
                        skill.source
                    ))
                }
                SkillServer::Stdio { command, env: vars } => {
                    let endpoint = Endpoint::Stdio {
                        command: command.clone(),
                        env: vars
                            .iter()
                            .filter_map(|var| env(var).map(|value| (var.clone(), value)))
                            .collect(),
                    };
                    let source = skill.source.clone();
                    Tools::Started(Box::new(ServerConfig::for_skill(endpoint, source)))
                }
                SkillServer::Http { url, headers } => {
                    match crate::mcp::http(Some(url.clone()), headers.clone()) {
                        Ok(endpoint) => {
                            let source = skill.source.clone();
                            Tools::Started(Box::new(ServerConfig::for_skill(endpoint, source)))
                        }
                        Err(problem) => Tools::Refused(format!(
                            "skill `{name}`'s MCP server cannot be used: {problem}"
                        )),
                    }
                }
            });
        }
        let Some(built_in) = built_in else {
            // A skill file of instructions only.
            return Ok(Tools::None);
        };
        if !built_in
            .needs
            .iter()
            .any(|vars| vars.iter().all(|v| set(v)))
        {
            let ways: Vec<String> = built_in
                .needs
                .iter()
                .map(|vars| vars.join(" and "))
                .collect();
            return Err(format!("needs {} set", ways.join(", or ")));
        }
        match &built_in.server {
            Some(server) => {
                let endpoint = Endpoint::Stdio {
                    command: server.command.iter().map(|s| (*s).to_owned()).collect(),
                    env: server
                        .env
                        .iter()
                        .filter_map(|(theirs, ours)| env(ours).map(|v| ((*theirs).to_owned(), v)))
                        .collect(),
                };
                let source = format!("the built-in `{name}` skill");
                Ok(Tools::Started(Box::new(ServerConfig::for_skill(
                    endpoint, source,
                ))))
            }
            None => Err(format!(
                "has no server: configure an MCP server named `{name}` ([mcp_servers.{name}] in the config file, or .mcp.json); {}",
                built_in.hint
            )),
        }
    }
}

/// Where an available skill's tools come from.
enum Tools {
    /// A configured server of its name.
    Configured,
    /// A server it brings.
    Started(Box<ServerConfig>),
    /// Instructions only.
    None,
    /// Its server may not start (why); its instructions still apply.
    Refused(String),
}

/// The skills found for a run in `work_dir`, and what `names` come to there, with the servers
/// configured for it (the workflow's too) and the process's environment.
pub fn for_node_in(work_dir: &Path, graph: &GraphConfig, names: &[String]) -> (Skills, NodeSkills) {
    let skills = Skills::for_run(work_dir, graph);
    let servers = crate::mcp::configured_names(work_dir, &graph.mcp_servers);
    let env = |name: &str| std::env::var(name).ok();
    let node = skills.for_node(names, &env, &|name| servers.iter().any(|s| s == name));
    (skills, node)
}

/// The check before a run starts (SWEny's pre-flight): what keeps each built-in agent node naming
/// skills (`skills=`, SWEny's `skills:`) from starting, a line per node ([`Skills::for_node`]).
/// What a node starts without is said when it starts. `run_servers` are the MCP servers the run
/// adds to the workflow's (a run file's), which count as skills of their names too.
pub fn preflight(
    workflow: &trellis_workflow::Workflow,
    run_servers: &[(String, trellis_workflow::mcp_config::ServerConfig)],
    work_dir: &Path,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<(), String> {
    let wanted: Vec<(&str, &[String])> = workflow
        .nodes
        .iter()
        .filter_map(|node| {
            let llm = node.kind.llm()?;
            let names = llm.skills.as_deref().filter(|names| !names.is_empty())?;
            (llm.backend == trellis_workflow::node_kind::Backend::Api)
                .then_some((node.id.as_str(), names))
        })
        .collect();
    if wanted.is_empty() {
        return Ok(());
    }
    let skills = Skills::for_run(work_dir, &workflow.graph);
    let declared: Vec<_> = workflow
        .graph
        .mcp_servers
        .iter()
        .chain(run_servers)
        .cloned()
        .collect();
    let servers = crate::mcp::configured_names(work_dir, &declared);
    let configured = |name: &str| servers.iter().any(|s| s == name);
    let mut problems = Vec::new();
    for (id, names) in wanted {
        let resolved = skills.for_node(names, env, &configured);
        problems.extend(
            resolved
                .errors
                .iter()
                .map(|problem| format!("node `{id}`: {problem}")),
        );
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(problems.join("\n"))
    }
}

/// A `SKILL.md`: front matter between `---` lines, then the body; `None` without a name.
fn parse(text: &str, path: &Path) -> Option<Skill> {
    let after = text.strip_prefix("---")?;
    let end = after.find("\n---")?;
    let front = &after[..end];
    let body = after[end + 4..].trim_start_matches(['-']).trim().to_owned();
    let docs = YamlLoader::load_from_str(front).ok()?;
    let meta = docs.first()?;
    let name = meta["name"].as_str()?.trim().to_owned();
    if name.is_empty() {
        return None;
    }
    let description = meta["description"]
        .as_str()
        .map_or_else(|| format!("Custom skill: {name}"), str::to_owned);
    let category = meta["category"]
        .as_str()
        .filter(|c| {
            [
                "general",
                "git",
                "tasks",
                "notification",
                "observability",
                "data",
            ]
            .contains(c)
        })
        .unwrap_or("general")
        .to_owned();
    let mcp = skill_server(&yaml_json(&meta["mcp"]));
    let required = match &meta["config"] {
        Yaml::Hash(config) => config
            .iter()
            .filter(|(_, field)| field["required"].as_bool() == Some(true))
            .filter_map(|(var, _)| var.as_str().map(str::to_owned))
            .collect(),
        _ => Vec::new(),
    };
    Some(Skill {
        name,
        description,
        body,
        required,
        category,
        mcp,
        source: path.display().to_string(),
        users_own: false,
    })
}

/// A skill's `mcp` block: `command` (with `args`) and `env`, or `url`.
fn skill_server(block: &Value) -> Option<SkillServer> {
    let text_map = |value: &Value| -> BTreeMap<String, String> {
        value
            .as_object()
            .map(|map| {
                map.iter()
                    .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_owned())))
                    .collect()
            })
            .unwrap_or_default()
    };
    if let Some(url) = block["url"].as_str() {
        return Some(SkillServer::Http {
            url: url.to_owned(),
            headers: text_map(&block["headers"]),
        });
    }
    let program = block["command"].as_str()?;
    let strings = |value: &Value| -> Vec<String> {
        value
            .as_array()
            .map(|items| {
                items
                    .iter()
                    .filter_map(Value::as_str)
                    .map(str::to_owned)
                    .collect()
            })
            .unwrap_or_default()
    };
    // `env` maps each variable to its description (or lists the names).
    let env = match &block["env"] {
        Value::Object(env) => env.keys().cloned().collect(),
        other => strings(other),
    };
    Some(SkillServer::Stdio {
        command: std::iter::once(program.to_owned())
            .chain(strings(&block["args"]))
            .collect(),
        env,
    })
}

/// A YAML value as JSON (keys that are not text are left out).
fn yaml_json(yaml: &Yaml) -> Value {
    match yaml {
        Yaml::String(text) | Yaml::Real(text) => Value::String(text.clone()),
        Yaml::Integer(n) => Value::from(*n),
        Yaml::Boolean(b) => Value::Bool(*b),
        Yaml::Array(items) => Value::Array(items.iter().map(yaml_json).collect()),
        Yaml::Hash(map) => Value::Object(
            map.iter()
                .filter_map(|(k, v)| Some((k.as_str()?.to_owned(), yaml_json(v))))
                .collect(),
        ),
        _ => Value::Null,
    }
}

/// The `use_skill` tool.
pub(crate) struct UseSkill(pub Skills);

#[async_trait]
impl ExternalTools for UseSkill {
    fn definitions(&self) -> Vec<ToolDef> {
        vec![ToolDef {
            name: "use_skill".to_owned(),
            description: "Load a skill's instructions (the skills are listed in the system prompt), then follow them.".to_owned(),
            parameters: json!({
                "type": "object",
                "properties": { "skill_name": { "type": "string", "description": "The skill's name, without a leading /" } },
                "required": ["skill_name"],
            }),
        }]
    }

    async fn call(&self, name: &str, arguments: &Value) -> Option<ToolOutput> {
        if name != "use_skill" {
            return None;
        }
        let wanted = arguments["skill_name"].as_str().unwrap_or_default();
        let wanted = wanted.trim().trim_start_matches('/');
        Some(match self.0.get(wanted) {
            Some(skill) => ToolOutput::ok(skill.body.clone()),
            None => ToolOutput::error(format!(
                "no skill `{wanted}`; the skills are: {}",
                self.0
                    .by_name
                    .keys()
                    .cloned()
                    .collect::<Vec<_>>()
                    .join(", ")
            )),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn skill_file(root: &Path, dir: &str, name: &str, text: &str) {
        let path = root.join(dir).join(name);
        std::fs::create_dir_all(&path).unwrap();
        std::fs::write(path.join("SKILL.md"), text).unwrap();
    }

    #[test]
    fn later_directories_win_and_the_front_matter_is_read() {
        let root = tempfile::tempdir().unwrap();
        skill_file(
            root.path(),
            ".fabro/skills",
            "review",
            "---\nname: review\ndescription: old\n---\nOld.",
        );
        skill_file(
            root.path(),
            ".claude/skills",
            "review",
            "---\nname: review\ndescription: Review code\nconfig:\n  GH_TOKEN:\n    description: a token\n    required: true\n  OPTIONAL:\n    required: false\n---\n\nLook at {{user_input}} carefully.\n",
        );
        skill_file(root.path(), "skills", "broken", "no front matter");
        let skills = Skills::discover(&directories(root.path(), None), false);
        let review = skills.get("review").unwrap();
        assert_eq!(review.description, "Review code");
        assert_eq!(review.body, "Look at {{user_input}} carefully.");
        assert_eq!(review.required, ["GH_TOKEN"]);
        assert!(skills.get("broken").is_none());
        assert_eq!(
            skills.expand("/review the parser please"),
            "Look at the parser please carefully."
        );
        assert_eq!(skills.expand("see /usr/bin/bash"), "see /usr/bin/bash");
        assert_eq!(skills.expand("/unknown thing"), "/unknown thing");
        let unset = |_: &str| None;
        let nothing = |_: &str| false;
        let node = skills.for_node(&["review".into(), "deploy".into()], &unset, &nothing);
        let problem = node.errors.join("; ");
        assert!(problem.contains("no skill named `deploy`"), "{problem}");
        assert!(
            problem.contains("`review` needs environment variables that are not set: GH_TOKEN"),
            "{problem}"
        );
        let set = |name: &str| (name == "GH_TOKEN").then(|| "x".to_owned());
        let ready = skills.for_node(&["review".into()], &set, &nothing);
        assert!(ready.errors.is_empty(), "{:?}", ready.errors);
        assert!(ready.instructions.starts_with("## Skill: review"));
    }

    #[test]
    fn swenys_built_in_skills_resolve_by_category() {
        let skills = Skills::default();
        let names = |list: &[&str]| list.iter().map(|n| (*n).to_owned()).collect::<Vec<_>>();
        let env = |name: &str| {
            ["GITHUB_TOKEN", "SENTRY_AUTH_TOKEN", "SENTRY_ORG"]
                .contains(&name)
                .then(|| format!("{name}-value"))
        };
        let linear = |name: &str| name == "linear";
        let node = skills.for_node(
            &names(&["github", "sentry", "datadog", "linear", "slack"]),
            &env,
            &linear,
        );
        // Sentry stands for the observability category; Slack's is a warning only.
        assert!(node.errors.is_empty(), "{:?}", node.errors);
        assert_eq!(node.configured, ["linear"]);
        let servers: Vec<&str> = node.servers.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(servers, ["github", "sentry"]);
        let github = &node.servers[0].1;
        let Endpoint::Stdio { command, env } = &github.endpoint else {
            panic!("{github:?}");
        };
        assert_eq!(command, &["github-mcp-server", "stdio"]);
        assert_eq!(env["GITHUB_PERSONAL_ACCESS_TOKEN"], "GITHUB_TOKEN-value");
        assert_eq!(
            node.warnings,
            [
                "no notification skill is available: `slack` needs SLACK_WEBHOOK_URL, or SLACK_BOT_TOKEN set"
            ]
        );

        let node = skills.for_node(&names(&["datadog", "betterstack"]), &|_| None, &|_| false);
        assert_eq!(node.errors.len(), 1);
        assert!(
            node.errors[0].starts_with("no observability skill is available: `datadog` needs DD_API_KEY and DD_APP_KEY set; `betterstack` needs"),
            "{:?}",
            node.errors
        );
        let dd = |name: &str| name.starts_with("DD_").then(|| "k".to_owned());
        let node = skills.for_node(&names(&["datadog"]), &dd, &|_| false);
        assert!(
            node.errors[0]
                .contains("`datadog` has no server: configure an MCP server named `datadog`"),
            "{:?}",
            node.errors
        );
    }

    #[test]
    fn a_project_skills_server_program_starts_only_when_allowed() {
        let root = tempfile::tempdir().unwrap();
        skill_file(
            root.path(),
            ".sweny/skills",
            "crm",
            "---\nname: crm\ncategory: data\nmcp:\n  command: crm-server\n  args: [--stdio]\n  env:\n    CRM_KEY: The CRM key\n---\nSearch by email first.\n",
        );
        let skills = Skills::discover(&directories(root.path(), None), false);
        let env = |name: &str| (name == "CRM_KEY").then(|| "secret".to_owned());
        let node = skills.for_node(&["crm".into()], &env, &|_| false);
        assert_eq!(node.servers, []);
        assert!(
            node.warnings[0].contains(ALLOW_STDIO_VAR),
            "{:?}",
            node.warnings
        );
        assert_eq!(node.instructions, "## Skill: crm\n\nSearch by email first.");
        let allowed = |name: &str| match name {
            "CRM_KEY" => Some("secret".to_owned()),
            ALLOW_STDIO_VAR => Some("1".to_owned()),
            _ => None,
        };
        let node = skills.for_node(&["crm".into()], &allowed, &|_| false);
        assert_eq!(node.servers[0].0, "crm");
        assert_eq!(
            node.servers[0].1.endpoint,
            Endpoint::Stdio {
                command: vec!["crm-server".into(), "--stdio".into()],
                env: BTreeMap::from([("CRM_KEY".into(), "secret".into())]),
            }
        );
    }

    #[cfg(unix)]
    #[test]
    fn a_linked_skill_is_not_read() {
        let root = tempfile::tempdir().unwrap();
        let elsewhere = tempfile::tempdir().unwrap();
        skill_file(
            elsewhere.path(),
            "x",
            "leak",
            "---\nname: leak\n---\nSecret.\n",
        );
        std::fs::create_dir_all(root.path().join(".claude/skills/leak")).unwrap();
        std::os::unix::fs::symlink(
            elsewhere.path().join("x/leak/SKILL.md"),
            root.path().join(".claude/skills/leak/SKILL.md"),
        )
        .unwrap();
        std::os::unix::fs::symlink(
            elsewhere.path().join("x/leak"),
            root.path().join(".claude/skills/linked"),
        )
        .unwrap();
        let skills = Skills::discover(&directories(root.path(), None), false);
        assert!(skills.is_empty());
        // Nor is a project's whole skill folder that is a link out of the project, while one to
        // a folder inside it, and the user's own, are followed.
        let project = tempfile::tempdir().unwrap();
        std::fs::create_dir(project.path().join(".fabro")).unwrap();
        std::os::unix::fs::symlink(
            elsewhere.path().join("x"),
            project.path().join(".fabro/skills"),
        )
        .unwrap();
        assert!(Skills::discover(&directories(project.path(), None), false).is_empty());
        skill_file(
            project.path(),
            "shared",
            "kept",
            "---\nname: kept\n---\nMine.\n",
        );
        std::os::unix::fs::symlink("shared", project.path().join("skills")).unwrap();
        let home = tempfile::tempdir().unwrap();
        std::fs::create_dir(home.path().join(".fabro")).unwrap();
        std::os::unix::fs::symlink(
            elsewhere.path().join("x"),
            home.path().join(".fabro/skills"),
        )
        .unwrap();
        let skills = Skills::discover(&directories(project.path(), Some(home.path())), true);
        let names: Vec<&str> = skills.by_name.keys().map(String::as_str).collect();
        assert_eq!(names, ["kept", "leak"]);
        assert!(skills.get("leak").unwrap().users_own);
    }

    #[test]
    fn a_verify_name_is_met_by_its_own_servers_tools() {
        // The same name, a server tool's own name, and SWEny's `<skill>_<tool>`.
        assert!(is_call("read_file", "read_file"));
        assert!(is_call("git_status", "mcp__git__git_status"));
        assert!(is_call(
            "github_search_issues",
            "mcp__github__search_issues"
        ));
        assert!(is_call("linear_list_teams", "mcp__linear__list_teams"));
        // The built-in skills' other names for their servers' tools.
        assert!(is_call(
            "github_create_pr",
            "mcp__github__create_pull_request"
        ));
        assert!(is_call(
            "github_add_comment",
            "mcp__github__add_issue_comment"
        ));
        assert!(is_call("linear_create_issue", "mcp__linear__save_issue"));
        assert!(is_call("linear_search_issues", "mcp__linear__list_issues"));
        // Never another server's tool, another tool, or a part of a name.
        assert!(!is_call("linear_create_issue", "mcp__github__create_issue"));
        assert!(!is_call("github_search_issues", "mcp__linear__list_issues"));
        assert!(!is_call("github_create_pr", "mcp__github__create_issue"));
        assert!(!is_call("github_search_issues", "search_issues"));
        assert!(!is_call("git", "mcp__git__git_status"));
        assert!(!is_call("status", "mcp__git__git_status"));
    }
}
