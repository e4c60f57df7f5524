//! The DOT-subset lexer. It turns source text into tokens with spans and never fails: a bad character,
//! an unterminated string or comment becomes an error token plus a diagnostic, and lexing goes on.
//!
//! Tokens: words (identifiers, numbers, durations, bare strings such as `gpt-5.2-codex`), quoted strings,
//! punctuation `{ } [ ] = ; , ->`, the unsupported `--`, and comments (`//`, `/* */`), which are kept as
//! tokens so nothing rewrites the source. Each token records whether a line break precedes it; the parser
//! uses that to resynchronise after an error.

use crate::ast::ValueKind;
use crate::diagnostic::Diagnostic;
use crate::span::Span;

#[derive(Debug, Clone, PartialEq)]
pub enum TokenKind {
    /// A bare word with its lexical class.
    Word(ValueKind),
    /// A quoted string (boxed: most tokens are not, and a token is as large as its largest kind —
    /// inline, the parser's moves of every token cost more than the allocation saves).
    Str(Box<Quoted>),
    LBrace,
    RBrace,
    LBracket,
    RBracket,
    Equals,
    Semicolon,
    Comma,
    Arrow,
    /// `--`: an undirected edge, reported by the parser.
    UndirectedEdge,
    Comment,
    /// A character that starts no token (already reported).
    Unknown,
    Eof,
}

/// A quoted string's unescaped text and its escape offset map (see `ast::Value::offset_map`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Quoted {
    pub text: crate::ast::Text,
    pub offset_map: Vec<(u32, u32)>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Token {
    pub kind: TokenKind,
    pub span: Span,
    pub newline_before: bool,
}

/// The tokens of `text`, comments included, up to and including the end of file; lexical errors
/// go to `diagnostics`.
#[cfg(test)]
pub fn lex(text: &str, diagnostics: &mut Vec<Diagnostic>) -> Vec<Token> {
    let mut lexer = Lexer::new(text, crate::diagnostic::MAX_DIAGNOSTICS);
    let mut tokens = Vec::new();
    loop {
        let token = lexer.next_token();
        let end = token.kind == TokenKind::Eof;
        tokens.push(token);
        if end {
            break;
        }
    }
    diagnostics.append(&mut lexer.diagnostics);
    tokens
}

fn is_word_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-')
}

/// Reads tokens from source text one at a time, as the parser asks for them: a workflow's tokens
/// are never all held at once (a 10,000-node file has over 100,000).
pub struct Lexer<'a> {
    text: &'a str,
    bytes: &'a [u8],
    pos: usize,
    newline: bool,
    /// The lexical errors so far, in source order.
    pub diagnostics: Vec<Diagnostic>,
    /// How many `unexpected character` errors may still be reported (past it they are counted).
    room: usize,
    /// An unterminated string or comment ran to the end of the file.
    pub unterminated: bool,
    /// The spans of the characters that start no token (reported or not), in source order.
    pub rejected: Vec<Span>,
}

impl<'a> Lexer<'a> {
    /// A lexer at the start of `text` that reports at most `room` unexpected characters.
    pub fn new(text: &'a str, room: usize) -> Self {
        Self {
            text,
            bytes: text.as_bytes(),
            pos: 0,
            newline: true,
            diagnostics: Vec::new(),
            room,
            unterminated: false,
            rejected: Vec::new(),
        }
    }

    /// The next token, comments included; at the end of the text, [`TokenKind::Eof`] (every time).
    pub fn next_token(&mut self) -> Token {
        while let Some(&b) = self.bytes.get(self.pos) {
            let start = self.pos;
            let kind = match b {
                b'\n' => {
                    self.newline = true;
                    self.pos += 1;
                    continue;
                }
                b' ' | b'\t' | b'\r' => {
                    self.pos += 1;
                    continue;
                }
                b'/' if self.peek(1) == Some(b'/') => {
                    self.pos = self.text[start..]
                        .find('\n')
                        .map_or(self.bytes.len(), |i| start + i);
                    TokenKind::Comment
                }
                b'/' if self.peek(1) == Some(b'*') => return self.block_comment(start),
                b'"' => self.string(start),
                b'{' => self.single(TokenKind::LBrace),
                b'}' => self.single(TokenKind::RBrace),
                b'[' => self.single(TokenKind::LBracket),
                b']' => self.single(TokenKind::RBracket),
                b'=' => self.single(TokenKind::Equals),
                b';' => self.single(TokenKind::Semicolon),
                b',' => self.single(TokenKind::Comma),
                b'-' if self.peek(1) == Some(b'>') => {
                    self.pos += 2;
                    TokenKind::Arrow
                }
                b'-' if self.peek(1) == Some(b'-') => {
                    self.pos += 2;
                    TokenKind::UndirectedEdge
                }
                b if is_word_byte(b) => self.word(start),
                b'+' if self
                    .peek(1)
                    .is_some_and(|n| n.is_ascii_digit() || n == b'.') =>
                {
                    self.pos += 1;
                    self.word(start)
                }
                _ => {
                    let ch = self.text[start..].chars().next().unwrap_or('\u{fffd}');
                    self.pos += ch.len_utf8();
                    let span = Span::from_range(start..self.pos);
                    // Past the cap, garbage is counted by the parser's note, not reported.
                    if self.room > 0 {
                        self.room -= 1;
                        self.diagnostics.push(
                            Diagnostic::error(
                                "syntax",
                                format!("unexpected character `{}`", ch.escape_debug()),
                                span,
                            )
                            .with_label("not part of the workflow language"),
                        );
                    }
                    self.rejected.push(span);
                    TokenKind::Unknown
                }
            };
            return self.token(kind, start);
        }
        let end = self.bytes.len();
        Token {
            kind: TokenKind::Eof,
            span: Span::from_range(end..end),
            newline_before: true,
        }
    }

