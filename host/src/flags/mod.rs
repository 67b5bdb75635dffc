//! Command-line flags shared by more than one front end, spelled as llama.cpp spells them:
//! expert placement (`serve`, `run`, `bench`, `plan`), grammars (`run`, `bench`), `serve`'s llama-server flags, and the
//! rewriting of multi-letter short flags.

pub mod grammar;
pub mod placement;
pub mod serve;
pub mod short;
