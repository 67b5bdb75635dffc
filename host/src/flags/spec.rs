//! Draft decoding flags of `serve`, `run` and `bench`, spelled as llama-server b11434 spells them,
//! each with its `LLAMA_ARG_*` twin: `--spec-type` (none, draft-mtp, draft-simple, ngram-simple,
//! ngram-mod, several combined as llama-server b11434 combines them: the n-gram types consulted
//! first each step, then the draft model or MTP block; llama.cpp's other types refused by name),
//! `--spec-draft-n-max`, `--spec-draft-n-min`, `--spec-draft-p-min` and
//! `--spec-draft-model` (`-md`: a separate file's MTP block drafts, qwen4exp's; `serve` only).
//! A file with MTP layers drafts with them unless `--spec-type none` (issue 48): each slot's
//! drafting gate (`bloomery_runtime::draft_gate`) keeps drafting on only while its measured
//! costs say it pays, since on an H100, before verify passes kept per-row states, drafting made
//! decode 4–11× slower (docs/performance.md, 2026-12-07; the card's figures for the gated path
//! are still to be measured). `--spec-synth-len` is
//! llama-server's synthetic acceptance length for benchmarks on random-weight files (tokens a
//! verify step, the target's own included), ungated, since it benchmarks the drafting path
//! itself; `--spec-no-gate` (bloomery's) drafts every step ungated. `bench` runs each of its `--spec-type` and `--spec-synth-len` values as a test of its
//! own.

use anyhow::bail;
use bloomery_runtime::ngram_draft::{NgramModConfig, NgramSimpleConfig};
use bloomery_runtime::ngram_map::NgramMapConfig;
use bloomery_runtime::spec::{SpecConfig, SpecType, SynthRates};
use clap::Args;

