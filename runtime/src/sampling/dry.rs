//! DRY, "don't repeat yourself" (llama.cpp's `dry` stage): a token that would extend a sequence
//! already seen in the recent context loses `multiplier · base^(length − allowed)` from its
//! logit, where `length` is the longest such repeat. Sequence breakers (text such as a newline)
//! cut the repeats a match may span; they are turned into token sequences once per vocabulary.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use super::candidates::Candidates;

/// Longest breaker text, in bytes (longer ones are cut).
const MAX_BREAKER_BYTES: usize = 40;
/// Most tokens kept of a breaker's tail.
const MAX_TAIL_TOKENS: usize = 20;
/// Roughly the natural log of `f32::MAX`: the penalty's exponent is held below it.
const FLOAT_MAX_LOG: f32 = 88.722_84;

/// The default breakers of llama-server: newline, colon, double quote and asterisk.
pub const DEFAULT_BREAKERS: [&str; 4] = ["\n", ":", "\"", "*"];

/// The sequence breakers as tokens: for every token whose text contains a breaker, or ends
/// with the start of one, the tails (tokenized rest of the breaker) that complete it. An empty
/// tail means the token breaks a sequence on its own.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct DryBreakers {
    heads: HashMap<u32, Vec<Vec<u32>>>,
}

impl DryBreakers {
    /// Breakers over a vocabulary of `n_vocab` tokens, each token's text given by `piece` (its
    /// bytes, special tokens rendered) and text tokenized by `tokenize` (no special tokens
    /// added or parsed). Breakers are cut to 40 bytes and their tails to 20 tokens; empty ones
    /// are skipped. Runs over the whole vocabulary once per breaker.
    pub fn new<'v>(
        n_vocab: usize,
        piece: impl Fn(u32) -> &'v [u8],
        mut tokenize: impl FnMut(&str) -> Vec<u32>,
        breakers: &[String],
    ) -> Self {
        let mut heads: HashMap<u32, Vec<Vec<u32>>> = HashMap::new();
        for b in breakers.iter().filter(|b| !b.is_empty()) {
            let b = &b.as_bytes()[..b.len().min(MAX_BREAKER_BYTES)];
            for id in 0..n_vocab as u32 {
                let word = piece(id);
                if contains(word, b) {
                    heads.entry(id).or_default().push(Vec::new());
                    continue;
                }
                for pos in (0..word.len()).filter(|&p| word[p] == b[0]) {
                    // The word's end from `pos` on is a proper prefix of the breaker.
                    let overlap = word.len() - pos;
                    if overlap >= b.len() || word[pos..] != b[..overlap] {
                        continue;
                    }
                    let mut tail = tokenize(&String::from_utf8_lossy(&b[overlap..]));
                    tail.truncate(MAX_TAIL_TOKENS);
                    let tails = heads.entry(id).or_default();
                    if !tails.contains(&tail) {
                        tails.push(tail);
                    }
                }
            }
        }
        DryBreakers { heads }
    }

    /// Breakers given as tokens directly: each sequence's first token and its tail.
    pub fn from_sequences(seqs: &[Vec<u32>]) -> Self {
        let mut heads: HashMap<u32, Vec<Vec<u32>>> = HashMap::new();
        for s in seqs {
            if let Some((&head, tail)) = s.split_first() {
                heads.entry(head).or_default().push(tail.to_vec());
            }
        }
        DryBreakers { heads }
    }

    /// True when no token breaks a sequence.
    pub fn is_empty(&self) -> bool {
        self.heads.is_empty()
    }
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

/// DRY's settings, its window of recent tokens and its work buffers.
#[derive(Clone, Debug)]
pub struct Dry {
    multiplier: f32,
    base: f32,
    allowed_length: usize,
    last_n: usize,
    breakers: Arc<DryBreakers>,
    recent: VecDeque<u32>,
    repeat_count: Vec<usize>,
    max_repeat: HashMap<u32, usize>,
}

impl Dry {
    /// The stage, or `None` when it is off (`multiplier == 0`, `base < 1` or `last_n == 0`).
    pub fn new(
        multiplier: f32,
        base: f32,
        allowed_length: usize,
        last_n: usize,
        breakers: Arc<DryBreakers>,
    ) -> Option<Self> {
        (multiplier != 0.0 && base >= 1.0 && last_n != 0).then(|| Dry {
            multiplier,
            base,
            allowed_length,
            last_n,
            breakers,
            recent: VecDeque::with_capacity(last_n),
            repeat_count: Vec::with_capacity(last_n),
            max_repeat: HashMap::new(),
        })
    }

    /// Records a token (a prompt token or a generated one).
    pub fn accept(&mut self, token: u32) {
        if self.recent.len() == self.last_n {
            self.recent.pop_front();
        }
        self.recent.push_back(token);
    }

    /// The `i`-th most recent token (0: the last one).
    fn back(&self, i: usize) -> u32 {
        self.recent[self.recent.len() - 1 - i]
    }

