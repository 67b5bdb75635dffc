//! Flags that put values over the model file's metadata, spelled as llama.cpp spells them:
//! `--override-kv KEY=TYPE:VALUE,...` and the rope flags (`--rope-scaling`, `--rope-scale`,
//! `--rope-freq-base`, `--rope-freq-scale`, `--yarn-orig-ctx`, and YaRN's mix:
//! `--yarn-ext-factor`, `--yarn-attn-factor`, `--yarn-beta-fast`, `--yarn-beta-slow`), which
//! become overrides of the architecture's rope keys, so the model plugins read them as they read
//! the file's own.

use anyhow::{bail, Context};
use bloomery_exec::overrides::{apply, MetaOverride, OverrideValue};
use bloomery_gguf::GgufModel;
use clap::Args;

/// Metadata overrides.
#[derive(Args, Clone, Debug, Default)]
pub struct MetadataArgs {
    /// Override model metadata by key (llama.cpp's `KEY=TYPE:VALUE`, several comma-separated or
    /// the flag repeated; types int, float, bool, str), e.g.
    /// `tokenizer.ggml.add_bos_token=bool:false`.
    #[arg(long = "override-kv", value_name = "KEY=TYPE:VALUE,...")]
    pub override_kv: Vec<String>,
    /// RoPE frequency scaling: none, linear or yarn (default: the model's).
    #[arg(long = "rope-scaling", env = "LLAMA_ARG_ROPE_SCALING_TYPE")]
    pub rope_scaling: Option<String>,
    /// RoPE context scaling factor: the context expands by N.
    #[arg(long = "rope-scale", value_name = "N", env = "LLAMA_ARG_ROPE_SCALE")]
    pub rope_scale: Option<f64>,
    /// RoPE base frequency (default: the model's; 0 too).
    #[arg(
        long = "rope-freq-base",
        value_name = "N",
        env = "LLAMA_ARG_ROPE_FREQ_BASE"
    )]
    pub rope_freq_base: Option<f64>,
    /// RoPE frequency scaling factor: the context expands by 1/N (default: the model's; 0 too).
    #[arg(
        long = "rope-freq-scale",
        value_name = "N",
        env = "LLAMA_ARG_ROPE_FREQ_SCALE"
    )]
    pub rope_freq_scale: Option<f64>,
    /// YaRN: the model's original context (default: the model's training context; 0 too).
    #[arg(
        long = "yarn-orig-ctx",
        value_name = "N",
        env = "LLAMA_ARG_YARN_ORIG_CTX"
    )]
    pub yarn_orig_ctx: Option<u32>,
    /// YaRN extrapolation mix factor (default: 1 under YaRN, else 0; negative too).
    #[arg(
        long = "yarn-ext-factor",
        value_name = "N",
        allow_negative_numbers = true,
        env = "LLAMA_ARG_YARN_EXT_FACTOR"
    )]
    pub yarn_ext_factor: Option<f64>,
    /// YaRN magnitude scale (used without an extrapolation mix; default 1; negative too).
    #[arg(
        long = "yarn-attn-factor",
        value_name = "N",
        allow_negative_numbers = true,
        env = "LLAMA_ARG_YARN_ATTN_FACTOR"
    )]
    pub yarn_attn_factor: Option<f64>,
    /// YaRN high correction dim (default 1; negative too).
    #[arg(
        long = "yarn-beta-slow",
        value_name = "N",
        allow_negative_numbers = true,
        env = "LLAMA_ARG_YARN_BETA_SLOW"
    )]
    pub yarn_beta_slow: Option<f64>,
    /// YaRN low correction dim (default 32; negative too).
    #[arg(
        long = "yarn-beta-fast",
        value_name = "N",
        allow_negative_numbers = true,
        env = "LLAMA_ARG_YARN_BETA_FAST"
    )]
    pub yarn_beta_fast: Option<f64>,
}

impl MetadataArgs {
    /// The overrides these flags give for a model of architecture `arch`: `--override-kv`'s in
    /// order, then the rope flags' (which, as llama.cpp's context settings, win over both).
    pub fn overrides(&self, arch: &str) -> anyhow::Result<Vec<MetaOverride>> {
        let mut out = Vec::new();
        for item in self.override_kv.iter().flat_map(|v| v.split(',')) {
            out.push(MetaOverride::parse(item).map_err(anyhow::Error::msg)?);
        }
        let mut set = |name: &str, value: OverrideValue| {
            out.push(MetaOverride {
                key: format!("{arch}.{name}"),
                value,
            })
        };
        if let Some(t) = &self.rope_scaling {
            if !["none", "linear", "yarn"].contains(&t.as_str()) {
                bail!("--rope-scaling {t:?}: expected none, linear or yarn");
            }
            set("rope.scaling.type", OverrideValue::Str(t.clone()));
        }
        let factor = match (self.rope_scale, self.rope_freq_scale) {
            (Some(_), Some(_)) => bail!("give --rope-scale or --rope-freq-scale, not both"),
            (Some(n), None) => Some((n, "--rope-scale")),
            (None, Some(s)) if s != 0.0 => Some((1.0 / s, "--rope-freq-scale")),
            (None, _) => None,
        };
        if let Some((n, flag)) = factor {
            if !(n.is_finite() && n > 0.0) {
                bail!("{flag}: the scale must be a positive number");
            }
            set("rope.scaling.factor", OverrideValue::Float(n));
        }
        match self.rope_freq_base {
            Some(b) if b != 0.0 => {
                if !(b.is_finite() && b > 1.0) {
                    bail!("--rope-freq-base {b}: a base above 1, or 0 for the model's");
                }
                set("rope.freq_base", OverrideValue::Float(b));
            }
            _ => {}
        }
        if let Some(n) = self.yarn_orig_ctx.filter(|&n| n != 0) {
            set(
                "rope.scaling.original_context_length",
                OverrideValue::Int(i64::from(n)),
            );
        }
        // Negative is llama.cpp's "not set": the model's (or the scaling type's) value stands.
        for (flag, name, v) in [
            ("--yarn-ext-factor", "yarn_ext_factor", self.yarn_ext_factor),
            (
                "--yarn-attn-factor",
                "yarn_attn_factor",
                self.yarn_attn_factor,
            ),
            ("--yarn-beta-slow", "yarn_beta_slow", self.yarn_beta_slow),
            ("--yarn-beta-fast", "yarn_beta_fast", self.yarn_beta_fast),
        ] {
            match v {
                Some(v) if !v.is_finite() => bail!("{flag} {v}: expected a number"),
                Some(v) if v >= 0.0 => {
                    set(&format!("rope.scaling.{name}"), OverrideValue::Float(v))
                }
                _ => {}
            }
        }
        Ok(out)
    }

