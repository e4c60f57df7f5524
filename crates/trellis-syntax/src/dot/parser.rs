//! Recursive-descent parser for the DOT subset, with error recovery: one pass reports every syntax
//! error and still returns as much of the document as it could read.
//!
//! Grammar (comments are skipped; `;` after statements is optional):
//!
//! ```text
//! file      := 'digraph' ID '{' stmt* '}' EOF
//! stmt      := ('graph' | 'node' | 'edge') attr_list+      defaults
//!            | ID '=' value                                graph (or subgraph) attribute
//!            | ID ('->' ID)+ attr_list*                    edge chain
//!            | ID attr_list*                               node
//!            | 'subgraph' ID? '{' stmt* '}' | '{' stmt* '}'
//! attr_list := '[' (ID '=' value (',' | ';')?)* ']'
//! value     := STRING | WORD                               WORD: identifier, number, duration, bare string
//! ```
//!
//! Keywords are case-insensitive, as in Graphviz. Recovery: after an error in a statement the parser
//! skips to the next `;`, `}` or line break; inside an attribute list, to the next `,` or `]`.

use crate::ast::{
    Attr, DefaultsTarget, Document, Ident, SourceFormat, Stmt, Text, Value, ValueKind, is_node_id,
};
use crate::diagnostic::{Diagnostic, MAX_DIAGNOSTICS};
use std::collections::VecDeque;

use crate::dot::lexer::{Lexer, Quoted, Token, TokenKind};
use crate::span::Span;

/// Parses DOT source. Never fails: problems are reported in `diagnostics`.
pub fn parse_dot(text: &str, diagnostics: &mut Vec<Diagnostic>) -> Document {
    let before = diagnostics.len();
    let mut lexer = Lexer::new(text, MAX_DIAGNOSTICS.saturating_sub(before));
    let first = next_significant(&mut lexer);
    let mut parser = Parser {
        text,
        lexer,
        current: first,
        ahead: VecDeque::new(),
        previous_span: None,
        pos: 0,
        diagnostics,
        echo: None,
        errors: 0,
        depth: 0,
        unreported: 0,
    };
    let document = parser.parse_file();
    // The lexer's errors go first, as if the whole file had been lexed before it was parsed: it
    // is, to its end, for the errors past what the parser read.
    while parser.lexer.next_token().kind != TokenKind::Eof {}
    let Parser {
        lexer,
        diagnostics,
        mut unreported,
        ..
    } = parser;
    unreported += lexer.unreported();
    let parsed = diagnostics.split_off(before);
    diagnostics.extend(lexer.diagnostics);
    for diagnostic in parsed {
        if diagnostics.len() < MAX_DIAGNOSTICS {
            diagnostics.push(diagnostic);
        } else {
            unreported += 1;
        }
    }
    if unreported > 0 {
        let end = Span::from_range(text.len()..text.len());
        diagnostics.push(Diagnostic::new(
            "syntax",
            crate::Severity::Note,
            format!("{unreported} more syntax errors are not shown; fix these first"),
            end,
        ));
    }
    document
}

/// The lexer's next token that is not a comment.
fn next_significant(lexer: &mut Lexer<'_>) -> Token {
    loop {
        let token = lexer.next_token();
        if token.kind != TokenKind::Comment {
            return token;
        }
    }
}

struct Parser<'a, 'd> {
    text: &'a str,
    lexer: Lexer<'a>,
    /// The current token (`Eof` at the end, for good).
    current: Token,
    /// The tokens read ahead of the current one, which most steps do not need.
    ahead: VecDeque<Token>,
    /// The span of the token before the current one, once there is one.
    previous_span: Option<Span>,
    /// How many tokens the parser has moved past.
    pos: usize,
    diagnostics: &'d mut Vec<Diagnostic>,
    /// Holds a dropped echo diagnostic, so `error` can still hand out a `&mut Diagnostic`.
    echo: Option<Diagnostic>,
    /// Errors reported so far, echoes included: tells `parse_stmts` a statement went wrong.
    errors: usize,
    /// Current subgraph nesting.
    depth: usize,
    /// Errors past the diagnostics cap, counted rather than kept.
    unreported: usize,
}

/// How deep subgraphs may nest: the parser recurses, and the stack is finite.
const MAX_NESTING: usize = 64;

impl Parser<'_, '_> {
    fn peek(&self) -> &Token {
        &self.current
    }

