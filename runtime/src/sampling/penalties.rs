//! Repetition penalties over the last tokens (llama.cpp's `penalties` stage): a token seen `c` times
//! in the window has its logit divided by `repeat` when positive (multiplied when not), then lowered
//! by `c · frequency + presence`.

use std::collections::VecDeque;

use super::candidates::Candidates;

/// The penalty window and its token counts.
#[derive(Clone, Debug)]
pub struct Penalties {
    last_n: usize,
    repeat: f32,
    frequency: f32,
    presence: f32,
    window: VecDeque<u32>,
    counts: Vec<u32>,
}

impl Penalties {
    /// A window of the last `last_n` tokens (0 turns the stage off) over a vocabulary of `n_vocab`.
    pub fn new(last_n: usize, repeat: f32, frequency: f32, presence: f32, n_vocab: usize) -> Self {
        let disabled = last_n == 0 || (repeat == 1.0 && frequency == 0.0 && presence == 0.0);
        Penalties {
            last_n: if disabled { 0 } else { last_n },
            repeat,
            frequency,
            presence,
            window: VecDeque::with_capacity(if disabled { 0 } else { last_n }),
            counts: if disabled {
                Vec::new()
            } else {
                vec![0; n_vocab]
            },
        }
    }

    /// True when the stage changes nothing.
    pub fn is_disabled(&self) -> bool {
        self.last_n == 0
    }

    /// Records a token (a prompt token or a sampled one); the oldest leaves a full window.
    pub fn accept(&mut self, token: u32) {
        if self.last_n == 0 {
            return;
        }
        if self.window.len() >= self.last_n {
            if let Some(old) = self.window.pop_front() {
                if let Some(c) = self.counts.get_mut(old as usize) {
                    *c = c.saturating_sub(1);
                }
            }
        }
        if let Some(c) = self.counts.get_mut(token as usize) {
            *c += 1;
            self.window.push_back(token);
        }
    }

    /// Forgets every token.
    pub fn reset(&mut self) {
        for &t in &self.window {
            if let Some(c) = self.counts.get_mut(t as usize) {
                *c = 0;
            }
        }
        self.window.clear();
    }

    /// Applies the penalties; the candidates are no longer sorted afterwards.
    pub fn apply(&self, cands: &mut Candidates) {
        if self.last_n == 0 {
            return;
        }
        for t in &mut cands.data {
            t.logit = self.penalized(t.id as usize, t.logit);
        }
        cands.sorted = false;
    }

    /// Token `id`'s logit after the penalties.
    #[inline]
    fn penalized(&self, id: usize, logit: f32) -> f32 {
        let count = self.counts.get(id).copied().unwrap_or(0);
        if count == 0 {
            return logit;
        }
        let l = if logit <= 0.0 {
            logit * self.repeat
        } else {
            logit / self.repeat
        };
        l - (count as f32 * self.frequency + self.presence)
    }

    /// The index of the highest penalized logit, the first on ties (0 for an empty row): what
    /// filling candidates, [`Penalties::apply`] and `temperature::argmax` give, without writing
    /// a candidate per token (greedy decoding's whole sampler).
    pub fn argmax(&self, logits: &[f32]) -> usize {
        let mut best = 0;
        let Some(&first) = logits.first() else {
            return 0;
        };
        if self.last_n == 0 {
            return first_max(logits);
        }
        let mut best_v = self.penalized(0, first);
        for (i, &v) in logits.iter().enumerate().skip(1) {
            let v = self.penalized(i, v);
            if v > best_v {
                (best, best_v) = (i, v);
            }
        }
        best
    }

    /// [`Penalties::argmax`] of `logits` with every index outside `ids` (ascending) set to
    /// negative infinity, reading only the logits of `ids`.
    pub fn argmax_among(&self, logits: &[f32], ids: impl IntoIterator<Item = u32>) -> usize {
        let mut ids = ids.into_iter().peekable();
        let Some(&first) = logits.first() else {
            return 0;
        };
        // The scan starts from index 0 whether or not it is admitted.
        let mut best = 0;
        let mut best_v = if ids.next_if_eq(&0).is_some() {
            self.penalized(0, first)
        } else {
            f32::NEG_INFINITY
        };
        for id in ids {
            let Some(&v) = logits.get(id as usize) else {
                break;
            };
            let v = self.penalized(id as usize, v);
            if v > best_v {
                (best, best_v) = (id as usize, v);
            }
        }
        best
    }
}

