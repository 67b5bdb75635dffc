//! Sampler flags of `serve` and `run` beyond the basic ones, spelled as llama.cpp spells them:
//! the stage order (`--samplers`, `--sampler-seq`), DRY, XTC, top-n-sigma, Mirostat, dynamic
//! temperature, adaptive-p and `-l/--logit-bias`. Values are checked when the settings are
//! built ([`SamplingArgs::apply`]), each error naming its flag.

use std::sync::Arc;

use anyhow::{bail, Context};
use bloomery_runtime::sampling::order::{from_letters, from_names};
use bloomery_runtime::sampling::{DryBreakers, MirostatVersion, SamplerParams};
use bloomery_text::Tokenizer;
use clap::Args;

/// The sampler flags beyond temperature, top-k/p, min-p, typical-p and the penalties.
#[derive(Args, Debug, Clone)]
pub struct SamplingArgs {
    /// The stages in order, separated by `;` (penalties, dry, top_n_sigma, top_k, typ_p, top_p,
    /// min_p, xtc, temperature, adaptive_p; also `top-k`, `topk`, `nucleus`, `temp`, `typ`).
    #[arg(long = "samplers", value_name = "SAMPLERS")]
    pub samplers: Option<String>,
    /// The stages in order, one letter each (default `edskypmxt`).
    #[arg(
        long = "sampler-seq",
        visible_alias = "sampling-seq",
        value_name = "SEQUENCE"
    )]
    pub sampler_seq: Option<String>,
    /// Keep tokens within N standard deviations of the top logit (-1: off).
    #[arg(long = "top-nsigma", visible_alias = "top-n-sigma", default_value_t = -1.0, allow_negative_numbers = true)]
    pub top_nsigma: f32,
    /// XTC: chance per token that the top choices are cut (0: off).
    #[arg(long = "xtc-probability", default_value_t = 0.0)]
    pub xtc_probability: f32,
    /// XTC: probability a top choice must reach to be cut (above 0.5: off).
    #[arg(long = "xtc-threshold", default_value_t = 0.1)]
    pub xtc_threshold: f32,
    /// DRY multiplier (0: off).
    #[arg(long = "dry-multiplier", default_value_t = 0.0)]
    pub dry_multiplier: f32,
    /// DRY base (a value below 1 keeps the default, as llama.cpp does).
    #[arg(long = "dry-base", default_value_t = 1.75)]
    pub dry_base: f32,
    /// DRY: repeats up to this length go unpenalized.
    #[arg(
        long = "dry-allowed-length",
        default_value_t = 2,
        allow_negative_numbers = true
    )]
    pub dry_allowed_length: i32,
    /// DRY: tokens scanned for repeats (0: off).
    #[arg(
        long = "dry-penalty-last-n",
        default_value_t = 64,
        allow_negative_numbers = true
    )]
    pub dry_penalty_last_n: i32,
    /// A DRY sequence breaker (repeatable; replaces the defaults `\n`, `:`, `"`, `*`; `none`:
    /// no breakers).
    #[arg(long = "dry-sequence-breaker", value_name = "STRING")]
    pub dry_sequence_breaker: Vec<String>,
    /// Adaptive-p target probability (negative: off).
    #[arg(long = "adaptive-target", default_value_t = -1.0, allow_negative_numbers = true)]
    pub adaptive_target: f32,
    /// Adaptive-p decay (0 to 0.99).
    #[arg(long = "adaptive-decay", default_value_t = 0.9)]
    pub adaptive_decay: f32,
    /// Dynamic temperature range (0: off).
    #[arg(long = "dynatemp-range", default_value_t = 0.0)]
    pub dynatemp_range: f32,
    /// Dynamic temperature exponent.
    #[arg(
        long = "dynatemp-exp",
        default_value_t = 1.0,
        allow_negative_numbers = true
    )]
    pub dynatemp_exp: f32,
    /// Mirostat: 0 off, 1 Mirostat, 2 Mirostat 2.0 (the other stages but the temperature are
    /// then skipped).
    #[arg(long = "mirostat", default_value_t = 0, allow_negative_numbers = true)]
    pub mirostat: i32,
    /// Mirostat learning rate (eta).
    #[arg(long = "mirostat-lr", default_value_t = 0.1)]
    pub mirostat_lr: f32,
    /// Mirostat target entropy (tau).
    #[arg(long = "mirostat-ent", default_value_t = 5.0)]
    pub mirostat_ent: f32,
    /// A logit bias, `TOKEN_ID+BIAS` or `TOKEN_ID-BIAS` (repeatable; `-inf` bans the token).
    #[arg(
        short = 'l',
        long = "logit-bias",
        value_name = "TOKEN_ID(+/-)BIAS",
        allow_hyphen_values = true
    )]
    pub logit_bias: Vec<String>,
}

/// `TOKEN_ID+BIAS` or `TOKEN_ID-BIAS` (llama.cpp's `-l` syntax).
pub fn parse_logit_bias(s: &str) -> Option<(u32, f32)> {
    let at = s.find(['+', '-'])?;
    let token: u32 = s[..at].trim().parse().ok()?;
    let magnitude: f32 = s[at + 1..].trim().parse().ok()?;
    let bias = if s.as_bytes()[at] == b'-' {
        -magnitude
    } else {
        magnitude
    };
    Some((token, bias))
}

