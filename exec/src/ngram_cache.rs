//! A bounded cache of n-gram table rows read from disk, least recently used out: text repeats
//! its n-grams (and a prompt's rows are read again by the prompt cache's reruns), so a row read
//! once is often read again, which from disk costs a whole `O_DIRECT` page.

use std::collections::{BTreeMap, HashMap};

/// A row: table index and row.
pub type RowKey = (usize, u64);

/// Raw row bytes by (table, row), at most `cap` bytes of them.
pub struct RowCache {
    cap: usize,
    used: usize,
    tick: u64,
    rows: HashMap<RowKey, (Vec<u8>, u64)>,
    /// Rows by the tick they were last used at: the first is the next out.
    order: BTreeMap<u64, RowKey>,
}

impl RowCache {
    /// An empty cache of at most `cap` bytes of rows.
    pub fn new(cap: usize) -> RowCache {
        RowCache {
            cap,
            used: 0,
            tick: 0,
            rows: HashMap::new(),
            order: BTreeMap::new(),
        }
    }

    /// The bytes of `key`, now the most recently used, when held.
    pub fn get(&mut self, key: RowKey) -> Option<&[u8]> {
        let tick = self.next_tick();
        let (bytes, last) = self.rows.get_mut(&key)?;
        self.order.remove(last);
        *last = tick;
        self.order.insert(tick, key);
        Some(bytes)
    }

    /// Holds `bytes` as row `key`, dropping the least recently used rows to make room (a row
    /// larger than the whole cache is not held).
    pub fn put(&mut self, key: RowKey, bytes: &[u8]) {
        if bytes.len() > self.cap || self.rows.contains_key(&key) {
            return;
        }
        while self.used + bytes.len() > self.cap {
            let Some((_, old)) = self.order.pop_first() else {
                break;
            };
            if let Some((b, _)) = self.rows.remove(&old) {
                self.used -= b.len();
            }
        }
        let tick = self.next_tick();
        self.used += bytes.len();
        self.rows.insert(key, (bytes.to_vec(), tick));
        self.order.insert(tick, key);
    }

    fn next_tick(&mut self) -> u64 {
        self.tick += 1;
        self.tick
    }
}

#[cfg(test)]
mod tests {
    use super::RowCache;

    #[test]
    fn the_least_recently_used_row_goes_first() {
        let mut c = RowCache::new(3 * 4);
        for r in 0..3u64 {
            c.put((0, r), &[r as u8; 4]);
        }
        // Row 0 used again: row 1 is now the oldest, and goes for row 3.
        assert_eq!(c.get((0, 0)), Some(&[0u8; 4][..]));
        c.put((0, 3), &[3; 4]);
        assert_eq!(c.get((0, 1)), None);
        assert_eq!(c.get((0, 2)), Some(&[2u8; 4][..]));
        assert_eq!(c.get((0, 3)), Some(&[3u8; 4][..]));
        assert_eq!(c.get((0, 0)), Some(&[0u8; 4][..]));
        assert_eq!(c.used, 12);
        // The same row of another table is another row; a row over the whole cache is not held.
        assert_eq!(c.get((1, 0)), None);
        c.put((1, 9), &[9; 13]);
        assert_eq!(c.get((1, 9)), None);
        assert_eq!(c.used, 12);
    }
}