/// Draft decoding.
#[derive(Args, Debug, Clone, PartialEq)]
pub struct SpecArgs {
    /// Comma-separated speculative decoding types: `none`, `draft-mtp` (the model's own MTP
    /// block; the default for a file with MTP layers, each slot drafting while it pays),
    /// `draft-simple` (a draft model, -md), `ngram-simple`, `ngram-map-k`, `ngram-map-k4v`,
    /// `ngram-mod` (token history). Several are combined as llama-server combines them: each
    /// step the n-gram types in that order, then draft-simple or draft-mtp, the first non-empty
    /// draft drafting it
    /// (`bench` runs each value as a test of its own; `a+b` there is one test combining them).
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
    /// Benchmarking only (the output is not valid): drafts kept at random for a mean of L
    /// tokens a verify step, the target's own included (1 to --spec-draft-n-max + 1, as
    /// llama-server's); the real draft and verify passes run. `bench` takes a comma-separated
    /// list, each value a test of its own.
    #[arg(
        long = "spec-synth-len",
        value_name = "L[,L...]",
        env = "LLAMA_ARG_SPEC_SYNTH_LEN"
    )]
    pub synth_len: Option<String>,
    /// Benchmarking only (the output is not valid): the unconditional probability that each
    /// draft position is kept, comma-separated, one per drafted position (at most
    /// --spec-draft-n-max after the model's own limit), non-increasing, each within [0, 1]; as
    /// llama-server's, instead of --spec-synth-len.
    #[arg(
        long = "spec-synth-rates",
        value_name = "P0,P1,...",
        env = "LLAMA_ARG_SPEC_SYNTH_RATES"
    )]
    pub synth_rates: Option<String>,
    /// The MTP block's own file, drafting with `--spec-type draft-mtp` (qwen4exp's MTP-only
    /// file, as llama.cpp b11434's converter `--mtp` writes it); `serve` only.
    #[arg(
        long = "spec-draft-model",
        visible_alias = "model-draft",
        value_name = "FILE",
        env = "LLAMA_ARG_SPEC_DRAFT_MODEL"
    )]
    pub draft_model: Option<std::path::PathBuf>,
    /// Draft every step a slot can, whatever it costs (bloomery's; no drafting gate): for
    /// draft counts comparable with llama-server's, and for timing the drafting path itself.
    #[arg(long = "spec-no-gate")]
    pub no_gate: bool,
    /// ngram-simple: tokens looked up in the history, the sampled one last (1 to 1024).
    #[arg(long = "spec-ngram-simple-size-n", value_name = "N", default_value_t = NgramSimpleConfig::DEFAULT.size_n as u16, value_parser = clap::value_parser!(u16).range(1..=1024))]
    pub ngram_simple_size_n: u16,
    /// ngram-simple: most tokens drafted after a match (1 to 1024).
    #[arg(long = "spec-ngram-simple-size-m", value_name = "N", default_value_t = NgramSimpleConfig::DEFAULT.size_m as u16, value_parser = clap::value_parser!(u16).range(1..=1024))]
    pub ngram_simple_size_m: u16,
    /// ngram-simple: at least 1; llama-server b11434's ngram-simple does not read it either
    /// (it looks up the latest match), so it changes nothing, and a warning says so.
    #[arg(long = "spec-ngram-simple-min-hits", value_name = "N", value_parser = clap::value_parser!(u16).range(1..))]
    pub ngram_simple_min_hits: Option<u16>,
    /// ngram-mod: tokens hashed for each lookup (1 to 1024; llama-server warns below 16).
    #[arg(long = "spec-ngram-mod-n-match", value_name = "N", default_value_t = NgramModConfig::DEFAULT.n_match as u16, value_parser = clap::value_parser!(u16).range(1..=1024))]
    pub ngram_mod_n_match: u16,
    /// ngram-mod: most tokens drafted (0 to 1024).
    #[arg(long = "spec-ngram-mod-n-max", value_name = "N", default_value_t = NgramModConfig::DEFAULT.n_max as u16, value_parser = clap::value_parser!(u16).range(0..=1024))]
    pub ngram_mod_n_max: u16,
    /// ngram-mod: a chain that misses before this many tokens drafts nothing (0 to 1024).
    #[arg(long = "spec-ngram-mod-n-min", value_name = "N", default_value_t = NgramModConfig::DEFAULT.n_min as u16, value_parser = clap::value_parser!(u16).range(0..=1024))]
    pub ngram_mod_n_min: u16,
    /// ngram-map-k: tokens of a key looked up in the history, the sampled one last (1 to 1024).
    #[arg(long = "spec-ngram-map-k-size-n", value_name = "N", default_value_t = NgramMapConfig::DEFAULT.size_n as u16, value_parser = clap::value_parser!(u16).range(1..=1024))]
    pub ngram_map_k_size_n: u16,
    /// ngram-map-k: tokens drafted after a key's match, the most (1 to 1024).
    #[arg(long = "spec-ngram-map-k-size-m", value_name = "N", default_value_t = NgramMapConfig::DEFAULT.size_m as u16, value_parser = clap::value_parser!(u16).range(1..=1024))]
    pub ngram_map_k_size_m: u16,
    /// ngram-map-k: at least 1; llama-server b11434's ngram-map-k does not read it (it drafts
    /// from every match), so it changes nothing there nor here.
    #[arg(long = "spec-ngram-map-k-min-hits", value_name = "N", default_value_t = NgramMapConfig::DEFAULT.min_hits, value_parser = clap::value_parser!(u16).range(1..))]
    pub ngram_map_k_min_hits: u16,
    /// ngram-map-k4v: tokens of a key (1 to 1024).
    #[arg(long = "spec-ngram-map-k4v-size-n", value_name = "N", default_value_t = NgramMapConfig::DEFAULT.size_n as u16, value_parser = clap::value_parser!(u16).range(1..=1024))]
    pub ngram_map_k4v_size_n: u16,
    /// ngram-map-k4v: tokens of a value, the most drafted (1 to 1024).
    #[arg(long = "spec-ngram-map-k4v-size-m", value_name = "N", default_value_t = NgramMapConfig::DEFAULT.size_m as u16, value_parser = clap::value_parser!(u16).range(1..=1024))]
    pub ngram_map_k4v_size_m: u16,
    /// ngram-map-k4v: times a key is seen before it drafts (at least 1).
    #[arg(long = "spec-ngram-map-k4v-min-hits", value_name = "N", default_value_t = NgramMapConfig::DEFAULT.min_hits, value_parser = clap::value_parser!(u16).range(1..))]
    pub ngram_map_k4v_min_hits: u16,
}