    /// Reads one more token ahead (the end of file repeats); returns it.
    fn pull(&mut self) -> &Token {
        let last = self.ahead.back().unwrap_or(&self.current);
        let token = if last.kind == TokenKind::Eof {
            last.clone()
        } else {
            next_significant(&mut self.lexer)
        };
        self.ahead.push_back(token);
        self.ahead.back().expect("just pushed")
    }

    /// The token `ahead` places after the current one (0: the current one).
    fn peek_at(&mut self, ahead: usize) -> &Token {
        if ahead == 0 {
            return &self.current;
        }
        while self.ahead.len() < ahead {
            self.pull();
        }
        &self.ahead[ahead - 1]
    }

    /// Moves past the current token (never past the end), returning it.
    fn bump(&mut self) -> Token {
        if self.current.kind == TokenKind::Eof {
            return self.current.clone();
        }
        let next = self
            .ahead
            .pop_front()
            .unwrap_or_else(|| next_significant(&mut self.lexer));
        self.pos += 1;
        let moved = std::mem::replace(&mut self.current, next);
        self.previous_span = Some(moved.span);
        moved
    }

    /// The span of the token before the current one (the current one's at the start).
    fn previous_span(&self) -> Span {
        self.previous_span.unwrap_or(self.current.span)
    }

    /// Moves the quoted string out of the current token, if it is one, leaving a bare word in its
    /// place: a token behind the parser is read again for its span only.
    fn take_quoted(&mut self) -> Option<Box<Quoted>> {
        let kind = &mut self.current.kind;
        if !matches!(kind, TokenKind::Str(_)) {
            return None;
        }
        match std::mem::replace(kind, TokenKind::Word(ValueKind::Quoted)) {
            TokenKind::Str(quoted) => Some(quoted),
            _ => None,
        }
    }

    fn slice(&self, span: Span) -> &str {
        &self.text[span.range()]
    }

    fn is_keyword(&self, token: &Token, keyword: &str) -> bool {
        matches!(token.kind, TokenKind::Word(_))
            && self.slice(token.span).eq_ignore_ascii_case(keyword)
    }

    fn error(
        &mut self,
        message: impl Into<String>,
        span: Span,
        label: impl Into<String>,
    ) -> &mut Diagnostic {
        // Errors at a character the lexer already rejected, a second error at the same place, and
        // "unclosed" errors at an end of file that an unterminated string explains are echoes: they are
        // built but dropped.
        // (The parser never reports past the tokens it has read, so the lexer has been there.)
        let rejected = self.lexer.rejected.binary_search(&span).is_ok();
        let last = (self.diagnostics.last()).or_else(|| self.lexer.diagnostics.last());
        let echo = rejected
            || (self.lexer.unterminated && span.start as usize >= self.text.len())
            || last.is_some_and(|d| d.primary.span == span);
        let diagnostic = Diagnostic::error("syntax", message, span).with_label(label);
        self.errors += 1;
        let full = self.diagnostics.len() + self.lexer.diagnostics.len() >= MAX_DIAGNOSTICS;
        if !echo && full {
            self.unreported += 1;
        }
        if echo || full {
            return self.echo.insert(diagnostic);
        }
        self.diagnostics.push(diagnostic);
        self.diagnostics.last_mut().expect("just pushed")
    }

    fn describe(&self, token: &Token) -> String {
        match &token.kind {
            TokenKind::Eof => "end of file".to_owned(),
            TokenKind::Str(_) => "a quoted string".to_owned(),
            _ => format!("`{}`", self.slice(token.span)),
        }
    }

