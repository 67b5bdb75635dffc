//! Token sampling with llama.cpp's sampler chain and llama-server's defaults: the logit bias,
//! then the configurable stages in order (by default repetition penalties, DRY, top-n-sigma,
//! top-k, typical-p, top-p, min-p, XTC, temperature with an optional dynamic range), then a
//! seeded draw from the softmax, or adaptive-p in its place; or, with Mirostat on, the logit
//! bias, the temperature and Mirostat alone. A temperature at or below zero samples greedily.
//! Every draw uses llama.cpp's random numbers (`rng.rs`), so a seed draws llama.cpp's tokens.

pub mod adaptive_p;
pub mod candidates;
pub mod dist;
pub mod dry;
pub mod logit_bias;
pub mod mirostat;
pub mod order;
pub mod penalties;
pub mod rng;
pub mod temperature;
pub mod top_n_sigma;
pub mod truncate;
pub mod typical;
pub mod xtc;

#[cfg(test)]
mod golden;
#[cfg(test)]
mod golden_stages;

use std::sync::Arc;

pub use candidates::{Candidates, TokenData};
pub use dry::DryBreakers;
pub use mirostat::Version as MirostatVersion;
pub use order::{Stage, DEFAULT_ORDER};
pub use penalties::Penalties;

use adaptive_p::AdaptiveP;
use dry::Dry;
use mirostat::Mirostat;
use rng::Mt19937;
use xtc::Xtc;

/// Sampling settings; [`Default`] gives llama-server's defaults.
#[derive(Clone, Debug, PartialEq)]
pub struct SamplerParams {
    /// Tokens kept by top-k (`<= 0`: all).
    pub top_k: i32,
    /// Mass kept by locally typical sampling (`>= 1`: off).
    pub typ_p: f32,
    /// Probability mass kept by top-p (`>= 1`: all).
    pub top_p: f32,
    /// Minimum probability relative to the top token (`<= 0`: off).
    pub min_p: f32,
    /// Temperature (`<= 0`: greedy).
    pub temp: f32,
    /// Dynamic temperature: the temperature ranges over `temp ± range` (`<= 0`: off).
    pub dynatemp_range: f32,
    /// Dynamic temperature: how the normalized entropy maps into the range.
    pub dynatemp_exponent: f32,
    /// Tokens the penalties look back over (0: off).
    pub penalty_last_n: usize,
    /// Repetition penalty (1: off).
    pub penalty_repeat: f32,
    /// Frequency penalty, per occurrence (0: off).
    pub penalty_freq: f32,
    /// Presence penalty, once per seen token (0: off).
    pub penalty_present: f32,
    /// DRY multiplier (0: off).
    pub dry_multiplier: f32,
    /// DRY base of the penalty's growth (below 1: off).
    pub dry_base: f32,
    /// DRY: repeats up to this length go unpenalized.
    pub dry_allowed_length: usize,
    /// DRY: tokens scanned for repeats (0: off).
    pub dry_penalty_last_n: usize,
    /// DRY sequence breakers, as tokens of the model's vocabulary.
    pub dry_breakers: Arc<DryBreakers>,
    /// Top-n-sigma (`<= 0`: off).
    pub top_n_sigma: f32,
    /// XTC: the chance per token that it cuts (0: off).
    pub xtc_probability: f32,
    /// XTC: the probability a top choice must reach to be cut (above 0.5: off).
    pub xtc_threshold: f32,
    /// Mirostat (`None`: off), which then replaces the stages after the temperature.
    pub mirostat: Option<MirostatVersion>,
    /// Mirostat target surprise, in bits.
    pub mirostat_tau: f32,
    /// Mirostat learning rate.
    pub mirostat_eta: f32,
    /// Adaptive-p target probability (negative: plain draws).
    pub adaptive_target: f32,
    /// Adaptive-p decay of the average of picked probabilities.
    pub adaptive_decay: f32,
    /// `(token, bias)` added to the logits first (negative infinity bans the token).
    pub logit_bias: Vec<(u32, f32)>,
    /// The stages and their order.
    pub order: Vec<Stage>,
    /// Fewest candidates top-p, min-p, typical-p and XTC leave (0: no floor beyond one).
    pub min_keep: usize,
    /// Seed of the draws (its low 32 bits, as llama.cpp's seed is 32-bit).
    pub seed: u64,
}

