//! Saved slot states in host RAM (`--cache-ram`). Before a slot's cache is overwritten by an
//! unrelated request, its tokens and state buffers are copied here; a later request on any slot
//! restores the longest prefix it shares with a saved state. Entries are evicted least recently
//! used first; a state larger than the whole budget is not kept. A state whose tokens begin
//! another saved state's adds nothing and is not kept; one that extends a saved state replaces it.
//! A decision's state keeps the final-norm rows of its positions too (its head reads every row):
//! a later decision restores only a prefix whose rows are kept.

use bloomery_exec::Rewind;

/// The per-sequence (convolution and recurrent) state of a slot at `n` positions (what
/// [`crate::model::LoadedModel::read_checkpoint`] gives): with the positional state of any later
/// point of the same tokens it restores position `n` of a hybrid model, whose recurrent state
/// cannot be rewound.
#[derive(Clone, Debug)]
pub struct Checkpoint {
    /// Positions evaluated when it was taken.
    pub n: usize,
    /// One byte string per per-sequence state buffer.
    pub parts: Vec<Vec<u8>>,
}

impl Checkpoint {
    /// Host bytes it occupies.
    pub fn bytes(&self) -> usize {
        self.parts.iter().map(Vec::len).sum()
    }
}

/// A slot's tokens and its state buffers for exactly those positions (what
/// [`crate::model::LoadedModel::read_slot`] gives), with the checkpoints taken on the way.
#[derive(Debug)]
pub struct SavedState {
    /// The tokens whose state is held.
    pub tokens: Vec<u32>,
    /// One byte string per state buffer.
    pub parts: Vec<Vec<u8>>,
    /// Checkpoints at fewer positions than `tokens` (hybrid models only).
    pub checkpoints: Vec<Checkpoint>,
    /// The final-norm rows of the first [`SavedState::hidden_rows`] positions, `n_embd` values
    /// each (kept by decisions; empty otherwise).
    pub hidden: Vec<f32>,
    /// Positions whose final-norm rows `hidden` holds.
    pub hidden_rows: usize,
}

impl SavedState {
    /// How many of its first `shared` positions `rule` restores, and from which checkpoint.
    pub fn reach(&self, rule: Rewind, shared: usize) -> (usize, Option<usize>) {
        rule.reach(
            self.tokens.len(),
            self.checkpoints.iter().map(|c| c.n),
            shared,
        )
    }

    /// Host bytes the state occupies (parts, checkpoints, rows and tokens).
    pub fn bytes(&self) -> u64 {
        let parts: usize = self.parts.iter().map(Vec::len).sum();
        let checkpoints: usize = self.checkpoints.iter().map(Checkpoint::bytes).sum();
        (parts + checkpoints + self.hidden.len() * 4 + self.tokens.len() * 4) as u64
    }
}

/// What [`PromptCache::insert`] did.
#[derive(Debug, PartialEq, Eq)]
pub enum Inserted {
    /// Kept; this many older entries were evicted to make room, this many replaced because
    /// the new state extends them.
    Stored {
        /// Entries evicted for room.
        evicted: usize,
        /// Entries whose tokens begin the new state's.
        replaced: usize,
    },
    /// An entry already holds these tokens or a longer state beginning with them.
    Covered,
    /// Larger than the whole budget.
    TooLarge,
}

struct Entry {
    state: SavedState,
    bytes: u64,
    last_used: u64,
}

/// The cache: entries and the bytes they hold, within a budget.
pub struct PromptCache {
    rule: Rewind,
    budget: u64,
    used: u64,
    clock: u64,
    entries: Vec<Entry>,
}

/// Length of the common prefix of two token lists.
pub fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

impl PromptCache {
    /// An empty cache holding at most `budget` bytes.
    /// An empty cache of `budget` bytes for a model whose states restore by `rule`.
    pub fn new(budget: u64, rule: Rewind) -> Self {
        PromptCache {
            rule,
            budget,
            used: 0,
            clock: 0,
            entries: Vec::new(),
        }
    }

    /// Bytes held.
    pub fn bytes(&self) -> u64 {
        self.used
    }

    /// Entries held.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether the cache holds nothing.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Whether an entry holds `tokens` or a longer state beginning with them that restores to
    /// exactly them, with the final-norm rows of at least `hidden_rows` positions.
    pub fn covers(&self, tokens: &[u32], hidden_rows: usize) -> bool {
        let n = tokens.len();
        self.entries.iter().any(|e| {
            e.state.tokens.starts_with(tokens)
                && e.state.reach(self.rule, n).0 == n
                && e.state.hidden_rows >= hidden_rows
        })
    }