/// One drafting setup of a benchmark: a single `--spec-type` value (None: the file's default)
/// and a fixed acceptance length.
#[derive(Clone, Debug, PartialEq)]
pub struct BenchSpec {
    /// The type (`none`, `draft-mtp`, or a combination as `--spec-type` takes it:
    /// `ngram-simple,draft-mtp`), or None for the default.
    pub spec_type: Option<String>,
    /// `--spec-synth-len`'s value for this test.
    pub synth_len: Option<f64>,
}

impl BenchSpec {
    /// How the bench's table names it: `none`, `draft-mtp`, `draft-mtp L1.7`,
    /// `ngram-simple+draft-mtp`; `default` for the file's own choice.
    pub fn name(&self) -> String {
        let t = self
            .spec_type
            .as_deref()
            .unwrap_or("default")
            .replace(',', "+");
        match self.synth_len {
            Some(l) => format!("{t} L{l}"),
            None => t.to_owned(),
        }
    }
}

/// llama-server b11434's speculative decoding types that bloomery does not implement.
const OTHER_TYPES: &[&str] = &[
    "draft-eagle3",
    "draft-dflash",
    "draft-dspark",
    "ngram-cache",
];

/// The types one `--spec-type` list names (llama-server's types, combined as b11434 combines
/// them: see [`SpecConfig::with_types`]); `none` alone is no type. An unknown or unimplemented
/// type, or `none` beside others (b11434 drops them all), is an error naming it.
fn types_of(list: &str) -> anyhow::Result<Vec<SpecType>> {
    let mut types = Vec::new();
    let names: Vec<&str> = list.split(',').map(str::trim).collect();
    for &t in &names {
        types.push(match t {
            "none" if names.len() == 1 => continue,
            "none" => bail!(
                "--spec-type {list}: none beside other types (llama-server then drafts with \
                 none of them): name none alone"
            ),
            "draft-mtp" => SpecType::DraftMtp,
            "ngram-simple" => SpecType::NgramSimple,
            "ngram-mod" => SpecType::NgramMod,
            "ngram-map-k" => SpecType::NgramMapK,
            "ngram-map-k4v" => SpecType::NgramMapK4v,
            "draft-simple" => SpecType::DraftSimple,
            t if OTHER_TYPES.contains(&t) => bail!(
                "--spec-type {t}: not supported: draft-mtp (the model's own MTP block), \
                 draft-simple (a draft model, -md), ngram-simple, ngram-map-k, ngram-map-k4v \
                 and ngram-mod (token history) are implemented"
            ),
            t => bail!(
                "--spec-type {t}: unknown speculative decoding type (none, draft-mtp, \
                 draft-simple, ngram-simple, ngram-map-k, ngram-map-k4v, ngram-mod, {})",
                OTHER_TYPES.join(", ")
            ),
        });
    }
    SpecConfig::OFF
        .with_types(&types)
        .map_err(|e| anyhow::anyhow!("--spec-type {list}: {e}"))?;
    Ok(types)
}

impl SpecArgs {
    /// Refuses `--spec-draft-model` (`-md`) where `command` does not load one.
    pub fn refuse_draft_model(&self, command: &str) -> anyhow::Result<()> {
        match &self.draft_model {
            Some(p) => bail!(
                "--spec-draft-model {}: `{command}` does not load a draft file (`serve` does)",
                p.display()
            ),
            None => Ok(()),
        }
    }

    /// The drafting these flags ask for on a model of `arch` with `n_mtp_layers` MTP layers, for
    /// `serve` and `run`; an unknown or unimplemented type, `draft-mtp` on a model without MTP
    /// layers, or a synthetic length out of range or given as a list is an error naming it.
    pub fn config(&self, n_mtp_layers: u32, arch: &str) -> anyhow::Result<SpecConfig> {
        let synth = match self.synth_len.as_deref() {
            None => None,
            Some(v) if v.contains(',') => {
                bail!("--spec-synth-len {v}: one length (only `bloomery bench` takes a list)")
            }
            Some(v) => Some(self.length(v)?),
        };
        self.resolve(self.spec_type.as_deref(), synth, n_mtp_layers, arch)
    }