    fn parse_file(&mut self) -> Document {
        let first = self.peek().clone();
        let mut header_span = first.span;
        if self.is_keyword(&first, "strict") {
            self.bump();
            self.error(
                "`strict` graphs are not supported",
                first.span,
                "remove `strict`",
            );
        }
        let keyword = self.peek().clone();
        if keyword.kind == TokenKind::Eof {
            self.error(
                "the workflow file is empty",
                keyword.span,
                "expected `digraph Name { ... }`",
            );
            return Document {
                format: SourceFormat::Dot,
                header_span,
                name: None,
                body: Vec::new(),
            };
        }
        let mut has_keyword = true;
        if self.is_keyword(&keyword, "digraph") {
            header_span = keyword.span;
            self.bump();
        } else if self.is_keyword(&keyword, "graph") {
            header_span = keyword.span;
            self.bump();
            self.error(
                "undirected graphs are not supported",
                keyword.span,
                "expected `digraph`",
            )
            .help = Some("workflows are directed: write `digraph Name { ... }`".into());
        } else {
            let found = self.describe(&keyword);
            self.error(
                format!("expected `digraph`, found {found}"),
                keyword.span,
                "a workflow starts with `digraph Name {`",
            );
            // Recover at the first `{`, if there is one.
            while !matches!(self.peek().kind, TokenKind::LBrace | TokenKind::Eof) {
                self.bump();
            }
            has_keyword = false;
        }
        // Without the keyword, asking for the name would only echo the first error.
        let name = if has_keyword || self.peek().kind != TokenKind::LBrace {
            self.parse_graph_name()
        } else {
            None
        };
        let body = if self.peek().kind == TokenKind::LBrace {
            let open = self.bump().span;
            let body = self.parse_stmts();
            self.expect_close_brace(open);
            body
        } else {
            let token = self.peek().clone();
            let found = self.describe(&token);
            self.error(
                format!("expected `{{`, found {found}"),
                token.span,
                "the graph body starts here",
            );
            Vec::new()
        };
        let trailing = self.peek().clone();
        if trailing.kind != TokenKind::Eof {
            self.error(
                "unexpected content after the end of the graph",
                trailing.span,
                "after the closing `}`",
            )
            .help = Some("a file holds exactly one `digraph`".into());
        }
        Document {
            format: SourceFormat::Dot,
            header_span,
            name,
            body,
        }
    }

    fn parse_graph_name(&mut self) -> Option<Ident> {
        let token = self.peek().clone();
        match &token.kind {
            TokenKind::Word(_) => {
                self.bump();
                Some(Ident {
                    name: Text::from(self.slice(token.span)),
                    span: token.span,
                })
            }
            TokenKind::Str(quoted) => {
                self.bump();
                Some(Ident {
                    name: quoted.text.clone(),
                    span: token.span,
                })
            }
            _ => {
                self.error(
                    "the graph needs a name",
                    token.span,
                    "expected a name before `{`",
                )
                .help = Some("write `digraph MyWorkflow { ... }`".into());
                None
            }
        }
    }

    fn expect_close_brace(&mut self, open: Span) {
        if self.peek().kind == TokenKind::RBrace {
            self.bump();
        } else {
            let at = self.peek().span;
            self.error(
                "unclosed `{`",
                at,
                "expected `}` before the end of the file",
            )
            .secondary
            .push(crate::Label::new(open, "opened here"));
        }
    }

    /// Statements up to (not including) a `}` or the end of the file.
    fn parse_stmts(&mut self) -> Vec<Stmt> {
        let mut stmts = Vec::new();
        loop {
            match self.peek().kind {
                TokenKind::RBrace | TokenKind::Eof => {
                    // A large workflow's statement list is kept while it is flattened: no slack.
                    stmts.shrink_to_fit();
                    return stmts;
                }
                TokenKind::Semicolon => {
                    self.bump();
                }
                _ => {
                    let (errors_before, stmt_start) = (self.errors, self.pos);
                    if let Some(stmt) = self.parse_stmt() {
                        stmts.push(stmt);
                    }
                    if self.errors > errors_before || self.pos == stmt_start {
                        self.synchronize(stmt_start);
                    }
                }
            }
        }
    }

    /// Skips to the start of the next statement: past a `;`, or before a `}` or a token on a new line.
    /// It always ends past `stmt_start`, so a statement that consumed nothing cannot loop.
    fn synchronize(&mut self, stmt_start: usize) {
        let start = stmt_start;
        loop {
            let token = self.peek();
            match token.kind {
                TokenKind::Eof | TokenKind::RBrace => return,
                TokenKind::Semicolon => {
                    self.bump();
                    return;
                }
                _ if token.newline_before && self.pos > start => return,
                _ => {
                    self.bump();
                }
            }
        }
    }