    /// Keeps `state`, evicting least recently used entries until it fits.
    pub fn insert(&mut self, state: SavedState) -> Inserted {
        if self.covers(&state.tokens, state.hidden_rows) {
            return Inserted::Covered;
        }
        let bytes = state.bytes();
        if bytes > self.budget {
            return Inserted::TooLarge;
        }
        let before = self.entries.len();
        let rule = self.rule;
        self.entries.retain(|e| {
            let n = e.state.tokens.len();
            !(state.tokens.starts_with(&e.state.tokens)
                && state.reach(rule, n).0 == n
                && state.hidden_rows >= e.state.hidden_rows)
        });
        let replaced = before - self.entries.len();
        self.used = self.entries.iter().map(|e| e.bytes).sum();
        let mut evicted = 0;
        while self.used + bytes > self.budget {
            let Some(lru) = (0..self.entries.len()).min_by_key(|&i| self.entries[i].last_used)
            else {
                break;
            };
            self.used -= self.entries.swap_remove(lru).bytes;
            evicted += 1;
        }
        self.clock += 1;
        self.used += bytes;
        self.entries.push(Entry {
            state,
            bytes,
            last_used: self.clock,
        });
        Inserted::Stored { evicted, replaced }
    }

    /// The entry to restore for `prompt`: its index and the number of positions to restore,
    /// the longest over all entries (from the state itself or one of its checkpoints); `limit`
    /// caps the prefix (the prompt's last token is always evaluated). With `rows`, only
    /// positions whose final-norm rows the entry keeps count (a decision reads every row).
    pub fn best(&self, prompt: &[u32], limit: usize, rows: bool) -> Option<(usize, usize)> {
        self.entries
            .iter()
            .enumerate()
            .map(|(i, e)| {
                let mut shared = common_prefix(&e.state.tokens, prompt).min(limit);
                if rows {
                    shared = shared.min(e.state.hidden_rows);
                }
                (i, e.state.reach(self.rule, shared).0)
            })
            .filter(|&(_, n)| n > 0)
            .max_by_key(|&(i, n)| (n, self.entries[i].last_used))
    }

