//! Drafts from token history, without a draft model, as llama-server b11434's n-gram types.
//! Verification keeps only what the target itself samples, so drafts change the speed, never
//! the output.
//!
//! - `ngram-simple` (common/ngram-map.cpp `common_ngram_simple_draft`): the last `size_n` tokens
//!   (the sampled one last) are looked for earlier in the slot's history, the latest occurrence
//!   first (never at position 0, never the current one); the up to `size_m` tokens that followed
//!   it are the draft, none when fewer than `size_n` follow.
//! - `ngram-mod` (common/ngram-mod.cpp and its driver in common/speculative.cpp): one table of
//!   4 Mi entries shared by every slot maps a hash of `n_match` tokens to the token that followed
//!   them last; a slot's prompt is added when its generation begins and its history in chunks of
//!   more than 32 new tokens; a draft chains lookups from the last `n_match` tokens up to `n_max`
//!   tokens, none when a lookup misses before `n_min`; the table is cleared when a new prompt
//!   leaves it more than a quarter full, and after five drafts in a row of one slot (across its
//!   generations) kept less than a quarter.

use crate::spec::DraftSource;
pub use crate::spec::{NgramModConfig, NgramSimpleConfig};

/// The `ngram-simple` drafter: stateless, the same for every slot.
pub struct NgramSimple {
    cfg: NgramSimpleConfig,
}

impl NgramSimple {
    /// A drafter with these settings.
    pub fn new(cfg: NgramSimpleConfig) -> NgramSimple {
        NgramSimple { cfg }
    }
}

impl DraftSource for NgramSimple {
    fn draft(&mut self, _id_slot: usize, tokens: &[u32], max: usize) -> Vec<u32> {
        let Some((&sampled, history)) = tokens.split_last() else {
            return Vec::new();
        };
        let mut d = simple_draft(history, sampled, self.cfg);
        d.truncate(max);
        d
    }
}

/// The draft that follows `history` and the token just `sampled` after it (empty: no match).
pub fn simple_draft(history: &[u32], sampled: u32, cfg: NgramSimpleConfig) -> Vec<u32> {
    let (n, m, len) = (cfg.size_n, cfg.size_m, history.len());
    if n == 0 || len <= n + m + 1 {
        return Vec::new();
    }
    // The pattern: the history's last n - 1 tokens, then the sampled one.
    let tail = &history[len - (n - 1)..];
    let matches = |j: usize| history[j..j + n - 1] == *tail && history[j + n - 1] == sampled;
    // Latest start first, from len - n - 1 down to 1: the reference looks no later (the
    // pattern's own place) and takes position 0 for "no match".
    let Some(at) = (1..len - n).rev().find(|&j| matches(j)) else {
        return Vec::new();
    };
    let copy = m.min(len - (at + n));
    if copy < n {
        return Vec::new();
    }
    history[at + n..at + n + copy].to_vec()
}

/// Entries of the `ngram-mod` table (b11434's size: 16 MiB of token ids).
const MOD_ENTRIES: usize = 4 * 1024 * 1024;
/// An entry no n-gram has written.
const MOD_EMPTY: i32 = -1;
/// New history positions a slot gathers before they are added to the table.
const MOD_CHUNK: usize = 32;

/// The `ngram-mod` drafter: the shared table and each slot's place in its history.
pub struct NgramMod {
    cfg: NgramModConfig,
    table: Vec<i32>,
    used: usize,
    slots: Vec<ModSlot>,
}

/// A slot's `ngram-mod` bookkeeping.
#[derive(Clone, Copy, Default)]
struct ModSlot {
    /// History positions before this one have been added to the table.
    added: usize,
    /// Length of the slot's last draft (0: none).
    last_draft: usize,
    /// Drafts in a row that kept less than a quarter of their tokens.
    low: u32,
}

impl NgramMod {
    /// A drafter for `n_slots` slots with an empty table.
    pub fn new(cfg: NgramModConfig, n_slots: usize) -> NgramMod {
        NgramMod {
            cfg,
            table: vec![MOD_EMPTY; MOD_ENTRIES],
            used: 0,
            slots: vec![ModSlot::default(); n_slots],
        }
    }

    /// The table entry of the `n_match` tokens `key`: b11434's multiplicative hash (wrapping
    /// 64-bit arithmetic) modulo the table's size.
    fn entry(&self, key: &[u32]) -> usize {
        let h = key.iter().fold(0u64, |h, &t| {
            h.wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(u64::from(t))
        });
        (h % MOD_ENTRIES as u64) as usize
    }

    /// Records that the `n_match` tokens starting at `at` of `tokens` were followed by the next.
    fn add(&mut self, tokens: &[u32], at: usize) {
        let n = self.cfg.n_match;
        let e = self.entry(&tokens[at..at + n]);
        if self.table[e] == MOD_EMPTY {
            self.used += 1;
        }
        self.table[e] = tokens[at + n] as i32;
    }

    fn clear(&mut self) {
        self.table.fill(MOD_EMPTY);
        self.used = 0;
    }

    fn slot(&mut self, id: usize) -> &mut ModSlot {
        if id >= self.slots.len() {
            self.slots.resize(id + 1, ModSlot::default());
        }
        &mut self.slots[id]
    }
}

