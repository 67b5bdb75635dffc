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
            let count = self.counts.get(t.id as usize).copied().unwrap_or(0);
            if count == 0 {
                continue;
            }
            if t.logit <= 0.0 {
                t.logit *= self.repeat;
            } else {
                t.logit /= self.repeat;
            }
            t.logit -= count as f32 * self.frequency + self.presence;
        }
        cands.sorted = false;
    }
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

    #[test]
    fn neutral_settings_are_off() {
        let mut p = Penalties::new(64, 1.0, 0.0, 0.0, 3);
        assert!(p.is_disabled());
        p.accept(1);
        assert_eq!(logits(&p, &[1.0, 1.0, 1.0]), vec![1.0, 1.0, 1.0]);
    }
}
