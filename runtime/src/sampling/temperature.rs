//! Temperature: divides the logits by `t`; `t <= 0` keeps only the highest logit (greedy), as
//! llama.cpp does. Dynamic temperature (llama.cpp's `temp-ext`) picks `t` per step within
//! `temp ± range` from the normalized entropy of the candidates.

use super::candidates::Candidates;

/// Scales the logits by `1 / temp`; with `temp <= 0` every logit but the first highest becomes
/// negative infinity.
pub fn temperature(cands: &mut Candidates, temp: f32) {
    if cands.is_empty() {
        return;
    }
    if temp <= 0.0 {
        let best = argmax(cands);
        for (i, t) in cands.data.iter_mut().enumerate() {
            if i != best {
                t.logit = f32::NEG_INFINITY;
            }
        }
        return;
    }
    for t in &mut cands.data {
        t.logit /= temp;
    }
}

/// Dynamic temperature: with `range > 0`, the temperature is
/// `lo + (hi − lo) · (H / ln n)^exponent` with `lo = max(0, temp − range)`, `hi = temp + range`,
/// `H` the entropy of the candidates' softmax and `n` their count (sorting them); otherwise the
/// plain temperature. Leaves probabilities set. Does not allocate.
pub fn dynamic(cands: &mut Candidates, temp: f32, range: f32, exponent: f32) {
    if range <= 0.0 {
        temperature(cands, temp);
        return;
    }
    if cands.len() <= 1 {
        return;
    }
    let (lo, hi) = ((temp - range).max(0.0), temp + range);
    let max_entropy = -(1.0 / cands.len() as f32).ln();
    cands.sort();
    cands.softmax();
    let entropy: f32 = cands
        .data
        .iter()
        .filter(|t| t.p > 0.0)
        .map(|t| -t.p * t.p.ln())
        .sum();
    let t = lo + (hi - lo) * (entropy / max_entropy).powf(exponent);
    temperature(cands, t);
    // Probabilities of the scaled logits, in f64 as llama.cpp computes them here.
    let max = f64::from(cands.data[0].logit);
    let mut sum = 0f64;
    for c in &mut cands.data {
        c.p = (f64::from(c.logit) - max).exp() as f32;
        sum += (f64::from(c.logit) - max).exp();
    }
    for c in &mut cands.data {
        c.p = (f64::from(c.p) / sum) as f32;
    }
}

/// Index in `cands` of the highest logit; the first one on ties.
pub fn argmax(cands: &Candidates) -> usize {
    let mut best = 0;
    for (i, t) in cands.data.iter().enumerate() {
        if t.logit > cands.data[best].logit {
            best = i;
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn divides_logits() {
        let mut c = Candidates::default();
        c.fill(&[1.0, -2.0]);
        temperature(&mut c, 0.5);
        assert_eq!(c.data[0].logit, 2.0);
        assert_eq!(c.data[1].logit, -4.0);
    }

    #[test]
    fn dynamic_temperature_follows_the_entropy() {
        // Uniform logits have the largest entropy: the temperature is temp + range.
        let mut c = Candidates::default();
        c.fill(&[1.0, 1.0, 1.0, 1.0]);
        dynamic(&mut c, 1.0, 0.5, 1.0);
        assert!(c.data.iter().all(|t| (t.logit - 1.0 / 1.5).abs() < 1e-6));
        // A certain pick has none: temp − range.
        c.fill(&[0.0, f32::NEG_INFINITY]);
        dynamic(&mut c, 1.0, 0.5, 1.0);
        assert_eq!(c.data[0].logit, 0.0);
        assert!((c.data[0].p - 1.0).abs() < 1e-6);
    }

    #[test]
    fn zero_keeps_only_the_first_maximum() {
        let mut c = Candidates::default();
        c.fill(&[1.0, 3.0, 3.0, 2.0]);
        temperature(&mut c, 0.0);
        let l: Vec<f32> = c.data.iter().map(|t| t.logit).collect();
        assert_eq!(l[1], 3.0);
        assert!(l[0] == f32::NEG_INFINITY && l[2] == f32::NEG_INFINITY);
    }
}
