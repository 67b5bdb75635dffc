//! Saved slot states in host RAM (`--cache-ram`). Before a slot's cache is overwritten by an
//! unrelated request, its tokens and state buffers are copied here; a later request on any slot
//! restores the longest prefix it shares with a saved state. Entries are evicted least recently
//! used first; a state larger than the whole budget is not kept. A state whose tokens begin
//! another saved state's adds nothing and is not kept; one that extends a saved state replaces it.

/// A slot's tokens and its state buffers for exactly those positions (what
/// [`crate::model::LoadedModel::read_slot`] gives).
#[derive(Debug)]
pub struct SavedState {
    /// The tokens whose state is held.
    pub tokens: Vec<u32>,
    /// One byte string per state buffer.
    pub parts: Vec<Vec<u8>>,
}

impl SavedState {
    /// Host bytes the state occupies (parts and tokens).
    pub fn bytes(&self) -> u64 {
        let parts: usize = self.parts.iter().map(Vec::len).sum();
        (parts + self.tokens.len() * 4) as u64
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
    pub fn new(budget: u64) -> Self {
        PromptCache {
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

    /// Whether an entry holds `tokens` or a longer state beginning with them.
    pub fn covers(&self, tokens: &[u32]) -> bool {
        self.entries
            .iter()
            .any(|e| e.state.tokens.starts_with(tokens))
    }

    /// Keeps `state`, evicting least recently used entries until it fits.
    pub fn insert(&mut self, state: SavedState) -> Inserted {
        if self.covers(&state.tokens) {
            return Inserted::Covered;
        }
        let bytes = state.bytes();
        if bytes > self.budget {
            return Inserted::TooLarge;
        }
        let before = self.entries.len();
        self.entries
            .retain(|e| !state.tokens.starts_with(&e.state.tokens));
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
    /// the longest over all entries. `restorable(saved, shared)` says how many of the `shared`
    /// leading positions of a state saved for `saved` positions can be restored; `limit` caps
    /// the prefix (the prompt's last token is always evaluated).
    pub fn best(
        &self,
        prompt: &[u32],
        limit: usize,
        restorable: impl Fn(usize, usize) -> usize,
    ) -> Option<(usize, usize)> {
        self.entries
            .iter()
            .enumerate()
            .map(|(i, e)| {
                let shared = common_prefix(&e.state.tokens, prompt).min(limit);
                (i, restorable(e.state.tokens.len(), shared))
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

    fn state(tokens: &[u32], bytes_per_token: usize) -> SavedState {
        SavedState {
            tokens: tokens.to_vec(),
            parts: vec![vec![7u8; tokens.len() * bytes_per_token]],
        }
    }

    fn any(_saved: usize, shared: usize) -> usize {
        shared
    }

    #[test]
    fn finds_the_longest_shared_prefix() {
        let mut c = PromptCache::new(1 << 20);
        c.insert(state(&[1, 2, 3, 4], 8));
        c.insert(state(&[1, 2, 9, 9, 9], 8));
        c.insert(state(&[5, 6], 8));
        assert_eq!(c.best(&[1, 2, 3, 4, 5, 6], 100, any), Some((0, 4)));
        assert_eq!(c.best(&[1, 2, 9, 9, 7], 100, any), Some((1, 4)));
        assert_eq!(c.best(&[1, 2, 9, 9, 7], 3, any), Some((1, 3)));
        assert_eq!(c.best(&[8], 100, any), None);
        // A model whose state cannot be rewound restores only whole saved states.
        let whole = |saved: usize, shared: usize| if shared == saved { saved } else { 0 };
        assert_eq!(c.best(&[1, 2, 3, 4, 5, 6], 100, whole), Some((0, 4)));
        assert_eq!(c.best(&[1, 2, 3, 7], 100, whole), None);
    }

    #[test]
    fn evicts_least_recently_used_within_the_budget() {
        // Each state: 4 tokens × (8 + 4) bytes = 48 bytes; room for two.
        let mut c = PromptCache::new(100);
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
        let (i, _) = c.best(&[1, 1, 1, 1, 0], 100, any).unwrap();
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
        assert!(c.best(&[2, 2], 100, any).is_none());
        assert!(c.best(&[1, 1], 100, any).is_some());
        assert!(c.best(&[3, 3], 100, any).is_some());
        assert_eq!(c.insert(state(&[4; 10], 8)), Inserted::TooLarge);
        assert_eq!(c.len(), 2);
    }

    #[test]
    fn keeps_one_entry_per_conversation() {
        let mut c = PromptCache::new(1 << 20);
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
}
