//! Test-artifact capture after command stages: screenshots, videos, reports and traces that a command
//! created or changed are copied into the run record. Looked for: files under `playwright-report/`,
//! `test-results/`, `cypress/videos/`, `cypress/screenshots/`, and `junit*.xml` or `*.trace.zip` anywhere.
//! Only files modified after the command started count, so one walk after the command is enough.
//! Dependency folders, tool caches and hidden directories are skipped, and so is the runs directory.
//! Files over 10 MB, and files past 50 MB per stage, are left out.

use std::path::{Path, PathBuf};
use std::time::SystemTime;

use trellis_engine::Artifact;
use walkdir::WalkDir;

const MAX_FILE: u64 = 10 * 1024 * 1024;
const MAX_STAGE: u64 = 50 * 1024 * 1024;
const ARTIFACT_DIRS: &[&[&str]] = &[
    &["playwright-report"],
    &["test-results"],
    &["cypress", "videos"],
    &["cypress", "screenshots"],
];
const SKIPPED_DIRS: &[&str] = &["node_modules", "target", "__pycache__", "venv"];

fn is_artifact(relative: &Path) -> bool {
    let components: Vec<&str> = relative
        .components()
        .filter_map(|c| c.as_os_str().to_str())
        .collect();
    let name = components.last().copied().unwrap_or_default();
    let in_dir = ARTIFACT_DIRS
        .iter()
        .any(|dir| components.windows(dir.len()).any(|w| w == *dir));
    let lower = name.to_ascii_lowercase();
    let xml = Path::new(&lower).extension().is_some_and(|e| e == "xml");
    in_dir || (lower.starts_with("junit") && xml) || lower.ends_with(".trace.zip")
}

/// Whether a scan of the working tree skips this entry: dependency folders, tool caches, hidden
/// directories, and `exclude` (the runs directory).
pub(crate) fn skipped(entry: &walkdir::DirEntry, exclude: &Path) -> bool {
    entry.depth() > 0
        && entry.file_type().is_dir()
        && (entry.path() == exclude
            || entry
                .file_name()
                .to_str()
                .is_some_and(|n| n.starts_with('.') || SKIPPED_DIRS.contains(&n)))
}

/// The runs directory of a stage directory (`<runs dir>/<run>/stages/<stage>`), which scans of the
/// working tree never enter.
pub fn runs_dir(stage_dir: &Path) -> PathBuf {
    stage_dir
        .ancestors()
        .nth(3)
        .map(Path::to_path_buf)
        .unwrap_or_default()
}

/// Copies artifact files under `root` modified since `since` into `dest`, keeping their relative paths.
/// Returns every artifact found, in path order: those copied, and those left out with the reason.
/// `exclude` (the runs directory) is never scanned.
#[allow(
    clippy::disallowed_methods,
    reason = "called on the blocking pool after the command ends"
)]
pub fn capture(
    root: &Path,
    since: SystemTime,
    dest: &Path,
    exclude: &Path,
) -> std::io::Result<Vec<Artifact>> {
    // Collected before copying, so nothing copied now can be found again.
    let mut found: Vec<(PathBuf, u64)> = WalkDir::new(root)
        .follow_links(false)
        .into_iter()
        .filter_entry(|e| !skipped(e, exclude))
        .filter_map(Result::ok)
        .filter(|e| e.file_type().is_file())
        .filter_map(|e| {
            let relative = e.path().strip_prefix(root).ok()?.to_path_buf();
            let meta = e.metadata().ok()?;
            (is_artifact(&relative) && meta.modified().is_ok_and(|m| m >= since))
                .then_some((relative, meta.len()))
        })
        .collect();
    found.sort();
    let mut artifacts = Vec::new();
    let mut total = 0;
    for (path, bytes) in found {
        let skipped = if bytes > MAX_FILE {
            Some("larger than 10 MB".to_owned())
        } else if total + bytes > MAX_STAGE {
            Some("past the stage's 50 MB of artifacts".to_owned())
        } else {
            None
        };
        if skipped.is_none() {
            let target = dest.join(&path);
            if let Some(parent) = target.parent() {
                std::fs::create_dir_all(parent)?;
            }
            std::fs::copy(root.join(&path), &target)?;
            total += bytes;
        }
        artifacts.push(Artifact {
            path: path.display().to_string(),
            bytes,
            skipped,
        });
    }
    Ok(artifacts)
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
