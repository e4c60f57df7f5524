//! Loop detection, by five rules.
//!
//! - **Repeats are not run.** A call identical to an earlier one (the same tool, the same arguments)
//!   with nothing in between that may have changed anything — no call of a tool that writes or runs
//!   commands (`write_file`, `edit_file`, `shell`, or an external tool) other than that same call
//!   itself — would give the same result (a call of a tool there is not changes nothing). The
//!   first repeat runs (the model may have lost the result); from the second repeat on the call is
//!   not run, and is answered with an error result that says why. Interleaved repeats
//!   (A, B, A, B, A) count as much as consecutive ones (A, A, A): the third A is refused.
//! - **Cycles are named.** When the last 10 calls that ran repeat with a period of 1, 2 or 3 (a cycle
//!   that does write or run something, so the first rule lets it through), the model is told it is
//!   going round in circles; the window then starts afresh, so one cycle is reported once.
//!
//! - **A failed edit is not tried on the same content again.** An `edit_file` call identical to one
//!   that failed, on a file whose content has not changed since (other calls in between or not),
//!   would fail the same way: it is not run, and is answered with an error result that says so. A
//!   small model tends to alternate a guessed edit with running the tests, which the first rule lets
//!   through (the tests may change things) and the second names only after ten calls.
//! - **An undone change is named.** A `write_file` or `edit_file` that leaves its file holding what
//!   it held earlier in the session (before or after another write) undid a change: the model is
//!   told so (the write stands). A small model alternates two edits with the tests in between
//!   (`12` → `15`, test, `15` → `12`, test), a cycle of four calls that writes every time, which
//!   the first rule lets through and the second, looking for periods up to three, does not see.
//! - **A call that keeps failing the same way is named.** A call that failed (a command that
//!   exited non-zero, a tool that answered with an error) with the very result it gave the last
//!   time it ran, and the time before — [`SAME_FAILURES`] times in a row, whatever ran in between —
//!   was not changed by what the model did in between: it is told so, and each further identical
//!   failure tells it again. A small model edits one file and runs the same wrong check after each
//!   edit (`node shop.js`, "Cannot find module", 10 times): each edit is new and writes, so the
//!   other rules let it through.
//!
//! Each refusal, cycle, undone change and failure repeated is an `Agent.LoopDetected` event and a
//! warning; a session stops after [`crate::session::LOOP_WARNINGS`] of them.

use std::collections::HashMap;

use serde_json::Value;

/// How many times an identical call runs before its repeats are refused.
pub const RUNS_OF_A_CALL: u32 = 2;

/// How many times in a row a call fails with the same result before the model is told.
pub const SAME_FAILURES: u32 = 3;

/// How many recent calls are compared.
pub const WINDOW: usize = 10;
const PERIODS: [usize; 3] = [1, 2, 3];

#[derive(Debug, Default)]
pub struct LoopDetector {
    /// The last calls that ran, for cycles.
    recent: Vec<String>,
    /// Every call since something last changed: how often it came, and the number of the last.
    since_change: HashMap<String, (u32, usize)>,
    /// The last call that may change something, which may repeat without clearing the above.
    last_change: Option<String>,
    /// Calls checked so far.
    calls: usize,
    /// Edits that failed, with a fingerprint of their file's content then: the number of the call.
    failed_edits: HashMap<(String, u64), usize>,
    /// Contents written files have had (a file and a fingerprint): the number of the last call
    /// they were seen at.
    contents: HashMap<(String, u64), usize>,
    /// Calls whose last run failed: a fingerprint of the result, how many runs in a row gave it,
    /// and the number of the last.
    failing: HashMap<String, (u64, u32, usize)>,
}

/// A call that failed with the same result [`SAME_FAILURES`] or more times in a row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SameFailure {
    /// The call as the model is reminded of it: a command, or the tool's name.
    pub call: String,
    pub times: u32,
    /// How many calls back it failed last.
    pub period: usize,
}

impl SameFailure {
    /// The warning the model is sent; `finishing` says how it ends the task.
    pub fn warning(&self, finishing: &str) -> String {
        format!(
            "Loop detected: {} failed {} times in a row with the same output — what you changed \
             in between did not change its failure. Read what it reports and change what that is \
             about, or check the task another way — or, if the task is done, {finishing}.",
            self.call, self.times
        )
    }
}

/// A write that put a file back to what it held before.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Undone {
    pub path: String,
    /// How many calls back the file last held this.
    pub period: usize,
}

impl Undone {
    /// The warning the model is sent; `finishing` says how it ends the task.
    pub fn warning(&self, finishing: &str) -> String {
        format!(
            "Loop detected: `{}` now holds what it held {} call(s) ago — this change undid an \
             earlier one, so running the same checks will give the same results as then. Step back, \
             reconsider your approach, and try something different — or, if the task is done, \
             {finishing}.",
            self.path, self.period
        )
    }
}

