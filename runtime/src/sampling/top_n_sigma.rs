//! Top-n-sigma (llama.cpp's `top-n-sigma` stage): keeps the tokens whose logit lies within `n`
//! standard deviations of the highest one, the spread taken over the finite logits.

use super::candidates::Candidates;

/// Sets to negative infinity every logit below `max - n · std`; `n <= 0` (or fewer than two
/// candidates) changes nothing. The mean and spread leave out logits already at negative
/// infinity. Does not allocate.
pub fn apply(cands: &mut Candidates, n: f32) {
    if n <= 0.0 || cands.len() <= 1 {
        return;
    }
    let mut max = cands.data[0].logit;
    let mut sum = 0f32;
    let mut count = 0usize;
    for t in cands.data.iter().filter(|t| t.logit != f32::NEG_INFINITY) {
        max = max.max(t.logit);
        sum += t.logit;
        count += 1;
    }
    let mean = if count > 0 { sum / count as f32 } else { 0.0 };
    let mut acc = 0f32;
    for t in cands.data.iter().filter(|t| t.logit != f32::NEG_INFINITY) {
        // Squared and added in f64, then kept in f32, as llama.cpp's `pow` call does.
        acc = (f64::from(acc) + f64::from(t.logit - mean).powi(2)) as f32;
    }
    let std = if count > 0 {
        f64::from(acc / count as f32).sqrt() as f32
    } else {
        0.0
    };
    let floor = max - n * std;
    for t in &mut cands.data {
        if t.logit < floor {
            t.logit = f32::NEG_INFINITY;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_tokens_within_n_deviations_of_the_top() {
        // mean 0, std 2 (values -2, -2, 2, 2); n = 1 keeps logits >= 2 - 2 = 0.
        let mut c = Candidates::default();
        c.fill(&[-2.0, 2.0, -2.0, 2.0, f32::NEG_INFINITY]);
        apply(&mut c, 1.0);
        let kept: Vec<u32> = c
            .data
            .iter()
            .filter(|t| t.logit.is_finite())
            .map(|t| t.id)
            .collect();
        assert_eq!(kept, vec![1, 3]);
        let mut c = Candidates::default();
        c.fill(&[-2.0, 2.0]);
        apply(&mut c, 0.0);
        assert!(c.data.iter().all(|t| t.logit.is_finite()));
    }
}
