//! The DOT subset: a lexer ([`lexer`]) and a recovering recursive-descent parser ([`parser`]).

pub mod lexer;
pub mod parser;