impl Default for SamplerParams {
    fn default() -> Self {
        SamplerParams {
            top_k: 40,
            typ_p: 1.0,
            top_p: 0.95,
            min_p: 0.05,
            temp: 0.8,
            dynatemp_range: 0.0,
            dynatemp_exponent: 1.0,
            penalty_last_n: 64,
            penalty_repeat: 1.0,
            penalty_freq: 0.0,
            penalty_present: 0.0,
            dry_multiplier: 0.0,
            dry_base: 1.75,
            dry_allowed_length: 2,
            dry_penalty_last_n: 64,
            dry_breakers: Arc::default(),
            top_n_sigma: -1.0,
            xtc_probability: 0.0,
            xtc_threshold: 0.1,
            mirostat: None,
            mirostat_tau: 5.0,
            mirostat_eta: 0.1,
            adaptive_target: -1.0,
            adaptive_decay: 0.9,
            logit_bias: Vec::new(),
            order: DEFAULT_ORDER.to_vec(),
            min_keep: 0,
            seed: 0,
        }
    }
}

/// What picks the token once the stages have run.
#[derive(Clone, Debug)]
enum Pick {
    /// A draw from the softmax.
    Dist,
    /// Adaptive-p.
    Adaptive(AdaptiveP),
    /// Mirostat (after the temperature; the stages do not run).
    Mirostat(Mirostat),
}

/// A sampler chain with its stateful stages, random numbers and candidate buffer.
#[derive(Clone, Debug)]
pub struct Sampler {
    params: SamplerParams,
    penalties: Penalties,
    dry: Option<Dry>,
    xtc: Option<Xtc>,
    pick: Pick,
    /// The greedy pick is the penalized argmax (nothing else in force changes it), taken
    /// without filling the candidates.
    plain_greedy: bool,
    /// Every draw leaves its candidates for [`Sampler::drawn_probs`].
    keep_candidates: bool,
    rng: Mt19937,
    cands: Candidates,
}

impl Sampler {
    /// A chain over a vocabulary of `n_vocab` tokens.
    pub fn new(params: SamplerParams, n_vocab: usize) -> Self {
        let seed = params.seed as u32;
        let p = &params;
        let in_order = |s: Stage| p.order.contains(&s);
        let pick = match p.mirostat {
            Some(v) => Pick::Mirostat(Mirostat::new(
                v,
                p.mirostat_tau,
                p.mirostat_eta,
                n_vocab,
                seed,
            )),
            None if in_order(Stage::AdaptiveP) => {
                Pick::Adaptive(AdaptiveP::new(p.adaptive_target, p.adaptive_decay, seed))
            }
            None => Pick::Dist,
        };
        let dry = Dry::new(
            p.dry_multiplier,
            p.dry_base,
            p.dry_allowed_length,
            p.dry_penalty_last_n,
            Arc::clone(&p.dry_breakers),
        );
        let xtc = Xtc::new(p.xtc_probability, p.xtc_threshold, p.min_keep, seed);
        let plain_greedy = p.temp <= 0.0
            && matches!(pick, Pick::Dist)
            && p.order == DEFAULT_ORDER
            && p.logit_bias.is_empty()
            && p.dynatemp_range <= 0.0
            && dry.is_none()
            && xtc.is_none()
            && p.top_n_sigma <= 0.0;
        Sampler {
            penalties: Penalties::new(
                p.penalty_last_n,
                p.penalty_repeat,
                p.penalty_freq,
                p.penalty_present,
                n_vocab,
            ),
            dry,
            xtc,
            pick,
            plain_greedy,
            keep_candidates: false,
            rng: Mt19937::new(seed),
            cands: Candidates {
                data: Vec::with_capacity(n_vocab),
                sorted: false,
            },
            params,
        }
    }

    /// The settings in force.
    pub fn params(&self) -> &SamplerParams {
        &self.params
    }

    /// Makes every [`Sampler::sample`] run the whole chain, greedy included, so that
    /// [`Sampler::drawn_probs`] can read what it left (llama-server's `post_sampling_probs`).
    pub fn keep_candidates(&mut self) {
        self.plain_greedy = false;
        self.keep_candidates = true;
    }

    /// Whether every draw leaves its candidates ([`Sampler::keep_candidates`] was called).
    pub fn keeps_candidates(&self) -> bool {
        self.keep_candidates
    }

