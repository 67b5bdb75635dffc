//! Locally typical sampling (llama.cpp's `typical` stage): keeps the tokens whose surprise
//! `-ln p` is closest to the entropy of the distribution, until their mass exceeds `p`.

use super::candidates::Candidates;

/// Keeps the most typical tokens whose mass first exceeds `p` (and at least `min_keep`); `p >= 1`
/// keeps everything. The list is left in typicality order (not sorted by logit). Allocates
/// nothing; the sort is in place.
pub fn typical(cands: &mut Candidates, p: f32, min_keep: usize) {
    if p >= 1.0 || cands.is_empty() {
        return;
    }
    cands.sort();
    cands.softmax();
    let entropy: f32 = cands.data.iter().map(|t| -t.p * t.p.ln()).sum();
    let score = |q: f32| (-q.ln() - entropy).abs();
    // Stable, so that equally typical tokens keep their logit order.
    cands.data.sort_by(|a, b| score(a.p).total_cmp(&score(b.p)));
    let mut cum = 0f32;
    let mut keep = cands.len();
    for (i, t) in cands.data.iter().enumerate() {
        cum += t.p;
        if cum > p && (min_keep == 0 || i + 1 >= min_keep) {
            keep = i + 1;
            break;
        }
    }
    cands.data.truncate(keep);
    cands.sorted = false;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_the_tokens_nearest_the_entropy() {
        // p = 0.5, 0.25, 0.125, 0.125: entropy 1.75 ln 2; surprises 1, 2, 3, 3 (× ln 2), so the
        // order by typicality is 0.25 (|2-1.75|), 0.5 (0.75), then the two 0.125 (1.25).
        let mut c = Candidates::default();
        c.fill(&[0.5f32.ln(), 0.25f32.ln(), 0.125f32.ln(), 0.125f32.ln()]);
        typical(&mut c, 0.5, 0);
        let ids: Vec<u32> = c.data.iter().map(|t| t.id).collect();
        // 0.25 alone is not > 0.5; 0.25 + 0.5 is.
        assert_eq!(ids, vec![1, 0]);
        assert!(!c.sorted);
        let mut c2 = Candidates::default();
        c2.fill(&[0.5f32.ln(), 0.25f32.ln(), 0.125f32.ln(), 0.125f32.ln()]);
        typical(&mut c2, 1.0, 0);
        assert_eq!(c2.len(), 4);
    }
}
