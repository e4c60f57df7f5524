//! The model stylesheet: CSS-like rules that assign models to nodes. This module parses the text; the
//! workflow crate applies it (specificity, explicit attributes win).
//!
//! ```text
//! sheet     := rule*
//! rule      := selector (',' selector)* '{' (decl (';' decl)* ';'?)? '}'
//! selector  := '*' | '#' ID | '.' CLASS | SHAPE
//! decl      := PROPERTY ':' VALUE             VALUE runs to ';' or '}', or is quoted
//! ```
//! `/* */` comments are allowed between tokens. Parsing recovers at the end of a bad rule, so every
//! problem in the sheet is reported. Spans are byte offsets into the stylesheet text.

use crate::span::{Span, Spanned};

/// What a rule's selector matches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Selector {
    Universal,
    Shape(String),
    Class(String),
    Id(String),
}

impl Selector {
    /// Specificity: `*` < shape < `.class` < `#id`.
    pub fn specificity(&self) -> u8 {
        match self {
            Selector::Universal => 0,
            Selector::Shape(_) => 1,
            Selector::Class(_) => 2,
            Selector::Id(_) => 3,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Declaration {
    pub property: Spanned<String>,
    pub value: Spanned<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StyleRule {
    pub selectors: Vec<Spanned<Selector>>,
    pub declarations: Vec<Declaration>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Stylesheet {
    pub rules: Vec<StyleRule>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StylesheetSyntaxError {
    pub message: String,
    pub span: Span,
}

/// Parses a stylesheet, returning every rule that parsed and every error.
pub fn parse_stylesheet(text: &str) -> (Stylesheet, Vec<StylesheetSyntaxError>) {
    let mut parser = SheetParser {
        text,
        pos: 0,
        errors: Vec::new(),
    };
    let mut sheet = Stylesheet::default();
    loop {
        parser.skip_trivia();
        if parser.pos >= text.len() {
            break;
        }
        if let Some(rule) = parser.parse_rule() {
            sheet.rules.push(rule);
        }
    }
    (sheet, parser.errors)
}

struct SheetParser<'a> {
    text: &'a str,
    pos: usize,
    errors: Vec<StylesheetSyntaxError>,
}

fn is_name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.')
}

impl<'a> SheetParser<'a> {
    fn rest(&self) -> &'a str {
        &self.text[self.pos..]
    }

    fn skip_trivia(&mut self) {
        loop {
            let trimmed = self.rest().trim_start();
            self.pos = self.text.len() - trimmed.len();
            if let Some(comment) = trimmed.strip_prefix("/*") {
                if let Some(i) = comment.find("*/") {
                    self.pos += i + 4;
                } else {
                    self.error("unterminated comment", self.pos, self.pos + 2);
                    self.pos = self.text.len();
                }
            } else {
                return;
            }
        }
    }

    fn error(&mut self, message: impl Into<String>, start: usize, end: usize) {
        self.errors.push(StylesheetSyntaxError {
            message: message.into(),
            span: Span::from_range(start..end).snapped(self.text),
        });
    }

    fn name(&mut self, allow_dots: bool) -> &str {
        let start = self.pos;
        let len = self
            .rest()
            .find(|c: char| !(is_name_char(c) && (allow_dots || c != '.')))
            .unwrap_or(self.rest().len());
        self.pos += len;
        &self.text[start..self.pos]
    }

    /// Skips past the end of the current rule after an error.
    fn recover(&mut self) {
        self.pos = self
            .rest()
            .find('}')
            .map_or(self.text.len(), |i| self.pos + i + 1);
    }

    fn parse_rule(&mut self) -> Option<StyleRule> {
        let mut selectors = Vec::new();
        loop {
            self.skip_trivia();
            let start = self.pos;
            let selector = match self.rest().chars().next() {
                Some('*') => {
                    self.pos += 1;
                    Some(Selector::Universal)
                }
                Some('#') => {
                    self.pos += 1;
                    Some(Selector::Id(self.name(false).to_owned()))
                        .filter(|s| !matches!(s, Selector::Id(n) if n.is_empty()))
                }
                Some('.') => {
                    self.pos += 1;
                    Some(Selector::Class(self.name(false).to_owned()))
                        .filter(|s| !matches!(s, Selector::Class(n) if n.is_empty()))
                }
                Some(c) if c.is_ascii_alphabetic() => {
                    Some(Selector::Shape(self.name(false).to_owned()))
                }
                _ => None,
            };
            let Some(selector) = selector else {
                let end = crate::span::char_end(self.text, self.pos.max(start));
                let found = &self.text[start..end];
                self.error(
                    format!(
                        "expected a selector (`*`, a shape, `.class` or `#id`), found `{found}`"
                    ),
                    start,
                    end.max(start),
                );
                self.recover();
                return None;
            };
            selectors.push(Spanned::new(selector, Span::from_range(start..self.pos)));
            self.skip_trivia();
            if self.rest().starts_with(',') {
                self.pos += 1;
                continue;
            }
            break;
        }
        if !self.rest().starts_with('{') {
            let at = self.pos;
            self.error(
                "expected `{` after the selector",
                at,
                (at + 1).min(self.text.len()),
            );
            self.recover();
            return None;
        }
        let declarations = self.parse_declarations();
        Some(StyleRule {
            selectors,
            declarations,
        })
    }

    /// Declarations after a rule's `{`, through its `}`.
    fn parse_declarations(&mut self) -> Vec<Declaration> {
        let open = self.pos;
        self.pos += 1;
        let mut declarations = Vec::new();
        loop {
            self.skip_trivia();
            if self.rest().starts_with('}') {
                self.pos += 1;
                break;
            }
            if self.rest().starts_with(';') {
                self.pos += 1;
                continue;
            }
            if self.pos >= self.text.len() {
                self.error("unclosed `{` in stylesheet rule", open, open + 1);
                break;
            }
            let prop_start = self.pos;
            let property = self.name(false).to_owned();
            if property.is_empty() {
                let end = (prop_start + 1).min(self.text.len());
                self.error("expected a property name", prop_start, end);
                self.recover();
                break;
            }
            let property = Spanned::new(property, Span::from_range(prop_start..self.pos));
            self.skip_trivia();
            if !self.rest().starts_with(':') {
                let at = self.pos;
                self.error(
                    format!("expected `:` after `{}`", property.value),
                    at,
                    (at + 1).min(self.text.len()),
                );
                self.recover();
                break;
            }
            self.pos += 1;
            self.skip_trivia();
            let value_start = self.pos;
            let value = if let Some(quote) = self
                .rest()
                .chars()
                .next()
                .filter(|c| *c == '"' || *c == '\'')
            {
                if let Some(end) = self.rest()[1..].find(quote) {
                    self.pos += end + 2;
                    self.text[value_start + 1..self.pos - 1].to_owned()
                } else {
                    self.error("unterminated quoted value", value_start, value_start + 1);
                    self.pos = self.text.len();
                    break;
                }
            } else {
                let len = self
                    .rest()
                    .find([';', '}', '\n'])
                    .unwrap_or(self.rest().len());
                self.pos += len;
                self.text[value_start..self.pos].trim_end().to_owned()
            };
            if value.is_empty() {
                self.error(
                    format!("missing value for `{}`", property.value),
                    prop_start,
                    self.pos,
                );
                continue;
            }
            let value_end = value_start + self.text[value_start..self.pos].trim_end().len();
            declarations.push(Declaration {
                property,
                value: Spanned::new(value, Span::from_range(value_start..value_end)),
            });
        }
        declarations
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_reference_example() {
        let (sheet, errors) = parse_stylesheet(
            "\n  *        { model: claude-haiku-4-5;reasoning_effort: low; }\n  .coding  { model: claude-sonnet-4-5;reasoning_effort: high; }\n  #review  { model: claude-sonnet-4-5;reasoning_effort: high; }\n",
        );
        assert!(errors.is_empty(), "{errors:?}");
        assert_eq!(sheet.rules.len(), 3);
        assert_eq!(
            sheet.rules[1].selectors[0].value,
            Selector::Class("coding".into())
        );
        assert_eq!(
            sheet.rules[2].declarations[0].value.value,
            "claude-sonnet-4-5"
        );
        assert_eq!(
            sheet.rules[0].declarations[1].property.value,
            "reasoning_effort"
        );
    }

    #[test]
    fn recovers_after_a_bad_rule() {
        let (sheet, errors) =
            parse_stylesheet("?? { model: x } box, tab { model: y } #a { model }");
        assert_eq!(sheet.rules.len(), 2, "{sheet:?} {errors:?}");
        assert_eq!(sheet.rules[0].selectors.len(), 2);
        assert_eq!(errors.len(), 2, "{errors:?}");
    }
}