/// The index of the first maximum of a non-empty row, as a scan with `>` from index 0 finds it
/// (a NaN is never a maximum, but a leading NaN stays the answer), in independent lanes so that
/// the compiler can vectorize it.
fn first_max(row: &[f32]) -> usize {
    const LANES: usize = 16;
    if row[0].is_nan() {
        return 0;
    }
    let (mut val, mut at) = ([f32::NEG_INFINITY; LANES], [0usize; LANES]);
    let chunks = row.chunks_exact(LANES);
    let tail = chunks.remainder();
    for (c, chunk) in chunks.enumerate() {
        for l in 0..LANES {
            if chunk[l] > val[l] {
                (val[l], at[l]) = (chunk[l], c * LANES + l);
            }
        }
    }
    let base = row.len() - tail.len();
    let (mut best, mut best_v) = (0, row[0]);
    for (i, v) in at
        .into_iter()
        .zip(val)
        .chain(tail.iter().enumerate().map(|(i, &v)| (base + i, v)))
    {
        if v > best_v || (v == best_v && i < best) {
            (best, best_v) = (i, v);
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;

    fn logits(p: &Penalties, l: &[f32]) -> Vec<f32> {
        let mut c = Candidates::default();
        c.fill(l);
        p.apply(&mut c);
        c.data.iter().map(|t| t.logit).collect()
    }

    #[test]
    fn repeat_divides_positive_and_multiplies_negative_logits() {
        let mut p = Penalties::new(64, 2.0, 0.0, 0.0, 4);
        p.accept(0);
        p.accept(1);
        p.accept(1);
        assert_eq!(
            logits(&p, &[4.0, -4.0, 4.0, 0.0]),
            vec![2.0, -8.0, 4.0, 0.0]
        );
    }

    #[test]
    fn frequency_counts_and_presence_once() {
        let mut p = Penalties::new(64, 1.0, 0.5, 0.25, 3);
        for t in [2, 2, 2, 0] {
            p.accept(t);
        }
        // token 2: 3 × 0.5 + 0.25; token 0: 0.5 + 0.25; token 1 unseen.
        assert_eq!(logits(&p, &[1.0, 1.0, 1.0]), vec![0.25, 1.0, -0.75]);
    }

    #[test]
    fn only_the_last_n_tokens_count() {
        let mut p = Penalties::new(2, 2.0, 0.0, 0.0, 3);
        for t in [0, 1, 2] {
            p.accept(t);
        }
        assert_eq!(logits(&p, &[2.0, 2.0, 2.0]), vec![2.0, 1.0, 1.0]);
        p.reset();
        assert_eq!(logits(&p, &[2.0, 2.0, 2.0]), vec![2.0, 2.0, 2.0]);
    }

    /// The greedy shortcut picks what the candidate path picks, ties and penalized leaders
    /// included.
    #[test]
    fn argmax_equals_the_penalized_candidates_argmax() {
        let row: Vec<f32> = (0..4000)
            .map(|i| ((i * 7919) % 1013) as f32 / 50.0 - 10.0)
            .collect();
        let leader = (0..row.len()).fold(0, |b, i| if row[i] > row[b] { i } else { b });
        for (repeat, freq, presence) in [(1.0, 0.0, 0.0), (1.3, 0.0, 0.0), (1.1, 0.4, 0.2)] {
            let mut p = Penalties::new(16, repeat, freq, presence, row.len());
            for t in [leader as u32, 5, 5, 17, leader as u32, 3999] {
                p.accept(t);
                let mut c = Candidates::default();
                c.fill(&row);
                p.apply(&mut c);
                let want = crate::sampling::temperature::argmax(&c);
                assert_eq!(p.argmax(&row), want, "{repeat} {freq} {presence} after {t}");
            }
        }
        // Rows longer than the lanes with a repeated maximum, NaNs and infinities.
        for row in [
            vec![f32::NEG_INFINITY; 40],
            (0..40)
                .map(|i| if i % 7 == 3 { 9.0 } else { i as f32 * 0.1 })
                .collect(),
            (0..41)
                .map(|i| if i % 5 == 0 { f32::NAN } else { -(i as f32) })
                .collect(),
            (0..37)
                .map(|i| if i == 36 { f32::INFINITY } else { 1.0 })
                .collect(),
        ] {
            let mut c = Candidates::default();
            c.fill(&row);
            let want = crate::sampling::temperature::argmax(&c);
            assert_eq!(
                Penalties::new(0, 1.0, 0.0, 0.0, 0).argmax(&row),
                want,
                "{row:?}"
            );
        }
        // Ties go to the first index, as the candidate path does.
        assert_eq!(
            Penalties::new(0, 1.0, 0.0, 0.0, 4).argmax(&[1.0, 3.0, 3.0, 2.0]),
            1
        );
        assert_eq!(Penalties::new(0, 1.0, 0.0, 0.0, 0).argmax(&[]), 0);
    }

    /// The argmax among admitted indices equals the argmax of the row with the others set to
    /// negative infinity: penalized leaders, ties, NaNs and infinities, index 0 in and out.
    #[test]
    fn argmax_among_equals_the_argmax_of_the_masked_row() {
        let smooth: Vec<f32> = (0..300)
            .map(|i| ((i * 7919) % 101) as f32 / 10.0 - 5.0)
            .collect();
        let mut rows = vec![
            smooth.clone(),
            vec![f32::NEG_INFINITY; 70],
            (0..70)
                .map(|i| if i % 5 == 0 { f32::NAN } else { 1.0 })
                .collect(),
            (0..70)
                .map(|i| if i % 9 == 4 { f32::INFINITY } else { 0.0 })
                .collect(),
        ];
        rows[1][3] = 0.5;
        let admitted: Vec<Vec<u32>> = vec![
            vec![],
            vec![0],
            vec![0, 4, 5, 13, 40],
            (1..70).step_by(3).collect(),
            (0..300).filter(|i| i % 7 != 2).collect(),
            vec![3, 299, 400],
        ];
        for (repeat, freq, presence) in [(1.0, 0.0, 0.0), (1.3, 0.4, 0.2)] {
            let mut p = Penalties::new(16, repeat, freq, presence, 300);
            for t in [0, 4, 4, 13, 36, 299] {
                p.accept(t);
            }
            for row in &rows {
                for ids in &admitted {
                    let mut masked = vec![f32::NEG_INFINITY; row.len()];
                    for &i in ids.iter().filter(|&&i| (i as usize) < row.len()) {
                        masked[i as usize] = row[i as usize];
                    }
                    let got = p.argmax_among(row, ids.iter().copied());
                    assert_eq!(got, p.argmax(&masked), "{repeat} {row:?} {ids:?}");
                }
            }
        }
    }

    #[test]
    fn neutral_settings_are_off() {
        let mut p = Penalties::new(64, 1.0, 0.0, 0.0, 3);
        assert!(p.is_disabled());
        p.accept(1);
        assert_eq!(logits(&p, &[1.0, 1.0, 1.0]), vec![1.0, 1.0, 1.0]);
    }
}
