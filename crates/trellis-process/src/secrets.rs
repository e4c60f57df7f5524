//! Secrets in the environment, keeping them out of what children see and what is recorded, and the
//! random tokens that guard the servers Trellis starts.
//!
//! A variable is a **secret** when its name, split at `_` into words, has a word that names one
//! (`SECRET`, `TOKEN`, `PASSWORD`, `PASSWD`, `PASS`, `CREDENTIAL`, `APIKEY`, `PRIVATE`, each also
//! plural) or two words that do (`API KEY`, `ACCESS KEY`, `SIGNING KEY`, `ENCRYPTION KEY`,
//! `MASTER KEY`, `CLIENT KEY`), or when its value is a URL with a password in it
//! (`postgres://user:password@host/db`): `ANTHROPIC_API_KEY`, `API_KEY`, `AWS_SECRET_ACCESS_KEY`,
//! `GITHUB_TOKEN`, `DB_PASS`, `GOOGLE_APPLICATION_CREDENTIALS_JSON` and `DATABASE_URL` above all are.
//! `TOKENIZERS_PARALLELISM` is not (`TOKENIZERS` is no such word).
//!
//! Commands that a workflow or a model wrote never get secrets — a node passes a variable on by naming
//! it in its `env` attribute — and, as a second line of defence, secret values (and a URL's password
//! on its own) are redacted from what commands print before it is recorded, shown to a model, or put in
//! a preamble or an event: as written, and in the encodings a leak would use (base64 at any alignment,
//! standard or URL-safe, hexadecimal and URL-encoding).

use std::borrow::Cow;
use std::ffi::{OsStr, OsString};
use std::sync::LazyLock;

/// 32 random letters and digits from the kernel's generator: a token a server asks for.
#[allow(
    clippy::disallowed_methods,
    reason = "/dev/urandom answers at once: no wait to keep off an async path"
)]
pub fn random_token() -> std::io::Result<String> {
    use std::io::Read as _;
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    let mut bytes = [0u8; 32];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut bytes)?;
    Ok(bytes
        .iter()
        .map(|b| char::from(ALPHABET[usize::from(*b) % ALPHABET.len()]))
        .collect())
}

/// Name words that make a variable a secret.
const SECRET_WORDS: &[&str] = &[
    "SECRET",
    "SECRETS",
    "TOKEN",
    "TOKENS",
    "PASSWORD",
    "PASSWORDS",
    "PASSWD",
    "PASS",
    "CREDENTIAL",
    "CREDENTIALS",
    "APIKEY",
    "PRIVATE",
];
/// Words that, before `KEY`, make a variable a secret.
const KEY_KINDS: &[&str] = &["API", "ACCESS", "SIGNING", "ENCRYPTION", "MASTER", "CLIENT"];
/// Values shorter than this are not redacted (they would match ordinary text).
const MIN_SECRET_CHARS: usize = 8;

/// Whether a variable is a secret, by its name.
pub fn is_secret(name: &str) -> bool {
    let upper = name.to_ascii_uppercase();
    let words: Vec<&str> = upper.split(['_', '-', '.']).collect();
    words.iter().any(|w| SECRET_WORDS.contains(w))
        || words
            .windows(2)
            .any(|pair| pair[1] == "KEY" && KEY_KINDS.contains(&pair[0]))
}

/// The password of a URL with credentials (`scheme://user:password@host...`) in `value`, if any.
pub fn url_password(value: &str) -> Option<&str> {
    let rest = &value[value.find("://")? + 3..];
    let authority = rest.split(['/', '?', '#']).next()?;
    let (userinfo, _) = authority.rsplit_once('@')?;
    let (_, password) = userinfo.split_once(':')?;
    (!password.is_empty()).then_some(password)
}

/// Whether a variable is a secret, by its name or its value.
fn is_secret_variable(name: &str, value: &OsStr) -> bool {
    is_secret(name) || value.to_str().and_then(url_password).is_some()
}