    fn parse_stmt(&mut self) -> Option<Stmt> {
        let token = self.peek().clone();
        let next = self.peek_at(1).kind.clone();
        for (keyword, target) in [
            ("graph", DefaultsTarget::Graph),
            ("node", DefaultsTarget::Node),
            ("edge", DefaultsTarget::Edge),
        ] {
            if self.is_keyword(&token, keyword) && next == TokenKind::LBracket {
                self.bump();
                let attrs = self.parse_attr_lists();
                let span = token.span.to(self.previous_span());
                return Some(Stmt::Defaults {
                    target,
                    attrs,
                    span,
                });
            }
        }
        if self.is_keyword(&token, "subgraph") || token.kind == TokenKind::LBrace {
            return self.parse_subgraph();
        }
        match &token.kind {
            TokenKind::Word(_) | TokenKind::Str(_) if next == TokenKind::Equals => {
                let attr = self.parse_attr()?;
                Some(Stmt::Attr(attr))
            }
            TokenKind::Word(_) | TokenKind::Str(_) => {
                let first = self.parse_node_id()?;
                if matches!(
                    self.peek().kind,
                    TokenKind::Arrow | TokenKind::UndirectedEdge
                ) {
                    self.parse_edge_chain(first)
                } else {
                    let attrs = self.parse_attr_lists();
                    Some(Stmt::Node { id: first, attrs })
                }
            }
            _ => {
                let found = self.describe(&token);
                self.error(format!("expected a statement, found {found}"), token.span, "not a node, edge or attribute")
                    .help = Some("statements are `id [attrs]`, `a -> b`, `key=value`, `node [...]`, `edge [...]`, `graph [...]` or `subgraph { ... }`".into());
                None
            }
        }
    }

    fn parse_subgraph(&mut self) -> Option<Stmt> {
        let start = self.peek().span;
        let mut name = None;
        if self.peek().kind != TokenKind::LBrace {
            self.bump(); // `subgraph`
            let token = self.peek().clone();
            if let TokenKind::Word(_) = token.kind {
                self.bump();
                name = Some(Ident {
                    name: Text::from(self.slice(token.span)),
                    span: token.span,
                });
            } else if let TokenKind::Str(quoted) = &token.kind {
                self.bump();
                name = Some(Ident {
                    name: quoted.text.clone(),
                    span: token.span,
                });
            }
        }
        if self.peek().kind != TokenKind::LBrace {
            let token = self.peek().clone();
            let found = self.describe(&token);
            self.error(
                format!("expected `{{` to open the subgraph, found {found}"),
                token.span,
                "expected `{`",
            );
            return None;
        }
        let open = self.bump().span;
        if self.depth >= MAX_NESTING {
            self.error(
                format!("subgraphs nested more than {MAX_NESTING} deep"),
                open,
                "too deep",
            );
            self.skip_balanced_braces();
            return None;
        }
        self.depth += 1;
        let body = self.parse_stmts();
        self.depth -= 1;
        self.expect_close_brace(open);
        let span = start.to(self.previous_span());
        Some(Stmt::Subgraph { name, body, span })
    }

    /// Skips to just past the `}` that closes an already consumed `{` (or to the end of the file).
    fn skip_balanced_braces(&mut self) {
        let mut depth = 1usize;
        while depth > 0 {
            match self.bump().kind {
                TokenKind::LBrace => depth += 1,
                TokenKind::RBrace => depth -= 1,
                TokenKind::Eof => return,
                _ => {}
            }
        }
    }

    fn parse_node_id(&mut self) -> Option<Ident> {
        let span = self.peek().span;
        let (name, quoted) = match &self.peek().kind {
            TokenKind::Word(_) => (Text::from(self.slice(span)), false),
            TokenKind::Str(quoted) => (quoted.text.clone(), true),
            TokenKind::LBrace => {
                let token = self.peek().clone();
                self.error(
                    "edges to subgraphs are not supported",
                    token.span,
                    "expected a node id",
                )
                .help = Some("write one edge per target: `a -> b` and `a -> c`".into());
                return None;
            }
            _ => {
                let token = self.peek().clone();
                let found = self.describe(&token);
                self.error(
                    format!("expected a node id, found {found}"),
                    token.span,
                    "expected a node id",
                );
                return None;
            }
        };
        self.bump();
        if !is_node_id(&name) {
            let what = if quoted {
                "quoted node ids"
            } else {
                "node ids"
            };
            self.error(
                format!("invalid node id `{name}`"),
                span,
                "not a valid node id",
            )
            .help = Some(format!(
                "{what} must start with a letter or `_` and contain only letters, digits and `_` (for example `run_tests`); put display text in `label`"
            ));
        }
        Some(Ident { name, span })
    }