    /// Opens the model file at `path` with these overrides over its metadata; also returns
    /// them, kept for the process, for the loader's [`bloomery_exec::LoadOptions::overrides`].
    pub fn open(
        &self,
        path: &std::path::Path,
    ) -> anyhow::Result<(GgufModel, &'static [MetaOverride])> {
        let mut file = GgufModel::open(path)?;
        let arch = file
            .metadata()
            .get_str("general.architecture")
            .with_context(|| format!("{}: no general.architecture", path.display()))?
            .to_owned();
        let overrides = self.overrides(&arch)?;
        apply(file.metadata_mut(), &overrides)
            .map_err(|why| anyhow::anyhow!("{}: {why}", path.display()))?;
        // The command line's, read once: they live as long as the process.
        Ok((file, Vec::leak(overrides)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(f: impl FnOnce(&mut MetadataArgs)) -> MetadataArgs {
        let mut a = MetadataArgs::default();
        f(&mut a);
        a
    }

    #[test]
    fn rope_flags_become_the_architecture_s_rope_keys() {
        let a = args(|a| {
            a.override_kv = vec!["x.a=int:1,x.b=bool:true".into(), "x.c=str:z".into()];
            a.rope_scaling = Some("yarn".into());
            a.rope_freq_scale = Some(0.25);
            a.rope_freq_base = Some(5e5);
            a.yarn_orig_ctx = Some(32768);
        });
        let got: Vec<(String, OverrideValue)> = a
            .overrides("qwen3moe")
            .unwrap()
            .into_iter()
            .map(|o| (o.key, o.value))
            .collect();
        assert_eq!(
            got,
            [
                ("x.a".into(), OverrideValue::Int(1)),
                ("x.b".into(), OverrideValue::Bool(true)),
                ("x.c".into(), OverrideValue::Str("z".into())),
                (
                    "qwen3moe.rope.scaling.type".into(),
                    OverrideValue::Str("yarn".into())
                ),
                (
                    "qwen3moe.rope.scaling.factor".into(),
                    OverrideValue::Float(4.0)
                ),
                ("qwen3moe.rope.freq_base".into(), OverrideValue::Float(5e5)),
                (
                    "qwen3moe.rope.scaling.original_context_length".into(),
                    OverrideValue::Int(32768)
                ),
            ]
        );
        // llama.cpp's 0 means the model's own.
        let zeros = args(|a| {
            a.rope_freq_base = Some(0.0);
            a.rope_freq_scale = Some(0.0);
            a.yarn_orig_ctx = Some(0);
        });
        assert!(zeros.overrides("a").unwrap().is_empty());
    }

    #[test]
    fn bad_rope_flags_are_named() {
        for (a, says) in [
            (
                args(|a| a.rope_scaling = Some("ntk".into())),
                "--rope-scaling",
            ),
            (args(|a| a.rope_scale = Some(-2.0)), "--rope-scale"),
            (
                args(|a| {
                    a.rope_scale = Some(2.0);
                    a.rope_freq_scale = Some(0.5);
                }),
                "not both",
            ),
            (args(|a| a.rope_freq_base = Some(0.5)), "--rope-freq-base"),
            (
                args(|a| a.override_kv = vec!["k=int:x".into()]),
                "--override-kv",
            ),
        ] {
            let e = a.overrides("a").unwrap_err().to_string();
            assert!(e.contains(says), "{e}");
        }
    }

    #[test]
    fn yarn_mix_flags_become_keys_and_negative_is_unset() {
        let a = args(|a| {
            a.yarn_ext_factor = Some(0.5);
            a.yarn_attn_factor = Some(-1.0);
            a.yarn_beta_fast = Some(8.0);
        });
        let got: Vec<(String, OverrideValue)> = a
            .overrides("q")
            .unwrap()
            .into_iter()
            .map(|o| (o.key, o.value))
            .collect();
        assert_eq!(
            got,
            [
                (
                    "q.rope.scaling.yarn_ext_factor".into(),
                    OverrideValue::Float(0.5)
                ),
                (
                    "q.rope.scaling.yarn_beta_fast".into(),
                    OverrideValue::Float(8.0)
                ),
            ]
        );
        let nan = args(|a| a.yarn_beta_slow = Some(f64::NAN));
        let e = nan.overrides("q").unwrap_err().to_string();
        assert!(e.contains("--yarn-beta-slow"), "{e}");
    }
}