    /// How many unexpected characters were found but not reported.
    pub fn unreported(&self) -> usize {
        self.rejected.len()
            - self
                .diagnostics
                .iter()
                .filter(|d| d.message.starts_with("unexpected character"))
                .count()
    }

    fn peek(&self, ahead: usize) -> Option<u8> {
        self.bytes.get(self.pos + ahead).copied()
    }

    /// The token of `kind` from `start` to here.
    fn token(&mut self, kind: TokenKind, start: usize) -> Token {
        Token {
            kind,
            span: Span::from_range(start..self.pos),
            newline_before: std::mem::take(&mut self.newline),
        }
    }

    fn single(&mut self, kind: TokenKind) -> TokenKind {
        self.pos += 1;
        kind
    }

    fn block_comment(&mut self, start: usize) -> Token {
        if let Some(i) = self.text[start + 2..].find("*/") {
            let body = &self.text[start..start + 2 + i];
            self.pos = start + 2 + i + 2;
            let newline = body.contains('\n');
            let token = self.token(TokenKind::Comment, start);
            self.newline |= newline;
            token
        } else {
            self.pos = self.bytes.len();
            self.unterminated = true;
            self.diagnostics.push(
                Diagnostic::error(
                    "syntax",
                    "unterminated block comment",
                    Span::from_range(start..start + 2),
                )
                .with_label("this comment is never closed")
                .with_help("close it with `*/`"),
            );
            self.token(TokenKind::Comment, start)
        }
    }

    fn word(&mut self, start: usize) -> TokenKind {
        while let Some(&b) = self.bytes.get(self.pos) {
            // A word stops before `->` or `--`, so `a->b` is three tokens.
            if !is_word_byte(b) || (b == b'-' && matches!(self.peek(1), Some(b'>' | b'-'))) {
                break;
            }
            self.pos += 1;
        }
        TokenKind::Word(classify_word(&self.text[start..self.pos]))
    }

    fn string(&mut self, start: usize) -> TokenKind {
        let mut text = crate::ast::Text::default();
        let mut offset_map = Vec::new();
        self.pos += 1;
        loop {
            // Plain text up to the next quote or backslash, copied in one piece.
            let run = self.bytes[self.pos..]
                .iter()
                .position(|&b| b == b'"' || b == b'\\')
                .unwrap_or(self.bytes.len() - self.pos);
            text.push_str(&self.text[self.pos..self.pos + run]);
            self.pos += run;
            let Some(&b) = self.bytes.get(self.pos) else {
                self.unterminated = true;
                self.diagnostics.push(
                    Diagnostic::error(
                        "syntax",
                        "unterminated string",
                        Span::from_range(start..start + 1),
                    )
                    .with_label("this quote is never closed")
                    .with_help("add the closing `\"`; write `\\\"` for a quote inside a string"),
                );
                break;
            };
            match b {
                b'"' => {
                    self.pos += 1;
                    break;
                }
                b'\\' => {
                    let next = self.peek(1);
                    match next {
                        Some(b'"') => text.push('"'),
                        Some(b'\\') => text.push('\\'),
                        Some(b'n') => text.push('\n'),
                        Some(b't') => text.push('\t'),
                        Some(b'\n') => {}
                        Some(b'\r') if self.peek(2) == Some(b'\n') => self.pos += 1,
                        // Unknown escapes stay as written, so regexes like `^v\d+` survive.
                        _ => {
                            text.push('\\');
                            self.pos += 1;
                            continue;
                        }
                    }
                    self.pos += 2;
                    if matches!(next, Some(b'\n' | b'\r')) {
                        // Backslash-newline continues the string; the next line's indentation is dropped.
                        while matches!(self.peek(0), Some(b' ' | b'\t')) {
                            self.pos += 1;
                        }
                    }
                    offset_map.push((text.len() as u32, self.pos as u32));
                }
                // The run above stopped at a quote or a backslash.
                _ => {}
            }
        }
        TokenKind::Str(Box::new(Quoted { text, offset_map }))
    }
}

