//! Draft decoding with the model's own multi-token-prediction (MTP) block, as llama-server's
//! `--spec-type draft-mtp` runs it (common/speculative.cpp of b11434): after every target pass the
//! block runs over the pass's rows, each token paired with the target's final-norm row of the
//! position before (the first with the row kept from the previous pass), which fills the block's
//! own K/V cache; then, from the last sampled token and the target's row that sampled it, the
//! block drafts up to `n_max` tokens, each step pairing its drafted token with the block's own
//! final-norm row. The first draft row goes through the block in the same pass as the rows it
//! takes in, and a draft pass reads back only its rows and the ten likeliest ids with their
//! probabilities ([`Readout::Top`]), not its logits. A draft is its greedy choice, kept while the probability of that choice among
//! the ten likeliest tokens reaches `p_min`, and dropped whole when shorter than `n_min`.
//!
//! Other sources (tests, benchmarks) draft through [`DraftSource`]. For benchmarks on
//! random-weight files, whose drafts are almost never right, [`SynthAcceptance`] keeps drafts
//! at random for a fixed mean acceptance length (llama-server's `--spec-synth-len`).

use bloomery_exec::{BatchInputs, LoadedModel, Readout};
use bloomery_plugin_api::model::ModelSpec;

use crate::sampling::rng::Mt19937;

/// Which drafts a generation is verified against (llama-server's `--spec-type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SpecType {
    /// No drafts.
    None,
    /// The model's MTP block (`draft-mtp`).
    DraftMtp,
    /// The slot's own history (`ngram-simple`, [`crate::ngram_draft`]).
    NgramSimple,
    /// A table of every slot's history (`ngram-mod`, [`crate::ngram_draft`]).
    NgramMod,
    /// A map per slot of its history's n-grams (`ngram-map-k`, [`crate::ngram_map`]).
    NgramMapK,
    /// The same map with up to four values per key (`ngram-map-k4v`, [`crate::ngram_map`]).
    NgramMapK4v,
    /// A separate, smaller model (`draft-simple` with `-md`, [`crate::draft_model`]).
    DraftSimple,
}

impl SpecType {
    /// The type's name as `--spec-type` spells it and llama-server reports it
    /// (`speculative.types` in a slot's params).
    pub fn name(self) -> &'static str {
        match self {
            SpecType::None => "none",
            SpecType::DraftMtp => "draft-mtp",
            SpecType::NgramSimple => "ngram-simple",
            SpecType::NgramMod => "ngram-mod",
            SpecType::NgramMapK => "ngram-map-k",
            SpecType::NgramMapK4v => "ngram-map-k4v",
            SpecType::DraftSimple => "draft-simple",
        }
    }
}

/// `--spec-ngram-simple-*` settings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NgramSimpleConfig {
    /// Tokens looked for (`--spec-ngram-simple-size-n`, 1 to 1024).
    pub size_n: usize,
    /// Most tokens drafted after a match (`--spec-ngram-simple-size-m`, 1 to 1024).
    pub size_m: usize,
}

impl NgramSimpleConfig {
    /// llama-server b11434's defaults (common.h `common_params_speculative_ngram_map`).
    pub const DEFAULT: NgramSimpleConfig = NgramSimpleConfig {
        size_n: 12,
        size_m: 48,
    };
}

/// `--spec-ngram-map-k-*` or `--spec-ngram-map-k4v-*` settings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NgramMapConfig {
    /// Tokens of a key (`size-n`, 1 to 1024).
    pub size_n: usize,
    /// Tokens of a value, the most drafted (`size-m`, 1 to 1024).
    pub size_m: usize,
    /// Times a key must have been seen before `ngram-map-k4v` drafts from it (`min-hits`, ≥ 1).
    pub min_hits: u16,
}

impl NgramMapConfig {
    /// llama-server b11434's defaults (common.h `common_params_speculative_ngram_map`).
    pub const DEFAULT: NgramMapConfig = NgramMapConfig {
        size_n: 12,
        size_m: 48,
        min_hits: 1,
    };
}

/// `--spec-ngram-mod-*` settings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NgramModConfig {
    /// Tokens hashed for a lookup (`--spec-ngram-mod-n-match`, 1 to 1024).
    pub n_match: usize,
    /// Most tokens drafted (`--spec-ngram-mod-n-max`, 0 to 1024).
    pub n_max: usize,
    /// A chain that misses before this many tokens drafts nothing (`--spec-ngram-mod-n-min`).
    pub n_min: usize,
}

impl NgramModConfig {
    /// llama-server b11434's defaults (common.h `common_params_speculative_ngram_mod`).
    pub const DEFAULT: NgramModConfig = NgramModConfig {
        n_match: 24,
        n_max: 64,
        n_min: 48,
    };
}

/// The n-gram types consulted before another, in llama-server b11434's order of priority
/// (common/speculative.cpp `common_speculative_init`).
const NGRAMS: [SpecType; 4] = [
    SpecType::NgramSimple,
    SpecType::NgramMapK,
    SpecType::NgramMapK4v,
    SpecType::NgramMod,
];

/// The n-gram types of a `--spec-type` list consulted before its last, in [`NGRAMS`]' order
/// (a slice of them; unused places hold [`SpecType::None`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NgramChain {
    types: [SpecType; NGRAMS.len()],
    len: usize,
}

