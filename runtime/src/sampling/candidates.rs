//! The candidate list a sampler chain works on: token ids with their logits and probabilities.

use std::cmp::Ordering;

/// One candidate token.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TokenData {
    /// Token id.
    pub id: u32,
    /// Logit (after the stages applied so far).
    pub logit: f32,
    /// Probability; valid only after a stage that computes a softmax (top-p, the final draw).
    pub p: f32,
}

/// The candidates left by the stages so far. `sorted` says they are in descending logit order.
#[derive(Clone, Debug, Default)]
pub struct Candidates {
    /// The candidates.
    pub data: Vec<TokenData>,
    /// True when `data` is in descending logit order.
    pub sorted: bool,
}

/// Descending logit; ties keep the lower id first so that every order is reproducible.
pub(crate) fn by_logit_desc(a: &TokenData, b: &TokenData) -> Ordering {
    b.logit.total_cmp(&a.logit).then(a.id.cmp(&b.id))
}

impl Candidates {
    /// Refills the list with every token of `logits` (id = index), unsorted. Reuses the
    /// allocation: on the decode path this does not allocate once the list has grown to the vocabulary.
    pub fn fill(&mut self, logits: &[f32]) {
        self.data.clear();
        self.data
            .extend(logits.iter().enumerate().map(|(i, &logit)| TokenData {
                id: i as u32,
                logit,
                p: 0.0,
            }));
        self.sorted = false;
    }

    /// Number of candidates.
    pub fn len(&self) -> usize {
        self.data.len()
    }

    /// True when no candidate is left.
    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }

    /// Puts the `k` highest logits first, in descending order (the rest follow in no order).
    pub fn sort_top(&mut self, k: usize) {
        if self.sorted {
            return;
        }
        let k = k.min(self.data.len());
        if k == 0 {
            return;
        }
        if k < self.data.len() {
            self.data.select_nth_unstable_by(k - 1, by_logit_desc);
        }
        self.data[..k].sort_unstable_by(by_logit_desc);
        if k == self.data.len() {
            self.sorted = true;
        }
    }

    /// Sorts every candidate in descending logit order.
    pub fn sort(&mut self) {
        let n = self.data.len();
        self.sort_top(n);
        self.sorted = true;
    }

    /// The largest logit (negative infinity when empty).
    pub fn max_logit(&self) -> f32 {
        if self.sorted {
            if let Some(first) = self.data.first() {
                return first.logit;
            }
        }
        self.data
            .iter()
            .fold(f32::NEG_INFINITY, |m, t| m.max(t.logit))
    }

    /// Sets `p` to the softmax of the logits (exp in f32 relative to the largest logit, as
    /// llama.cpp does). Does not reorder.
    pub fn softmax(&mut self) {
        if self.data.is_empty() {
            return;
        }
        let max = self.max_logit();
        let mut sum = 0f32;
        for t in &mut self.data {
            t.p = (t.logit - max).exp();
            sum += t.p;
        }
        for t in &mut self.data {
            t.p /= sum;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn softmax_sums_to_one_and_keeps_order() {
        let mut c = Candidates::default();
        c.fill(&[0.0, (2f32).ln(), 0.0]);
        c.softmax();
        let p: Vec<f32> = c.data.iter().map(|t| t.p).collect();
        assert!((p[0] - 0.25).abs() < 1e-6 && (p[1] - 0.5).abs() < 1e-6);
        assert!((p.iter().sum::<f32>() - 1.0).abs() < 1e-6);
    }

    #[test]
    fn sort_top_puts_the_largest_first_ties_by_id() {
        let mut c = Candidates::default();
        c.fill(&[1.0, 3.0, 2.0, 3.0, -1.0]);
        c.sort_top(3);
        let ids: Vec<u32> = c.data[..3].iter().map(|t| t.id).collect();
        assert_eq!(ids, vec![1, 3, 2]);
        assert!(!c.sorted);
        c.sort();
        let ids: Vec<u32> = c.data.iter().map(|t| t.id).collect();
        assert_eq!(ids, vec![1, 3, 2, 0, 4]);
    }
}
