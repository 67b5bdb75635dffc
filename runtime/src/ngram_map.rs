//! The `ngram-map-k` and `ngram-map-k4v` drafters of llama-server b11434 (common/ngram-map.cpp
//! `common_ngram_map_*`, driven per slot by common/speculative.cpp), from token history without
//! a draft model. Each slot keeps a map of its own:
//!
//! - the key: the last `size_n` tokens, the sampled one last. It is looked up first in a table of
//!   2^18 entries from a hash of `size_n` tokens to the first position seen with that hash
//!   (collisions checked against the history), then searched backwards through the prompt and
//!   then the generated part; positions whose following `size_m` tokens are not yet all known
//!   are left out, and position 0 means none. Every position searched enters the table.
//! - each matched key keeps how often it occurred and up to four value m-grams (the `size_m`
//!   tokens after an occurrence) with how often each followed it, and, per value, how many
//!   tokens of its last draft the target kept (`size_m` at first).
//! - `ngram-map-k` (keys only) drafts the `size_m` tokens after the match, at most as many as
//!   the target kept of the key's last draft. `ngram-map-k4v` drafts once the key has been seen
//!   `min_hits` times and its most frequent value occurred at least twice as often as the
//!   others together, the tokens after the match, at most as many as that value's last draft
//!   kept.
//!
//! A new generation whose history is shorter than the map's last look (a chat whose earlier
//! reasoning was dropped) forgets every key and table entry at or past its prompt's shared part.

use crate::spec::DraftSource;
pub use crate::spec::NgramMapConfig;

/// Entries of the hash table (b11434's `COMMON_NGRAM_HASH_MAP_SIZE`).
const HASH_ENTRIES: usize = 1 << 18;
/// Values kept per key (`COMMON_NGRAM_MAX_VALUES`).
const VALUES: usize = 4;
/// The most a count goes to (`COMMON_NGRAM_MAX_VALUE_COUNT`).
const MAX_COUNT: u16 = 16_380;
/// The multiplier of the n-gram hash (an LCG's, near 2^32 (√5 − 1)/2).
const HASH_FACTOR: u32 = 2_654_435_761;

/// A value m-gram after a key.
#[derive(Clone, Copy, Debug)]
struct Value {
    /// Where it begins in the history (0: unused).
    at: usize,
    /// Times it followed the key.
    count: u16,
    /// Tokens the target kept of the last draft made from it.
    kept: i32,
}

/// A key n-gram seen more than once.
#[derive(Clone, Debug)]
struct Key {
    /// Where it occurs in the history.
    at: usize,
    /// Values are counted up to here.
    counted_to: usize,
    /// Times it was matched.
    count: u16,
    values: [Value; VALUES],
}

/// One slot's map.
struct SlotMap {
    keys: Vec<Key>,
    /// Hash of `size_n` tokens → the first position seen with it (0: none).
    table: Vec<u32>,
    /// Positions after this one have not entered the table.
    table_last: u32,
    /// The history's length when the slot's generation began.
    begin: usize,
    /// The history's length at the last look.
    last_check: usize,
    /// The key and value of the last draft, when it made one.
    last_draft: Option<(usize, usize)>,
}

impl SlotMap {
    fn new() -> SlotMap {
        SlotMap {
            keys: Vec::new(),
            table: vec![0; HASH_ENTRIES],
            table_last: 0,
            begin: 0,
            last_check: 0,
            last_draft: None,
        }
    }
}

/// The hash of `tokens` (wrapping 32-bit LCG steps).
fn hash(tokens: &[u32]) -> usize {
    let h = tokens
        .iter()
        .fold(0u32, |h, &t| h.wrapping_mul(HASH_FACTOR).wrapping_add(t));
    h as usize % HASH_ENTRIES
}

/// The `ngram-map-k` (`keys_only`) or `ngram-map-k4v` drafter, a map per slot.
pub struct NgramMap {
    cfg: NgramMapConfig,
    keys_only: bool,
    slots: Vec<SlotMap>,
}

impl NgramMap {
    /// A drafter with these settings for `n_slots` slots; `keys_only` for `ngram-map-k`.
    pub fn new(cfg: NgramMapConfig, keys_only: bool, n_slots: usize) -> NgramMap {
        NgramMap {
            cfg,
            keys_only,
            slots: (0..n_slots).map(|_| SlotMap::new()).collect(),
        }
    }