impl NgramChain {
    /// No n-gram type consulted first.
    pub const EMPTY: NgramChain = NgramChain {
        types: [SpecType::None; NGRAMS.len()],
        len: 0,
    };

    /// The types of [`NGRAMS`] that `keep` keeps, in its order.
    fn of(keep: impl Fn(SpecType) -> bool) -> NgramChain {
        let mut c = NgramChain::EMPTY;
        for t in NGRAMS.into_iter().filter(|&t| keep(t)) {
            c.types[c.len] = t;
            c.len += 1;
        }
        c
    }
}

impl std::ops::Deref for NgramChain {
    type Target = [SpecType];

    fn deref(&self) -> &[SpecType] {
        &self.types[..self.len]
    }
}

/// Draft decoding settings (llama-server's `--spec-*` flags).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SpecConfig {
    /// What drafts when none of [`SpecConfig::first`] does (of the types `--spec-type` lists,
    /// the last in b11434's order of priority).
    pub kind: SpecType,
    /// The n-gram types consulted before `kind`, each step, in b11434's order (`ngram-simple`,
    /// `ngram-map-k`, `ngram-map-k4v`, `ngram-mod`): the first to draft a non-empty draft drafts the step, and only the
    /// one that drafted hears how much of it was kept; empty for one type.
    pub first: NgramChain,
    /// Most tokens `kind` drafts after one sampled token (`--spec-draft-n-max` for a model's
    /// drafts, an n-gram type's own limit for its).
    pub n_max: usize,
    /// A draft shorter than this is dropped (`--spec-draft-n-min`).
    pub n_min: usize,
    /// Drafting stops at a token whose probability among the block's ten likeliest is below
    /// this (`--spec-draft-p-min`).
    pub p_min: f32,
    /// Benchmarks only (`--spec-synth-len L`): drafts are kept at random, whatever the target's
    /// rows say, for a mean of L tokens a verify step, the target's own included (1 to
    /// `n_max` + 1; see [`SynthAcceptance`]).
    pub synth_len: Option<f64>,
    /// Benchmarks only (`--spec-synth-rates`): drafts kept at random, each position's
    /// unconditional rate given (one per drafted position; see [`SynthAcceptance`]).
    pub synth_rates: Option<SynthRates>,
    /// Each slot drafts only while its measured costs say drafting pays
    /// ([`crate::draft_gate`]); off, every step a slot can draft drafts (tests that count
    /// drafts). A synthetic acceptance length benchmarks the drafting path itself: the
    /// runtime ungates it.
    pub gate: bool,
    /// `ngram-simple`'s settings (`--spec-ngram-simple-*`).
    pub ngram_simple: NgramSimpleConfig,
    /// `ngram-mod`'s settings (`--spec-ngram-mod-*`).
    pub ngram_mod: NgramModConfig,
    /// `ngram-map-k`'s settings (`--spec-ngram-map-k-*`).
    pub ngram_map_k: NgramMapConfig,
    /// `ngram-map-k4v`'s settings (`--spec-ngram-map-k4v-*`).
    pub ngram_map_k4v: NgramMapConfig,
}

impl SpecConfig {
    /// No drafting.
    pub const OFF: SpecConfig = SpecConfig {
        kind: SpecType::None,
        ..SpecConfig::MTP
    };

    /// llama-server b11434's defaults with `--spec-type draft-mtp`.
    pub const MTP: SpecConfig = SpecConfig {
        kind: SpecType::DraftMtp,
        first: NgramChain::EMPTY,
        n_max: 3,
        n_min: 0,
        p_min: 0.0,
        synth_len: None,
        synth_rates: None,
        gate: true,
        ngram_simple: NgramSimpleConfig::DEFAULT,
        ngram_mod: NgramModConfig::DEFAULT,
        ngram_map_k: NgramMapConfig::DEFAULT,
        ngram_map_k4v: NgramMapConfig::DEFAULT,
    };

    /// These settings drafting with every type of `types` (any order; a repeat counts once;
    /// [`SpecType::None`] among others adds nothing), consulted in b11434's order of priority:
    /// the n-gram types, then `draft-simple` or `draft-mtp`. `n_max` is set by the caller for
    /// the last of them. Both `draft-simple` and `draft-mtp` is an error naming them: the draft
    /// file (`-md`) is either a whole draft model or an MTP block.
    pub fn with_types(self, types: &[SpecType]) -> Result<SpecConfig, String> {
        let has = |t: SpecType| types.contains(&t);
        if has(SpecType::DraftSimple) && has(SpecType::DraftMtp) {
            return Err(
                "combining draft-simple with draft-mtp is not supported: the draft \
                        file (-md) is either a whole draft model or an MTP block"
                    .into(),
            );
        }
        let kind = [SpecType::DraftMtp, SpecType::DraftSimple]
            .into_iter()
            .chain(NGRAMS.into_iter().rev())
            .find(|&t| has(t))
            .unwrap_or(SpecType::None);
        let first = NgramChain::of(|t| has(t) && t != kind);
        Ok(SpecConfig {
            kind,
            first,
            ..self
        })
    }

