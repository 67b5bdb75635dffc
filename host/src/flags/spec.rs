//! Draft decoding flags of `serve`, `run` and `bench`, spelled as llama-server b11434 spells them,
//! each with its `LLAMA_ARG_*` twin: `--spec-type none|draft-mtp` (llama.cpp's other types
//! refused by name), `--spec-draft-n-max`, `--spec-draft-n-min` and `--spec-draft-p-min`.
//! Without `--spec-type`, a file with MTP layers drafts with them.

use anyhow::bail;
use bloomery_runtime::spec::{SpecConfig, SpecType};
use clap::Args;

/// Draft decoding.
#[derive(Args, Debug, Clone, PartialEq)]
pub struct SpecArgs {
    /// Comma-separated speculative decoding types: `none` or `draft-mtp` (the model's own MTP
    /// block; the default when the file has MTP layers).
    #[arg(long = "spec-type", value_name = "TYPES", env = "LLAMA_ARG_SPEC_TYPE")]
    pub spec_type: Option<String>,
    /// Most tokens drafted after each sampled token.
    #[arg(long = "spec-draft-n-max", value_name = "N", default_value_t = SpecConfig::MTP.n_max, env = "LLAMA_ARG_SPEC_DRAFT_N_MAX")]
    pub n_max: usize,
    /// A draft shorter than this is dropped.
    #[arg(long = "spec-draft-n-min", value_name = "N", default_value_t = SpecConfig::MTP.n_min, env = "LLAMA_ARG_SPEC_DRAFT_N_MIN")]
    pub n_min: usize,
    /// Drafting stops at a token whose probability among the draft head's ten likeliest is
    /// below this (greedy drafting).
    #[arg(long = "spec-draft-p-min", value_name = "P", default_value_t = SpecConfig::MTP.p_min, env = "LLAMA_ARG_SPEC_DRAFT_P_MIN")]
    pub p_min: f32,
}

/// llama-server b11434's speculative decoding types that bloomery does not implement.
const OTHER_TYPES: &[&str] = &[
    "draft-simple",
    "draft-eagle3",
    "draft-dflash",
    "draft-dspark",
    "ngram-simple",
    "ngram-map-k",
    "ngram-map-k4v",
    "ngram-mod",
    "ngram-cache",
];

impl SpecArgs {
    /// The drafting these flags ask for on a model of `arch` with `n_mtp_layers` MTP layers;
    /// an unknown or unimplemented type, or `draft-mtp` on a model without MTP layers, is an
    /// error naming it.
    pub fn config(&self, n_mtp_layers: u32, arch: &str) -> anyhow::Result<SpecConfig> {
        let kind = match self.spec_type.as_deref() {
            None if n_mtp_layers > 0 => SpecType::DraftMtp,
            None => SpecType::None,
            Some(list) => {
                let mut kind = SpecType::None;
                for t in list.split(',').map(str::trim) {
                    match t {
                        "none" => {}
                        "draft-mtp" => kind = SpecType::DraftMtp,
                        t if OTHER_TYPES.contains(&t) => bail!(
                            "--spec-type {t}: not supported: only draft-mtp (the model's own MTP \
                             block) is implemented"
                        ),
                        t => bail!(
                            "--spec-type {t}: unknown speculative decoding type (none, \
                             draft-mtp, {})",
                            OTHER_TYPES.join(", ")
                        ),
                    }
                }
                if kind == SpecType::DraftMtp && n_mtp_layers == 0 {
                    bail!("--spec-type draft-mtp: this model (`{arch}`) has no MTP layers");
                }
                kind
            }
        };
        Ok(SpecConfig {
            kind,
            n_max: self.n_max,
            n_min: self.n_min,
            p_min: self.p_min,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(spec_type: Option<&str>) -> SpecArgs {
        SpecArgs {
            spec_type: spec_type.map(str::to_owned),
            n_max: 5,
            n_min: 1,
            p_min: 0.5,
        }
    }

    #[test]
    fn drafting_is_on_by_default_with_mtp_layers_and_refused_by_name_otherwise() {
        let on = args(None).config(1, "qwen35moe").unwrap();
        assert_eq!(
            (on.kind, on.n_max, on.n_min, on.p_min),
            (SpecType::DraftMtp, 5, 1, 0.5)
        );
        assert_eq!(
            args(None).config(0, "qwen3moe").unwrap().kind,
            SpecType::None
        );
        assert_eq!(
            args(Some("none")).config(1, "x").unwrap().kind,
            SpecType::None
        );
        assert_eq!(
            args(Some("draft-mtp")).config(1, "x").unwrap().kind,
            SpecType::DraftMtp
        );
        let e = args(Some("draft-mtp")).config(0, "qwen3moe").unwrap_err();
        assert!(
            e.to_string().contains("(`qwen3moe`) has no MTP layers"),
            "{e}"
        );
        let e = args(Some("draft-mtp,ngram-mod"))
            .config(1, "x")
            .unwrap_err();
        assert!(
            e.to_string()
                .starts_with("--spec-type ngram-mod: not supported"),
            "{e}"
        );
        let e = args(Some("draft-mpt")).config(1, "x").unwrap_err();
        assert!(
            e.to_string().starts_with("--spec-type draft-mpt: unknown"),
            "{e}"
        );
    }
}
