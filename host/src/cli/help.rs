//! `--help` as llama-server lays it out: `serve`'s flags under llama-server's sections (common,
//! sampling, speculative, server; `common/arg.cpp` of b11434 puts each flag in one), with
//! bloomery's placement flags in a section of their own, and every flag listed with the
//! spellings clap cannot show itself (llama.cpp's multi-letter shorts such as `-np`, `-ngl`).

use clap::{Arg, Command, CommandFactory};

use super::Cli;

/// llama-server's sections, in its order, then bloomery's placement.
pub const SECTIONS: [&str; 5] = [
    "common params",
    "sampling params",
    "speculative params",
    "server params",
    "placement params",
];

/// `serve` flags that arg.cpp marks as sampling parameters (`set_sampling`), and bloomery's
/// own sampling switch.
const SAMPLING: &[&str] = &[
    "temp",
    "top-k",
    "top-p",
    "min-p",
    "typical",
    "repeat-last-n",
    "repeat-penalty",
    "presence-penalty",
    "frequency-penalty",
    "ignore-eos",
    "seed",
    "samplers",
    "sampler-seq",
    "top-nsigma",
    "xtc-probability",
    "xtc-threshold",
    "dry-multiplier",
    "dry-base",
    "dry-allowed-length",
    "dry-penalty-last-n",
    "dry-sequence-breaker",
    "adaptive-target",
    "adaptive-decay",
    "dynatemp-range",
    "dynatemp-exp",
    "mirostat",
    "mirostat-lr",
    "mirostat-ent",
    "logit-bias",
    "no-schemajump",
    "grammar",
    "grammar-file",
    "json-schema",
    "json-schema-file",
];

/// `serve` flags arg.cpp gives the server alone (`LLAMA_EXAMPLE_SERVER`), and bloomery's own
/// server flags.
const SERVER: &[&str] = &[
    "parallel",
    "reverse-prompt",
    "spm-infill",
    "log-prompts-dir",
    "ui-config",
    "ui-config-file",
    "host",
    "port",
    "reuse-port",
    "api-key",
    "api-key-file",
    "alias",
    "tags",
    "special",
    "cache-prompt",
    "cache-reuse",
    "reasoning-effort",
    "reasoning",
    "context-shift",
    "no-context-shift",
    "no-cache-prompt",
    "prefill-assistant",
    "no-prefill-assistant",
    "ctx-checkpoints",
    "checkpoint-min-step",
    "cache-ram",
    "slot-save-path",
    "metrics",
    "embedding",
    "pooling",
    "embd-normalize",
    "slots",
    "no-slots",
    "jinja",
    "no-jinja",
    "chat-template",
    "chat-template-file",
    "reasoning-format",
    "reasoning-budget",
    "reasoning-budget-message",
    "timeout",
    "threads-http",
    "queue-depth",
    "decision-head",
    "decision-head-device",
    "idle-timeout",
    "shutdown-timeout",
    "ui",
    "no-ui",
    "path",
    "cors-origins",
    "cors-methods",
    "cors-headers",
    "cors-credentials",
    "no-cors-credentials",
    "ssl-key-file",
    "ssl-cert-file",
    "api-prefix",
    "props",
    "sse-ping-interval",
    "chat-template-kwargs",
    "slot-prompt-similarity",
    "sleep-idle-seconds",
];

/// Speculative decoding's flags (arg.cpp's `set_spec`).
const SPECULATIVE: &[&str] = &[
    "spec-type",
    "spec-draft-n-max",
    "spec-draft-n-min",
    "spec-draft-p-min",
    "spec-synth-len",
    "spec-synth-rates",
    "spec-draft-model",
    "spec-no-gate",
    "spec-ngram-simple-size-n",
    "spec-ngram-simple-size-m",
    "spec-ngram-simple-min-hits",
    "spec-ngram-mod-n-match",
    "spec-ngram-mod-n-max",
    "spec-ngram-mod-n-min",
    "spec-ngram-map-k-size-n",
    "spec-ngram-map-k-size-m",
    "spec-ngram-map-k-min-hits",
    "spec-ngram-map-k4v-size-n",
    "spec-ngram-map-k4v-size-m",
    "spec-ngram-map-k4v-min-hits",
];