    /// Most tokens a drafting step may draft, for the placement plan (which counts it only for
    /// a file with MTP layers): `--spec-draft-n-max`, or 0 where `--spec-type` (every value of
    /// bench's list) turns drafting off; an unknown or unimplemented type is an error naming it.
    pub fn planned_n_max(&self) -> anyhow::Result<u32> {
        let mut n = 0;
        for kind in self.planned_kinds()? {
            n = n.max(match kind {
                SpecType::None => 0,
                SpecType::DraftMtp => self.n_max,
                SpecType::NgramSimple => usize::from(self.ngram_simple_size_m),
                SpecType::NgramMod => usize::from(self.ngram_mod_n_max),
                SpecType::NgramMapK => usize::from(self.ngram_map_k_size_m),
                SpecType::NgramMapK4v => usize::from(self.ngram_map_k4v_size_m),
                SpecType::DraftSimple => self.n_max,
            });
        }
        Ok(u32::try_from(n).unwrap_or(u32::MAX))
    }

    /// Whether the drafts come from elsewhere than the model's MTP layers (an n-gram type or
    /// `draft-simple` among `--spec-type`'s values), so that the plan keeps drafting room for a
    /// model without MTP layers too.
    pub fn planned_history(&self) -> anyhow::Result<bool> {
        Ok(self
            .planned_kinds()?
            .iter()
            .any(|k| !matches!(k, SpecType::None | SpecType::DraftMtp)))
    }

    /// Whether `--spec-type` names draft-simple: the `--spec-draft-model` file drafts whole.
    pub fn draft_simple(&self) -> anyhow::Result<bool> {
        Ok(self.planned_kinds()?.contains(&SpecType::DraftSimple))
    }

    /// Every type `--spec-type` names (whether one list combined or bench's tests, each value
    /// of its list), or the default (MTP layers' drafting, where the file has them).
    fn planned_kinds(&self) -> anyhow::Result<Vec<SpecType>> {
        match self.spec_type.as_deref() {
            None => Ok(vec![SpecType::DraftMtp]),
            Some(list) => list
                .split(',')
                .map(types_of)
                .try_fold(Vec::new(), |mut all, t| {
                    all.extend(t?);
                    Ok(all)
                }),
        }
    }

    /// `--spec-synth-rates` for drafting as `spec` asks on a model of `arch`: one rate per
    /// position the longest draft holds, checked as llama-server checks them, and not with a
    /// synthetic length.
    fn rates(
        &self,
        spec: SpecConfig,
        arch: &str,
        synth_len: Option<f64>,
    ) -> anyhow::Result<Option<SynthRates>> {
        let Some(list) = self.synth_rates.as_deref() else {
            return Ok(None);
        };
        if synth_len.is_some() {
            bail!(
                "--spec-synth-rates: synthetic acceptance length and rates are mutually exclusive"
            );
        }
        if spec.kind == SpecType::None {
            bail!("--spec-synth-rates {list}: nothing drafts (--spec-type none, or no MTP layers)");
        }
        let values = list
            .split(',')
            .map(|v| v.trim().parse::<f64>())
            .collect::<Result<Vec<_>, _>>()
            .map_err(|_| anyhow::anyhow!("--spec-synth-rates {list:?}: expected numbers"))?;
        let rates = SynthRates::new(&values)
            .map_err(|e| anyhow::anyhow!("--spec-synth-rates {list}: {e}"))?;
        let n_max = spec.for_model(arch).most();
        if values.len() != n_max {
            bail!(
                "--spec-synth-rates {list}: synthetic acceptance rates must contain {n_max} \
                 values (one per drafted position), got {}",
                values.len()
            );
        }
        Ok(Some(rates))
    }