    fn parse_edge_chain(&mut self, first: Ident) -> Option<Stmt> {
        // Most chains are one edge: room for its two ends.
        let mut chain = Vec::with_capacity(2);
        chain.push(first);
        while matches!(
            self.peek().kind,
            TokenKind::Arrow | TokenKind::UndirectedEdge
        ) {
            let arrow = self.bump();
            if arrow.kind == TokenKind::UndirectedEdge {
                self.error(
                    "undirected edges (`--`) are not supported",
                    arrow.span,
                    "use `->`",
                );
            }
            chain.push(self.parse_node_id()?);
        }
        let attrs = self.parse_attr_lists();
        let span = chain[0].span.to(self.previous_span());
        Some(Stmt::Edge { chain, attrs, span })
    }

    /// Zero or more `[...]` lists, concatenated.
    fn parse_attr_lists(&mut self) -> Vec<Attr> {
        let mut attrs = Vec::new();
        while self.peek().kind == TokenKind::LBracket {
            let open = self.bump().span;
            attrs.reserve_exact(self.assignments_ahead());
            loop {
                match self.peek().kind {
                    TokenKind::RBracket => {
                        self.bump();
                        break;
                    }
                    TokenKind::Comma | TokenKind::Semicolon => {
                        self.bump();
                    }
                    TokenKind::Eof
                    | TokenKind::RBrace
                    | TokenKind::LBrace
                    | TokenKind::LBracket => {
                        let at = self.peek().span;
                        self.error("unclosed `[`", at, "expected `]`")
                            .secondary
                            .push(crate::Label::new(open, "attribute list opened here"));
                        return attrs;
                    }
                    _ => match self.parse_attr() {
                        Some(attr) => attrs.push(attr),
                        None => self.skip_in_attr_list(),
                    },
                }
            }
        }
        // Sized by counting ahead; a list with errors may hold fewer.
        attrs.shrink_to_fit();
        attrs
    }

    /// How many `=` the attribute list being read holds before its end: about as many attributes
    /// as it will give (counted on the token list, so the attributes' vector is allocated once).
    fn assignments_ahead(&mut self) -> usize {
        let ends = |t: &Token| {
            matches!(
                t.kind,
                TokenKind::RBracket
                    | TokenKind::LBracket
                    | TokenKind::LBrace
                    | TokenKind::RBrace
                    | TokenKind::Eof
            )
        };
        // Reads the list ahead, up to its end: one list's tokens at most are held.
        let mut read = ends(&self.current) || self.ahead.iter().any(ends);
        while !read {
            read = ends(self.pull());
        }
        std::iter::once(&self.current)
            .chain(&self.ahead)
            .take_while(|t| !ends(t))
            .filter(|t| t.kind == TokenKind::Equals)
            .count()
    }

    fn skip_in_attr_list(&mut self) {
        while !matches!(
            self.peek().kind,
            TokenKind::Comma
                | TokenKind::Semicolon
                | TokenKind::RBracket
                | TokenKind::RBrace
                | TokenKind::LBrace
                | TokenKind::LBracket
                | TokenKind::Eof
        ) {
            self.bump();
        }
    }

    /// `key = value`.
    fn parse_attr(&mut self) -> Option<Attr> {
        let span = self.peek().span;
        let key = match &self.peek().kind {
            TokenKind::Word(_) => Ident {
                name: Text::from(self.slice(span)),
                span,
            },
            TokenKind::Str(quoted) => Ident {
                name: quoted.text.clone(),
                span,
            },
            _ => {
                let token = self.peek().clone();
                let found = self.describe(&token);
                self.error(
                    format!("expected an attribute name, found {found}"),
                    token.span,
                    "expected `key=value`",
                );
                return None;
            }
        };
        self.bump();
        if self.peek().kind != TokenKind::Equals {
            let token = self.peek().clone();
            let found = self.describe(&token);
            self.error(
                format!("expected `=` after `{}`, found {found}", key.name),
                token.span,
                "expected `=`",
            )
            .help = Some(format!("attributes are written `{}=value`", key.name));
            return None;
        }
        self.bump();
        let span = self.peek().span;
        let value = if let Some(quoted) = self.take_quoted() {
            Value {
                text: quoted.text,
                kind: ValueKind::Quoted,
                span,
                offset_map: quoted.offset_map,
            }
        } else if let TokenKind::Word(kind) = self.peek().kind {
            Value::plain(self.slice(span), kind, span)
        } else {
            let token = self.peek().clone();
            let found = self.describe(&token);
            self.error(
                format!("expected a value for `{}`, found {found}", key.name),
                token.span,
                "expected a value",
            )
            .help = Some(
                "values are quoted strings, numbers, booleans, durations or bare words".into(),
            );
            return None;
        };
        self.bump();
        Some(Attr { key, value })
    }
}
