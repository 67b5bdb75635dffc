//! The tokens a grammar state admits: a sorted list when few are (a state of a JSON grammar
//! admits some hundreds of a 248k vocabulary, and a request keeps a mask per state it meets),
//! one bit per token when many are.

/// A list is kept when at most one token in this many is admitted (at most half the bits'
/// size).
const LIST_SHARE: usize = 64;

/// The tokens a grammar state admits.
#[derive(Clone, Debug)]
pub struct Mask {
    /// The admitted tokens in increasing order, when few are; else empty.
    ids: Box<[u32]>,
    /// One bit per token, when many are admitted; else empty.
    bits: Box<[u64]>,
    count: usize,
}

impl Mask {
    /// The mask of the tokens in `found` (in any order, repeats allowed; ids from `n_vocab` on
    /// are dropped) over a vocabulary of `n_vocab`. Leaves `found` empty (a buffer the caller
    /// keeps).
    pub(crate) fn of(n_vocab: usize, found: &mut Vec<u32>) -> Self {
        found.retain(|&id| (id as usize) < n_vocab);
        if found.len() * LIST_SHARE <= n_vocab {
            found.sort_unstable();
            found.dedup();
            let ids: Box<[u32]> = found.as_slice().into();
            found.clear();
            return Mask {
                count: ids.len(),
                ids,
                bits: Box::default(),
            };
        }
        let mut bits = vec![0u64; n_vocab.div_ceil(64)];
        for &id in found.iter() {
            bits[(id / 64) as usize] |= 1 << (id % 64);
        }
        found.clear();
        Mask {
            ids: Box::default(),
            count: bits.iter().map(|w| w.count_ones() as usize).sum(),
            bits: bits.into(),
        }
    }

    /// Whether token `id` is admitted.
    pub fn allows(&self, id: u32) -> bool {
        if self.bits.is_empty() {
            return self.ids.binary_search(&id).is_ok();
        }
        self.bits
            .get((id / 64) as usize)
            .is_some_and(|w| w & (1 << (id % 64)) != 0)
    }

    /// How many tokens are admitted.
    pub fn count(&self) -> usize {
        self.count
    }

    /// The only admitted token, when exactly one is.
    pub fn only(&self) -> Option<u32> {
        (self.count == 1).then(|| self.admitted().next()).flatten()
    }

    /// The admitted tokens, in increasing order.
    pub fn admitted(&self) -> impl Iterator<Item = u32> + '_ {
        Admitted {
            ids: self.ids.iter(),
            words: &self.bits,
            word: 0,
            rest: self.bits.first().copied().unwrap_or(0),
        }
    }

    /// Sets every refused token's logit to negative infinity (`logits` has one per token).
    pub fn apply(&self, logits: &mut [f32]) {
        if self.bits.is_empty() {
            let mut from = 0;
            for &id in self.ids.iter() {
                let Some(gap) = logits.get_mut(from..id as usize) else {
                    break;
                };
                gap.fill(f32::NEG_INFINITY);
                from = id as usize + 1;
            }
            if let Some(rest) = logits.get_mut(from..) {
                rest.fill(f32::NEG_INFINITY);
            }
            return;
        }
        // 64 tokens per word of the mask.
        let words = self.bits.iter().chain(std::iter::repeat(&0));
        for (chunk, &word) in logits.chunks_mut(64).zip(words) {
            match word {
                u64::MAX => {}
                0 => chunk.fill(f32::NEG_INFINITY),
                _ => {
                    for (i, l) in chunk.iter_mut().enumerate() {
                        if word >> i & 1 == 0 {
                            *l = f32::NEG_INFINITY;
                        }
                    }
                }
            }
        }
    }
}

/// The admitted tokens of a mask, from its list or its bits.
struct Admitted<'a> {
    ids: std::slice::Iter<'a, u32>,
    words: &'a [u64],
    /// The word being read and its bits not yet handed out.
    word: usize,
    rest: u64,
}

impl Iterator for Admitted<'_> {
    type Item = u32;

    fn next(&mut self) -> Option<u32> {
        if let Some(&id) = self.ids.next() {
            return Some(id);
        }
        while self.rest == 0 {
            self.word += 1;
            self.rest = *self.words.get(self.word)?;
        }
        let bit = self.rest.trailing_zeros();
        self.rest &= self.rest - 1;
        Some(self.word as u32 * 64 + bit)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Both forms answer alike: `allows`, `count`, `only`, `admitted` and `apply`, with
    /// repeats, ids past the vocabulary, whole words in and out and a short last word.
    #[test]
    fn lists_and_bits_agree_with_allows() {
        let many: Vec<u32> = (64..128)
            .chain([0, 3, 63, 130, 191, 256, 299, 64])
            .collect();
        for (n_vocab, ids) in [
            (300, many.clone()),
            (300, vec![]),
            (300, vec![299, 7, 7, 400]),
            (64_000, many),
            (64_000, vec![5]),
            (8, vec![5]),
        ] {
            let mut found = ids.clone();
            let mask = Mask::of(n_vocab, &mut found);
            assert!(found.is_empty());
            let mut want: Vec<u32> = ids.into_iter().filter(|&i| i < n_vocab as u32).collect();
            want.sort_unstable();
            want.dedup();
            let allowed: Vec<u32> = (0..n_vocab as u32 + 70)
                .filter(|&i| mask.allows(i))
                .collect();
            assert_eq!(allowed, want, "{n_vocab}");
            assert_eq!(mask.admitted().collect::<Vec<_>>(), want);
            assert_eq!(mask.count(), want.len());
            assert_eq!(mask.only(), (want.len() == 1).then(|| want[0]));
            // Logits past the vocabulary are refused too.
            let mut logits: Vec<f32> = (0..n_vocab + 10).map(|i| i as f32).collect();
            mask.apply(&mut logits);
            for (i, &l) in logits.iter().enumerate() {
                let kept = want.contains(&(i as u32));
                assert_eq!(l, if kept { i as f32 } else { f32::NEG_INFINITY }, "{i}");
            }
        }
    }
}
