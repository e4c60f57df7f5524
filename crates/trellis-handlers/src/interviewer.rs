//! Who answers human gates: `--auto-approve` (the first option), an answers file (`--answers FILE`, a
//! JSON object from gate id to a label, accelerator key or free text), and the terminal. They chain: an
//! answers file falls back to the terminal, and the terminal says `Unavailable` when standard input is
//! not a terminal, so a non-interactive run waits for input instead of guessing.

use std::collections::HashMap;
use std::io::{BufRead, IsTerminal, Write};

use async_trait::async_trait;
use parking_lot::Mutex;
use trellis_engine::services::{Answer, Interviewer, Question};

use crate::human::match_choice;

/// Takes the first option of every gate.
pub struct AutoApprove;

#[async_trait]
impl Interviewer for AutoApprove {
    async fn ask(&self, question: &Question) -> Answer {
        if question.choices.is_empty() {
            Answer::Freeform("approved".into())
        } else {
            Answer::Choice(0)
        }
    }
}

/// Answers from a map of gate id to answer text; each answer is used once, then the fallback is asked.
pub struct Answers {
    answers: Mutex<HashMap<String, String>>,
    fallback: Box<dyn Interviewer>,
}

impl Answers {
    pub fn new(answers: HashMap<String, String>, fallback: Box<dyn Interviewer>) -> Self {
        Self {
            answers: Mutex::new(answers),
            fallback,
        }
    }

    /// Reads a JSON object of gate id to answer.
    pub fn parse(text: &str) -> Result<HashMap<String, String>, String> {
        let value: serde_json::Value =
            serde_json::from_str(text).map_err(|e| format!("not valid JSON: {e}"))?;
        let object = value
            .as_object()
            .ok_or("expected a JSON object mapping gate ids to answers")?;
        object
            .iter()
            .map(|(k, v)| match v {
                serde_json::Value::String(s) => Ok((k.clone(), s.clone())),
                other => Err(format!(
                    "the answer for `{k}` must be a string, found {other}"
                )),
            })
            .collect()
    }
}

#[async_trait]
impl Interviewer for Answers {
    async fn ask(&self, question: &Question) -> Answer {
        let answer = self.answers.lock().remove(&question.node_id);
        match answer {
            Some(text) => match match_choice(&text, &question.choices) {
                Some(i) => Answer::Choice(i),
                None => Answer::Freeform(text),
            },
            None => self.fallback.ask(question).await,
        }
    }
}

/// Asks on the terminal; unavailable when standard input is not a terminal.
pub struct Console;

fn read_answer(question: &Question) -> Answer {
    let mut stderr = std::io::stderr();
    let _ = writeln!(stderr, "\n? {}", question.prompt);
    for (i, choice) in question.choices.iter().enumerate() {
        // A label with an accelerator shows it already (`[A] Approve`); others are numbered.
        match choice.key {
            Some(_) => {
                let _ = writeln!(stderr, "  {}", choice.label);
            }
            None => {
                let _ = writeln!(stderr, "  {}) {}", i + 1, choice.label);
            }
        }
    }
    if question.freeform {
        let _ = writeln!(stderr, "  (or type your own answer)");
    }
    loop {
        let _ = write!(stderr, "> ");
        let _ = stderr.flush();
        let mut line = String::new();
        match std::io::stdin().lock().read_line(&mut line) {
            Ok(0) | Err(_) => return Answer::Unavailable,
            Ok(_) => {}
        }
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        if let Some(i) = match_choice(line, &question.choices) {
            return Answer::Choice(i);
        }
        if let Ok(n) = line.parse::<usize>()
            && (1..=question.choices.len()).contains(&n)
        {
            return Answer::Choice(n - 1);
        }
        if question.freeform {
            return Answer::Freeform(line.to_owned());
        }
        let _ = writeln!(stderr, "  not an option; type a key or a label");
    }
}

#[async_trait]
impl Interviewer for Console {
    async fn ask(&self, question: &Question) -> Answer {
        if !std::io::stdin().is_terminal() {
            return Answer::Unavailable;
        }
        let q = question.clone();
        // A person may take all day: the reading gets a thread of its own.
        let reading = trellis_process::task::own_thread("trellis-console", move || read_answer(&q));
        match question.timeout {
            Some(limit) => match tokio::time::timeout(limit, reading).await {
                Ok(answer) => answer.unwrap_or(Answer::Unavailable),
                Err(_) => Answer::TimedOut,
            },
            None => reading.await.unwrap_or(Answer::Unavailable),
        }
    }
}

/// Nobody is there to answer (a non-interactive run): a gate with a `timeout` has its time run out at
/// once — nobody could answer before it ends, so waiting it out would only delay the same outcome
/// (its default, or its failure without one) — and a gate without one waits for input.
pub struct Unattended;

#[async_trait]
impl Interviewer for Unattended {
    async fn ask(&self, question: &Question) -> Answer {
        match question.timeout {
            Some(_) => Answer::TimedOut,
            None => Answer::Unavailable,
        }
    }
}
