//! XTC, "exclude top choices" (llama.cpp's `xtc` stage): with a given chance per token, removes
//! every token at or above a probability threshold except the least likely of them.

use super::candidates::Candidates;
use super::rng::Mt19937;

/// XTC's settings and its own random numbers (seeded with the request's seed, as llama.cpp
/// seeds each sampler that draws).
#[derive(Clone, Debug)]
pub struct Xtc {
    probability: f32,
    threshold: f32,
    min_keep: usize,
    rng: Mt19937,
}

impl Xtc {
    /// The stage, or `None` when it is off (`probability <= 0` or `threshold > 0.5`).
    pub fn new(probability: f32, threshold: f32, min_keep: usize, seed: u32) -> Option<Self> {
        (probability > 0.0 && threshold <= 0.5).then(|| Xtc {
            probability,
            threshold,
            min_keep,
            rng: Mt19937::new(seed),
        })
    }

    /// Draws the chance (one draw per call with two or more candidates); when it falls at or
    /// below the probability, sorts the candidates, and drops the leading tokens whose
    /// probability reaches the threshold, keeping the last such one, if at least `min_keep`
    /// remain. Does not allocate.
    pub fn apply(&mut self, cands: &mut Candidates) {
        if cands.len() < 2 {
            return;
        }
        if self.rng.uniform_f32() > self.probability {
            return;
        }
        cands.sort();
        cands.softmax();
        let above = cands
            .data
            .iter()
            .take_while(|t| t.p >= self.threshold)
            .count();
        let last = above.saturating_sub(1);
        if last > 0 && cands.len() - last >= self.min_keep {
            cands.data.drain(..last);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn removes_all_top_choices_but_the_least_likely() {
        // probabilities 0.5, 0.25, 0.125, 0.125; threshold 0.2 keeps the 0.25 one and below.
        let mut x = Xtc::new(1.0, 0.2, 1, 0).unwrap();
        let mut c = Candidates::default();
        c.fill(&[0.125f32, 0.5, 0.125, 0.25].map(f32::ln));
        x.apply(&mut c);
        let ids: Vec<u32> = c.data.iter().map(|t| t.id).collect();
        assert_eq!(ids, vec![3, 0, 2]);
        assert!(Xtc::new(0.0, 0.1, 1, 0).is_none() && Xtc::new(0.5, 0.6, 1, 0).is_none());
    }
}