    /// Lowers the logits of the tokens that would extend a repeat longer than the allowed
    /// length. Allocates only while its buffers grow to the window.
    pub fn apply(&mut self, cands: &mut Candidates) {
        let n = self.recent.len().min(self.last_n);
        if n <= self.allowed_length {
            return;
        }
        let Some(limit) = self.repeat_limit(n) else {
            return;
        };
        self.repeat_lengths(n, limit);
        self.max_repeat.clear();
        for i in 0..n - 1 {
            let len = self.repeat_count[i];
            if len >= self.allowed_length {
                let next = self.back(n - 2 - i);
                let best = self.max_repeat.entry(next).or_insert(0);
                *best = (*best).max(len);
            }
        }
        let max_exponent = if self.base > 1.000_001 {
            (FLOAT_MAX_LOG / self.base.ln()) as usize
        } else {
            0
        };
        for t in &mut cands.data {
            let Some(&len) = self.max_repeat.get(&t.id) else {
                continue;
            };
            let breaks_alone = self
                .breakers
                .heads
                .get(&t.id)
                .is_some_and(|tails| tails.iter().any(Vec::is_empty));
            if breaks_alone {
                continue;
            }
            let mut exponent = len - self.allowed_length;
            if max_exponent > 0 {
                exponent = exponent.min(max_exponent);
            }
            // In f64 and then f32, as llama.cpp's `std::pow` of a float and an int is.
            let penalty =
                (f64::from(self.multiplier) * f64::from(self.base).powf(exponent as f64)) as f32;
            t.logit -= penalty;
        }
        cands.sorted = false;
    }

    /// The longest repeat a match may span: up to the most recent breaker (the longest
    /// breaker sequence found there), or `None` when that is below the allowed length.
    fn repeat_limit(&self, n: usize) -> Option<usize> {
        let mut limit = n;
        for i in 0..n {
            let Some(tails) = self.breakers.heads.get(&self.back(i)) else {
                continue;
            };
            let longest = tails
                .iter()
                .filter(|tail| {
                    tail.len() <= i
                        && tail
                            .iter()
                            .enumerate()
                            .all(|(k, &t)| t == self.back(i - k - 1))
                })
                .map(Vec::len)
                .max();
            if let Some(len) = longest {
                limit = i - len;
                break;
            }
        }
        (limit >= self.allowed_length).then_some(limit)
    }

    /// For each position of the window, the length of the longest suffix of the window that
    /// also ends there (capped at `limit`), by the Z-algorithm run backwards: linear in `n`.
    /// `repeat_count[n - 1 - k]` holds the match of the suffix against the window shifted by `k`.
    fn repeat_lengths(&mut self, n: usize, limit: usize) {
        self.repeat_count.clear();
        self.repeat_count.resize(n, 0);
        let last = n - 1;
        let (mut lt, mut rt) = (0usize, 0usize);
        for k in 1..n {
            if k > rt {
                let mut len = 0;
                while len + k < n && self.back(len) == self.back(len + k) {
                    len += 1;
                }
                self.repeat_count[last - k] = len.min(limit);
                if len > 0 {
                    lt = k;
                    rt = k + len - 1;
                }
            } else {
                let pair = self.repeat_count[last - (k - lt)];
                let right = rt - k + 1;
                if pair < right {
                    self.repeat_count[last - k] = pair.min(limit);
                } else {
                    let mut i = rt + 1;
                    while i < n && self.back(i) == self.back(i - k) {
                        i += 1;
                    }
                    self.repeat_count[last - k] = (i - k).min(limit);
                    lt = k;
                    rt = i - 1;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dry(breakers: DryBreakers, history: &[u32]) -> Dry {
        let mut d = Dry::new(1.0, 2.0, 2, 64, Arc::new(breakers)).unwrap();
        for &t in history {
            d.accept(t);
        }
        d
    }

    fn penalties(d: &mut Dry, n: usize) -> Vec<f32> {
        let mut c = Candidates::default();
        c.fill(&vec![0.0; n]);
        d.apply(&mut c);
        c.data.iter().map(|t| -t.logit).collect()
    }

    #[test]
    fn a_token_extending_a_repeat_is_penalized_by_its_length() {
        // a b c x a b c: `x` would extend "a b c" (length 3): 1 · 2^(3 − 2) = 2.
        let mut d = dry(DryBreakers::default(), &[0, 1, 2, 9, 0, 1, 2]);
        let p = penalties(&mut d, 10);
        assert_eq!(p[9], 2.0);
        assert!(p.iter().enumerate().all(|(i, &v)| i == 9 || v == 0.0));
    }

    #[test]
    fn a_breaker_in_between_limits_the_repeat() {
        // With 0 breaking on its own, the repeat "0 1 2" counts only up to it (two tokens):
        // `9` loses 1 · 2^(2 − 2) = 1, not 2.
        let mut d = dry(
            DryBreakers::from_sequences(&[vec![0]]),
            &[0, 1, 2, 9, 0, 1, 2],
        );
        assert_eq!(penalties(&mut d, 10)[9], 1.0);
    }

    #[test]
    fn breakers_come_from_token_texts() {
        let words: [&[u8]; 4] = [b"ab", b"x\n", b"q:", b"z"];
        let b = DryBreakers::new(
            4,
            |id| words[id as usize],
            |_| vec![7],
            &["\n".into(), ":z".into()],
        );
        assert_eq!(b.heads.get(&1), Some(&vec![vec![]]));
        // "q:" ends with the start of ":z": its tail is the tokenized "z".
        assert_eq!(b.heads.get(&2), Some(&vec![vec![7]]));
        assert!(!b.heads.contains_key(&0) && !b.heads.contains_key(&3));
    }
}