    fn slot(&mut self, id: usize) -> &mut SlotMap {
        if id >= self.slots.len() {
            self.slots.resize_with(id + 1, SlotMap::new);
        }
        &mut self.slots[id]
    }

    /// The draft after `inp` and the token just `sampled`, updating the slot's map.
    fn draft_from(&mut self, id: usize, inp: &[u32], sampled: u32) -> Vec<u32> {
        let (n, m) = (self.cfg.size_n, self.cfg.size_m);
        let (keys_only, min_hits) = (self.keys_only, self.cfg.min_hits);
        let map = self.slot(id);
        map.last_draft = None;
        let len = inp.len();
        if len < 2 * n + m || map.begin > len {
            return Vec::new();
        }
        map.last_check = len;
        let mut key: Vec<u32> = inp[len + 1 - n..].to_vec();
        key.push(sampled);
        let is_key = |at: usize| inp[at..at + n] == key[..];
        // The latest position whose `m` following tokens are all known.
        let last = len - n - m - 1;
        let table_last = map.table_last as usize;
        let mut at = match map.table[hash(&key)] as usize {
            i if i != 0 && i < last && is_key(i) => i,
            _ => 0,
        };
        if at == 0 && map.begin > n + m + 1 {
            at = (table_last + 1..=map.begin - n - m - 1)
                .rev()
                .find(|&j| is_key(j))
                .unwrap_or(0);
        }
        if at == 0 {
            let floor = map.begin.max(table_last) + 1;
            at = (floor..=last).rev().find(|&j| is_key(j)).unwrap_or(0);
        }
        // Every position searched enters the table (the first seen with a hash keeps it).
        let mut enter = |j: usize| {
            let e = &mut map.table[hash(&inp[j..j + n])];
            if *e == 0 {
                *e = j as u32;
            }
        };
        if map.begin > n + m + 1 {
            (table_last + 1..=map.begin - n - m - 1)
                .rev()
                .for_each(&mut enter);
        }
        (map.begin.max(table_last) + 1..=last)
            .rev()
            .for_each(&mut enter);
        map.table_last = map.table_last.max(last as u32);
        if at == 0 {
            return Vec::new();
        }
        let found = map.keys.iter().position(|k| inp[k.at..k.at + n] == key[..]);
        let k = found.unwrap_or_else(|| {
            let unused = Value {
                at: 0,
                count: 0,
                kept: m as i32,
            };
            map.keys.push(Key {
                at,
                counted_to: 0,
                count: 0,
                values: [unused; VALUES],
            });
            map.keys.len() - 1
        });
        let entry = &mut map.keys[k];
        entry.count = (entry.count + 1).min(MAX_COUNT);
        let after = |kept: i32| -> Vec<u32> {
            let n_draft = (m as i32).min(kept).max(0) as usize;
            inp[at + n..at + n + n_draft].to_vec()
        };
        if keys_only {
            map.last_draft = Some((k, 0));
            return after(entry.values[0].kept);
        }
        if entry.count < min_hits {
            return Vec::new();
        }
        // Count the values after every occurrence of the key up to this match.
        for i in entry.counted_to..=at {
            if !is_key(i) {
                continue;
            }
            let v_at = i + n;
            let mut slot = None;
            for (v, value) in entry.values.iter_mut().enumerate() {
                if value.at == 0 {
                    *value = Value {
                        at: v_at,
                        count: 0,
                        kept: m as i32,
                    };
                    slot = Some(v);
                    break;
                }
                if inp[v_at..v_at + m] == inp[value.at..value.at + m] {
                    slot = Some(v);
                    break;
                }
            }
            if let Some(v) = slot {
                let c = &mut entry.values[v].count;
                *c = (*c + 1).min(MAX_COUNT);
            }
        }
        entry.counted_to = at;
        let (mut best, mut best_count) = (0, 0);
        for (v, value) in entry.values.iter().enumerate() {
            if value.count > best_count {
                (best, best_count) = (v, value.count);
            }
        }
        let others: u32 = (entry.values.iter().enumerate())
            .filter(|&(v, _)| v != best)
            .map(|(_, value)| u32::from(value.count))
            .sum();
        if others > 0 && u32::from(best_count) < 2 * others {
            return Vec::new();
        }
        let kept = entry.values[best].kept;
        map.last_draft = Some((k, best));
        after(kept)
    }
}

