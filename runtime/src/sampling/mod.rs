//! Token sampling in llama.cpp's default chain order, with llama-server's defaults: repetition
//! penalties, top-k, typical-p, top-p, min-p, temperature, then a seeded draw from the softmax.
//! A temperature at or below zero samples greedily (the highest penalized logit).
//!
//! DRY, XTC, top-n-sigma and mirostat are not implemented; their llama-server defaults
//! leave them off.

pub mod candidates;
pub mod dist;
pub mod penalties;
pub mod temperature;
pub mod truncate;
pub mod typical;

#[cfg(test)]
mod golden;

use rand::rngs::StdRng;
use rand::SeedableRng;

pub use candidates::{Candidates, TokenData};
pub use penalties::Penalties;

/// Sampling settings; [`Default`] gives llama-server's defaults.
#[derive(Clone, Copy, Debug, PartialEq)]
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
    /// Tokens the penalties look back over (0: off).
    pub penalty_last_n: usize,
    /// Repetition penalty (1: off).
    pub penalty_repeat: f32,
    /// Frequency penalty, per occurrence (0: off).
    pub penalty_freq: f32,
    /// Presence penalty, once per seen token (0: off).
    pub penalty_present: f32,
    /// Fewest candidates top-p and min-p leave (0: no floor beyond one).
    pub min_keep: usize,
    /// Seed of the draw.
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
            penalty_last_n: 64,
            penalty_repeat: 1.0,
            penalty_freq: 0.0,
            penalty_present: 0.0,
            min_keep: 0,
            seed: 0,
        }
    }
}

/// A sampler chain with its penalty window, RNG and candidate buffer.
#[derive(Clone, Debug)]
pub struct Sampler {
    params: SamplerParams,
    penalties: Penalties,
    rng: StdRng,
    cands: Candidates,
}

impl Sampler {
    /// A chain over a vocabulary of `n_vocab` tokens.
    pub fn new(params: SamplerParams, n_vocab: usize) -> Self {
        Sampler {
            penalties: Penalties::new(
                params.penalty_last_n,
                params.penalty_repeat,
                params.penalty_freq,
                params.penalty_present,
                n_vocab,
            ),
            rng: StdRng::seed_from_u64(params.seed),
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

    /// Records a token in the penalty window (prompt tokens and each sampled token, as
    /// llama-server does).
    pub fn accept(&mut self, token: u32) {
        self.penalties.accept(token);
    }

    /// Runs every stage but the draw on `logits` and returns the candidates left, with their
    /// probabilities (the softmax of the final logits, in descending order).
    pub fn candidates(&mut self, logits: &[f32]) -> &Candidates {
        self.filter(logits);
        self.cands.sort();
        self.cands.softmax();
        &self.cands
    }

    fn filter(&mut self, logits: &[f32]) {
        let p = self.params;
        let c = &mut self.cands;
        c.fill(logits);
        self.penalties.apply(c);
        truncate::top_k(c, p.top_k);
        typical::typical(c, p.typ_p, p.min_keep);
        truncate::top_p(c, p.top_p, p.min_keep);
        truncate::min_p(c, p.min_p, p.min_keep);
        temperature::temperature(c, p.temp);
    }

    /// Advances the RNG as one draw does, for a token taken without sampling (the only one a
    /// grammar admits), so that the draws after it are those of sampling token by token.
    pub fn skip_draw(&mut self) {
        let _: f64 = rand::Rng::gen(&mut self.rng);
    }

    /// Picks the next token from one row of logits (`n_vocab` values). Greedy when the temperature
    /// is at or below zero; otherwise the full chain and a draw. Does not accept the token (call
    /// [`Sampler::accept`]). Does not allocate once the candidate buffer has reached the vocabulary.
    pub fn sample(&mut self, logits: &[f32]) -> u32 {
        if self.params.temp <= 0.0 {
            // Every truncation stage keeps the highest logit, so greedy is the penalized argmax.
            return self.penalties.argmax(logits) as u32;
        }
        self.filter(logits);
        match dist::draw(&mut self.cands, &mut self.rng) {
            Some(i) => self.cands.data[i].id,
            // An empty vocabulary: nothing to pick from.
            None => 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::Rng;

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
