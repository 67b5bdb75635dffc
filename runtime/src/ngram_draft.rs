//! Drafts from the slot's own token history, without a draft model: llama-server b11434's
//! `--spec-type ngram-simple` (common/ngram-map.cpp `common_ngram_simple_draft`). The last
//! `size_n` tokens (the sampled one last) are looked for earlier in the history, the latest
//! occurrence first (never at position 0, never the current one); the up to `size_m` tokens that
//! followed it are the draft, none when fewer than `size_n` follow. Verification keeps only what
//! the target itself samples, so drafts change the speed, never the output.

use crate::spec::DraftSource;

/// `--spec-ngram-simple-*` settings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NgramSimpleConfig {
    /// Tokens looked for (`--spec-ngram-simple-size-n`, 1 to 1024).
    pub size_n: usize,
    /// Most tokens drafted after a match (`--spec-ngram-simple-size-m`, 1 to 1024).
    pub size_m: usize,
}

impl NgramSimpleConfig {
    /// llama-server b11434's defaults (common.h `common_params_speculative_ngram_map`).
    pub const DEFAULT: NgramSimpleConfig = NgramSimpleConfig {
        size_n: 12,
        size_m: 48,
    };
}

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

#[cfg(test)]
mod tests {
    use super::{simple_draft, NgramSimpleConfig};

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
