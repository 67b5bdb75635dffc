//! Structured output: grammars in llama.cpp's GBNF syntax, parsed with errors that give a line and
//! column ([`gbnf`]); a pushdown matcher over code points that carries partial UTF-8 across
//! tokens ([`Matcher`]); the vocabulary mask, computed from a trie of the token pieces and cached
//! per grammar state ([`TokenTrie`], [`Mask`]); and llama.cpp's JSON-schema-to-grammar conversion,
//! stricter where llama.cpp drops a keyword silently ([`schema`]).
//!
//! This crate knows nothing of models or sampling: the runtime hands it token pieces and asks
//! which tokens may come next.

pub mod gbnf;
mod mask;
mod matcher;
mod program;
mod sample;

pub mod schema;
mod stacks;
mod utf8;
mod vocab;

pub use gbnf::{Grammar, ParseError};
pub use mask::Mask;
pub use matcher::{Matcher, Rejected};
pub use vocab::TokenTrie;