/// Sorts a bare word into its lexical class.
pub fn classify_word(word: &str) -> ValueKind {
    let unsigned = word.strip_prefix(['-', '+']).unwrap_or(word);
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    if word == "true" || word == "false" {
        ValueKind::Boolean
    } else if !unsigned.starts_with(|c: char| c.is_ascii_digit() || c == '.') {
        // Numbers and durations start with a digit (or a fraction's point): most words are names.
        ValueKind::Bare
    } else if digits(unsigned) {
        ValueKind::Integer
    } else if let Some((int, frac)) = unsigned.split_once('.')
        && (digits(int) || int.is_empty())
        && (digits(frac) || (frac.is_empty() && !int.is_empty()))
    {
        ValueKind::Float
    } else if crate::ast::parse_duration(word).is_some() {
        ValueKind::Duration
    } else {
        ValueKind::Bare
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kinds(text: &str) -> Vec<TokenKind> {
        let mut diagnostics = Vec::new();
        lex(text, &mut diagnostics)
            .into_iter()
            .map(|t| t.kind)
            .filter(|k| *k != TokenKind::Eof)
            .collect()
    }

    #[test]
    fn words_are_classified() {
        assert_eq!(classify_word("42"), ValueKind::Integer);
        assert_eq!(classify_word("-1"), ValueKind::Integer);
        assert_eq!(classify_word("3.14"), ValueKind::Float);
        assert_eq!(classify_word(".5"), ValueKind::Float);
        assert_eq!(classify_word("-0.5"), ValueKind::Float);
        assert_eq!(classify_word("250ms"), ValueKind::Duration);
        assert_eq!(classify_word("true"), ValueKind::Boolean);
        assert_eq!(classify_word("claude-sonnet-4-5"), ValueKind::Bare);
        assert_eq!(classify_word("gpt-5.2-codex"), ValueKind::Bare);
        assert_eq!(classify_word("LR"), ValueKind::Bare);
        assert_eq!(classify_word("."), ValueKind::Bare);
    }

    #[test]
    fn arrows_split_words() {
        assert_eq!(
            kinds("a->b"),
            vec![
                TokenKind::Word(ValueKind::Bare),
                TokenKind::Arrow,
                TokenKind::Word(ValueKind::Bare)
            ]
        );
    }

    #[test]
    fn escapes_and_continuations() {
        let mut diagnostics = Vec::new();
        let tokens = lex(
            "\"a\\\"b\\\\c\\nd\\te\\d and \\\n      more\"",
            &mut diagnostics,
        );
        let TokenKind::Str(quoted) = &tokens[0].kind else {
            panic!("expected a string")
        };
        assert_eq!(quoted.text, "a\"b\\c\nd\te\\d and more");
        assert_eq!(diagnostics, []);

        // Text between escapes is copied in runs: characters of any width, an unknown escape last.
        let tokens = lex("\"é ü\\\"日本\\q\"", &mut diagnostics);
        let TokenKind::Str(quoted) = &tokens[0].kind else {
            panic!("expected a string")
        };
        assert_eq!(quoted.text, "é ü\"日本\\q");
        // After the escaped quote (text offset 6), the text continues at source offset 8.
        assert_eq!(quoted.offset_map, [(6, 8)]);
        assert_eq!(diagnostics, []);
    }

    #[test]
    fn comment_markers_inside_strings_are_text() {
        let mut diagnostics = Vec::new();
        let tokens = lex("\"// not /* a */ comment\" // real", &mut diagnostics);
        assert!(
            matches!(&tokens[0].kind, TokenKind::Str(quoted) if quoted.text == "// not /* a */ comment")
        );
        assert_eq!(tokens[1].kind, TokenKind::Comment);
    }

    #[test]
    fn unterminated_things_are_reported() {
        let mut diagnostics = Vec::new();
        lex("\"abc", &mut diagnostics);
        lex("/* abc", &mut diagnostics);
        assert_eq!(diagnostics.len(), 2);
    }
}
