//! `serve --completion-bash`: a bash completion script for `bloomery serve`, in the form
//! llama-server b11434 prints for `--completion-bash` (one `opts` list, GGUF files after `-m`,
//! `.gbnf` after `--grammar-file`, `.jinja` after `--chat-template-file`): every llama-server
//! spelling `serve` takes (refused ones left out) and bloomery's own serve flags, registered for
//! `bloomery`.

use crate::flags::llama_server::{Answer, LLAMA_SERVER};

/// Every spelling `serve` takes: llama-server's that are not refused, in arg.cpp's order, then
/// bloomery's own long and short flags.
fn spellings() -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for f in LLAMA_SERVER {
        if !matches!(f.answer, Answer::Refused(_) | Answer::OnlyOff(_)) {
            out.extend(f.spellings.iter().map(|s| (*s).to_owned()));
        }
        if !matches!(f.answer, Answer::Refused(_) | Answer::OnlyOn(_)) {
            out.extend(f.negations.iter().map(|s| (*s).to_owned()));
        }
    }
    let cmd = super::help::command();
    if let Some(serve) = cmd.find_subcommand("serve") {
        for a in serve.get_arguments().filter(|a| !a.is_hide_set()) {
            out.extend(a.get_long().map(|l| format!("--{l}")));
            out.extend(a.get_short().map(|c| format!("-{c}")));
        }
    }
    let mut seen = std::collections::HashSet::new();
    out.retain(|s| seen.insert(s.clone()));
    out
}

/// The script.
pub fn bash() -> String {
    format!(
        r#"_bloomery_completions() {{
    local cur prev opts
    COMPREPLY=()
    cur="${{COMP_WORDS[COMP_CWORD]}}"
    prev="${{COMP_WORDS[COMP_CWORD-1]}}"

    opts="{opts} "

    case "$prev" in
        --model|-m)
            COMPREPLY=( $(compgen -f -X '!*.gguf' -- "$cur") $(compgen -d -- "$cur") )
            return 0
            ;;
        --grammar-file)
            COMPREPLY=( $(compgen -f -X '!*.gbnf' -- "$cur") $(compgen -d -- "$cur") )
            return 0
            ;;
        --chat-template-file)
            COMPREPLY=( $(compgen -f -X '!*.jinja' -- "$cur") $(compgen -d -- "$cur") )
            return 0
            ;;
        *)
            COMPREPLY=( $(compgen -W "${{opts}}" -- "$cur") )
            return 0
            ;;
    esac
}}

complete -F _bloomery_completions bloomery
"#,
        opts = spellings().join(" ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_script_offers_what_serve_takes_and_not_what_it_refuses() {
        let s = spellings();
        for taken in [
            "-m",
            "-hf",
            "--hf-repo",
            "-np",
            "--no-escape",
            "--fim-qwen-30b-default",
            "--gpu-budget",
        ] {
            assert!(s.iter().any(|x| x == taken), "{taken}");
        }
        for refused in ["--lora", "-kvu", "--mmproj", "--perf"] {
            assert!(s.iter().all(|x| x != refused), "{refused}");
        }
        let script = bash();
        assert!(script.contains("complete -F _bloomery_completions bloomery"));
        assert!(
            script.contains(" --completion-bash "),
            "it completes itself too"
        );
    }
}
