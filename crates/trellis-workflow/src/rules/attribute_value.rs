//! `attribute-value` (error): an attribute's value has the type its attribute needs.
//!
//! Durations are a number with a unit (`timeout="900s"`; a bare number is read as seconds with a
//! `duration-unit` warning), counts are whole numbers
//! (`max_visits=3`), booleans are `true` or `false`, and word-valued attributes take one of their words
//! (`retry_policy=standard`, `language=python`, `join_policy="k_of_n(2)"`; a node's `provider` and the
//! graph's `default_provider` are `anthropic`, `openai`, `gemini`, `openai-compatible` or `local`, or
//! another name of one: `claude`, `google`, `llama`, ...). A wrong value would otherwise
//! be silently ignored at run time, so it is an error:
//!
//! ```dot
//! test [shape=parallelogram, script="make test", timeout="ten minutes"]   // error: not a duration
//! ```

use std::str::FromStr;
use std::time::Duration;

use trellis_syntax::ast::Value;
use trellis_syntax::{Diagnostic, Severity};

use crate::flatten::AttrMap;
use crate::node_kind::{PROVIDER_ALIASES, PROVIDERS};
use crate::rules::{Rule, duration_unit};

pub const RULE: Rule = Rule {
    code: "attribute-value",
    severity: Severity::Error,
    summary: "attribute values have the type the attribute needs",
};

/// Reads typed values from an attribute map, reporting values of the wrong type.
pub(crate) struct AttrReader<'a> {
    pub attrs: &'a AttrMap,
    pub out: &'a mut Vec<Diagnostic>,
}

impl<'a> AttrReader<'a> {
    /// The value of `key` (borrowed from the map, not from the reader, so reading it and reporting
    /// on it go together without a copy).
    pub fn value(&self, key: &str) -> Option<&'a Value> {
        self.attrs.get(key).map(|a| &a.value)
    }

    pub fn string(&self, key: &str) -> Option<String> {
        self.value(key).map(|v| v.text.as_str().to_owned())
    }

    fn report(&mut self, key: &str, value: &Value, expected: &str, help: Option<String>) {
        let mut diagnostic = RULE
            .diagnostic(
                format!("`{key}` expects {expected}, found `{}`", value.text),
                value.span,
            )
            .with_label(format!("not {expected}"));
        diagnostic.help = help;
        self.out.push(diagnostic);
    }

    pub fn bool(&mut self, key: &str) -> Option<bool> {
        let value = self.value(key)?;
        let parsed = value.as_bool();
        if parsed.is_none() {
            self.report(key, value, "`true` or `false`", None);
        }
        parsed
    }

    pub fn int(&mut self, key: &str, min: i64) -> Option<i64> {
        let value = self.value(key)?;
        match value.as_i64() {
            Some(n) if n >= min => Some(n),
            _ => {
                let expected = match min {
                    i64::MIN..0 => "a whole number".to_owned(),
                    0 => "a whole number (0 or more)".to_owned(),
                    _ => format!("a whole number ({min} or more)"),
                };
                self.report(key, value, &expected, None);
                None
            }
        }
    }

    pub fn count(&mut self, key: &str, min: u32) -> Option<u32> {
        self.int(key, i64::from(min))
            .map(|n| u32::try_from(n).unwrap_or(u32::MAX))
    }

    /// A duration with a unit; a plain `0` is accepted as zero (used to disable timeouts), and another
    /// bare number as seconds with a warning (`duration-unit`).
    pub fn duration(&mut self, key: &str) -> Option<Duration> {
        let value = self.value(key)?;
        if value.text.trim() == "0" {
            return Some(Duration::ZERO);
        }
        if let Some(seconds) = duration_unit::seconds(key, value, self.out) {
            return Some(seconds);
        }
        let parsed = value.as_duration();
        if parsed.is_none() {
            let help = "durations are a whole number with a unit: 250ms, 30s, 15m, 2h, 1d";
            self.report(key, value, "a duration", Some(help.to_owned()));
        }
        parsed
    }

    /// One of a fixed set of words.
    pub fn word<T: FromStr>(&mut self, key: &str, words: &[&str]) -> Option<T> {
        let value = self.value(key)?;
        let parsed = value.text.parse().ok();
        if parsed.is_none() {
            self.unknown_word(key, value, words, words);
        }
        parsed
    }

    /// A provider's name as written (`provider`, `default_provider`): one of [`PROVIDERS`] or the
    /// other names they go by ([`PROVIDER_ALIASES`]).
    pub fn provider(&mut self, key: &str) -> Option<String> {
        let value = self.value(key)?;
        let name = value.text.trim();
        if !PROVIDERS.contains(&name) && !PROVIDER_ALIASES.contains(&name) {
            let spellings: Vec<&str> = PROVIDERS.iter().chain(PROVIDER_ALIASES).copied().collect();
            self.unknown_word(key, value, PROVIDERS, &spellings);
        }
        Some(value.text.to_string())
    }

    /// Reports `value` as none of `words`, with the nearest of `spellings`.
    fn unknown_word(&mut self, key: &str, value: &Value, words: &[&str], spellings: &[&str]) {
        let mut diagnostic = RULE
            .diagnostic(
                format!(
                    "`{key}` must be one of {}; found `{}`",
                    words.join(", "),
                    value.text
                ),
                value.span,
            )
            .with_label(format!("unknown {key}"));
        if let Some(near) = crate::rules::closest(&value.text, spellings.iter().copied()) {
            diagnostic = diagnostic.with_help(format!("did you mean `{near}`?"));
        }
        self.out.push(diagnostic);
    }

    /// A value parsed by `T::from_str` whose error explains itself.
    pub fn parsed<T: FromStr<Err = String>>(&mut self, key: &str, expected: &str) -> Option<T> {
        let value = self.value(key)?;
        match value.text.parse() {
            Ok(parsed) => Some(parsed),
            Err(reason) => {
                self.report(key, value, expected, Some(reason));
                None
            }
        }
    }
}