    /// Most tokens a step of `kind` drafts: n-gram drafts are as long as the match gives (the
    /// room left bounds them), as in llama-server, where --spec-draft-n-max bounds a draft
    /// model's and the MTP block's.
    fn n_max_of(&self, kind: SpecType) -> usize {
        match kind {
            SpecType::NgramSimple => usize::from(self.ngram_simple_size_m),
            SpecType::NgramMod => usize::from(self.ngram_mod_n_max),
            SpecType::NgramMapK => usize::from(self.ngram_map_k_size_m),
            SpecType::NgramMapK4v => usize::from(self.ngram_map_k4v_size_m),
            _ => self.n_max,
        }
    }

    /// One `--spec-synth-len` value, between 1 and `--spec-draft-n-max` + 1.
    fn length(&self, v: &str) -> anyhow::Result<f64> {
        let l: f64 = v.trim().parse().map_err(|_| {
            anyhow::anyhow!("--spec-synth-len {v:?}: expected a mean acceptance length")
        })?;
        if !(1.0..=self.n_max as f64 + 1.0).contains(&l) {
            bail!(
                "--spec-synth-len {v}: must lie between 1 and --spec-draft-n-max + 1 ({}): tokens \
                 a verify step, the target's own included",
                self.n_max + 1
            );
        }
        Ok(l)
    }

    /// The drafting setups a benchmark runs, each value of `--spec-type` (comma-separated) and
    /// with drafting each value of `--spec-synth-len` a test of its own; checked before any
    /// model loads.
    pub fn bench_specs(&self) -> anyhow::Result<Vec<BenchSpec>> {
        let lens = match &self.synth_len {
            None => vec![None],
            Some(list) => list
                .split(',')
                .map(|v| self.length(v).map(Some))
                .collect::<anyhow::Result<_>>()?,
        };
        let types: Vec<Option<String>> = match &self.spec_type {
            None => vec![None],
            // `a+b` is one test drafting with both (a comma separates tests).
            Some(list) => list
                .split(',')
                .map(|t| Some(t.trim().replace('+', ",")))
                .collect(),
        };
        let mut out = Vec::new();
        for t in types {
            if let Some(t) = &t {
                types_of(t)?;
            }
            if t.as_deref() == Some("none") {
                out.push(BenchSpec {
                    spec_type: t,
                    synth_len: None,
                });
                continue;
            }
            out.extend(lens.iter().map(|&synth_len| BenchSpec {
                spec_type: t.clone(),
                synth_len,
            }));
        }
        if self.synth_len.is_some() && out.iter().all(|b| b.synth_len.is_none()) {
            bail!("--spec-synth-len: --spec-type none drafts nothing to accept");
        }
        Ok(out)
    }

    /// A benchmark setup's drafting on a model of `arch` with `n_mtp_layers` MTP layers.
    pub fn bench_config(
        &self,
        b: &BenchSpec,
        n_mtp_layers: u32,
        arch: &str,
    ) -> anyhow::Result<SpecConfig> {
        self.resolve(b.spec_type.as_deref(), b.synth_len, n_mtp_layers, arch)
    }

