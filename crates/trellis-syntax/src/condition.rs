//! The edge condition language, parsed into an expression tree. Evaluation lives in
//! `trellis-workflow`, which gives the keys their meaning; this module knows only the grammar.
//!
//! ```text
//! expr   := and ('||' and)*
//! and    := unary ('&&' unary)*             `&&` binds tighter than `||`
//! unary  := '!' unary | '(' expr ')' | clause
//! clause := key (op value)?                 a bare key is a truthiness check
//! op     := '=' | '==' | '!=' | '>' | '<' | '>=' | '<=' | 'contains' | 'matches'
//! key    := [A-Za-z_][A-Za-z0-9_.-]*        `outcome`, `preferred_label`, `context.KEY`, `KEY`
//! value  := '"' … '"' | '\'' … '\'' | raw
//! ```
//!
//! A raw value runs to the next space, `&&`, `||`, or a `)` that closes a group; parentheses inside a raw
//! value must balance, so `matches ^(a|b)$` works. Parentheses for grouping are an extension of the
//! reference grammar. Spans are byte offsets into the condition text.

use crate::span::{Span, Spanned};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CompareOp {
    Eq,
    Ne,
    Gt,
    Lt,
    Ge,
    Le,
    Contains,
    Matches,
}

impl CompareOp {
    pub fn as_str(self) -> &'static str {
        match self {
            CompareOp::Eq => "=",
            CompareOp::Ne => "!=",
            CompareOp::Gt => ">",
            CompareOp::Lt => "<",
            CompareOp::Ge => ">=",
            CompareOp::Le => "<=",
            CompareOp::Contains => "contains",
            CompareOp::Matches => "matches",
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub enum CondExpr {
    Or(Vec<CondExpr>),
    And(Vec<CondExpr>),
    Not(Box<CondExpr>),
    Compare {
        key: Spanned<String>,
        op: Spanned<CompareOp>,
        value: Spanned<String>,
    },
    Truthy {
        key: Spanned<String>,
    },
}

/// A syntax error in a condition, with its span inside the condition text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConditionSyntaxError {
    pub message: String,
    pub span: Span,
    pub help: Option<String>,
}

/// Parses a condition. An empty condition is an error here; callers decide what an empty attribute means.
pub fn parse_condition(text: &str) -> Result<CondExpr, ConditionSyntaxError> {
    let mut parser = CondParser {
        text,
        pos: 0,
        depth: 0,
    };
    let expr = parser.parse_or()?;
    parser.skip_space();
    if parser.pos < text.len() {
        let rest = parser.rest();
        let span = parser.span_here(rest.find(char::is_whitespace).unwrap_or(rest.len()).max(1));
        let help = if rest.starts_with(')') {
            "this `)` has no matching `(`".to_owned()
        } else {
            "join clauses with `&&` or `||`; quote values that contain spaces".to_owned()
        };
        return Err(ConditionSyntaxError {
            message: format!("unexpected `{}`", parser.word_at()),
            span,
            help: Some(help),
        });
    }
    Ok(expr)
}

/// How deep `!` and `(` may nest: the parser recurses, and the stack is finite.
const MAX_NESTING: usize = 64;

struct CondParser<'a> {
    text: &'a str,
    pos: usize,
    depth: usize,
}

