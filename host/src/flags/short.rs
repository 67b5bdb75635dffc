//! llama.cpp's multi-letter short flags (`-np`, `-ngl`, `-ctk`, …), which clap cannot spell,
//! rewritten to their long forms before the command line is parsed.

/// llama.cpp's short flags of more than one letter, which clap cannot spell, and their long
/// forms; [`expand_short_flags`] rewrites them before parsing.
const MULTI_LETTER_SHORT: &[(&str, &str)] = &[
    ("-np", "--parallel"),
    ("-ngl", "--n-gpu-layers"),
    ("-ub", "--ubatch-size"),
    ("-fa", "--flash-attn"),
    ("-ctk", "--cache-type-k"),
    ("-ctv", "--cache-type-v"),
    ("-cmoe", "--cpu-moe"),
    ("-ncmoe", "--n-cpu-moe"),
    ("-ot", "--override-tensor"),
    ("-dev", "--device"),
    ("-ts", "--tensor-split"),
    ("-mg", "--main-gpu"),
    ("-sm", "--split-mode"),
    ("-cram", "--cache-ram"),
    ("-to", "--timeout"),
    ("-pg", "--pg"),
    ("-md", "--spec-draft-model"),
    ("-hf", "--hf-repo"),
    ("-hfr", "--hf-repo"),
    ("-hff", "--hf-file"),
    ("-hft", "--hf-token"),
    ("-mu", "--model-url"),
    ("-cl", "--cache-list"),
];

/// The multi-letter short spellings of a long flag (`--parallel`: `-np`).
pub fn spellings_of(long: &str) -> Vec<&'static str> {
    MULTI_LETTER_SHORT
        .iter()
        .filter(|(_, l)| *l == long)
        .map(|(s, _)| *s)
        .collect()
}

/// The command line with llama.cpp's multi-letter short flags (`-np 4`, `-ngl=99`) after the
/// `serve`, `bench` or `run` subcommand written as their long forms (a prompt after `-p` is left
/// as it is).
pub fn expand_short_flags<I: IntoIterator<Item = std::ffi::OsString>>(
    args: I,
) -> Vec<std::ffi::OsString> {
    let (mut serving, mut after_text_flag) = (false, false);
    args.into_iter()
        .map(|a| {
            if !serving {
                serving = a == "serve" || a == "bench" || a == "run" || a == "plan";
                return a;
            }
            // A prompt is text, never a flag: `run -p -np` keeps its prompt.
            let text = std::mem::replace(&mut after_text_flag, a == "-p" || a == "--prompt");
            if text {
                return a;
            }
            let Some(s) = a.to_str() else { return a };
            let (flag, value) = match s.split_once('=') {
                Some((f, v)) => (f, Some(v)),
                None => (s, None),
            };
            match MULTI_LETTER_SHORT.iter().find(|(short, _)| *short == flag) {
                Some((_, long)) => match value {
                    Some(v) => format!("{long}={v}").into(),
                    None => (*long).into(),
                },
                None => a,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn expand(args: &[&str]) -> Vec<String> {
        expand_short_flags(args.iter().map(std::ffi::OsString::from))
            .into_iter()
            .map(|a| a.into_string().unwrap())
            .collect()
    }

    #[test]
    fn md_is_the_draft_model_flag_not_a_cluster_of_m_and_d() {
        // clap would read `-md X` as `-m d` followed by a stray `X`.
        assert_eq!(
            expand(&["bloomery", "run", "-md", "d.gguf", "-m", "x"]),
            ["bloomery", "run", "--spec-draft-model", "d.gguf", "-m", "x"]
        );
    }

    #[test]
    fn run_takes_ngl_like_llama_cli() {
        assert_eq!(
            expand(&["bloomery", "run", "-ngl", "99", "-p", "hi"]),
            ["bloomery", "run", "--n-gpu-layers", "99", "-p", "hi"]
        );
    }

    #[test]
    fn multi_letter_short_flags_after_serve_become_long_flags() {
        assert_eq!(
            expand(&["bloomery", "serve", "-np", "4", "-ngl=99", "-fa", "on", "-m", "x"]),
            [
                "bloomery",
                "serve",
                "--parallel",
                "4",
                "--n-gpu-layers=99",
                "--flash-attn",
                "on",
                "-m",
                "x"
            ]
        );
        assert_eq!(
            expand(&["bloomery", "run", "-p", "-np"]),
            ["bloomery", "run", "-p", "-np"]
        );
    }
}