/// Where the model's weights and experts go: llama.cpp's `-ngl`, `-cmoe`, `-ncmoe`, `-ot`,
/// `--mlock`, `-dev`, `-ts`, `-mg`, `-sm`, and bloomery's budgets and tiering switches.
const PLACEMENT: &[&str] = &[
    "n-gpu-layers",
    "cpu-moe",
    "n-cpu-moe",
    "override-tensor",
    "mlock",
    "check-tensors",
    "gpu-budget",
    "device",
    "tensor-split",
    "main-gpu",
    "split-mode",
    "host-budget",
    "no-residency",
    "disk-prefetch",
    "bus-experts",
    "no-decode-staging",
];

/// The section a `serve` flag (by its long name) is listed under.
pub fn section(long: &str) -> &'static str {
    let is = |list: &[&str]| list.contains(&long);
    if is(PLACEMENT) {
        SECTIONS[4]
    } else if is(SAMPLING) {
        SECTIONS[1]
    } else if is(SPECULATIVE) {
        SECTIONS[2]
    } else if is(SERVER) {
        SECTIONS[3]
    } else {
        SECTIONS[0]
    }
}

/// The spellings of a flag that clap does not show: llama-server's (for `serve`), or the
/// multi-letter shorts the other commands take.
fn unshown(long: &str, serve: bool) -> Vec<&'static str> {
    let dashed = format!("--{long}");
    let spellings: Vec<&'static str> = if serve {
        crate::flags::llama_server::lookup(&dashed)
            .map(|(f, _)| f.spellings.to_vec())
            .unwrap_or_default()
    } else {
        crate::flags::short::spellings_of(&dashed)
    };
    spellings
        .into_iter()
        .filter(|s| s.starts_with('-') && !s.starts_with("--") && s.len() > 2)
        .collect()
}

/// An argument with its unshown spellings before its help text and, for `serve`, its section.
fn describe(arg: Arg, serve: bool) -> Arg {
    let Some(long) = arg.get_long().map(str::to_owned) else {
        return arg;
    };
    let mut arg = arg;
    let extra = unshown(&long, serve);
    if !extra.is_empty() {
        let help = arg.get_help().map(ToString::to_string).unwrap_or_default();
        arg = arg.help(format!("[{}] {help}", extra.join(", ")));
    }
    if serve {
        arg = arg.help_heading(section(&long));
    }
    arg
}

/// The whole command line, as `--help` shows it.
pub fn command() -> Command {
    Cli::command().mut_subcommands(|c| {
        let serve = c.get_name() == "serve";
        c.mut_args(|a| describe(a, serve))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn help(args: &[&str]) -> String {
        let mut c = command();
        let e = c
            .try_get_matches_from_mut(args)
            .expect_err("help ends the parse");
        e.render().to_string()
    }

    #[test]
    fn serve_help_is_grouped_as_llama_server_groups_it() {
        let h = help(&["bloomery", "serve", "--help"]);
        let at = |s: &str| {
            h.find(&format!("{s}:"))
                .unwrap_or_else(|| panic!("no {s} in\n{h}"))
        };
        // Sections in llama-server's order (no speculative flag is served yet).
        assert!(at("common params") < at("sampling params"));
        assert!(at("sampling params") < at("server params"));
        assert!(at("server params") < at("placement params"));
        let section_of = |flag: &str| {
            let pos = h.find(flag).unwrap_or_else(|| panic!("no {flag}"));
            SECTIONS
                .iter()
                .filter_map(|s| h.find(&format!("{s}:")).map(|p| (p, *s)))
                .filter(|(p, _)| *p < pos)
                .max()
                .map(|(_, s)| s)
        };
        assert_eq!(section_of("--ctx-size"), Some("common params"));
        assert_eq!(section_of("--top-k"), Some("sampling params"));
        assert_eq!(section_of("--port"), Some("server params"));
        assert_eq!(section_of("--n-cpu-moe"), Some("placement params"));
        assert!(h.contains("[-np] Slots"), "{h}");
        assert!(h.contains("[-ngl]"), "{h}");
    }

    #[test]
    fn the_description_says_what_bloomery_is_and_bench_lists_llama_bench_spellings() {
        let h = help(&["bloomery", "--help"]);
        assert!(h.contains("mixture-of-experts"), "{h}");
        assert!(h.contains("llama-server"), "{h}");
        let b = help(&["bloomery", "bench", "--help"]);
        for s in ["[-ub]", "[-ctk]", "[-fa]", "[-ncmoe]", "[-pg]", "[-np]"] {
            assert!(b.contains(s), "{s} missing:\n{b}");
        }
    }
}