impl<'a> CondParser<'a> {
    fn rest(&self) -> &'a str {
        &self.text[self.pos..]
    }

    fn skip_space(&mut self) {
        self.pos += self.rest().len() - self.rest().trim_start().len();
    }

    fn span_here(&self, len: usize) -> Span {
        Span::from_range(self.pos..(self.pos + len).min(self.text.len())).snapped(self.text)
    }

    fn word_at(&self) -> String {
        let rest = self.rest();
        rest[..rest.find(char::is_whitespace).unwrap_or(rest.len())]
            .chars()
            .take(40)
            .collect()
    }

    fn error<T>(
        &self,
        message: impl Into<String>,
        len: usize,
        help: Option<&str>,
    ) -> Result<T, ConditionSyntaxError> {
        Err(ConditionSyntaxError {
            message: message.into(),
            span: self.span_here(len),
            help: help.map(str::to_owned),
        })
    }

    fn eat(&mut self, token: &str) -> bool {
        self.skip_space();
        if self.rest().starts_with(token) {
            self.pos += token.len();
            true
        } else {
            false
        }
    }

    fn parse_or(&mut self) -> Result<CondExpr, ConditionSyntaxError> {
        let mut terms = vec![self.parse_and()?];
        while self.eat("||") {
            terms.push(self.parse_and()?);
        }
        Ok(if terms.len() == 1 {
            terms.pop().expect("one term")
        } else {
            CondExpr::Or(terms)
        })
    }

    fn parse_and(&mut self) -> Result<CondExpr, ConditionSyntaxError> {
        let mut terms = vec![self.parse_unary()?];
        while self.eat("&&") {
            terms.push(self.parse_unary()?);
        }
        Ok(if terms.len() == 1 {
            terms.pop().expect("one term")
        } else {
            CondExpr::And(terms)
        })
    }

    fn parse_unary(&mut self) -> Result<CondExpr, ConditionSyntaxError> {
        self.skip_space();
        if self.depth >= MAX_NESTING {
            return self.error(
                format!("the condition nests `!` and `(` more than {MAX_NESTING} deep"),
                1,
                Some("simplify the condition"),
            );
        }
        if self.rest().starts_with('!') && !self.rest().starts_with("!=") {
            self.pos += 1;
            self.depth += 1;
            let inner = self.parse_unary();
            self.depth -= 1;
            return Ok(CondExpr::Not(Box::new(inner?)));
        }
        if self.rest().starts_with('(') {
            let open = self.pos;
            self.pos += 1;
            self.depth += 1;
            let inner = self.parse_or();
            self.depth -= 1;
            let inner = inner?;
            if !self.eat(")") {
                return Err(ConditionSyntaxError {
                    message: "unclosed `(`".into(),
                    span: Span::from_range(open..open + 1),
                    help: Some("add the matching `)`".into()),
                });
            }
            return Ok(inner);
        }
        self.parse_clause()
    }

    fn parse_clause(&mut self) -> Result<CondExpr, ConditionSyntaxError> {
        self.skip_space();
        let start = self.pos;
        let key_len = self
            .rest()
            .char_indices()
            .find(|&(i, c)| {
                !(c.is_ascii_alphanumeric() || c == '_' || (i > 0 && matches!(c, '.' | '-')))
            })
            .map_or(self.rest().len(), |(i, _)| i);
        if key_len == 0 || self.rest().starts_with(|c: char| c.is_ascii_digit()) {
            if self.pos >= self.text.len() {
                let what = if self.text.trim().is_empty() {
                    "the condition is empty"
                } else {
                    "the condition ends too early"
                };
                return self.error(
                    format!("{what}: expected a key"),
                    0,
                    Some("conditions look like `outcome=success` or `context.score > 80`"),
                );
            }
            return self.error(
                format!("expected a key, found `{}`", self.word_at()),
                self.word_at().len().max(1),
                Some("keys are `outcome`, `preferred_label`, `context.KEY` or a context key"),
            );
        }
        self.pos += key_len;
        let key = Spanned::new(
            self.text[start..self.pos].to_owned(),
            Span::from_range(start..self.pos),
        );
        self.skip_space();
        let op_start = self.pos;
        let rest = self.rest();
        let op = if rest.is_empty()
            || rest.starts_with("&&")
            || rest.starts_with("||")
            || rest.starts_with(')')
        {
            return Ok(CondExpr::Truthy { key });
        } else if let Some((op, len)) = [
            ("==", CompareOp::Eq),
            ("!=", CompareOp::Ne),
            (">=", CompareOp::Ge),
            ("<=", CompareOp::Le),
            ("=", CompareOp::Eq),
            (">", CompareOp::Gt),
            ("<", CompareOp::Lt),
        ]
        .into_iter()
        .find(|(sym, _)| rest.starts_with(sym))
        .map(|(sym, op)| (op, sym.len()))
        {
            self.pos += len;
            op
        } else if let Some(op) = [
            ("contains", CompareOp::Contains),
            ("matches", CompareOp::Matches),
        ]
        .into_iter()
        .find(|(word, _)| {
            rest.starts_with(word) && rest[word.len()..].starts_with(char::is_whitespace)
        })
        .map(|(word, op)| {
            self.pos += word.len();
            op
        }) {
            op
        } else {
            return self.error(
                format!(
                    "expected an operator after `{}`, found `{}`",
                    key.value,
                    self.word_at()
                ),
                self.word_at().len().max(1),
                Some(
                    "operators are = != > < >= <= contains matches; combine clauses with && and ||",
                ),
            );
        };
        let op = Spanned::new(op, Span::from_range(op_start..self.pos));
        let value = self.parse_value(&key.value, op.value)?;
        Ok(CondExpr::Compare { key, op, value })
    }

    fn parse_value(
        &mut self,
        key: &str,
        op: CompareOp,
    ) -> Result<Spanned<String>, ConditionSyntaxError> {
        self.skip_space();
        let start = self.pos;
        let rest = self.rest();
        if let Some(quote) = rest.chars().next().filter(|c| *c == '"' || *c == '\'') {
            let Some(end) = rest[1..].find(quote) else {
                return self.error("unterminated quoted value", 1, Some("close the quote"));
            };
            self.pos += end + 2;
            return Ok(Spanned::new(
                rest[1..=end].to_owned(),
                Span::from_range(start..self.pos),
            ));
        }
        let mut depth = 0usize;
        let mut len = rest.len();
        for (i, c) in rest.char_indices() {
            let tail = &rest[i..];
            if c.is_whitespace()
                || (depth == 0 && (tail.starts_with("&&") || tail.starts_with("||") || c == ')'))
            {
                len = i;
                break;
            }
            match c {
                '(' => depth += 1,
                ')' => depth -= 1,
                _ => {}
            }
        }
        if len == 0 {
            return self.error(
                format!("missing value after `{key} {}`", op.as_str()),
                0,
                Some("write a value, or `\"\"` for the empty string"),
            );
        }
        self.pos += len;
        Ok(Spanned::new(
            rest[..len].to_owned(),
            Span::from_range(start..self.pos),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(text: &str) -> String {
        fn go(e: &CondExpr) -> String {
            match e {
                CondExpr::Or(t) => {
                    format!("({})", t.iter().map(go).collect::<Vec<_>>().join(" || "))
                }
                CondExpr::And(t) => {
                    format!("({})", t.iter().map(go).collect::<Vec<_>>().join(" && "))
                }
                CondExpr::Not(e) => format!("!{}", go(e)),
                CondExpr::Compare { key, op, value } => {
                    format!("[{} {} {}]", key.value, op.value.as_str(), value.value)
                }
                CondExpr::Truthy { key } => format!("[{}]", key.value),
            }
        }
        go(&parse_condition(text).unwrap())
    }

    #[test]
    fn precedence_and_grouping() {
        assert_eq!(
            shape("outcome=success && context.ready=true || context.override"),
            "(([outcome = success] && [context.ready = true]) || [context.override])"
        );
        assert_eq!(shape("a && (b || c)"), "([a] && ([b] || [c]))");
        assert_eq!(shape("!outcome=success"), "![outcome = success]");
        assert_eq!(shape("!(a || b)"), "!([a] || [b])");
    }

    #[test]
    fn operators_and_values() {
        assert_eq!(shape("context.score > 80"), "[context.score > 80]");
        assert_eq!(shape("context.count<=10"), "[context.count <= 10]");
        assert_eq!(shape("outcome!=fail"), "[outcome != fail]");
        assert_eq!(
            shape("context.log contains error"),
            "[context.log contains error]"
        );
        assert_eq!(
            shape(r"context.version matches ^v\d+"),
            r"[context.version matches ^v\d+]"
        );
        assert_eq!(shape("(x matches ^(a|b)$)"), "[x matches ^(a|b)$]");
        assert_eq!(
            shape("msg contains \"two words\""),
            "[msg contains two words]"
        );
        assert_eq!(shape("a == 'x'"), "[a = x]");
        assert_eq!(
            shape("internal.retry_count.plan >= 2"),
            "[internal.retry_count.plan >= 2]"
        );
    }

    #[test]
    fn errors_point_at_the_problem() {
        let err = parse_condition("outcome=").unwrap_err();
        assert!(err.message.contains("missing value"), "{err:?}");
        let err = parse_condition("a && ").unwrap_err();
        assert!(err.message.contains("ends too early"), "{err:?}");
        let err = parse_condition("a ~ b").unwrap_err();
        assert_eq!(err.span, Span::new(2, 3));
        let err = parse_condition("(a || b").unwrap_err();
        assert_eq!(err.message, "unclosed `(`");
        let err = parse_condition("a) ").unwrap_err();
        assert!(err.help.unwrap().contains("no matching"));
        let err = parse_condition("msg contains two words").unwrap_err();
        assert_eq!(err.message, "unexpected `words`");
        assert!(
            parse_condition("   ")
                .unwrap_err()
                .message
                .contains("empty")
        );
    }
}
