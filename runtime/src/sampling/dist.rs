//! The final draw: softmax of the remaining logits and one uniform number from the seeded
//! Mersenne Twister, with llama.cpp's rule (the first token whose running mass reaches
//! `u · total`): the same seed and candidates in the same order draw llama.cpp's token.

use super::candidates::Candidates;
use super::rng::Mt19937;

/// Sets each candidate's probability and returns the index of the drawn one. Always draws one
/// number, even for a single candidate, so that the RNG stream does not depend on the list size.
/// Returns `None` only for an empty list. Does not allocate.
pub fn draw(cands: &mut Candidates, rng: &mut Mt19937) -> Option<usize> {
    let u = rng.uniform_f64();
    if cands.is_empty() {
        return None;
    }
    if cands.len() == 1 {
        cands.data[0].p = 1.0;
        return Some(0);
    }
    let max = cands.max_logit();
    let mut total = 0f64;
    for t in &mut cands.data {
        t.p = (t.logit - max).exp();
        total += f64::from(t.p);
    }
    let target = total * u;
    let mut running = 0f64;
    let mut chosen = None;
    for (i, t) in cands.data.iter_mut().enumerate() {
        if chosen.is_none() {
            running += f64::from(t.p);
            // Unlike llama.cpp, a zero-probability token is never picked (a draw of exactly 0
            // would otherwise select a leading -inf logit).
            if running >= target && t.p > 0.0 {
                chosen = Some(i);
            }
        }
        t.p = (f64::from(t.p) / total) as f32;
    }
    Some(chosen.unwrap_or(cands.len() - 1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frequencies_follow_the_softmax() {
        let mut rng = Mt19937::new(1);
        let mut counts = [0u32; 3];
        let mut c = Candidates::default();
        let logits = [0.0, (2f32).ln(), f32::NEG_INFINITY];
        for _ in 0..20000 {
            c.fill(&logits);
            counts[draw(&mut c, &mut rng).unwrap()] += 1;
        }
        assert_eq!(counts[2], 0);
        let ratio = counts[1] as f64 / counts[0] as f64;
        assert!((ratio - 2.0).abs() < 0.1, "{counts:?}");
        assert!((c.data[1].p - 2.0 / 3.0).abs() < 1e-6);
    }
}