    /// The probabilities the last [`Sampler::sample`] drew from (llama-server's
    /// `post_sampling_probs`; call [`Sampler::keep_candidates`] first): token `id`'s (1 when the
    /// chain no longer holds it, as llama-server reports it) and the `n` most likely candidates
    /// with a probability above zero, best first (ties by id). Allocates the list it returns.
    pub fn drawn_probs(&self, id: u32, n: usize) -> (f32, Vec<(u32, f32)>) {
        let data = &self.cands.data;
        let p = data.iter().find(|t| t.id == id).map_or(1.0, |t| t.p);
        let mut top: Vec<(u32, f32)> = data
            .iter()
            .filter(|t| t.p > 0.0)
            .map(|t| (t.id, t.p))
            .collect();
        let by_p = |a: &(u32, f32), b: &(u32, f32)| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0));
        let n = n.min(top.len());
        if n > 0 && n < top.len() {
            top.select_nth_unstable_by(n - 1, by_p);
        }
        top.truncate(n);
        top.sort_unstable_by(by_p);
        (p, top)
    }

    /// Records a token in the stages that look back (prompt tokens and each sampled token, as
    /// llama-server does); adaptive-p learns from the token it drew.
    pub fn accept(&mut self, token: u32) {
        self.penalties.accept(token);
        if let Some(d) = &mut self.dry {
            d.accept(token);
        }
        if let Pick::Adaptive(a) = &mut self.pick {
            a.accept(token);
        }
    }

    /// Runs the logit bias and the stages (not the pick) on `logits` and returns the
    /// candidates left, with their probabilities (the softmax of the final logits, in
    /// descending order). Stateful stages advance as in a sampled step.
    pub fn candidates(&mut self, logits: &[f32]) -> &Candidates {
        self.filter(logits);
        self.cands.sort();
        self.cands.softmax();
        &self.cands
    }

    fn filter(&mut self, logits: &[f32]) {
        let p = &self.params;
        let c = &mut self.cands;
        c.fill(logits);
        logit_bias::apply(c, &p.logit_bias);
        if matches!(self.pick, Pick::Mirostat(_)) {
            temperature::temperature(c, p.temp);
            return;
        }
        for &stage in &p.order {
            match stage {
                Stage::Penalties => self.penalties.apply(c),
                Stage::Dry => {
                    if let Some(d) = &mut self.dry {
                        d.apply(c);
                    }
                }
                Stage::TopNSigma => top_n_sigma::apply(c, p.top_n_sigma),
                Stage::TopK => truncate::top_k(c, p.top_k),
                Stage::TypicalP => typical::typical(c, p.typ_p, p.min_keep),
                Stage::TopP => truncate::top_p(c, p.top_p, p.min_keep),
                Stage::MinP => truncate::min_p(c, p.min_p, p.min_keep),
                Stage::Xtc => {
                    if let Some(x) = &mut self.xtc {
                        x.apply(c);
                    }
                }
                Stage::Temperature => {
                    temperature::dynamic(c, p.temp, p.dynatemp_range, p.dynatemp_exponent)
                }
                // It picks: see `sample`.
                Stage::AdaptiveP => {}
            }
        }
    }

    /// Advances the draw's random numbers as one draw does, for a token taken without
    /// sampling (the only one a grammar admits), so that the draws after it are those of
    /// sampling token by token.
    pub fn skip_draw(&mut self) {
        self.rng.uniform_f64();
    }

    /// The token [`Sampler::sample`] would pick from `logits` with every token outside `ids`
    /// (ascending) set to negative infinity, when the chain is plain greedy (its pick is the
    /// penalized argmax): read from the logits of `ids` alone, with no copy of the row. None
    /// for any other chain. When the chain's pick from the whole row is in `ids`, this is that
    /// pick (the first maximum of the row is the first maximum of any part holding it).
    pub fn greedy_among(&self, logits: &[f32], ids: impl IntoIterator<Item = u32>) -> Option<u32> {
        self.plain_greedy
            .then(|| self.penalties.argmax_among(logits, ids) as u32)
    }

    /// Picks the next token from one row of logits (`n_vocab` values): the chain, then its
    /// pick. Does not accept the token (call [`Sampler::accept`]). Does not allocate once the
    /// candidate buffer has reached the vocabulary (DRY's and adaptive-p's buffers grow once).
    pub fn sample(&mut self, logits: &[f32]) -> u32 {
        if self.plain_greedy {
            // Every truncation stage keeps the highest logit, so greedy is the penalized argmax.
            return self.penalties.argmax(logits) as u32;
        }
        self.filter(logits);
        let c = &mut self.cands;
        let picked = match &mut self.pick {
            Pick::Dist => dist::draw(c, &mut self.rng),
            Pick::Adaptive(a) => a.sample(c),
            Pick::Mirostat(m) => m.sample(c),
        };
        match picked {
            Some(i) => c.data[i].id,
            // An empty vocabulary: nothing to pick from.
            None => 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    fn random_logits(seed: u64, n: usize) -> Vec<f32> {
        let mut rng = StdRng::seed_from_u64(seed);
        (0..n).map(|_| rng.gen_range(-5.0..5.0)).collect()
    }

    fn argmax(l: &[f32]) -> u32 {
        let mut best = 0;
        for (i, &v) in l.iter().enumerate() {
            if v > l[best] {
                best = i;
            }
        }
        best as u32
    }

    fn run(params: SamplerParams, steps: usize) -> Vec<u32> {
        let mut s = Sampler::new(params, 300);
        (0..steps)
            .map(|i| {
                let t = s.sample(&random_logits(i as u64, 300));
                s.accept(t);
                t
            })
            .collect()
    }

    #[test]
    fn greedy_equals_argmax() {
        let params = SamplerParams {
            temp: 0.0,
            ..SamplerParams::default()
        };
        let mut s = Sampler::new(params, 300);
        for i in 0..20 {
            let l = random_logits(i, 300);
            assert_eq!(s.sample(&l), argmax(&l));
        }
    }

    #[test]
    fn top_k_one_is_greedy() {
        let params = SamplerParams {
            top_k: 1,
            seed: 9,
            ..SamplerParams::default()
        };
        let mut s = Sampler::new(params, 300);
        for i in 0..20 {
            let l = random_logits(i, 300);
            assert_eq!(s.sample(&l), argmax(&l));
        }
    }

    #[test]
    fn the_same_seed_gives_the_same_sequence() {
        let p = |seed| SamplerParams {
            temp: 1.5,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            seed,
            ..SamplerParams::default()
        };
        assert_eq!(run(p(5), 50), run(p(5), 50));
        assert_ne!(run(p(5), 50), run(p(6), 50));
    }

    #[test]
    fn the_chain_keeps_top_k_then_top_p_then_min_p() {
        // probabilities ∝ 8, 4, 2, 1, 1 (ids 0..5); top-k 4 drops one of the ties (id 4),
        // top-p 0.9 over 8/15, 4/15, 2/15 reaches 14/15 ≥ 0.9 at three, min-p 0.25 keeps ≥ 2.
        let logits: Vec<f32> = [8f32, 4.0, 2.0, 1.0, 1.0].iter().map(|p| p.ln()).collect();
        let params = SamplerParams {
            top_k: 4,
            top_p: 0.9,
            min_p: 0.25,
            temp: 1.0,
            ..SamplerParams::default()
        };
        let mut s = Sampler::new(params, 5);
        let c = s.candidates(&logits);
        let ids: Vec<u32> = c.data.iter().map(|t| t.id).collect();
        assert_eq!(ids, vec![0, 1, 2]);
        let p: Vec<f32> = c.data.iter().map(|t| t.p).collect();
        assert!((p[0] - 8.0 / 14.0).abs() < 1e-6 && (p[2] - 2.0 / 14.0).abs() < 1e-6);
    }

    #[test]
    fn draws_follow_the_kept_distribution() {
        let logits = random_logits(3, 300);
        let params = SamplerParams {
            seed: 11,
            ..SamplerParams::default()
        };
        let mut s = Sampler::new(params, 300);
        let want: Vec<(u32, f32)> = s
            .candidates(&logits)
            .data
            .iter()
            .map(|t| (t.id, t.p))
            .collect();
        let mut counts = vec![0u32; 300];
        let n = 40_000;
        for _ in 0..n {
            counts[s.sample(&logits) as usize] += 1;
        }
        let kept: u32 = want.iter().map(|&(id, _)| counts[id as usize]).sum();
        assert_eq!(kept, n, "a token outside the kept set was drawn");
        for (id, p) in want {
            let f = counts[id as usize] as f32 / n as f32;
            assert!((f - p).abs() < 0.01, "token {id}: drawn {f}, p {p}");
        }
    }

    #[test]
    fn penalties_apply_before_the_cut() {
        let params = SamplerParams {
            temp: 0.0,
            penalty_repeat: 4.0,
            ..SamplerParams::default()
        };
        let mut s = Sampler::new(params, 3);
        s.accept(0);
        assert_eq!(s.sample(&[2.0, 1.0, 0.0]), 1);
    }
}
