//! Test-artifact capture after command stages: screenshots, videos, reports and traces that a command
//! created or changed are copied into the run record. Looked for: files under `playwright-report/`,
//! `test-results/`, `cypress/videos/`, `cypress/screenshots/`, and `junit*.xml` or `*.trace.zip` anywhere;
//! tool caches and dependency folders are skipped. Files over 10 MB, and files past 50 MB per stage,
//! are left out.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use walkdir::WalkDir;

const MAX_FILE: u64 = 10 * 1024 * 1024;
const MAX_STAGE: u64 = 50 * 1024 * 1024;
const ARTIFACT_DIRS: &[&[&str]] = &[
    &["playwright-report"],
    &["test-results"],
    &["cypress", "videos"],
    &["cypress", "screenshots"],
];
const SKIPPED_DIRS: &[&str] = &[
    "node_modules",
    ".git",
    ".cache",
    ".yarn",
    "target",
    ".venv",
    "__pycache__",
    ".trellis",
];

/// Size and modification time of each artifact file before a command ran.
#[derive(Debug, Default)]
pub struct Baseline(HashMap<PathBuf, (u64, Option<SystemTime>)>);

fn is_artifact(relative: &Path) -> bool {
    let components: Vec<&str> = relative
        .components()
        .filter_map(|c| c.as_os_str().to_str())
        .collect();
    let name = components.last().copied().unwrap_or_default();
    let in_dir = ARTIFACT_DIRS
        .iter()
        .any(|dir| components.windows(dir.len()).any(|w| w == *dir));
    in_dir || (name.starts_with("junit") && name.ends_with(".xml")) || name.ends_with(".trace.zip")
}

/// Artifact files under `root`, leaving out `exclude` (the runs directory, when it lies inside the work
/// directory: captured copies must not be captured again).
fn artifact_files<'a>(
    root: &'a Path,
    exclude: &'a Path,
) -> impl Iterator<Item = (PathBuf, std::fs::Metadata)> + 'a {
    WalkDir::new(root)
        .follow_links(false)
        .into_iter()
        .filter_entry(move |e| {
            !(e.file_type().is_dir()
                && (e.path() == exclude
                    || e.file_name()
                        .to_str()
                        .is_some_and(|n| SKIPPED_DIRS.contains(&n))))
        })
        .filter_map(Result::ok)
        .filter(|e| e.file_type().is_file())
        .filter_map(move |e| {
            let relative = e.path().strip_prefix(root).ok()?.to_path_buf();
            if !is_artifact(&relative) {
                return None;
            }
            Some((relative, e.metadata().ok()?))
        })
}

/// Records what artifact files exist before a command runs.
pub fn baseline(root: &Path, exclude: &Path) -> Baseline {
    Baseline(
        artifact_files(root, exclude)
            .map(|(path, meta)| (path, (meta.len(), meta.modified().ok())))
            .collect(),
    )
}

/// Copies artifact files that are new or changed since `baseline` into `dest`, keeping their relative
/// paths. Returns the copied paths (relative).
pub fn capture(
    root: &Path,
    baseline: &Baseline,
    dest: &Path,
    exclude: &Path,
) -> std::io::Result<Vec<PathBuf>> {
    let mut copied = Vec::new();
    let mut total = 0;
    // Collected before copying, so nothing copied now can be found again.
    let found: Vec<_> = artifact_files(root, exclude).collect();
    for (relative, meta) in found {
        let fingerprint = (meta.len(), meta.modified().ok());
        if baseline.0.get(&relative) == Some(&fingerprint)
            || meta.len() > MAX_FILE
            || total + meta.len() > MAX_STAGE
        {
            continue;
        }
        let target = dest.join(&relative);
        if let Some(parent) = target.parent() {
            std::fs::create_dir_all(parent)?;
        }
        std::fs::copy(root.join(&relative), &target)?;
        total += meta.len();
        copied.push(relative);
    }
    copied.sort();
    Ok(copied)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recognises_artifacts() {
        assert!(is_artifact(Path::new("test-results/login/shot.png")));
        assert!(is_artifact(Path::new("web/cypress/videos/a.mp4")));
        assert!(is_artifact(Path::new("reports/junit-unit.xml")));
        assert!(is_artifact(Path::new("trace/run.trace.zip")));
        assert!(!is_artifact(Path::new("cypress/fixtures/a.json")));
        assert!(!is_artifact(Path::new("src/main.rs")));
    }
}
