//! Stages that cut the candidate list, with llama.cpp's definitions: top-k (keep the k highest
//! logits), top-p (the smallest prefix of the sorted softmax whose mass reaches p) and min-p (keep
//! tokens whose probability is at least p times the largest one, tested on logits).

use super::candidates::Candidates;

/// Keeps the `k` highest logits, sorted; `k <= 0` keeps everything.
pub fn top_k(cands: &mut Candidates, k: i32) {
    if k <= 0 || cands.is_empty() {
        return;
    }
    let k = (k as usize).min(cands.len());
    cands.sort_top(k);
    cands.data.truncate(k);
    cands.sorted = true;
}

/// Keeps the smallest sorted prefix whose softmax mass (over the current candidates and logits) is
/// at least `p`, and at least `min_keep` tokens; `p >= 1` keeps everything.
pub fn top_p(cands: &mut Candidates, p: f32, min_keep: usize) {
    if p >= 1.0 || cands.is_empty() {
        return;
    }
    cands.softmax();
    cands.sort();
    let mut cum = 0f32;
    let mut keep = cands.len();
    for (i, t) in cands.data.iter().enumerate() {
        cum += t.p;
        if cum >= p && i + 1 >= min_keep {
            keep = i + 1;
            break;
        }
    }
    cands.data.truncate(keep);
}

/// Keeps tokens with `logit >= max_logit + ln(p)` (probability at least `p` times the top one), and
/// at least `min_keep` tokens; `p <= 0` keeps everything.
pub fn min_p(cands: &mut Candidates, p: f32, min_keep: usize) {
    if p <= 0.0 || cands.is_empty() {
        return;
    }
    let threshold = cands.max_logit() + p.ln();
    let passing = cands.data.iter().filter(|t| t.logit >= threshold).count();
    if passing >= min_keep.max(1) {
        // Order is kept, so a sorted list stays sorted.
        cands.data.retain(|t| t.logit >= threshold);
        return;
    }
    cands.sort();
    cands.data.truncate(min_keep.min(cands.len()));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cands(logits: &[f32]) -> Candidates {
        let mut c = Candidates::default();
        c.fill(logits);
        c
    }

    fn ids(c: &Candidates) -> Vec<u32> {
        let mut v: Vec<u32> = c.data.iter().map(|t| t.id).collect();
        v.sort();
        v
    }

    /// Logits whose softmax is exactly `probs` (all powers of two, so the sums are exact).
    fn from_probs(probs: &[f32]) -> Candidates {
        cands(&probs.iter().map(|p| p.ln()).collect::<Vec<_>>())
    }

    #[test]
    fn top_k_keeps_the_k_largest_sorted() {
        let mut c = cands(&[0.1, 0.9, 0.5, 0.7]);
        top_k(&mut c, 2);
        assert_eq!(c.data.iter().map(|t| t.id).collect::<Vec<_>>(), vec![1, 3]);
        assert!(c.sorted);
        let mut c = cands(&[0.1, 0.9]);
        top_k(&mut c, 0);
        assert_eq!(c.len(), 2);
        top_k(&mut c, 10);
        assert_eq!(c.len(), 2);
    }

    #[test]
    fn top_p_stops_at_the_first_prefix_reaching_p() {
        // probabilities 0.5, 0.25, 0.125, 0.125
        let probs = [0.125, 0.5, 0.125, 0.25];
        // exactly at the boundary: 0.5 + 0.25 = 0.75 >= 0.75 keeps two
        let mut c = from_probs(&probs);
        top_p(&mut c, 0.75, 0);
        assert_eq!(ids(&c), vec![1, 3]);
        // just above it needs the third
        let mut c = from_probs(&probs);
        top_p(&mut c, 0.76, 0);
        assert_eq!(c.len(), 3);
        // p = 0.5 keeps only the top token; min_keep raises it
        let mut c = from_probs(&probs);
        top_p(&mut c, 0.5, 0);
        assert_eq!(ids(&c), vec![1]);
        let mut c = from_probs(&probs);
        top_p(&mut c, 0.5, 3);
        assert_eq!(c.len(), 3);
        // p = 1 keeps all
        let mut c = from_probs(&probs);
        top_p(&mut c, 1.0, 0);
        assert_eq!(c.len(), 4);
    }

    #[test]
    fn min_p_keeps_tokens_at_exactly_p_times_the_top() {
        // probabilities relative to the top: 1, 0.5, 0.25, 0.125
        let probs = [0.125, 1.0, 0.25, 0.5];
        let mut c = from_probs(&probs);
        min_p(&mut c, 0.25, 0);
        assert_eq!(ids(&c), vec![1, 2, 3]);
        let mut c = from_probs(&probs);
        min_p(&mut c, 0.26, 0);
        assert_eq!(ids(&c), vec![1, 3]);
        let mut c = from_probs(&probs);
        min_p(&mut c, 0.9, 3);
        assert_eq!(ids(&c), vec![1, 2, 3]);
        let mut c = from_probs(&probs);
        min_p(&mut c, 0.0, 0);
        assert_eq!(c.len(), 4);
    }
}