/// This process's environment, each variable with whether it is a secret: read once (a fan-out starts
/// many commands at once), since `trellis` never changes its own environment (setting a variable is
/// `unsafe`, which the workspace forbids).
static ENVIRONMENT: LazyLock<Vec<(OsString, OsString, bool)>> = LazyLock::new(|| {
    std::env::vars_os()
        .map(|(name, value)| {
            let secret = is_secret_variable(&name.to_string_lossy(), &value);
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

/// What to look for in output: every form of every secret value of this process's environment (and
/// those [`register`]ed since), with the name it is redacted as, longest first (so a form containing
/// another is replaced whole).
static SECRETS: LazyLock<parking_lot::RwLock<Vec<(String, String)>>> = LazyLock::new(|| {
    let mut forms: Vec<(String, String)> = ENVIRONMENT
        .iter()
        .filter(|(_, _, secret)| *secret)
        .filter_map(|(name, value, _)| Some((name.to_str()?, value.to_str()?)))
        .flat_map(|(name, value)| forms_of(name, value))
        .collect();
    order(&mut forms);
    parking_lot::RwLock::new(forms)
});

/// The forms of a secret `value` (and of a URL's password in it) to redact as `name`.
fn forms_of(name: &str, value: &str) -> Vec<(String, String)> {
    let password = url_password(value).map(str::to_owned);
    std::iter::once(value.to_owned())
        .chain(password)
        .filter(|v| v.chars().count() >= MIN_SECRET_CHARS)
        .flat_map(|v| encodings(&v))
        .map(|form| (name.to_owned(), form))
        .collect()
}

/// Longest first; equal forms side by side, so each is searched for once.
fn order(forms: &mut Vec<(String, String)>) {
    forms.sort_by(|a, b| b.1.len().cmp(&a.1.len()).then_with(|| a.1.cmp(&b.1)));
    forms.dedup_by(|a, b| a.1 == b.1);
}

/// Redacts `value` as `[redacted NAME]` from now on, as a secret of the environment is: for secrets a
/// configuration file holds (an MCP server's `env` or headers). An `Authorization` value's credential
/// (what follows `Bearer `, `Basic `, …) is redacted on its own too.
pub fn register(name: &str, value: &str) {
    let credential = value
        .split_once(' ')
        .map(|(_, rest)| rest.trim())
        .filter(|rest| !rest.is_empty());
    let mut added = forms_of(name, value);
    if let Some(credential) = credential {
        added.extend(forms_of(name, credential));
    }
    if added.is_empty() {
        return;
    }
    let mut forms = SECRETS.write();
    forms.extend(added);
    order(&mut forms);
}

fn known() -> parking_lot::RwLockReadGuard<'static, Vec<(String, String)>> {
    SECRETS.read()
}

/// `value` as written and in the encodings a leak would use: base64 (standard and URL-safe, at each
/// of the three alignments it can take inside a longer encoded text, without the partial groups at
/// either end), hexadecimal (both cases) and URL-encoding.
fn encodings(value: &str) -> Vec<String> {
    use base64::Engine as _;
    use std::fmt::Write as _;
    let mut forms = vec![value.to_owned()];
    for offset in 0..3 {
        let mut bytes = vec![0u8; offset];
        bytes.extend_from_slice(value.as_bytes());
        for engine in [
            &base64::engine::general_purpose::STANDARD,
            &base64::engine::general_purpose::URL_SAFE,
        ] {
            let encoded = engine.encode(&bytes);
            // The first group mixes in the offset's bytes, the last one what follows the value.
            let start = if offset == 0 { 0 } else { 4 };
            let end = encoded.len().saturating_sub(4);
            if end >= start + MIN_SECRET_CHARS {
                forms.push(encoded[start..end].to_owned());
            }
        }
    }
    let hex = value.bytes().fold(String::new(), |mut hex, b| {
        let _ = write!(hex, "{b:02x}");
        hex
    });
    forms.push(hex.to_ascii_uppercase());
    forms.push(hex);
    let url_encoded: String =
        percent_encoding::utf8_percent_encode(value, percent_encoding::NON_ALPHANUMERIC).collect();
    forms.push(url_encoded);
    forms.sort();
    forms.dedup();
    forms
}

/// `text` with every known secret value replaced by `[redacted NAME]`.
pub fn redact(text: &str) -> Cow<'_, str> {
    let mut text = Cow::Borrowed(text);
    for (name, value) in known().iter() {
        if text.contains(value.as_str()) {
            text = Cow::Owned(text.replace(value.as_str(), &format!("[redacted {name}]")));
        }
    }
    text
}

/// `bytes` with every known secret value redacted, or `None` when none occurs in them.
pub fn redact_bytes(bytes: &[u8]) -> Option<Vec<u8>> {
    let found = known()
        .iter()
        .any(|(_, value)| memchr::memmem::find(bytes, value.as_bytes()).is_some());
    found.then(|| {
        redact(&String::from_utf8_lossy(bytes))
            .into_owned()
            .into_bytes()
    })
}

/// Keeps this process's memory and environment (provider keys) from other processes of the same user:
/// `/proc/PID/environ` and `/proc/PID/mem` become root's. For a process that runs commands; root
/// reads them anyway, and the sandbox's PID namespace is what hides Trellis from its children then.
pub fn keep_this_process_private() {
    let _ = nix::sys::prctl::set_dumpable(false);
}

/// A finished command's log file, whole, with known secret values redacted in the file too. It
/// blocks: called on the blocking pool when a command has ended.
pub fn redact_file(path: &std::path::Path) -> std::io::Result<Vec<u8>> {
    use crate::files::{Access, open_record};
    use std::io::{Read as _, Write as _};
    // The log is in a stage directory the command may have written: a symlink put in its place, or
    // in place of a folder on its way, is neither read nor written through.
    let mut bytes = Vec::new();
    open_record(path, Access::Read)?.read_to_end(&mut bytes)?;
    match redact_bytes(&bytes) {
        Some(redacted) => {
            open_record(path, Access::Replace)?.write_all(&redacted)?;
            Ok(redacted)
        }
        None => Ok(bytes),
    }
}

#[cfg(test)]
mod tests {

    #[test]
    fn a_registered_value_and_its_credential_are_redacted_from_then_on() {
        let value = "Bearer q8w7e6r5t4y3u2i1";
        assert_eq!(redact(value), value);
        register("Authorization", value);
        assert_eq!(redact(value), "[redacted Authorization]");
        assert_eq!(
            redact("token=q8w7e6r5t4y3u2i1;"),
            "token=[redacted Authorization];"
        );
        // Short values would match ordinary text: not taken.
        register("Cookie", "a=1");
        assert_eq!(redact("a=1"), "a=1");
    }

    use super::*;

    #[test]
    #[allow(clippy::disallowed_methods, reason = "the test sets up files")]
    fn a_log_replaced_by_a_symlink_is_neither_read_nor_written_through() {
        let dir = tempfile::tempdir().unwrap();
        let outside = dir.path().join("outside.txt");
        std::fs::write(&outside, "token=sk-ant-0123456789abcdef0123456789").unwrap();
        let log = dir.path().join("stdout.log");
        std::os::unix::fs::symlink(&outside, &log).unwrap();
        assert!(redact_file(&log).is_err());
        assert_eq!(
            std::fs::read_to_string(&outside).unwrap(),
            "token=sk-ant-0123456789abcdef0123456789"
        );
    }

    #[test]
    fn secrets_are_recognised_by_the_words_of_their_names() {
        for name in [
            "ANTHROPIC_API_KEY",
            "API_KEY",
            "aws_secret",
            "AWS_SECRET_ACCESS_KEY",
            "AWS_ACCESS_KEY_ID",
            "GITHUB_TOKEN",
            "DB_PASSWORD",
            "DB_PASS",
            "X_CREDENTIAL",
            "GOOGLE_APPLICATION_CREDENTIALS_JSON",
            "SSH_PRIVATE_KEY",
            "OPENAI_APIKEY",
        ] {
            assert!(is_secret(name), "{name}");
        }
        for name in [
            "PATH",
            "HOME",
            "PWD",
            "TOKENIZERS_PARALLELISM",
            "PASSTHROUGH",
            "KEYBOARD",
            "SSH_AUTH_SOCK",
        ] {
            assert!(!is_secret(name), "{name}");
        }
    }

    #[test]
    fn a_url_with_a_password_holds_a_secret() {
        assert_eq!(url_password("postgres://u:pw0rd@h/db"), Some("pw0rd"));
        assert_eq!(url_password("https://user@host/x"), None);
        assert_eq!(url_password("https://host/x?a=b:c@d"), None);
        assert_eq!(url_password("plain text"), None);
        assert!(is_secret_variable(
            "DATABASE_URL",
            OsStr::new("postgres://u:pw@h/db")
        ));
        assert!(!is_secret_variable(
            "HOMEPAGE",
            OsStr::new("https://example.org/")
        ));
    }

    #[test]
    fn every_encoding_of_a_value_is_found_at_any_offset() {
        use base64::Engine as _;
        let secret = "sk-test-0123456789abcdef";
        let forms = encodings(secret);
        for prefix in ["", "A", "AB", "XYZ=", "PATH=/usr/bin\0"] {
            let leaked = format!("{prefix}SECRET={secret}\0HOME=/root");
            let encoded = base64::engine::general_purpose::STANDARD.encode(leaked.as_bytes());
            assert!(
                forms.iter().any(|f| encoded.contains(f.as_str())),
                "base64 after {prefix:?}: {encoded}"
            );
        }
        assert!(
            forms
                .iter()
                .any(|f| f.starts_with("736b2d74657374") && f.len() == 48)
        );
        assert!(forms.iter().any(|f| f == "sk%2Dtest%2D0123456789abcdef"));
    }
}