/// A repeated call that is not run: its tool, how many calls back it came last, and how often it
/// came since anything changed (this time included).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Repeat {
    pub tool: String,
    pub period: usize,
    pub times: u32,
    /// An edit that failed on the file's same content before (`times` is then 2).
    pub failed_edit: bool,
    /// That edit's `old_string` and `new_string` are the same: it fails whatever the file holds.
    pub same_text: bool,
}

/// A fingerprint of a result or a file's content: what the detector compares them by.
pub fn fingerprint(content: &[u8]) -> u64 {
    std::hash::BuildHasher::hash_one(
        &std::hash::BuildHasherDefault::<std::hash::DefaultHasher>::default(),
        content,
    )
}

/// One call as the detector compares it.
fn key(tool: &str, arguments: &Value) -> String {
    format!("{tool}\u{0}{arguments}")
}

/// A detected loop: its period and the tools in one cycle.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Loop {
    pub period: usize,
    pub tools: Vec<String>,
}

impl LoopDetector {
    /// Before a call runs: the repeat it is, when it must not run. `changes` says whether the tool
    /// may change anything (it writes files or runs commands).
    pub fn check(&mut self, tool: &str, arguments: &Value, changes: bool) -> Option<Repeat> {
        let key = key(tool, arguments);
        self.calls += 1;
        if changes && self.last_change.as_ref() != Some(&key) {
            self.since_change.clear();
            self.last_change = Some(key.clone());
        }
        let (times, last) = self.since_change.entry(key).or_insert((0, self.calls));
        *times += 1;
        let period = self.calls - std::mem::replace(last, self.calls);
        (*times > RUNS_OF_A_CALL).then(|| Repeat {
            tool: tool.to_owned(),
            period,
            times: *times,
            failed_edit: false,
            same_text: false,
        })
    }

    /// Whether an edit identical to this one failed before (on some content): only then is the
    /// file's content worth a look ([`Self::check_edit`]).
    pub fn failed_before(&self, tool: &str, arguments: &Value) -> bool {
        let key = key(tool, arguments);
        self.failed_edits.keys().any(|(failed, _)| *failed == key)
    }

    /// Before an edit runs, with `content` a fingerprint of its file's content now: the repeat it
    /// is when the same edit failed on the same content. When it is none, [`Self::check`] follows.
    pub fn check_edit(&mut self, tool: &str, arguments: &Value, content: u64) -> Option<Repeat> {
        let last = *self.failed_edits.get(&(key(tool, arguments), content))?;
        self.calls += 1;
        Some(Repeat {
            tool: tool.to_owned(),
            period: self.calls - last,
            times: 2,
            failed_edit: true,
            same_text: arguments.get("old_string").is_some()
                && arguments.get("old_string") == arguments.get("new_string"),
        })
    }

    /// After an edit failed on the content `content` fingerprints.
    pub fn edit_failed(&mut self, tool: &str, arguments: &Value, content: u64) {
        self.failed_edits
            .insert((key(tool, arguments), content), self.calls);
    }

    /// After a write of `path` ran without error, with fingerprints of the file's content before
    /// it (none when it did not exist) and after: the undone change it is, when the file holds
    /// what it held before an earlier call.
    pub fn wrote(&mut self, path: &str, before: Option<u64>, after: u64) -> Option<Undone> {
        let calls = self.calls;
        // The file held `before` until this call.
        if let Some(before) = before {
            self.contents
                .insert((path.to_owned(), before), calls.saturating_sub(1));
        }
        let last = self.contents.insert((path.to_owned(), after), calls);
        match last {
            Some(last) if before != Some(after) => Some(Undone {
                path: path.to_owned(),
                period: calls - last,
            }),
            _ => None,
        }
    }

    /// After a call ran, whether it `failed` and with what `output`: the failure it repeats when it
    /// failed the same way [`SAME_FAILURES`] or more times in a row. `shown` is how the model is
    /// reminded of the call.
    pub fn ran(
        &mut self,
        (tool, arguments): (&str, &Value),
        failed: bool,
        output: &str,
        shown: impl FnOnce() -> String,
    ) -> Option<SameFailure> {
        let key = key(tool, arguments);
        if !failed {
            self.failing.remove(&key);
            return None;
        }
        let result = fingerprint(output.as_bytes());
        let calls = self.calls;
        let (last, times, at) = self.failing.entry(key).or_insert((result, 0, calls));
        let period = calls - std::mem::replace(at, calls);
        if *last == result {
            *times += 1;
        } else {
            (*last, *times) = (result, 1);
        }
        (*times >= SAME_FAILURES).then(|| SameFailure {
            call: shown(),
            times: *times,
            period,
        })
    }

