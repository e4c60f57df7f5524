//! Run-wide settings from the command line or the API, kept in `run.json` so a resumed run keeps them.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// How much of a run is real.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum RunMode {
    /// Everything runs.
    #[default]
    Real,
    /// Models are simulated; commands, waits and human gates run (`--simulate`).
    Simulate,
    /// Models are simulated, commands are not run, waits and gate timeouts pass at once (`--dry-run`).
    DryRun,
}

impl RunMode {
    /// The mode the `--dry-run` and `--simulate` flags ask for (at most one of them is set).
    pub fn from_flags(dry_run: bool, simulate: bool) -> Self {
        if dry_run {
            RunMode::DryRun
        } else if simulate {
            RunMode::Simulate
        } else {
            RunMode::Real
        }
    }

    /// Whether model stages answer with canned responses instead of calling a model.
    pub fn models_simulated(self) -> bool {
        self != RunMode::Real
    }
}

/// Run-wide settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
#[serde(default, from = "Recorded")]
pub struct Settings {
    /// The directory commands run in.
    #[cfg_attr(feature = "schema", schema(value_type = String))]
    pub work_dir: PathBuf,
    pub mode: RunMode,
    /// Stages a run may execute before it is stopped as a runaway, its sub-workflows' stages included.
    pub max_steps: u32,
    /// Directories `@file` and `workflow=` references may reach besides the workflow's own tree
    /// (`--allow-dir`); sub-workflows are compiled with them too.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    #[cfg_attr(feature = "schema", schema(value_type = Vec<String>))]
    pub allowed_dirs: Vec<PathBuf>,
    /// The most an agent's tools may do without asking, whatever the workflow says
    /// (`--permissions`): `read-only`, `read-write` or `full`.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "schema", schema(value_type = Option<String>))]
    pub permissions: Option<trellis_workflow::node_kind::Permissions>,
    /// The run's inputs, which the workflow's templates name (`--input`, a run file's
    /// `[run.inputs]`); its sub-workflows are compiled with them too.
    #[serde(skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub inputs: std::collections::BTreeMap<String, String>,
    /// The model for nodes that name none, over the graph's (a run file's `[run.model] name`); its
    /// sub-workflows are compiled with it too.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// The provider of a model the catalog does not place (`--provider`, a run file's
    /// `[run.model] provider`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub provider: Option<String>,
    /// More files command stages capture as artifacts, by glob under the working directory (a run
    /// file's `[run.artifacts] include`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub artifacts: Vec<String>,
    /// Paths, by glob, left out of the files a stage is recorded as touching (a run file's
    /// `[run.checkpoint] exclude_globs`: Trellis commits nothing at checkpoints).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub exclude_globs: Vec<String>,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            work_dir: PathBuf::from("."),
            mode: RunMode::Real,
            max_steps: 10_000,
            allowed_dirs: Vec::new(),
            permissions: None,
            inputs: std::collections::BTreeMap::new(),
            model: None,
            provider: None,
            artifacts: Vec::new(),
            exclude_globs: Vec::new(),
        }
    }
}

impl Settings {
    /// Whether model stages answer with canned responses instead of calling a model.
    pub fn models_simulated(&self) -> bool {
        self.mode.models_simulated()
    }

    /// Whether commands are not run and waits pass at once.
    pub fn dry_run(&self) -> bool {
        self.mode == RunMode::DryRun
    }
}

/// The glob set of a run's `globs` (its artifact or excluded paths); none when it has none. A glob
/// that does not parse was reported when the run file was read, and is left out.
pub fn glob_set(globs: &[String]) -> Option<globset::GlobSet> {
    if globs.is_empty() {
        return None;
    }
    let mut set = globset::GlobSetBuilder::new();
    for glob in globs {
        if let Ok(glob) = globset::Glob::new(glob) {
            set.add(glob);
        }
    }
    set.build().ok()
}

/// `run.json`'s settings as read: records written before `mode` existed said `dry_run` and
/// `simulate`, and a dry run resumed by a newer Trellis must stay a dry run.
#[derive(Deserialize)]
#[serde(default)]
struct Recorded {
    work_dir: PathBuf,
    mode: Option<RunMode>,
    dry_run: bool,
    simulate: bool,
    max_steps: u32,
    allowed_dirs: Vec<PathBuf>,
    permissions: Option<trellis_workflow::node_kind::Permissions>,
    inputs: std::collections::BTreeMap<String, String>,
    model: Option<String>,
    provider: Option<String>,
    artifacts: Vec<String>,
    exclude_globs: Vec<String>,
}

impl Default for Recorded {
    fn default() -> Self {
        let Settings {
            work_dir,
            max_steps,
            allowed_dirs,
            ..
        } = Settings::default();
        Self {
            work_dir,
            mode: None,
            dry_run: false,
            simulate: false,
            max_steps,
            allowed_dirs,
            permissions: None,
            inputs: std::collections::BTreeMap::new(),
            model: None,
            provider: None,
            artifacts: Vec::new(),
            exclude_globs: Vec::new(),
        }
    }
}

impl From<Recorded> for Settings {
    fn from(recorded: Recorded) -> Self {
        Self {
            mode: recorded
                .mode
                .unwrap_or_else(|| RunMode::from_flags(recorded.dry_run, recorded.simulate)),
            work_dir: recorded.work_dir,
            max_steps: recorded.max_steps,
            allowed_dirs: recorded.allowed_dirs,
            permissions: recorded.permissions,
            inputs: recorded.inputs,
            model: recorded.model,
            provider: recorded.provider,
            artifacts: recorded.artifacts,
            exclude_globs: recorded.exclude_globs,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_from_before_the_mode_keeps_its_dry_run() {
        let old: Settings = serde_json::from_str(
            r#"{"work_dir":"/w","dry_run":true,"simulate":false,"max_steps":7}"#,
        )
        .unwrap();
        assert_eq!(old.mode, RunMode::DryRun);
        assert_eq!(old.max_steps, 7);
        let simulated: Settings = serde_json::from_str(r#"{"simulate":true}"#).unwrap();
        assert_eq!(simulated.mode, RunMode::Simulate);
        assert_eq!(simulated.max_steps, 10_000);
    }

    #[test]
    fn settings_round_trip_with_their_mode() {
        let settings = Settings {
            mode: RunMode::Simulate,
            ..Settings::default()
        };
        let text = serde_json::to_string(&settings).unwrap();
        assert!(text.contains(r#""mode":"simulate""#), "{text}");
        assert_eq!(serde_json::from_str::<Settings>(&text).unwrap(), settings);
    }
}
