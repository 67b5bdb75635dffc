//! Temperature: divides the logits by `t`; `t <= 0` keeps only the highest logit (greedy), as
//! llama.cpp does.

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
    fn zero_keeps_only_the_first_maximum() {
        let mut c = Candidates::default();
        c.fill(&[1.0, 3.0, 3.0, 2.0]);
        temperature(&mut c, 0.0);
        let l: Vec<f32> = c.data.iter().map(|t| t.logit).collect();
        assert_eq!(l[1], 3.0);
        assert!(l[0] == f32::NEG_INFINITY && l[2] == f32::NEG_INFINITY);
    }
}
