//! Permissions: which of a built-in agent's tool calls run without asking (`permissions=` on the
//! node or the graph; Fabro's levels). Reading, searching and listing always run; writing files
//! needs `read-write`; a shell, or a tool the agent does not know, needs `full` (the default). A call
//! beyond the level is put to a person as a question through the run's interviewer — the terminal,
//! or the web app, where it shows as a gate — with `[N] No`, `[Y] Yes` (this call) and
//! `[A] Always` (raise the level for the rest of the stage). Nobody to ask (no terminal,
//! `--auto-approve`, which takes the first answer) means no: the call is denied with an error result
//! the model reads, and the stage goes on.

use async_trait::async_trait;
use parking_lot::Mutex;
use std::sync::Arc;
use trellis_agent::{AgentEvent, Approver, Category, Observer};
use trellis_engine::services::{Answer, Choice, Interviewer, Question};
use trellis_llm::ToolCall;
use trellis_workflow::node_kind::Permissions;

/// The most of a call's arguments a question quotes.
const ARGUMENTS_CHARS: usize = 300;

/// The lowest level that runs a category of tools without asking.
fn needed(category: Category) -> Permissions {
    match category {
        Category::Read => Permissions::ReadOnly,
        Category::Write => Permissions::ReadWrite,
        Category::Shell => Permissions::Full,
    }
}

/// Whether `level` runs `category` without asking.
fn allows(level: Permissions, category: Category) -> bool {
    rank(level) >= rank(needed(category))
}

fn rank(level: Permissions) -> u8 {
    match level {
        Permissions::ReadOnly => 0,
        Permissions::ReadWrite => 1,
        Permissions::Full => 2,
    }
}

/// A stage's permission level and who is asked beyond it.
pub(crate) struct Gate {
    node_id: String,
    level: Mutex<Permissions>,
    interviewer: Arc<dyn Interviewer>,
}

impl Gate {
    /// The gate of an agent stage at the node's level, lowered to the run's ceiling
    /// (`--permissions`); none when the level lets every call run.
    pub(crate) fn of(
        node_id: &str,
        (level, ceiling): (Permissions, Option<Permissions>),
        interviewer: Arc<dyn Interviewer>,
    ) -> Option<Self> {
        let level = match ceiling {
            Some(ceiling) if rank(ceiling) < rank(level) => ceiling,
            _ => level,
        };
        (level != Permissions::Full).then(|| Self {
            node_id: node_id.to_owned(),
            level: Mutex::new(level),
            interviewer,
        })
    }
}

const CHOICES: [(&str, char); 3] = [("[N] No", 'N'), ("[Y] Yes", 'Y'), ("[A] Always", 'A')];

#[async_trait]
impl Approver for Gate {
    async fn approve(
        &self,
        call: &ToolCall,
        category: Category,
        observer: &dyn Observer,
    ) -> Result<(), String> {
        let level = *self.level.lock();
        if allows(level, category) {
            return Ok(());
        }
        let mut arguments = call.arguments.to_string();
        if arguments.chars().count() > ARGUMENTS_CHARS {
            arguments = arguments.chars().take(ARGUMENTS_CHARS).collect::<String>() + "…";
        }
        let prompt = format!(
            "Agent `{}` wants to run: {}({arguments})\nIts permissions are {level}; a {} tool needs {}. Allow it?",
            self.node_id,
            call.name,
            category.as_str(),
            needed(category)
        );
        let question = Question {
            node_id: self.node_id.clone(),
            prompt: prompt.clone(),
            choices: CHOICES
                .iter()
                .map(|(label, key)| Choice {
                    label: (*label).to_owned(),
                    key: Some(*key),
                })
                .collect(),
            freeform: false,
            timeout: None,
        };
        observer.on_event(AgentEvent::ApprovalAsked {
            prompt,
            options: CHOICES.iter().map(|(l, _)| (*l).to_owned()).collect(),
        });
        let answer = self.interviewer.ask(&question).await;
        let chosen = match answer {
            Answer::Choice(i) if i < CHOICES.len() => Some(i),
            _ => None,
        };
        let label = chosen.map_or("[N] No", |i| CHOICES[i].0);
        observer.on_event(AgentEvent::ApprovalAnswered {
            label: label.to_owned(),
            asked: !matches!(answer, Answer::Unavailable),
        });
        match chosen {
            Some(1) => Ok(()),
            Some(2) => {
                *self.level.lock() = needed(category);
                Ok(())
            }
            _ => Err(format!(
                "Not run: `{}` is a {} tool, and this agent's permissions are {level} ({} needed){}. Do the task with the tools you are allowed, or say what you would need.",
                call.name,
                category.as_str(),
                needed(category),
                if matches!(answer, Answer::Unavailable) {
                    "; nobody was there to allow it"
                } else {
                    "; the person running the workflow said no"
                }
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_allow_their_categories_and_those_below() {
        assert!(allows(Permissions::ReadOnly, Category::Read));
        assert!(!allows(Permissions::ReadOnly, Category::Write));
        assert!(allows(Permissions::ReadWrite, Category::Write));
        assert!(!allows(Permissions::ReadWrite, Category::Shell));
        assert!(allows(Permissions::Full, Category::Shell));
        assert_eq!(needed(Category::of("mcp__git__status")), Permissions::Full);
        // Fabro's categories: the web needs what a shell does; reading many files, what reading does.
        assert_eq!(needed(Category::of("web_fetch")), Permissions::Full);
        assert_eq!(needed(Category::of("web_search")), Permissions::Full);
        assert_eq!(
            needed(Category::of("read_many_files")),
            Permissions::ReadOnly
        );
    }
}