    /// The types consulted each step, in order: [`SpecConfig::first`], then `kind`.
    pub fn types(&self) -> impl Iterator<Item = SpecType> + '_ {
        self.first
            .iter()
            .copied()
            .chain(Some(self.kind).filter(|&k| k != SpecType::None))
    }

    /// The types as llama-server's `speculative.types` names them (comma-separated, in the
    /// order they are consulted; `none` for none).
    pub fn names(&self) -> String {
        let names: Vec<&str> = self.types().map(SpecType::name).collect();
        match names.is_empty() {
            true => SpecType::None.name().into(),
            false => names.join(","),
        }
    }

    /// Most tokens a draft of type `t` holds: `n_max` for `kind`, an n-gram type's own limit
    /// (`--spec-ngram-simple-size-m`, `--spec-ngram-mod-n-max`, the maps' `size-m`) for one
    /// consulted before it.
    pub fn cap(&self, t: SpecType) -> usize {
        match t {
            t if t == self.kind => self.n_max,
            SpecType::NgramSimple => self.ngram_simple.size_m,
            SpecType::NgramMod => self.ngram_mod.n_max,
            SpecType::NgramMapK => self.ngram_map_k.size_m,
            SpecType::NgramMapK4v => self.ngram_map_k4v.size_m,
            _ => self.n_max,
        }
    }

    /// Most tokens any draft holds (b11434's `common_speculative_n_max` over its
    /// implementations): what a verify pass makes room for. The last drafter's is `n_max`
    /// whatever `kind` (a test source drafts in its place).
    pub fn most(&self) -> usize {
        let first = self.first.iter().map(|&t| self.cap(t));
        first.chain(Some(self.n_max)).max().unwrap_or(0)
    }

    /// Whether the slots' drafting gates choose when to draft: asked for, and no synthetic
    /// acceptance length (which benchmarks the drafting path itself).
    pub fn gated(&self) -> bool {
        self.gate && !self.synthetic()
    }

    /// The drafters each slot gates, in the order they are consulted (`first`, then `kind`,
    /// which a test `source` drafts as when there is one): none unless it drafts gated.
    pub fn gated_drafters(&self, source: bool) -> Vec<&'static str> {
        match self.gated() && (self.kind != SpecType::None || source) {
            true => self
                .first
                .iter()
                .chain(Some(&self.kind))
                .map(|t| t.name())
                .collect(),
            false => Vec::new(),
        }
    }

    /// Whether drafts are kept at random (`--spec-synth-len` or `--spec-synth-rates`:
    /// benchmarks only, the output is not valid).
    pub fn synthetic(&self) -> bool {
        self.synth_len.is_some() || self.synth_rates.is_some()
    }

    /// These settings for a model of architecture `arch` drafting with its own MTP layers:
    /// `n_max` at most the [`mtp_width`] of its layers (other drafting as it is).
    pub fn for_model(self, arch: &str) -> SpecConfig {
        if self.kind != SpecType::DraftMtp {
            return self;
        }
        SpecConfig {
            n_max: mtp_width(arch).map_or(self.n_max, |w| self.n_max.min(w)),
            ..self
        }
    }
}

/// Most tokens the MTP layers of architecture `arch` draft after one sampled token, where that
/// is fewer than `--spec-draft-n-max` may ask (issue 48): GLM-5.3's single NextN layer predicts
/// the token after next from the trunk's row and drafts one token a step; other blocks chain.
pub fn mtp_width(arch: &str) -> Option<usize> {
    match arch {
        "glm5-next" | "glm5next" => Some(1),
        _ => None,
    }
}

/// Whether `draft`, a separate draft file (`-md`: qwen4exp's MTP-only file, as llama.cpp
/// b11434's converter `--mtp` writes it), can draft for `target`: it must hold an MTP block, be
/// of the target's architecture, follow the same number of trunk layers (its block is the layer
/// after them) and share the target's width and vocabulary. The error names what differs.
pub fn check_draft_model(target: &ModelSpec, draft: &ModelSpec) -> Result<(), String> {
    let (t, d) = (&target.hparams, &draft.hparams);
    let (ta, da) = (target.architecture.as_str(), draft.architecture.as_str());
    if draft.caps.n_mtp_layers == 0 {
        return Err(format!(
            "the draft file (`{da}`) holds no MTP (nextn) block"
        ));
    }
    if da != ta {
        return Err(format!(
            "the draft file is another model's: architecture `{da}`, the model's `{ta}`"
        ));
    }
    let differs = [
        (
            "trunk layers (block_count less the MTP block)",
            t.n_layer,
            d.n_layer,
        ),
        ("width (embedding_length)", t.n_embd, d.n_embd),
        ("vocabulary (tokens)", t.n_vocab, d.n_vocab),
    ];
    match differs.iter().find(|(_, a, b)| a != b) {
        Some((what, a, b)) => Err(format!(
            "the draft file does not fit the model: {what} {b}, the model's {a}"
        )),
        None => Ok(()),
    }
}

/// Most positions `--spec-synth-rates` gives: a verify pass keeps the row states of at most 16
/// rows, the sampled token and 15 drafts.
pub const MAX_SYNTH_RATES: usize = 15;

/// `--spec-synth-rates`: the unconditional probability that each draft position is kept
/// (llama-server's benchmarking setting), held inline so that settings stay `Copy`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SynthRates {
    len: usize,
    rates: [f64; MAX_SYNTH_RATES],
}