impl DraftSource for NgramMap {
    fn begin(&mut self, id_slot: usize, prompt: &[u32]) {
        let (n, m) = (self.cfg.size_n, self.cfg.size_m);
        let keys_only = self.keys_only;
        let map = self.slot(id_slot);
        let size = prompt.len();
        let mut cut = map.begin;
        if cut > size {
            cut = size.saturating_sub(n + m);
        }
        if size < map.last_check {
            for e in map.table.iter_mut() {
                if *e != 0 && *e as usize >= cut {
                    *e = 0;
                }
            }
            map.table_last = cut.saturating_sub(1) as u32;
            map.keys.retain_mut(|key| {
                if key.at >= cut {
                    return false;
                }
                if keys_only {
                    return true;
                }
                for j in (0..VALUES).rev() {
                    if key.values[j].at != 0 && key.values[j].at >= cut {
                        key.values.copy_within(j + 1.., j);
                        let last = &mut key.values[VALUES - 1];
                        (last.at, last.count) = (0, 0);
                    }
                }
                key.values[0].at != 0
            });
        }
        map.last_check = size;
        map.begin = size;
    }

    fn draft(&mut self, id_slot: usize, tokens: &[u32], max: usize) -> Vec<u32> {
        let Some((&sampled, history)) = tokens.split_last() else {
            return Vec::new();
        };
        let mut d = self.draft_from(id_slot, history, sampled);
        d.truncate(max);
        d
    }

    fn accepted(&mut self, id_slot: usize, accepted: usize) {
        let map = self.slot(id_slot);
        if let Some((k, v)) = map.last_draft {
            if let Some(key) = map.keys.get_mut(k) {
                key.values[v].kept = accepted.min(u16::MAX as usize) as i32;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ONE: NgramMapConfig = NgramMapConfig {
        size_n: 1,
        size_m: 1,
        min_hits: 1,
    };

    /// `prompt` begun in slot 0, then the draft after it and the token `sampled`.
    fn first_draft(d: &mut NgramMap, prompt: &[u32], sampled: u32) -> Vec<u32> {
        d.begin(0, prompt);
        let mut tokens = prompt.to_vec();
        tokens.push(sampled);
        d.draft(0, &tokens, 8)
    }

    /// ngram-map-k4v drafts only while the key's most frequent value occurred at least twice as
    /// often as its others together, and then the tokens after the match (not that value's).
    #[test]
    fn a_value_drafts_only_when_it_dominates_the_others() {
        // After 5: 1 three times, 2 twice: 3 < 2·2, no draft.
        let p = [9, 5, 1, 5, 1, 5, 1, 5, 2, 5, 2, 7];
        assert_eq!(
            first_draft(&mut NgramMap::new(ONE, false, 1), &p, 5),
            Vec::<u32>::new()
        );
        // 1 four times, 2 twice: the latest match (position 11) drafts what followed it.
        let p = [9, 5, 1, 5, 1, 5, 1, 5, 1, 5, 2, 5, 2, 7];
        assert_eq!(first_draft(&mut NgramMap::new(ONE, false, 1), &p, 5), [2]);
        // Below min_hits nothing drafts.
        let twice = NgramMapConfig { min_hits: 2, ..ONE };
        assert_eq!(
            first_draft(&mut NgramMap::new(twice, false, 1), &p, 5),
            Vec::<u32>::new()
        );
    }

    /// ngram-map-k drafts from every match, at most as many tokens as the target kept of the
    /// key's last draft.
    #[test]
    fn a_key_drafts_no_more_than_its_last_draft_kept() {
        let mut d = NgramMap::new(ONE, true, 1);
        let p = [9, 5, 1, 5, 2, 7];
        assert_eq!(first_draft(&mut d, &p, 5), [2]);
        d.accepted(0, 0);
        let tokens = [&p[..], &[5, 5]].concat();
        assert_eq!(d.draft(0, &tokens, 8), Vec::<u32>::new());
    }
}