    /// After a call ran: the cycle it completes, if any.
    pub fn record(&mut self, tool: &str, arguments: &Value) -> Option<Loop> {
        self.recent.push(key(tool, arguments));
        if self.recent.len() > WINDOW {
            self.recent.remove(0);
        }
        if self.recent.len() < WINDOW {
            return None;
        }
        let period = PERIODS
            .into_iter()
            .find(|&p| (p..WINDOW).all(|i| self.recent[i] == self.recent[i - p]))?;
        let tools = self.recent[WINDOW - period..]
            .iter()
            .map(|s| s.split('\u{0}').next().unwrap_or_default().to_owned())
            .collect();
        self.recent.clear();
        Some(Loop { period, tools })
    }
}

impl Loop {
    /// The warning the model is sent; `finishing` says how it ends the task.
    pub fn warning(&self, finishing: &str) -> String {
        format!(
            "Loop detected: your last {WINDOW} tool calls repeat the same {} call(s) ({}) with the same arguments. \
             Repeating them will not give a different result. Step back, reconsider your approach, and try \
             something different — or, if the task is done, {finishing}.",
            self.period,
            self.tools.join(", ")
        )
    }
}

impl Repeat {
    /// The error result the model gets instead of the call's; `finishing` says how it ends the
    /// task.
    pub fn refusal(&self, finishing: &str) -> String {
        if self.same_text {
            return format!(
                "Not run: this same `{}` call failed before, as its old_string and new_string are \
                 the same, so it would fail the same way. Put in new_string the text as it should \
                 read once the task is done, or change the file another way.",
                self.tool
            );
        }
        if self.failed_edit {
            return format!(
                "Not run: this same `{}` call failed before, and the file has not changed since, so \
                 it would fail the same way. Copy old_string exactly from the file's content (read \
                 it again with read_file), or change the file another way.",
                self.tool
            );
        }
        format!(
            "Not run: this is call number {} of `{}` with these same arguments since anything in the \
             working directory last changed, so it would give the same result as before — see your \
             earlier call. Use that result and do something different; if the task is done, \
             {finishing}.",
            self.times, self.tool
        )
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn period_one_two_and_three_are_found_and_reported_once() {
        for period in [1usize, 2, 3] {
            let mut detector = LoopDetector::default();
            let mut found = Vec::new();
            for i in 0..25 {
                let path = format!("f{}", i % period);
                if let Some(l) = detector.record("read_file", &json!({ "path": path })) {
                    found.push((i, l.period));
                }
            }
            assert_eq!(found, [(9, period), (19, period)], "period {period}");
        }
    }

    #[test]
    fn varied_calls_are_not_a_loop() {
        let mut detector = LoopDetector::default();
        for i in 0..30 {
            assert_eq!(
                detector.record("read_file", &json!({ "path": i % 4 })),
                None
            );
        }
    }

    /// Runs `calls` (tool, path, whether it changes anything) through the repeat rule; the indexes of
    /// those refused.
    fn refused(calls: &[(&str, &str, bool)]) -> Vec<usize> {
        let mut detector = LoopDetector::default();
        calls
            .iter()
            .enumerate()
            .filter_map(|(i, (tool, path, changes))| {
                detector
                    .check(tool, &json!({ "path": path }), *changes)
                    .map(|_| i)
            })
            .collect()
    }

    #[test]
    fn the_second_repeat_of_a_call_is_refused_consecutive_or_interleaved() {
        let a = ("read_file", "a", false);
        let b = ("grep", "b", false);
        assert_eq!(refused(&[a, a, a, a]), [2, 3]);
        assert_eq!(refused(&[a, b, a, b, a, b]), [4, 5]);
        let mut detector = LoopDetector::default();
        for _ in 0..2 {
            assert_eq!(
                detector.check("read_file", &json!({ "path": "a" }), false),
                None
            );
            detector.check("grep", &json!({ "path": "b" }), false);
        }
        assert_eq!(
            detector.check("read_file", &json!({ "path": "a" }), false),
            Some(Repeat {
                tool: "read_file".into(),
                period: 2,
                times: 3,
                failed_edit: false,
                same_text: false,
            })
        );
    }

    #[test]
    fn an_edit_that_failed_is_refused_on_the_same_content_whatever_ran_in_between() {
        let mut detector = LoopDetector::default();
        let edit = json!({ "path": "calc.py", "old_string": "x", "new_string": "y" });
        assert!(!detector.failed_before("edit_file", &edit));
        assert_eq!(detector.check_edit("edit_file", &edit, 7), None);
        detector.check("edit_file", &edit, true);
        detector.edit_failed("edit_file", &edit, 7);
        assert!(detector.failed_before("edit_file", &edit));
        detector.check("shell", &json!({ "command": "pytest" }), true);
        let repeat = detector.check_edit("edit_file", &edit, 7).unwrap();
        assert!(repeat.failed_edit);
        assert_eq!(repeat.period, 2);
        assert!(
            repeat.refusal("answer").contains("failed before"),
            "{}",
            repeat.refusal("answer")
        );
        // The file changed: the edit may work now; another edit is another call.
        assert_eq!(detector.check_edit("edit_file", &edit, 8), None);
        let other = json!({ "path": "calc.py", "old_string": "a - b", "new_string": "a + b" });
        assert_eq!(detector.check_edit("edit_file", &other, 7), None);
        // An edit that changes nothing is told so, not to copy old_string from the file.
        let same = json!({ "path": "calc.py", "old_string": "a + b", "new_string": "a + b" });
        detector.edit_failed("edit_file", &same, 7);
        let repeat = detector.check_edit("edit_file", &same, 7).unwrap();
        assert!(repeat.same_text);
        assert!(
            repeat
                .refusal("answer")
                .contains("as its old_string and new_string are the same"),
            "{}",
            repeat.refusal("answer")
        );
    }

    #[test]
    fn a_call_failing_the_same_way_three_times_in_a_row_is_named_each_time_after() {
        let mut detector = LoopDetector::default();
        let check = json!({ "command": "node shop.js" });
        let mut ran = |failed: bool, output: &str| {
            detector
                .ran(("shell", &check), failed, output, || {
                    "`node shop.js`".into()
                })
                .map(|f| f.times)
        };
        // Edits in between (each new, each writing) change nothing of it.
        assert_eq!(ran(true, "Cannot find module"), None);
        assert_eq!(ran(true, "Cannot find module"), None);
        assert_eq!(ran(true, "Cannot find module"), Some(3));
        assert_eq!(ran(true, "Cannot find module"), Some(4));
        // Another failure starts the count again, and so does a success.
        assert_eq!(ran(true, "SyntaxError"), None);
        assert_eq!(ran(true, "SyntaxError"), None);
        assert_eq!(ran(false, "10"), None);
        assert_eq!(ran(true, "SyntaxError"), None);
        assert_eq!(ran(true, "SyntaxError"), None);
        assert_eq!(ran(true, "SyntaxError"), Some(3));
        // Another call has a count of its own.
        let other = json!({ "command": "node shop.js --all" });
        for _ in 0..2 {
            assert_eq!(
                detector.ran(("shell", &other), true, "SyntaxError", String::new),
                None
            );
        }
        let warning = SameFailure {
            call: "`node shop.js`".into(),
            times: 3,
            period: 2,
        }
        .warning("call finish");
        assert!(
            warning.starts_with(
                "Loop detected: `node shop.js` failed 3 times in a row with the same output"
            ),
            "{warning}"
        );
    }

    #[test]
    fn a_write_that_puts_a_file_back_to_an_earlier_content_is_named_each_time() {
        let mut detector = LoopDetector::default();
        let (original, fifteen) = (1, 2);
        let mut undone = Vec::new();
        // edit 12 -> 15, test, edit 15 -> 12, test, ... as a small model went round in CI.
        for i in 0..4 {
            let (before, after) = if i % 2 == 0 {
                (original, fifteen)
            } else {
                (fifteen, original)
            };
            let edit = json!({ "path": "src/lib.rs", "i": i % 2 });
            detector.check("edit_file", &edit, true);
            undone.push(detector.wrote("src/lib.rs", Some(before), after));
            detector.check("shell", &json!({ "command": "cargo test" }), true);
        }
        assert_eq!(undone[0], None);
        assert_eq!(
            undone[1..],
            [3, 3, 3].map(|period| Some(Undone {
                path: "src/lib.rs".into(),
                period
            }))
        );
        assert!(
            undone[1]
                .as_ref()
                .unwrap()
                .warning("answer")
                .contains("undid")
        );
        // Moving on to new content, or writing what a file holds, is no undoing; nor is another
        // file's content.
        assert_eq!(detector.wrote("src/lib.rs", Some(original), 3), None);
        assert_eq!(detector.wrote("src/lib.rs", Some(3), 3), None);
        assert_eq!(detector.wrote("src/main.rs", None, original), None);
    }

    #[test]
    fn a_change_in_between_lets_a_call_run_again_but_a_repeated_change_is_a_repeat() {
        let read = ("read_file", "a", false);
        let write = ("write_file", "a", true);
        let test = ("shell", "pytest", true);
        assert_eq!(
            refused(&[read, read, write, read, read, test, read]),
            Vec::<usize>::new()
        );
        // The same command again and again, with nothing else in between, changes nothing new.
        assert_eq!(refused(&[test, test, test]), [2]);
        assert_eq!(refused(&[test, read, test, read, test, read]), [4, 5]);
    }
}