    fn resolve(
        &self,
        spec_type: Option<&str>,
        synth_len: Option<f64>,
        n_mtp_layers: u32,
        arch: &str,
    ) -> anyhow::Result<SpecConfig> {
        let types = match spec_type {
            // A file with MTP layers drafts with them.
            None if n_mtp_layers > 0 => vec![SpecType::DraftMtp],
            None => Vec::new(),
            Some(list) => {
                let types = types_of(list)?;
                if types.contains(&SpecType::DraftMtp) && n_mtp_layers == 0 {
                    bail!("--spec-type draft-mtp: this model (`{arch}`) has no MTP layers");
                }
                types
            }
        };
        let ngram_simple = NgramSimpleConfig {
            size_n: usize::from(self.ngram_simple_size_n),
            size_m: usize::from(self.ngram_simple_size_m),
        };
        let mut spec = SpecConfig {
            n_min: self.n_min,
            p_min: self.p_min,
            synth_len,
            gate: !self.no_gate,
            ngram_simple,
            ngram_mod: NgramModConfig {
                n_match: usize::from(self.ngram_mod_n_match),
                n_max: usize::from(self.ngram_mod_n_max),
                n_min: usize::from(self.ngram_mod_n_min),
            },
            ngram_map_k: NgramMapConfig {
                size_n: usize::from(self.ngram_map_k_size_n),
                size_m: usize::from(self.ngram_map_k_size_m),
                min_hits: self.ngram_map_k_min_hits,
            },
            ngram_map_k4v: NgramMapConfig {
                size_n: usize::from(self.ngram_map_k4v_size_n),
                size_m: usize::from(self.ngram_map_k4v_size_m),
                min_hits: self.ngram_map_k4v_min_hits,
            },
            ..SpecConfig::OFF
        }
        .with_types(&types)
        .map_err(|e| anyhow::anyhow!("--spec-type: {e}"))?;
        let kind = spec.kind;
        spec.n_max = self.n_max_of(kind);
        if kind == SpecType::DraftSimple && self.draft_model.is_none() {
            bail!(
                "--spec-type draft-simple: no draft model: name one with --spec-draft-model (-md)"
            );
        }
        spec.synth_rates = self.rates(spec, arch, synth_len)?;
        if let (Some(l), SpecType::None) = (synth_len, kind) {
            bail!("--spec-synth-len {l}: this model (`{arch}`) has no MTP layers to draft with");
        }
        if let (Some(h), true) = (
            self.ngram_simple_min_hits,
            types.contains(&SpecType::NgramSimple),
        ) {
            tracing::warn!(
                "--spec-ngram-simple-min-hits {h}: ngram-simple drafts after the latest match \
                 whatever the hits (as llama-server b11434's does): no effect"
            );
        }
        let n_max = spec.for_model(arch).most();
        if let Some(l) = synth_len.filter(|&l| l > n_max as f64 + 1.0) {
            bail!(
                "--spec-synth-len {l}: this model's MTP layers (`{arch}`) draft at most {n_max} \
                 token(s) a step, so a step makes at most {} tokens",
                n_max + 1
            );
        }
        Ok(spec)
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
            synth_len: None,
            draft_model: None,
            no_gate: false,
            ngram_simple_size_n: 3,
            ngram_simple_size_m: 20,
            ngram_simple_min_hits: None,
            ngram_mod_n_match: 24,
            ngram_mod_n_max: 64,
            ngram_mod_n_min: 48,
            ngram_map_k_size_n: 12,
            ngram_map_k_size_m: 48,
            ngram_map_k_min_hits: 1,
            ngram_map_k4v_size_n: 12,
            ngram_map_k4v_size_m: 48,
            ngram_map_k4v_min_hits: 1,
            synth_rates: None,
        }
    }

    #[test]
    fn ngram_simple_drafts_on_any_model_as_long_as_its_m_gram_and_plans_for_it() {
        let mut a = args(Some("ngram-simple"));
        let c = a.config(0, "qwen3moe").unwrap();
        assert_eq!((c.kind, c.n_max), (SpecType::NgramSimple, 20));
        assert_eq!((c.ngram_simple.size_n, c.ngram_simple.size_m), (3, 20));
        // GLM-5.3's one-token NextN width bounds only its MTP drafting.
        assert_eq!(
            a.config(1, "glm5-next")
                .unwrap()
                .for_model("glm5-next")
                .n_max,
            20
        );
        assert_eq!(
            (a.planned_n_max().unwrap(), a.planned_history().unwrap()),
            (20, true)
        );
        a.spec_type = Some("none,ngram-simple".into());
        assert_eq!(a.planned_n_max().unwrap(), 20);
        a.spec_type = None;
        assert_eq!(
            (a.planned_n_max().unwrap(), a.planned_history().unwrap()),
            (5, false)
        );
        // Types combined as b11434 combines them, whatever the order listed: the n-gram types
        // first, each its own limit; the longest draft sizes the verify pass.
        let c = args(Some("draft-mtp,ngram-simple")).config(1, "x").unwrap();
        assert_eq!(
            (c.kind, &*c.first, c.n_max, c.most()),
            (SpecType::DraftMtp, &[SpecType::NgramSimple][..], 5, 20)
        );
        assert_eq!(c.names(), "ngram-simple,draft-mtp");
        let c = args(Some("ngram-mod,draft-simple,ngram-simple,ngram-mod"));
        let e = c.config(0, "x").unwrap_err().to_string();
        assert!(e.contains("draft-simple: no draft model"), "{e}");
        let c = args(Some("ngram-mod,ngram-simple")).config(0, "x").unwrap();
        assert_eq!(
            (c.kind, &*c.first, c.most()),
            (SpecType::NgramMod, &[SpecType::NgramSimple][..], 64)
        );
        let c = args(Some("ngram-simple,ngram-mod,draft-mtp")).config(1, "x");
        assert_eq!(c.unwrap().names(), "ngram-simple,ngram-mod,draft-mtp");
        // The two maps sit between ngram-simple and ngram-mod in b11434's order.
        let c = args(Some(
            "ngram-mod,ngram-map-k4v,draft-mtp,ngram-map-k,ngram-simple",
        ));
        let c = c.config(1, "x").unwrap();
        assert_eq!(
            c.names(),
            "ngram-simple,ngram-map-k,ngram-map-k4v,ngram-mod,draft-mtp"
        );
        assert_eq!(c.most(), 64);
        let c = args(Some("ngram-map-k4v")).config(0, "x").unwrap();
        assert_eq!(
            (c.kind, c.n_max, c.ngram_map_k4v.size_m),
            (SpecType::NgramMapK4v, 48, 48)
        );
        let refused = |list: &str, what: &str| {
            let e = args(Some(list)).config(1, "x").unwrap_err().to_string();
            assert!(e.contains(what), "{list}: {e}");
        };
        refused(
            "draft-simple,draft-mtp",
            "combining draft-simple with draft-mtp",
        );
        refused("ngram-simple,none", "none beside other types");
        refused(
            "ngram-simple,ngram-cache",
            "--spec-type ngram-cache: not supported",
        );
        let mut r = args(Some("draft-mtp"));
        r.synth_rates = Some("0.8,0.5,0.5,0.1,0".into());
        let c = r.config(1, "qwen35moe").unwrap();
        assert_eq!(c.synth_rates.unwrap().rates(), &[0.8, 0.5, 0.5, 0.1, 0.0]);
        assert!(!c.gated());
        r.synth_rates = Some("0.8,0.5".into());
        let e = r.config(1, "qwen35moe").unwrap_err().to_string();
        assert!(e.contains("must contain 5 values"), "{e}");
        r.synth_len = Some("2".into());
        let e = r.config(1, "qwen35moe").unwrap_err().to_string();
        assert!(e.contains("mutually exclusive"), "{e}");
        let m = args(Some("ngram-mod"));
        let c = m.config(0, "qwen3moe").unwrap();
        assert_eq!(
            (c.kind, c.n_max, c.ngram_mod.n_match),
            (SpecType::NgramMod, 64, 24)
        );
        assert_eq!(
            (m.planned_n_max().unwrap(), m.planned_history().unwrap()),
            (64, true)
        );
    }

    #[test]
    fn drafting_is_on_by_default_with_mtp_layers_off_when_asked_and_refused_without_them() {
        let default = args(None).config(1, "qwen35moe").unwrap();
        assert_eq!((default.kind, default.gate), (SpecType::DraftMtp, true));
        let mut ungated = args(None);
        ungated.no_gate = true;
        assert!(!ungated.config(1, "qwen35moe").unwrap().gate);
        let on = args(Some("draft-mtp")).config(1, "qwen35moe").unwrap();
        assert_eq!(
            (on.kind, on.n_max, on.n_min, on.p_min),
            (SpecType::DraftMtp, 5, 1, 0.5)
        );
        let mut synth = args(None);
        synth.synth_len = Some("2".into());
        assert_eq!(
            synth.config(1, "qwen35moe").unwrap().kind,
            SpecType::DraftMtp
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
        let e = args(Some("draft-mtp,ngram-cache"))
            .config(1, "x")
            .unwrap_err();
        assert!(
            e.to_string()
                .starts_with("--spec-type ngram-cache: not supported"),
            "{e}"
        );
        let e = args(Some("draft-mpt")).config(1, "x").unwrap_err();
        assert!(
            e.to_string().starts_with("--spec-type draft-mpt: unknown"),
            "{e}"
        );
    }

    #[test]
    fn a_benchmark_runs_each_type_and_length_and_only_bench_takes_a_length() {
        let mut a = args(Some("none,draft-mtp"));
        a.n_max = 3;
        a.synth_len = Some("1.2, 2.8".into());
        let names: Vec<String> = a.bench_specs().unwrap().iter().map(|b| b.name()).collect();
        assert_eq!(names, ["none", "draft-mtp L1.2", "draft-mtp L2.8"]);
        let specs = a.bench_specs().unwrap();
        let c = a.bench_config(&specs[2], 1, "x").unwrap();
        assert_eq!((c.kind, c.synth_len), (SpecType::DraftMtp, Some(2.8)));
        assert_eq!(a.bench_config(&specs[0], 1, "x").unwrap().synth_len, None);
        // The file's default type, with a length: refused on a file without MTP layers.
        let mut d = args(None);
        d.synth_len = Some("2.7".into());
        let b = &d.bench_specs().unwrap()[0];
        assert_eq!(b.name(), "default L2.7");
        let e = d.bench_config(b, 0, "qwen3moe").unwrap_err().to_string();
        assert!(
            e.contains("(`qwen3moe`) has no MTP layers to draft with"),
            "{e}"
        );
        // GLM-5.3's NextN layer drafts one token a step: at most 2 tokens a step.
        let e = d.bench_config(b, 1, "glm5-next").unwrap_err().to_string();
        assert!(
            e.contains("(`glm5-next`) draft at most 1 token(s) a step, so a step makes at most 2"),
            "{e}"
        );
        d.synth_len = Some("1.7".into());
        let b = &d.bench_specs().unwrap()[0];
        assert_eq!(
            d.bench_config(b, 1, "glm5-next").unwrap().synth_len,
            Some(1.7)
        );
        let refused = |a: &SpecArgs, what: &str| {
            let e = a.bench_specs().unwrap_err().to_string();
            assert!(e.contains(what), "{e}");
        };
        a.synth_len = Some("4.5".into());
        refused(&a, "between 1 and --spec-draft-n-max + 1 (4)");
        a.synth_len = Some("x".into());
        refused(&a, "expected a mean acceptance length");
        a.synth_len = Some("0.5".into());
        refused(&a, "between 1");
        let mut n = args(Some("none"));
        n.synth_len = Some("2".into());
        refused(&n, "--spec-type none drafts nothing");
        refused(
            &args(Some("draft-mtp,ngram-cache")),
            "ngram-cache: not supported",
        );
        // `+` combines types in one test, as a comma does for serve.
        let c = args(Some("none, ngram-simple+draft-mtp"));
        let specs = c.bench_specs().unwrap();
        let names: Vec<String> = specs.iter().map(|b| b.name()).collect();
        assert_eq!(names, ["none", "ngram-simple+draft-mtp"]);
        let both = c.bench_config(&specs[1], 1, "x").unwrap();
        assert_eq!(both.kind, SpecType::DraftMtp);
        assert_eq!(
            both.first,
            args(Some("ngram-simple,draft-mtp"))
                .config(1, "x")
                .unwrap()
                .first
        );
        refused(&args(Some("none+draft-mtp")), "none");
        // serve and run take one length, checked as bench checks it.
        assert_eq!(d.config(1, "x").unwrap().synth_len, Some(1.7));
        d.synth_len = Some("1.5,2".into());
        let e = d.config(1, "x").unwrap_err().to_string();
        assert!(
            e.contains("one length (only `bloomery bench` takes a list)"),
            "{e}"
        );
        d.synth_len = Some("7".into());
        let e = d.config(1, "x").unwrap_err().to_string();
        assert!(
            e.contains("between 1 and --spec-draft-n-max + 1 (6)"),
            "{e}"
        );
    }
}