impl DraftSource for NgramMod {
    fn begin(&mut self, id_slot: usize, prompt: &[u32]) {
        let n = self.cfg.n_match;
        // The streak of poorly kept drafts runs on across the slot's generations, as b11434's
        // `n_low` does (its `begin` resets only the history place and the last draft's length).
        let s = self.slot(id_slot);
        *s = ModSlot {
            low: s.low,
            ..ModSlot::default()
        };
        if prompt.len() < n {
            return;
        }
        for at in 0..prompt.len() - n {
            self.add(prompt, at);
        }
        self.slot(id_slot).added = prompt.len() - n;
        if self.used as f64 / MOD_ENTRIES as f64 > 0.25 {
            tracing::warn!("ngram-mod: the table is more than a quarter full: cleared");
            self.clear();
        }
    }

    fn draft(&mut self, id_slot: usize, tokens: &[u32], max: usize) -> Vec<u32> {
        let NgramModConfig {
            n_match: n,
            n_max,
            n_min,
        } = self.cfg;
        self.slot(id_slot).last_draft = 0;
        let Some((&sampled, history)) = tokens.split_last() else {
            return Vec::new();
        };
        let len = history.len();
        if len < n {
            return Vec::new();
        }
        let from = self.slot(id_slot).added;
        if from + MOD_CHUNK < len {
            for at in from..len - n {
                self.add(history, at);
            }
            self.slot(id_slot).added = len - n;
        }
        // The chain: the last n_match tokens (the sampled one last), then each looked-up token.
        let mut chain: Vec<u32> = history[len + 1 - n..].to_vec();
        chain.push(sampled);
        for i in 0..n_max {
            let next = self.table[self.entry(&chain[i..i + n])];
            if next == MOD_EMPTY {
                if i < n_min {
                    return Vec::new();
                }
                break;
            }
            chain.push(next as u32);
        }
        let mut draft = chain.split_off(n);
        self.slot(id_slot).last_draft = draft.len();
        draft.truncate(max);
        draft
    }

    fn accepted(&mut self, id_slot: usize, accepted: usize) {
        let s = self.slot(id_slot);
        if s.last_draft == 0 {
            return;
        }
        if (accepted as f64) / (s.last_draft as f64) < 0.25 {
            s.low += 1;
            if s.low >= 5 {
                s.low = 0;
                s.added = 0;
                self.clear();
            }
        } else {
            s.low = 0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{simple_draft, DraftSource, NgramMod, NgramModConfig, NgramSimpleConfig};

    /// b11434's `n_low` runs on across a slot's generations (its `begin` leaves it): four
    /// poorly kept drafts, a new generation, a fifth, and the table is cleared. Shown failing
    /// with the streak reset when a generation begins (the combined types' anchor found it).
    #[test]
    fn the_ngram_mod_streak_of_poor_drafts_runs_across_generations() {
        let cfg = NgramModConfig {
            n_match: 1,
            n_max: 2,
            n_min: 1,
        };
        let mut m = NgramMod::new(cfg, 1);
        let prompt = [1, 2, 3, 1, 2, 3, 1];
        m.begin(0, &prompt);
        let draft = |m: &mut NgramMod| m.draft(0, &[1, 2, 3, 1, 2, 3, 1, 2], 8);
        for _ in 0..4 {
            assert_eq!(draft(&mut m), [3, 1]);
            m.accepted(0, 0);
        }
        m.begin(0, &[7, 8]);
        assert_eq!(draft(&mut m), [3, 1]);
        m.accepted(0, 0);
        assert!(draft(&mut m).is_empty(), "the table was not cleared");
    }

    fn cfg(size_n: usize, size_m: usize) -> NgramSimpleConfig {
        NgramSimpleConfig { size_n, size_m }
    }

    #[test]
    fn the_tokens_after_the_latest_earlier_match_are_drafted() {
        // "1 2 3 4 5 6 7 8 | 9 9 9 1 2 3 4 5 6 7 8 9 9 | 1 2" + sampled 3: the pattern "2 3"
        // occurs at 1 (and 12); 12 is the latest with tokens after it.
        let h = [
            1, 2, 3, 4, 5, 6, 7, 8, 9, 9, 9, 1, 2, 3, 4, 5, 6, 7, 8, 9, 9, 1, 2,
        ];
        assert_eq!(simple_draft(&h, 3, cfg(2, 4)), vec![4, 5, 6, 7]);
        // A longer m-gram stops at the history's end; a history no longer than
        // size_n + size_m + 1 drafts nothing.
        assert_eq!(
            simple_draft(&h, 3, cfg(2, 10)),
            vec![4, 5, 6, 7, 8, 9, 9, 1, 2]
        );
        assert!(simple_draft(&h, 3, cfg(2, 20)).is_empty());
    }

    #[test]
    fn no_draft_without_a_match_or_history() {
        let h: Vec<u32> = (0..40).collect();
        assert!(simple_draft(&h, 7, cfg(3, 4)).is_empty());
        assert!(simple_draft(&[1, 2, 3], 1, cfg(1, 2)).is_empty());
    }
}
