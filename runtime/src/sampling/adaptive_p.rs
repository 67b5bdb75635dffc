//! Adaptive-p (llama.cpp's `adaptive-p` sampler): reshapes the distribution to favour tokens
//! whose probability is near a target, the target moved each step by a decaying average of the
//! probabilities of the tokens actually picked, then draws. It takes the place of the final draw.

use super::candidates::Candidates;
use super::rng::Mt19937;

/// Width of the bump around the target, in probability.
const WIDTH: f32 = 0.3;
/// The logit a token exactly at the target gets.
const PEAK: f32 = 5.0;
/// How fast the logits fall away from the target.
const SHARPNESS: f32 = 10.0;

/// Adaptive-p's state: the decaying average and the pick it waits to see accepted.
#[derive(Clone, Debug)]
pub struct AdaptiveP {
    target: f32,
    decay: f32,
    weighted_sum: f32,
    total_weight: f32,
    original: Vec<f32>,
    pending: Option<(u32, usize)>,
    rng: Mt19937,
}

impl AdaptiveP {
    /// A sampler aiming at probability `target` (negative: plain draws) with average decay
    /// `decay` (held to 0..=0.99).
    pub fn new(target: f32, decay: f32, seed: u32) -> Self {
        let decay = decay.clamp(0.0, 0.99);
        AdaptiveP {
            target,
            decay,
            weighted_sum: target / (1.0 - decay),
            total_weight: 1.0 / (1.0 - decay),
            original: Vec::new(),
            pending: None,
            rng: Mt19937::new(seed),
        }
    }

    /// Reshapes the candidates (in their current order) and draws one; returns its index.
    /// `None` for no candidates. Allocates only while its buffer grows to the list.
    pub fn sample(&mut self, cands: &mut Candidates) -> Option<usize> {
        if cands.is_empty() {
            return None;
        }
        cands.softmax();
        if self.target < 0.0 {
            return Some(self.rng.discrete(cands.data.iter().map(|t| t.p)));
        }
        self.original.clear();
        self.original.extend(cands.data.iter().map(|t| t.p));
        let target = self.target.clamp(0.0, 1.0);
        let adapted = if self.total_weight == 0.0 {
            target
        } else {
            2.0 * target - self.weighted_sum / self.total_weight
        }
        .clamp(0.0, 1.0);
        for t in cands
            .data
            .iter_mut()
            .filter(|t| t.logit != f32::NEG_INFINITY)
        {
            let d = ((t.p - adapted) * (1.0 / WIDTH)).abs();
            t.logit = PEAK - SHARPNESS * d * d / (1.0 + d);
        }
        cands.sorted = false;
        cands.softmax();
        let i = self.rng.discrete(cands.data.iter().map(|t| t.p));
        self.pending = Some((cands.data[i].id, i));
        Some(i)
    }

    /// Sees the token the step produced: the drawn one updates the average with its
    /// probability before the reshaping.
    pub fn accept(&mut self, token: u32) {
        if let Some((id, i)) = self.pending.take() {
            if id == token {
                self.weighted_sum = self.original[i] + self.decay * self.weighted_sum;
                self.total_weight = 1.0 + self.decay * self.total_weight;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_near_the_target_get_the_most_mass() {
        let mut a = AdaptiveP::new(0.25, 0.0, 1);
        let mut c = Candidates::default();
        c.fill(&[0.5f32, 0.25, 0.125, 0.125].map(f32::ln));
        a.sample(&mut c).unwrap();
        let best = c.data.iter().max_by(|x, y| x.p.total_cmp(&y.p)).unwrap();
        assert_eq!(best.id, 1);
    }
}