impl SynthRates {
    /// Rates checked as b11434 checks them: at least one, each finite and within [0, 1],
    /// non-increasing; at most [`MAX_SYNTH_RATES`]. The error says what is wrong.
    pub fn new(values: &[f64]) -> Result<SynthRates, String> {
        if values.is_empty() || values.len() > MAX_SYNTH_RATES {
            return Err(format!(
                "{} values: give 1 to {MAX_SYNTH_RATES}, one per drafted position",
                values.len()
            ));
        }
        if values
            .iter()
            .any(|r| !r.is_finite() || !(0.0..=1.0).contains(r))
        {
            return Err("synthetic acceptance rates must be finite and within [0, 1]".into());
        }
        if values.windows(2).any(|w| w[1] > w[0]) {
            return Err("synthetic acceptance rates must be monotonically non-increasing".into());
        }
        let mut rates = [0.0; MAX_SYNTH_RATES];
        rates[..values.len()].copy_from_slice(values);
        Ok(SynthRates {
            len: values.len(),
            rates,
        })
    }

    /// The rates, position 0 first.
    pub fn rates(&self) -> &[f64] {
        &self.rates[..self.len]
    }
}

/// Synthetic acceptance for benchmarks on random-weight files (`--spec-synth-len L`), as
/// llama-server b11434 does it (common/speculative.cpp `common_speculative_synth_rates_resolve`,
/// tools/server/server-context.cpp `server_sample_and_accept_synth`): the real draft passes and
/// the real verify pass run, and only the verdict is forced. Draft position i is kept with
/// probability p, given every draft before it kept (so the unconditional rate of position i is
/// p^(i+1)), p chosen so that p + p² + … + p^n_max = L − 1; a drafted end-of-generation token is
/// never kept. The kept tokens are the drafts themselves, so the cache holds what the request
/// generated, and the target's row after them gives the next token as usual. Each request draws
/// from its own MT19937 seeded with its seed, one uniform double a position looked at, as
/// llama-server's slot does.
/// With `--spec-synth-rates R0,R1,…` (the unconditional rate of each position, non-increasing),
/// position i is kept given the ones before it with probability Ri / Ri−1 (R−1 = 1; 0 after a
/// rate of 0), as b11434 turns rates into its per-position probabilities.
pub(crate) struct SynthAcceptance {
    /// Each draft position's probability of being kept, given every one before it kept.
    p: Vec<f64>,
}

impl SynthAcceptance {
    /// The acceptance `spec` asks for (its synthetic length or rates; none without either),
    /// over drafts of at most [`SpecConfig::most`] tokens.
    pub(crate) fn of(spec: &SpecConfig) -> Option<SynthAcceptance> {
        if let Some(r) = &spec.synth_rates {
            let mut prev = 1.0;
            let p = r
                .rates()
                .iter()
                .map(|&r| {
                    let q = if prev > 0.0 { r / prev } else { 0.0 };
                    prev = r;
                    q
                })
                .collect();
            return Some(SynthAcceptance { p });
        }
        spec.synth_len
            .map(|len| SynthAcceptance::new(len, spec.most()))
    }

    /// Acceptance of mean length `len` (tokens a verify step, the target's own included) over
    /// drafts of `n_max` tokens.
    pub(crate) fn new(len: f64, n_max: usize) -> SynthAcceptance {
        SynthAcceptance {
            p: vec![synth_rate(len, n_max); n_max],
        }
    }

    /// How many of a step's `drafts` it keeps, drawing from the request's `rng` (`is_eog`: an
    /// end-of-generation token).
    pub(crate) fn accepted(
        &self,
        rng: &mut Mt19937,
        drafts: &[u32],
        is_eog: impl Fn(u32) -> bool,
    ) -> usize {
        drafts
            .iter()
            .zip(&self.p)
            .take_while(|&(&t, &p)| rng.uniform_f64() < p && !is_eog(t))
            .count()
    }
}

