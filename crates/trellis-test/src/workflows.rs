//! Generated workflows for the benchmarks.

use std::fmt::Write as _;

/// A chain of `commands` command stages `s1` … `sN`, each running `script` (which may not hold a
/// double quote), between the start and the exit.
pub fn command_chain(commands: usize, script: &str) -> String {
    let mut dot =
        String::from("digraph Chain {\n  start [shape=Mdiamond]\n  exit [shape=Msquare]\n");
    for stage in 1..=commands {
        let _ = writeln!(dot, "  s{stage} [shape=parallelogram, script=\"{script}\"]");
    }
    let nodes: Vec<String> = (1..=commands).map(|s| format!("s{s}")).collect();
    let _ = writeln!(dot, "  start -> {} -> exit\n}}", nodes.join(" -> "));
    dot
}

/// A workflow of `nodes` nodes that mixes every common node kind, subgraphs with classes, a
/// stylesheet, conditions and loops, so every validation rule has real work to do.
pub fn generated(nodes: usize) -> String {
    let mut dot = String::from(
        "digraph Generated {\n  graph [goal=\"Benchmark\", model_stylesheet=\"* { model: m1; } .hot { model: m2; } #n5 { model: m3; }\"]\n  start [shape=Mdiamond]\n  exit [shape=Msquare]\n",
    );
    let body = nodes - 2;
    for i in 0..body {
        if i % 100 == 0 {
            let _ = writeln!(
                dot,
                "  subgraph cluster_{i} {{\n    label=\"Group {i}\"\n    node [timeout=\"30s\"]"
            );
        }
        let _ = match i % 4 {
            0 => writeln!(
                dot,
                "    n{i} [shape=parallelogram, script=\"make step-{i}\"]"
            ),
            1 => writeln!(
                dot,
                "    n{i} [shape=tab, class=\"hot\", prompt=\"Do step {i} of $goal\"]"
            ),
            2 => writeln!(dot, "    n{i} [shape=diamond]"),
            _ => writeln!(dot, "    n{i} [prompt=\"Agent step {i}\", max_visits=3]"),
        };
        if i % 100 == 99 || i + 1 == body {
            dot.push_str("  }\n");
        }
    }
    dot.push_str("  start -> n0\n");
    for i in 0..body - 1 {
        if i % 4 == 2 {
            // A diamond: forward on success, back three nodes otherwise.
            let _ = writeln!(
                dot,
                "  n{i} -> n{} [condition=\"outcome=success && context.score >= 5\"]",
                i + 1
            );
            let _ = writeln!(dot, "  n{i} -> n{}", i.saturating_sub(3));
        } else {
            let _ = writeln!(dot, "  n{i} -> n{}", i + 1);
        }
    }
    let _ = writeln!(dot, "  n{} -> exit\n}}", body - 1);
    dot
}

/// A triage workflow routed by a model from its input alone: the router reads `input.report` and sends
/// it to `escalate` or `backlog`.
pub const TRIAGE_ROUTER: &str = r#"entry: intake
inputs:
  report: { type: string, required: true }
nodes:
  intake: { type: command, script: "true" }
  escalate: { type: command, script: echo escalated }
  backlog: { type: command, script: echo backlog }
edges:
  - { from: intake, to: escalate, when: "the report describes a crash, data loss, an outage or a security problem" }
  - { from: intake, to: backlog, when: "the report is about something cosmetic, a typo, or a feature request" }
"#;

/// Clear-cut bug reports and the branch each belongs to, alternating; the first ten are the test's, all
/// of them the benchmark's.
pub const TRIAGE_CASES: &[(&str, &str)] = &[
    (
        "Clicking Save deletes all my documents permanently.",
        "escalate",
    ),
    (
        "The word 'recieve' is misspelled on the settings page.",
        "backlog",
    ),
    (
        "The server crashes with a segmentation fault on every request since the last deploy.",
        "escalate",
    ),
    ("Please add a dark mode to the dashboard.", "backlog"),
    (
        "Anyone can read other users' private messages by changing the id in the URL.",
        "escalate",
    ),
    (
        "The logo is two pixels off center on the login page.",
        "backlog",
    ),
    (
        "The whole site has been down for everyone for the last hour.",
        "escalate",
    ),
    ("It would be nice to export reports as CSV.", "backlog"),
    (
        "After the migration, half of the customer orders are missing from the database.",
        "escalate",
    ),
    (
        "The footer text is light gray and a little hard to read.",
        "backlog",
    ),
    (
        "The mobile app crashes immediately on launch for all Android users.",
        "escalate",
    ),
    (
        "Could you add keyboard shortcuts for the editor?",
        "backlog",
    ),
    (
        "Passwords are written in plain text to the public log file.",
        "escalate",
    ),
    (
        "The tooltip on the Help button has a typo: 'documentaton'.",
        "backlog",
    ),
    (
        "Uploading a file corrupts it and the original is lost.",
        "escalate",
    ),
    ("Please make the sidebar collapsible.", "backlog"),
    (
        "Payments fail for every customer with error 500, so no one can check out.",
        "escalate",
    ),
    (
        "The button corners are square, but the design uses rounded corners.",
        "backlog",
    ),
    (
        "An attacker can log in as admin without a password using SQL injection.",
        "escalate",
    ),
    (
        "Feature request: support for a German translation.",
        "backlog",
    ),
    (
        "The nightly backup job has been silently deleting old backups and now none are left.",
        "escalate",
    ),
    (
        "The heading font size on the About page is slightly too large.",
        "backlog",
    ),
    (
        "The API returns other tenants' invoices to any logged-in user.",
        "escalate",
    ),
    ("Add an option to sort the project list by name.", "backlog"),
    (
        "The desktop app freezes and crashes when opening any file larger than 1 MB.",
        "escalate",
    ),
    (
        "There is an extra space before the comma in the welcome email.",
        "backlog",
    ),
    (
        "Our production database was wiped by the cleanup script.",
        "escalate",
    ),
    ("Please let users pick their avatar color.", "backlog"),
    (
        "Login is broken for all users: the page crashes with an exception.",
        "escalate",
    ),
    (
        "The icon for settings looks a bit blurry on retina screens.",
        "backlog",
    ),
];
