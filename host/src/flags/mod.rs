//! Command-line flags shared by more than one front end, spelled as llama.cpp spells them:
//! cache types (`serve`, `run`, `bench`), expert placement (`serve`, `run`, `bench`, `plan`),
//! grammars (`run`, `bench`), draft decoding (`serve`, `run`, `bench`), samplers (`serve`, `run`), `serve`'s llama-server flags, its page,
//! CORS and TLS flags, and the rewriting of multi-letter short flags.

pub mod cache_type;
pub mod cards;
pub mod escapes;
pub mod grammar;
pub mod hub;
pub mod llama_bench;
pub mod llama_server;
pub mod logging;
pub mod metadata;
pub mod placement;
pub mod sampling;
pub mod serve;
pub mod short;
pub mod spec;
pub mod web;

use std::ffi::OsString;

use self::llama_server::Refusal;

/// The command line as clap will parse it: `serve`'s arguments screened against llama-server's
/// flags ([`llama_server::screen`]: refused flags named, multi-letter short flags spelled long),
/// the other subcommands' multi-letter short flags spelled long ([`short::expand_short_flags`]),
/// and `bench`'s llama-bench flags it does not take refused ([`llama_bench::screen`]).
/// `env` reads the environment (for refused flags' `LLAMA_ARG_*` twins).
pub fn command_line(
    args: Vec<OsString>,
    env: impl Fn(&str) -> Option<String>,
) -> Result<Vec<OsString>, Refusal> {
    match args.iter().position(|a| a == "serve") {
        Some(at) => {
            let mut out = args[..=at].to_vec();
            out.extend(llama_server::screen(&args[at + 1..], env)?);
            Ok(out)
        }
        None => {
            if let Some(at) = args.iter().position(|a| a == "bench") {
                llama_bench::screen(&args[at + 1..])?;
            }
            Ok(short::expand_short_flags(args))
        }
    }
}