/// The per-position acceptance probability p of a mean acceptance length `len` over drafts of
/// `n_max` tokens: p + p² + … + p^n_max = `len` − 1, by 32 bisections as llama.cpp finds it
/// (0 for `len` ≤ 1, 1 for `len` ≥ `n_max` + 1).
pub fn synth_rate(len: f64, n_max: usize) -> f64 {
    if len >= n_max as f64 + 1.0 {
        return 1.0;
    }
    if len <= 1.0 {
        return 0.0;
    }
    let (mut lo, mut hi) = (0.0f64, 1.0f64);
    for _ in 0..32 {
        let mid = 0.5 * (lo + hi);
        let (mut sum, mut term) = (0.0, mid);
        for _ in 0..n_max {
            sum += term;
            term *= mid;
        }
        if sum < len - 1.0 {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    0.5 * (lo + hi)
}

/// A source of drafts other than the model's MTP block: for tests (a perfect source, a wrong
/// one) and benchmarks.
pub trait DraftSource: Send {
    /// Slot `id_slot` begins generating after `prompt` (the whole prompt it holds).
    fn begin(&mut self, _id_slot: usize, _prompt: &[u32]) {}

    /// Up to `max` tokens that may follow `tokens` (what slot `id_slot` holds and the token just
    /// sampled after it).
    fn draft(&mut self, id_slot: usize, tokens: &[u32], max: usize) -> Vec<u32>;

    /// The target kept `accepted` tokens of slot `id_slot`'s last (non-empty) draft.
    fn accepted(&mut self, _id_slot: usize, _accepted: usize) {}
}

/// One slot's rows of a target pass, as the MTP block takes them in.
pub struct Chunk<'a> {
    /// The slot.
    pub slot: usize,
    /// Position of the first row.
    pub start: usize,
    /// The rows' tokens.
    pub tokens: &'a [u32],
    /// The target's final-norm rows of `tokens`, `n_embd` values each.
    pub rows: &'a [f32],
    /// Rows of the chunk the slot keeps (drafted tokens past the first refused one are not).
    pub kept: usize,
}

/// One slot's draft request: the token just sampled, at `pos`, and at most `max` tokens.
#[derive(Clone, Copy, Debug)]
pub struct Want {
    /// The slot.
    pub slot: usize,
    /// The token just sampled.
    pub last: u32,
    /// Its position.
    pub pos: usize,
    /// Most tokens to draft.
    pub max: usize,
}

/// The MTP block's driver: the target row each slot's next block row pairs with, and the rows a
/// slot that is not drafting has put off taking in.
pub struct MtpDrafter {
    cfg: SpecConfig,
    n_embd: usize,
    /// Per slot, the target's final-norm row of the last position it keeps (zeros before a
    /// slot's first pass, as draft-mtp's `pending_h` of a new sequence).
    pending: Vec<Vec<f32>>,
    /// The separate draft file's model (qwen4exp's MTP-only file), when the block is not the
    /// target's own (boxed: a loaded model is large beside the rest).
    draft: Option<Box<LoadedModel>>,
    /// Per slot, kept rows not yet taken in ([`MtpDrafter::defer`]).
    behind: Vec<Behind>,
    /// What the block's passes cost so far.
    stats: DraftStats,
}

/// A slot's kept rows the block has not taken in yet: consecutive positions from `start`.
#[derive(Default)]
struct Behind {
    start: usize,
    tokens: Vec<u32>,
    rows: Vec<f32>,
}

impl Behind {
    /// Adds the kept rows of `c` (`n` values a row). A chunk that starts inside these rows
    /// replaces those from its start on (the slot's sequence was cut back); one that starts
    /// after a gap, or before them, starts them afresh (the block's cache then misses those
    /// positions, which only makes its drafts worse).
    fn push(&mut self, c: &Chunk<'_>, n: usize) {
        let end = self.start + self.tokens.len();
        if self.tokens.is_empty() || c.start < self.start || c.start > end {
            self.tokens.clear();
            self.rows.clear();
            self.start = c.start;
        }
        let keep = c.start - self.start;
        self.tokens.truncate(keep);
        self.rows.truncate(keep * n);
        self.tokens.extend_from_slice(&c.tokens[..c.kept]);
        self.rows.extend_from_slice(&c.rows[..c.kept * n]);
    }
}

impl MtpDrafter {
    /// A driver for `n_slots` slots whose rows are `n_embd` wide (the target's final-norm rows,
    /// or the rows a separate draft file's block reads).
    pub fn new(cfg: SpecConfig, n_slots: usize, n_embd: usize) -> MtpDrafter {
        MtpDrafter {
            cfg,
            n_embd,
            pending: vec![vec![0.0; n_embd]; n_slots],
            behind: (0..n_slots).map(|_| Behind::default()).collect(),
            draft: None,
            stats: DraftStats::default(),
        }
    }

    /// This driver running the block of the separate draft file `draft` (whose rows, as the
    /// target's, are read as [`bloomery_plugin_api::graph::NEXTN_HIDDEN`]) instead of the
    /// target's own.
    pub fn with_draft_model(mut self, mut draft: LoadedModel) -> MtpDrafter {
        draft.read_rows_from(bloomery_plugin_api::graph::NEXTN_HIDDEN);
        self.draft = Some(Box::new(draft));
        self
    }

    /// The separate draft file's model, when the block is not the target's (its caches, for
    /// checking what the driver fed it).
    pub fn draft_model(&self) -> Option<&LoadedModel> {
        self.draft.as_deref()
    }

    /// Values a row the block pairs with.
    pub fn width(&self) -> usize {
        self.n_embd
    }

    /// The model whose block drafts: the separate draft file's, else `target`.
    fn block<'a>(&'a mut self, target: &'a mut LoadedModel) -> &'a mut LoadedModel {
        match self.draft.as_deref_mut() {
            Some(d) => d,
            None => target,
        }
    }

    /// Forgets slot `slot`'s carried row and the rows it put off (a new sequence starts there).
    pub fn reset(&mut self, slot: usize) {
        self.pending[slot].fill(0.0);
        self.behind[slot] = Behind::default();
    }

    /// Kept rows slot `slot` has put off taking in.
    pub fn behind(&self, slot: usize) -> usize {
        self.behind[slot].tokens.len()
    }

    /// Puts off taking in the kept rows of `c`, for a slot that is not drafting: they wait on
    /// the host until the slot drafts again ([`MtpDrafter::catch_up`]) or a chunk of it is
    /// taken in, then go through the block in one pass, where each step would otherwise run a
    /// block pass of its own.
    pub fn defer(&mut self, c: &Chunk<'_>) {
        self.behind[c.slot].push(c, self.n_embd);
    }

    /// Takes in the rows slots of `slots` put off, before they draft.
    pub fn catch_up(&mut self, model: &mut LoadedModel, slots: &[usize]) -> Result<(), String> {
        let owned: Vec<Behind> = slots
            .iter()
            .map(|&s| std::mem::take(&mut self.behind[s]))
            .collect();
        let chunks: Vec<Chunk<'_>> = slots
            .iter()
            .zip(&owned)
            .filter(|(_, b)| !b.tokens.is_empty())
            .map(|(&slot, b)| Chunk {
                slot,
                start: b.start,
                tokens: &b.tokens,
                rows: &b.rows,
                kept: b.tokens.len(),
            })
            .collect();
        self.step(model, &chunks, &[]).map(|_| ())
    }

    /// Runs the block over the rows of a target pass (filling its cache at their positions),
    /// after any rows their slots put off, and keeps each slot's row of its last kept position
    /// for the next pairing.
    pub fn take_in(&mut self, model: &mut LoadedModel, chunks: &[Chunk<'_>]) -> Result<(), String> {
        self.take_in_and_draft(model, chunks, &[]).map(|_| ())
    }

    /// [`MtpDrafter::take_in`] of `chunks` (and [`MtpDrafter::catch_up`] of the drafting
    /// slots), then [`MtpDrafter::draft`] for `wants`, one block pass fewer: a drafting slot's
    /// first draft row is the position right after the rows it takes in (its token the one just
    /// sampled, paired with the target's row of the last kept position), so that row and every
    /// slot's rows taken in go through the block in one pass. Where a drafting slot's rows do
    /// not end right before its draft row, they go in alone first.
    pub fn take_in_and_draft(
        &mut self,
        model: &mut LoadedModel,
        chunks: &[Chunk<'_>],
        wants: &[Want],
    ) -> Result<Vec<Vec<u32>>, String> {
        let n = self.n_embd;
        // A chunk of a slot with rows put off goes in after them, as one run of positions.
        let mut joined: Vec<(usize, Behind, usize)> = Vec::new();
        let mut alone: Vec<&Chunk<'_>> = Vec::new();
        for c in chunks.iter().filter(|c| !c.tokens.is_empty()) {
            let mut b = std::mem::take(&mut self.behind[c.slot]);
            let end = b.start + b.tokens.len();
            // Rows put off from past where the chunk starts were cut from the sequence; after
            // a gap the block misses those positions either way (its drafts only get worse).
            if b.tokens.is_empty() || c.start < b.start || c.start > end {
                alone.push(c);
                continue;
            }
            let before = c.start - b.start;
            b.tokens.truncate(before);
            b.rows.truncate(before * n);
            b.tokens.extend_from_slice(c.tokens);
            b.rows.extend_from_slice(c.rows);
            joined.push((c.slot, b, before + c.kept));
        }
        // A drafting slot's rows put off go in before its draft row too.
        for w in wants.iter().filter(|w| w.max > 0) {
            let b = std::mem::take(&mut self.behind[w.slot]);
            if !b.tokens.is_empty() {
                let kept = b.tokens.len();
                joined.push((w.slot, b, kept));
            }
        }
        let runs: Vec<Chunk<'_>> = joined
            .iter()
            .map(|(slot, b, kept)| Chunk {
                slot: *slot,
                start: b.start,
                tokens: &b.tokens,
                rows: &b.rows,
                kept: *kept,
            })
            .chain(alone.into_iter().map(|c| Chunk { ..*c }))
            .collect();
        let ends_before = |r: &Chunk<'_>| {
            wants
                .iter()
                .all(|w| w.slot != r.slot || w.max == 0 || r.start + r.kept == w.pos)
        };
        if !runs.iter().all(ends_before) {
            self.step(model, &runs, &[])?;
            return self.step(model, &[], wants);
        }
        self.step(model, &runs, wants)
    }

    /// Drafts for every slot of `wants`, all slots' steps in shared passes; the drafts in the
    /// order of `wants`.
    pub fn draft(
        &mut self,
        model: &mut LoadedModel,
        wants: &[Want],
    ) -> Result<Vec<Vec<u32>>, String> {
        self.step(model, &[], wants)
    }

    /// Block passes run and bytes they read back, since the driver was made.
    pub fn stats(&self) -> DraftStats {
        self.stats
    }

    /// Runs the block over the kept rows of `runs` (each a slot's consecutive positions, its
    /// first row paired with the slot's carried row), carrying each slot's row of its last kept
    /// position, and drafts for `wants`: the first draft rows in the same pass as `runs` (each
    /// the position right after its slot's run), each later draft row a pass of its own shared
    /// by all slots.
    fn step(
        &mut self,
        model: &mut LoadedModel,
        runs: &[Chunk<'_>],
        wants: &[Want],
    ) -> Result<Vec<Vec<u32>>, String> {
        let n = self.n_embd;
        let mut drafts: Vec<Vec<u32>> = vec![Vec::new(); wants.len()];
        let runs: Vec<&Chunk<'_>> = runs.iter().filter(|c| c.kept > 0).collect();
        // The row a slot's next block row pairs with: the target's row of its last kept
        // position.
        let carried = |slot: usize, pending: &[Vec<f32>]| -> Vec<f32> {
            match runs.iter().find(|r| r.slot == slot) {
                Some(r) => r.rows[(r.kept - 1) * n..r.kept * n].to_vec(),
                None => pending[slot].clone(),
            }
        };
        // Each drafting slot's next row: its token and the row it pairs with.
        let mut rows: Vec<(usize, u32, Vec<f32>)> = wants
            .iter()
            .enumerate()
            .filter(|(_, w)| w.max > 0)
            .map(|(i, w)| (i, w.last, carried(w.slot, &self.pending)))
            .collect();
        let mut first = true;
        while first || !rows.is_empty() {
            let mut batch = empty_batch();
            let mut hidden = Vec::with_capacity((rows.len() + 1) * n);
            if first {
                for c in &runs {
                    for (i, &t) in c.tokens[..c.kept].iter().enumerate() {
                        batch.tokens.push(t as i32);
                        batch.positions.push((c.start + i) as i32);
                        batch.slots.push(c.slot as i32);
                        match i {
                            0 => hidden.extend_from_slice(&self.pending[c.slot]),
                            _ => hidden.extend_from_slice(&c.rows[(i - 1) * n..i * n]),
                        }
                    }
                }
            }
            for (i, token, h) in &rows {
                let w = &wants[*i];
                batch.output_rows.push(batch.tokens.len() as i32);
                batch.tokens.push(*token as i32);
                batch.positions.push((w.pos + drafts[*i].len()) as i32);
                batch.slots.push(w.slot as i32);
                hidden.extend_from_slice(h);
            }
            if batch.tokens.is_empty() {
                return Ok(drafts);
            }
            // Rows taken in alone read back nothing the driver uses: the last row's, as every
            // pass needs an output.
            let readout = match rows.is_empty() {
                true => {
                    batch.output_rows.push(batch.tokens.len() as i32 - 1);
                    Readout::Embeddings
                }
                false => Readout::Top(TOP_K as u32),
            };
            let out = self
                .block(model)
                .forward_draft_reading(&batch, &hidden, readout)
                .map_err(|e| match first {
                    true => format!("the MTP block's pass over the target's rows: {e}"),
                    false => format!("an MTP draft step: {e}"),
                })?;
            self.stats.passes += 1;
            self.stats.read_bytes += out.bytes();
            if first {
                for c in &runs {
                    self.pending[c.slot].copy_from_slice(&c.rows[(c.kept - 1) * n..c.kept * n]);
                }
                first = false;
            }
            let mut next = Vec::with_capacity(rows.len());
            for (r, (i, _, _)) in rows.into_iter().enumerate() {
                // The block's likeliest token and its probability among the ten likeliest.
                let (best, p) = (out.top_ids[r * TOP_K], out.top_probs[r * TOP_K]);
                if p < self.cfg.p_min {
                    continue;
                }
                let best = u32::try_from(best)
                    .map_err(|_| format!("an MTP draft step chose token {best}"))?;
                drafts[i].push(best);
                if drafts[i].len() < wants[i].max {
                    next.push((i, best, out.embeddings[r * n..(r + 1) * n].to_vec()));
                }
            }
            rows = next;
        }
        for d in &mut drafts {
            if d.len() < self.cfg.n_min {
                d.clear();
            }
        }
        Ok(drafts)
    }
}

/// What the MTP block's passes cost the host, counted (the card's time is not).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DraftStats {
    /// Block passes: rows taken in, drafts, or both.
    pub passes: u64,
    /// Bytes those passes read back to the host.
    pub read_bytes: u64,
}

/// Candidates the draft's probability is taken over (draft-mtp's top-k sampler, then a
/// softmax over them): the block's pass reads only these back, not its logits.
pub(crate) const TOP_K: usize = 10;

/// A pass's inputs with no rows yet.
pub(crate) fn empty_batch() -> BatchInputs {
    BatchInputs {
        tokens: Vec::new(),
        positions: Vec::new(),
        slots: Vec::new(),
        output_rows: Vec::new(),
        ngram_rows: Vec::new(),
        logit_rows: vec![],
    }
}

#[cfg(test)]
mod tests {
    use super::{
        synth_rate, Behind, Chunk, Mt19937, SpecConfig, SpecType, SynthAcceptance, SynthRates,
    };

    /// b11434's order of priority (common_speculative_init), whatever the order listed: the
    /// n-gram types (ngram-simple, ngram-map-k, ngram-map-k4v, ngram-mod), then the draft model
    /// or the MTP block.
    #[test]
    fn combined_types_are_consulted_in_llama_servers_order() {
        use SpecType::*;
        let chain = |types: &[SpecType]| {
            let c = SpecConfig::OFF.with_types(types).unwrap();
            c.types().collect::<Vec<_>>()
        };
        assert_eq!(chain(&[DraftMtp, NgramSimple]), [NgramSimple, DraftMtp]);
        assert_eq!(chain(&[DraftSimple, NgramMod]), [NgramMod, DraftSimple]);
        assert_eq!(
            chain(&[NgramMod, DraftMtp, NgramSimple, NgramMod]),
            [NgramSimple, NgramMod, DraftMtp]
        );
        assert_eq!(chain(&[NgramMod, NgramSimple]), [NgramSimple, NgramMod]);
        assert_eq!(chain(&[NgramMod]), [NgramMod]);
        assert_eq!(
            chain(&[NgramMod, NgramMapK4v, DraftMtp, NgramMapK, NgramSimple]),
            [NgramSimple, NgramMapK, NgramMapK4v, NgramMod, DraftMtp]
        );
        assert_eq!(chain(&[NgramMapK4v, NgramMapK]), [NgramMapK, NgramMapK4v]);
        assert_eq!(chain(&[None]), []);
        assert_eq!(SpecConfig::OFF.names(), "none");
        let c = SpecConfig::MTP
            .with_types(&[NgramSimple, DraftMtp])
            .unwrap();
        // Each type's own limit: the n-gram's m-gram, the MTP block's n_max.
        assert_eq!((c.cap(NgramSimple), c.cap(DraftMtp), c.most()), (48, 3, 48));
        assert!(SpecConfig::OFF
            .with_types(&[DraftMtp, DraftSimple])
            .is_err());
    }

    #[test]
    fn synthetic_acceptance_has_the_asked_mean_length() {
        // p + p² + p³ = 0.7 and 1.7; the ends.
        for (len, n_max) in [(1.7, 3), (2.7, 3), (1.5, 1), (3.2, 5)] {
            let p = synth_rate(len, n_max);
            let sum: f64 = (1..=n_max as i32).map(|i| p.powi(i)).sum();
            assert!((sum - (len - 1.0)).abs() < 1e-8, "L {len}: p {p}");
            let s = SynthAcceptance::new(len, n_max);
            let mut rng = Mt19937::new(7);
            let n = 20_000;
            let drafts = vec![5u32; n_max];
            let kept: usize = (0..n)
                .map(|_| s.accepted(&mut rng, &drafts, |_| false))
                .sum();
            let mean = 1.0 + kept as f64 / n as f64;
            // The spread of the mean is under 0.01 over 20,000 steps.
            assert!((mean - len).abs() < 0.03, "L {len}: mean {mean}");
        }
        assert_eq!((synth_rate(1.0, 3), synth_rate(4.0, 3)), (0.0, 1.0));
        let s = SynthAcceptance::new(4.0, 3);
        let mut rng = Mt19937::new(7);
        assert_eq!(s.accepted(&mut rng, &[1, 2, 3], |_| false), 3);
        // A drafted end of generation is never kept.
        assert_eq!(s.accepted(&mut rng, &[1, 9, 3], |t| t == 9), 1);
    }

    #[test]
    fn synthetic_rates_keep_each_position_at_its_unconditional_rate() {
        let rates = [0.9, 0.6, 0.3, 0.0];
        let spec = SpecConfig {
            n_max: 4,
            synth_rates: Some(SynthRates::new(&rates).unwrap()),
            ..SpecConfig::MTP
        };
        let s = SynthAcceptance::of(&spec).unwrap();
        let mut rng = Mt19937::new(11);
        let n = 40_000;
        let mut kept_at = [0usize; 4];
        for _ in 0..n {
            let k = s.accepted(&mut rng, &[5; 4], |_| false);
            kept_at.iter_mut().take(k).for_each(|c| *c += 1);
        }
        for (i, (&c, &r)) in kept_at.iter().zip(&rates).enumerate() {
            let rate = c as f64 / n as f64;
            assert!((rate - r).abs() < 0.01, "position {i}: {rate} against {r}");
        }
        // b11434's checks.
        assert!(SynthRates::new(&[0.5, 0.7])
            .unwrap_err()
            .contains("non-increasing"));
        assert!(SynthRates::new(&[1.5])
            .unwrap_err()
            .contains("within [0, 1]"));
        assert!(SynthRates::new(&[]).is_err());
    }

    /// Rows put off keep one run of positions: a chunk inside them replaces the rest; one after
    /// a gap or before them starts afresh.
    #[test]
    fn rows_put_off_stay_one_run_of_positions() {
        let chunk = |start, tokens: &'static [u32], kept| Chunk {
            slot: 0,
            start,
            tokens,
            rows: &[0.0; 8][..tokens.len() * 2],
            kept,
        };
        let mut b = Behind::default();
        b.push(&chunk(5, &[1, 2, 3], 3), 2);
        b.push(&chunk(8, &[4, 9, 9], 1), 2);
        assert_eq!(
            (b.start, b.tokens.clone(), b.rows.len()),
            (5, vec![1, 2, 3, 4], 8)
        );
        // Cut back to position 7.
        b.push(&chunk(7, &[6], 1), 2);
        assert_eq!((b.start, b.tokens.clone()), (5, vec![1, 2, 6]));
        // A gap, then a chunk before them.
        b.push(&chunk(20, &[7], 1), 2);
        assert_eq!((b.start, b.tokens.clone()), (20, vec![7]));
        b.push(&chunk(3, &[8, 9], 2), 2);
        assert_eq!(
            (b.start, b.tokens.clone(), b.rows.len()),
            (3, vec![8, 9], 4)
        );
    }
}
