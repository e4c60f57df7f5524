//! Secrets in the environment: variables whose names end in `_API_KEY`, `_SECRET`, `_TOKEN`,
//! `_PASSWORD` or `_CREDENTIAL` (the providers' keys among them). Commands that a workflow or a model
//! wrote never get them — a node passes a variable on by naming it in its `env` attribute — and, as a
//! second line of defence, their values are redacted from what commands print before it is recorded,
//! shown to a model, or put in a preamble or an event.

use std::borrow::Cow;
use std::ffi::{OsStr, OsString};
use std::sync::LazyLock;

/// Names ending so are secrets.
const SECRET_SUFFIXES: &[&str] = &["_API_KEY", "_SECRET", "_TOKEN", "_PASSWORD", "_CREDENTIAL"];
/// Values shorter than this are not redacted (they would match ordinary text).
const MIN_SECRET_CHARS: usize = 8;

/// Whether a variable is a secret, by its name.
pub fn is_secret(name: &str) -> bool {
    let upper = name.to_ascii_uppercase();
    SECRET_SUFFIXES.iter().any(|s| upper.ends_with(s))
}

/// This process's environment, each variable with whether it is a secret: read once (a fan-out starts
/// many commands at once), since `trellis` never changes its own environment (setting a variable is
/// `unsafe`, which the workspace forbids).
static ENVIRONMENT: LazyLock<Vec<(OsString, OsString, bool)>> = LazyLock::new(|| {
    std::env::vars_os()
        .map(|(name, value)| {
            let secret = is_secret(&name.to_string_lossy());
            (name, value, secret)
        })
        .collect()
});

/// The environment a command gets: this process's, without its secrets, except those `pass` names.
pub fn child_env(pass: &[String]) -> impl Iterator<Item = (&'static OsStr, &'static OsStr)> {
    ENVIRONMENT
        .iter()
        .filter(move |(name, _, secret)| !secret || pass.iter().any(|p| OsStr::new(p) == name))
        .map(|(name, value, _)| (name.as_os_str(), value.as_os_str()))
}

/// The secret values of this process's environment, longest first (so a value containing another is
/// replaced whole).
static SECRETS: LazyLock<Vec<(String, String)>> = LazyLock::new(|| {
    let mut secrets: Vec<(String, String)> = std::env::vars()
        .filter(|(name, value)| is_secret(name) && value.chars().count() >= MIN_SECRET_CHARS)
        .collect();
    secrets.sort_by_key(|(_, value)| std::cmp::Reverse(value.len()));
    secrets
});

/// `text` with every known secret value replaced by `[redacted NAME]`.
pub fn redact(text: &str) -> Cow<'_, str> {
    let mut text = Cow::Borrowed(text);
    for (name, value) in SECRETS.iter() {
        if text.contains(value.as_str()) {
            text = Cow::Owned(text.replace(value.as_str(), &format!("[redacted {name}]")));
        }
    }
    text
}

/// `bytes` with every known secret value redacted, or `None` when none occurs in them.
pub fn redact_bytes(bytes: &[u8]) -> Option<Vec<u8>> {
    let found = SECRETS
        .iter()
        .any(|(_, value)| memchr::memmem::find(bytes, value.as_bytes()).is_some());
    found.then(|| {
        redact(&String::from_utf8_lossy(bytes))
            .into_owned()
            .into_bytes()
    })
}

/// A finished command's log file, whole, with known secret values redacted in the file too.
#[allow(
    clippy::disallowed_methods,
    reason = "called on the blocking pool when a command has ended"
)]
pub fn redact_file(path: &std::path::Path) -> std::io::Result<Vec<u8>> {
    let bytes = std::fs::read(path)?;
    match redact_bytes(&bytes) {
        Some(redacted) => {
            std::fs::write(path, &redacted)?;
            Ok(redacted)
        }
        None => Ok(bytes),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_are_recognised_by_suffix() {
        for name in [
            "ANTHROPIC_API_KEY",
            "aws_secret",
            "GITHUB_TOKEN",
            "DB_PASSWORD",
            "X_CREDENTIAL",
        ] {
            assert!(is_secret(name), "{name}");
        }
        for name in ["PATH", "HOME", "TOKENIZERS_PARALLELISM"] {
            assert!(!is_secret(name), "{name}");
        }
    }
}