/// The processed DRY sequence breakers for `breakers`, over the tokenizer's vocabulary.
pub fn dry_breakers(tok: &Tokenizer, n_vocab: usize, breakers: &[String]) -> Arc<DryBreakers> {
    Arc::new(DryBreakers::new(
        n_vocab,
        |id| tok.token_to_piece(id, true),
        |text| tok.encode(text, false, false).unwrap_or_default(),
        breakers,
    ))
}

impl SamplingArgs {
    /// The DRY breakers the flags ask for (llama-server's defaults when none is given).
    pub fn breakers(&self) -> Vec<String> {
        if self.dry_sequence_breaker.is_empty() {
            return bloomery_runtime::sampling::dry::DEFAULT_BREAKERS
                .iter()
                .map(|s| (*s).to_owned())
                .collect();
        }
        // `none` clears the list wherever it appears, as llama.cpp's parser does.
        let last_none = self.dry_sequence_breaker.iter().rposition(|b| b == "none");
        let from = last_none.map_or(0, |i| i + 1);
        self.dry_sequence_breaker[from..].to_vec()
    }

    /// Sets these flags' settings on `s`; `n_vocab` bounds the logit-bias ids. The DRY breakers
    /// are processed over the tokenizer's vocabulary here, once (DRY on or off: a request may
    /// turn it on).
    pub fn apply(
        &self,
        s: &mut SamplerParams,
        tok: &Tokenizer,
        n_vocab: usize,
        escapes: &crate::flags::escapes::EscapeArgs,
    ) -> anyhow::Result<()> {
        if let Some(names) = &self.samplers {
            let names: Vec<&str> = names.split(';').filter(|n| !n.is_empty()).collect();
            s.order = from_names(&names).context("--samplers")?;
        }
        if let Some(seq) = &self.sampler_seq {
            s.order = from_letters(seq).context("--sampler-seq")?;
        }
        s.top_n_sigma = self.top_nsigma;
        s.xtc_probability = self.xtc_probability;
        s.xtc_threshold = self.xtc_threshold;
        s.dry_multiplier = self.dry_multiplier;
        if self.dry_base >= 1.0 {
            s.dry_base = self.dry_base;
        } else {
            tracing::warn!(
                "--dry-base {} is below 1: the default {} is kept, as llama.cpp does",
                self.dry_base,
                s.dry_base
            );
        }
        s.dry_allowed_length = usize::try_from(self.dry_allowed_length).map_err(|_| {
            anyhow::anyhow!(
                "--dry-allowed-length {}: must be at least 0",
                self.dry_allowed_length
            )
        })?;
        s.dry_penalty_last_n = usize::try_from(self.dry_penalty_last_n).map_err(|_| {
            anyhow::anyhow!(
                "--dry-penalty-last-n {}: must be at least 0",
                self.dry_penalty_last_n
            )
        })?;
        // Processed even with DRY off, for the requests that turn it on.
        let breakers: Vec<String> = self.breakers().iter().map(|b| escapes.apply(b)).collect();
        s.dry_breakers = dry_breakers(tok, n_vocab, &breakers);
        s.adaptive_target = self.adaptive_target;
        s.adaptive_decay = self.adaptive_decay;
        s.dynatemp_range = self.dynatemp_range;
        s.dynatemp_exponent = self.dynatemp_exp;
        s.mirostat = match self.mirostat {
            0 => None,
            1 => Some(MirostatVersion::V1),
            2 => Some(MirostatVersion::V2),
            m => bail!("--mirostat {m}: must be 0 (off), 1 or 2"),
        };
        s.mirostat_eta = self.mirostat_lr;
        s.mirostat_tau = self.mirostat_ent;
        for b in &self.logit_bias {
            let (token, bias) = parse_logit_bias(b).with_context(|| {
                format!("--logit-bias {b:?}: expected TOKEN_ID+BIAS or TOKEN_ID-BIAS")
            })?;
            if token as usize >= n_vocab {
                bail!("--logit-bias {b:?}: token {token} is outside the vocabulary of {n_vocab}");
            }
            s.logit_bias.push((token, bias));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn logit_bias_takes_llama_cpps_syntax() {
        assert_eq!(parse_logit_bias("15043+1"), Some((15043, 1.0)));
        assert_eq!(parse_logit_bias("15043-0.5"), Some((15043, -0.5)));
        assert_eq!(parse_logit_bias("2-inf"), Some((2, f32::NEG_INFINITY)));
        assert_eq!(parse_logit_bias("x+1"), None);
        assert_eq!(parse_logit_bias("12"), None);
    }

    #[derive(clap::Parser)]
    struct Cmd {
        #[command(flatten)]
        s: SamplingArgs,
    }

    fn args(a: &[&str]) -> SamplingArgs {
        use clap::Parser;
        Cmd::parse_from(std::iter::once("x").chain(a.iter().copied())).s
    }

    #[test]
    fn breakers_default_replace_and_none() {
        assert_eq!(args(&[]).breakers().len(), 4);
        let a = args(&[
            "--dry-sequence-breaker",
            "x",
            "--dry-sequence-breaker",
            "none",
        ]);
        assert!(a.breakers().is_empty());
        let a = args(&[
            "--dry-sequence-breaker",
            "none",
            "--dry-sequence-breaker",
            "y",
        ]);
        assert_eq!(a.breakers(), vec!["y".to_owned()]);
        assert_eq!(args(&["-l", "5-2", "-l", "6+1"]).logit_bias, ["5-2", "6+1"]);
    }
}
