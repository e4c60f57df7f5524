//! Skills (the Agent Skills format Fabro, SWEny and Claude Code share): a directory holding a
//! `SKILL.md` whose YAML front matter names the skill (`name`, `description`, `category`, `config`)
//! and whose Markdown body is its instructions. They are found in `~/.fabro/skills/`, then the
//! project's `.fabro/skills/`, `skills/`, `.sweny/skills/` and `.claude/skills/` (the project is the
//! working directory's git root, or the working directory), one level deep; a later directory's
//! skill replaces an earlier one of the same name.
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
use yaml_rust2::{Yaml, YamlLoader};

/// One skill.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Skill {
    pub name: String,
    pub description: String,
    /// Its instructions (the body of `SKILL.md`).
    pub body: String,
    /// Environment variables it needs set (`config` entries with `required: true`).
    pub required: Vec<String>,
    /// The file it came from.
    pub path: PathBuf,
}

/// The skills found for a working directory, by name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Skills {
    by_name: BTreeMap<String, Skill>,
}

/// The directories searched, in order (later ones win).
pub fn directories(work_dir: &Path, home: Option<&Path>) -> Vec<PathBuf> {
    let project = work_dir
        .ancestors()
        .find(|dir| dir.join(".git").exists())
        .unwrap_or(work_dir);
    home.map(|home| home.join(".fabro/skills"))
        .into_iter()
        .chain(
            [".fabro/skills", "skills", ".sweny/skills", ".claude/skills"]
                .iter()
                .map(|dir| project.join(dir)),
        )
        .collect()
}

impl Skills {
    /// The skills in `dirs`; a `SKILL.md` that cannot be read is skipped.
    pub fn discover(dirs: &[PathBuf]) -> Self {
        let mut by_name = BTreeMap::new();
        for dir in dirs {
            let Ok(entries) = std::fs::read_dir(dir) else {
                continue;
            };
            let mut paths: Vec<PathBuf> = entries
                .filter_map(Result::ok)
                .map(|e| e.path().join("SKILL.md"))
                .filter(|p| p.is_file())
                .collect();
            paths.sort();
            for path in paths {
                if let Some(skill) = std::fs::read_to_string(&path)
                    .ok()
                    .and_then(|text| parse(&text, &path))
                {
                    by_name.insert(skill.name.clone(), skill);
                }
            }
        }
        Self { by_name }
    }

    /// The skills for a run in `work_dir`, with the user's home from `HOME`.
    pub fn for_work_dir(work_dir: &Path) -> Self {
        let home = std::env::var_os("HOME").map(PathBuf::from);
        Self::discover(&directories(work_dir, home.as_deref()))
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

    /// The instructions of the skills `names` for a node's prompt, or what keeps the node from
    /// starting: skills that are not there, and required variables that are not set (`env` looks
    /// one up).
    pub fn for_node(
        &self,
        names: &[String],
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<String, String> {
        let mut text = String::new();
        let mut unknown = Vec::new();
        let mut missing = Vec::new();
        for name in names {
            let Some(skill) = self.get(name) else {
                unknown.push(name.clone());
                continue;
            };
            for var in &skill.required {
                if env(var).is_none_or(|v| v.trim().is_empty()) {
                    missing.push(format!("{var} (skill `{name}`)"));
                }
            }
            let _ = write!(text, "## Skill: {name}\n\n{}\n\n", skill.body.trim());
        }
        let mut problems = Vec::new();
        if !unknown.is_empty() {
            let known: Vec<&str> = self.by_name.keys().map(String::as_str).collect();
            problems.push(format!(
                "no skill named {} was found (in ~/.fabro/skills, .fabro/skills, skills, .sweny/skills or .claude/skills; found: {})",
                unknown.iter().map(|n| format!("`{n}`")).collect::<Vec<_>>().join(", "),
                if known.is_empty() { "none".to_owned() } else { known.join(", ") }
            ));
        }
        if !missing.is_empty() {
            problems.push(format!(
                "the skills need environment variables that are not set: {}",
                missing.join(", ")
            ));
        }
        if problems.is_empty() {
            Ok(text.trim_end().to_owned())
        } else {
            Err(problems.join("; "))
        }
    }
}

/// The check before a run starts (SWEny's pre-flight): every built-in agent node's `skills=` are
/// there and have the variables they require; the problems of all of them, a line per node.
pub fn preflight(
    workflow: &trellis_workflow::Workflow,
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
    let skills = Skills::for_work_dir(work_dir);
    let problems: Vec<String> = wanted
        .into_iter()
        .filter_map(|(id, names)| {
            skills
                .for_node(names, env)
                .err()
                .map(|problem| format!("node `{id}`: {problem}"))
        })
        .collect();
    if problems.is_empty() {
        Ok(())
    } else {
        Err(problems.join("\n"))
    }
}

/// A `SKILL.md`: front matter between `---` lines, then the body; `None` without a name.
fn parse(text: &str, path: &Path) -> Option<Skill> {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
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
        path: path.to_path_buf(),
    })
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
        let skills = Skills::discover(&directories(root.path(), None));
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
        let none = |_: &str| None;
        let problem = skills
            .for_node(&["review".into(), "deploy".into()], &none)
            .unwrap_err();
        assert!(problem.contains("no skill named `deploy`"), "{problem}");
        assert!(problem.contains("GH_TOKEN (skill `review`)"), "{problem}");
        let set = |name: &str| (name == "GH_TOKEN").then(|| "x".to_owned());
        assert!(
            skills
                .for_node(&["review".into()], &set)
                .unwrap()
                .starts_with("## Skill: review")
        );
    }
}