    /// Entry `i` (from [`PromptCache::best`]), marked as just used.
    pub fn touch(&mut self, i: usize) -> &SavedState {
        self.clock += 1;
        let e = &mut self.entries[i];
        e.last_used = self.clock;
        &e.state
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const POSITIONAL: Rewind = Rewind {
        per_sequence: false,
    };
    const HYBRID: Rewind = Rewind { per_sequence: true };

    fn state(tokens: &[u32], bytes_per_token: usize) -> SavedState {
        SavedState {
            tokens: tokens.to_vec(),
            parts: vec![vec![7u8; tokens.len() * bytes_per_token]],
            checkpoints: Vec::new(),
            hidden: Vec::new(),
            hidden_rows: 0,
        }
    }

    fn with_checkpoints(mut s: SavedState, at: &[usize]) -> SavedState {
        s.checkpoints = at
            .iter()
            .map(|&n| Checkpoint {
                n,
                parts: vec![vec![1u8; 16]],
            })
            .collect();
        s
    }

    #[test]
    fn finds_the_longest_shared_prefix() {
        let mut c = PromptCache::new(1 << 20, POSITIONAL);
        c.insert(state(&[1, 2, 3, 4], 8));
        c.insert(state(&[1, 2, 9, 9, 9], 8));
        c.insert(state(&[5, 6], 8));
        assert_eq!(c.best(&[1, 2, 3, 4, 5, 6], 100, false), Some((0, 4)));
        assert_eq!(c.best(&[1, 2, 9, 9, 7], 100, false), Some((1, 4)));
        assert_eq!(c.best(&[1, 2, 9, 9, 7], 3, false), Some((1, 3)));
        assert_eq!(c.best(&[8], 100, false), None);
    }

    #[test]
    fn a_hybrid_restores_whole_states_or_checkpoints() {
        let mut c = PromptCache::new(1 << 20, HYBRID);
        c.insert(with_checkpoints(state(&[1, 2, 3, 4, 5, 6], 8), &[2, 4]));
        // The whole state, when the prompt continues it.
        assert_eq!(c.best(&[1, 2, 3, 4, 5, 6, 7], 100, false), Some((0, 6)));
        // The latest checkpoint within the shared prefix otherwise.
        assert_eq!(c.best(&[1, 2, 3, 4, 5, 9], 100, false), Some((0, 4)));
        assert_eq!(c.best(&[1, 2, 3, 9], 100, false), Some((0, 2)));
        assert_eq!(c.best(&[1, 9], 100, false), None);
        assert_eq!(
            c.entries[0].state.reach(HYBRID, 5),
            (4, Some(1)),
            "names the checkpoint it restores from"
        );
        // A shorter state of the same tokens is covered only where a checkpoint stands.
        assert_eq!(c.insert(state(&[1, 2, 3, 4], 8)), Inserted::Covered);
        assert!(matches!(
            c.insert(state(&[1, 2, 3], 8)),
            Inserted::Stored { replaced: 0, .. }
        ));
        // And a longer one replaces a saved state only when it can restore all of it.
        assert!(matches!(
            c.insert(state(&[1, 2, 3, 4, 5, 6, 7], 8)),
            Inserted::Stored { replaced: 0, .. }
        ));
        assert_eq!(c.len(), 3);
    }

    #[test]
    fn checkpoints_count_in_the_budget() {
        let plain = state(&[1, 2, 3], 8);
        let with = with_checkpoints(state(&[1, 2, 3], 8), &[1, 2]);
        assert_eq!(with.bytes(), plain.bytes() + 32);
    }

    #[test]
    fn evicts_least_recently_used_within_the_budget() {
        // Each state: 4 tokens × (8 + 4) bytes = 48 bytes; room for two.
        let mut c = PromptCache::new(100, POSITIONAL);
        let s = |t: u32| state(&[t, t, t, t], 8);
        assert_eq!(
            c.insert(s(1)),
            Inserted::Stored {
                evicted: 0,
                replaced: 0
            }
        );
        c.insert(s(2));
        assert_eq!(c.bytes(), 96);
        // Using 1 makes 2 the least recently used.
        let (i, _) = c.best(&[1, 1, 1, 1, 0], 100, false).unwrap();
        c.touch(i);
        assert_eq!(
            c.insert(s(3)),
            Inserted::Stored {
                evicted: 1,
                replaced: 0
            }
        );
        assert_eq!(c.len(), 2);
        assert_eq!(c.bytes(), 96);
        assert!(c.best(&[2, 2], 100, false).is_none());
        assert!(c.best(&[1, 1], 100, false).is_some());
        assert!(c.best(&[3, 3], 100, false).is_some());
        assert_eq!(c.insert(state(&[4; 10], 8)), Inserted::TooLarge);
        assert_eq!(c.len(), 2);
    }

    #[test]
    fn keeps_one_entry_per_conversation() {
        let mut c = PromptCache::new(1 << 20, POSITIONAL);
        c.insert(state(&[1, 2, 3], 8));
        // A longer state of the same conversation replaces the shorter one.
        assert_eq!(
            c.insert(state(&[1, 2, 3, 4, 5], 8)),
            Inserted::Stored {
                evicted: 0,
                replaced: 1
            }
        );
        assert_eq!(c.len(), 1);
        assert_eq!(c.bytes(), 5 * 12);
        // Its own prefix adds nothing.
        assert_eq!(c.insert(state(&[1, 2], 8)), Inserted::Covered);
        assert_eq!(c.len(), 1);
    }

    #[test]
    fn a_decision_restores_only_positions_whose_rows_are_kept() {
        let mut c = PromptCache::new(1 << 20, POSITIONAL);
        let mut s = state(&[1, 2, 3, 4, 5, 6], 8);
        s.hidden = vec![0.5; 4 * 2];
        s.hidden_rows = 4;
        assert!(matches!(c.insert(s), Inserted::Stored { .. }));
        // A generation restores every shared position; a decision only those with rows.
        assert_eq!(c.best(&[1, 2, 3, 4, 5, 9], 100, false), Some((0, 5)));
        assert_eq!(c.best(&[1, 2, 3, 4, 5, 9], 100, true), Some((0, 4)));
        // The same tokens with more rows are not covered by the entry; with fewer they are.
        assert!(!c.covers(&[1, 2, 3, 4, 5, 6], 6));
        assert!(c.covers(&[1, 2, 3, 4, 5, 6], 4));
        let mut more = state(&[1, 2, 3, 4, 5, 6], 8);
        more.hidden = vec![0.5; 6 * 2];
        more.hidden_rows = 6;
        assert!(matches!(
            c.insert(more),
            Inserted::Stored { replaced: 1, .. }
        ));
        assert_eq!(c.best(&[1, 2, 3, 4, 5, 9], 100, true), Some((0, 5)));
    }
}
