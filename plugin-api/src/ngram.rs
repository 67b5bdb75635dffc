//! Hashed n-gram table row ids (Qwen3.8-Flash-Next's PLE table, DeepSeek-V4.1-Flash's Engram),
//! computed by the host.
//!
//! A model whose graph reads [`crate::graph::BatchInput::NgramRows`] declares an [`NgramSpec`] in
//! its [`crate::model::ModelSpec`]; the host fills that input with [`NgramSpec::row_ids`] from its
//! record of each row's sequence (llama.cpp b11434 computes the same ids on the host, in
//! `llm_graph_input_qwen4exp_ple::set_input`). The host needs the ids of the token it is about to
//! feed anyway, to fetch those table rows ahead of the pass.
//!
//! The hash: each token is first mapped through `token_map` (the Engram's compressed vocabulary;
//! an empty map hashes the ids as they are). `ctx_0` is the row's token and `ctx_j` the token `j`
//! positions back. Once a predecessor is missing (before the sequence start), or with
//! `cut_at_end` equals the end id, it and every older one read as the end id (the row's own token
//! being the end id cuts nothing). Each of the `tables` hash tables has its own constants: for
//! each n-gram size `m = 2 ..= ngram_size`, `h = XOR_{j<m} ctx_j·multipliers[t·ngram_size + j]` in
//! u64, and each of that size's heads `k = t·per_table + (m − 2)·heads_per_ngram + g` reads row
//! `h mod head_sizes[k] + head_offsets[k]` (`per_table` = `(ngram_size − 1)·heads_per_ngram`).
//! A row's ids are table after table, head after head.
//!
//! Qwen3.8's PLE: one table, `cut_at_end`, no map (llama.cpp b11434 `qwen4exp`, transformers 5.24
//! `qwen4_exp`). DeepSeek-V4.1's Engram: one table per Engram layer, the end id being the pad id
//! in the compressed vocabulary, no cut (DeepSeek's Engram reference pads only before the
//! sequence start), the map `engram.token_map` (`docs/deepseek41-plan.md`).

use abi_stable::std_types::RVec;
use abi_stable::StableAbi;

use crate::PluginError;

/// The longest n-gram a spec may name (llama.cpp b11434's `LLAMA_MAX_PLE_NGRAM`).
pub const MAX_NGRAM: u32 = 8;

/// The constants of hashed n-gram tables' row ids.
#[repr(C)]
#[derive(StableAbi, Clone, Debug, PartialEq)]
pub struct NgramSpec {
    /// Longest n-gram (at least 2): the row reads its token and `ngram_size − 1` predecessors.
    pub ngram_size: u32,
    /// Heads per n-gram size.
    pub heads_per_ngram: u32,
    /// The (mapped) id a missing or cut predecessor hashes as.
    pub end_id: u32,
    /// A predecessor equal to the end id cuts the context (Qwen3.8's PLE); without it only the
    /// sequence start does (DeepSeek-V4.1's Engram).
    pub cut_at_end: bool,
    /// Hash tables (at least 1), each with its own multipliers and heads.
    pub tables: u32,
    /// Token id → hashed id; empty: the ids as they are. A token past the map hashes as the end
    /// id (the host refuses such a token at the embedding gather of the same pass).
    pub token_map: RVec<u32>,
    /// One multiplier per table and context position, `tables·ngram_size` values.
    pub multipliers: RVec<u64>,
    /// Each head's row count (the modulus), `tables·(ngram_size − 1)·heads_per_ngram` values.
    pub head_sizes: RVec<u64>,
    /// Each head's first row in its table, as many values.
    pub head_offsets: RVec<u64>,
}

impl NgramSpec {
    /// Row ids per table and token: `(ngram_size − 1)·heads_per_ngram`.
    pub fn per_table(&self) -> usize {
        self.ngram_size.saturating_sub(1) as usize * self.heads_per_ngram as usize
    }

    /// Row ids per token: `tables·per_table`.
    pub fn n_ids(&self) -> usize {
        self.tables as usize * self.per_table()
    }

    /// Checks the counts and that every row id fits an i32 (a plugin's declaration is checked
    /// by the host before it computes with it).
    pub fn check(&self) -> Result<(), PluginError> {
        let n = self.n_ids();
        let n_mult = self.tables as usize * self.ngram_size as usize;
        if !(2..=MAX_NGRAM).contains(&self.ngram_size)
            || self.heads_per_ngram == 0
            || self.tables == 0
            || self.multipliers.len() != n_mult
            || self.head_sizes.len() != n
            || self.head_offsets.len() != n
        {
            return Err(PluginError::invalid(format!(
                "n-gram spec: {} table(s) of sizes up to {} (2 to {MAX_NGRAM}) with {} heads each \
                 need {n_mult} multipliers and {n} head sizes and offsets; it has {}, {} and {}",
                self.tables,
                self.ngram_size,
                self.heads_per_ngram,
                self.multipliers.len(),
                self.head_sizes.len(),
                self.head_offsets.len()
            )));
        }
        let fits = self
            .head_sizes
            .iter()
            .zip(&self.head_offsets)
            .all(|(&s, &o)| s > 0 && o.checked_add(s).is_some_and(|e| e <= i32::MAX as u64 + 1));
        if !fits {
            return Err(PluginError::invalid(
                "n-gram spec: a head with no rows or rows past i32::MAX",
            ));
        }
        // DeepSeek's Engram hashes in int64 with multipliers small enough that no product
        // overflows: with a token map the u64 hash equals it only under that bound.
        if let Some(&top) = self.token_map.iter().max() {
            let top = u64::from(top.max(self.end_id));
            if let Some(&m) = self
                .multipliers
                .iter()
                .find(|&&m| top.checked_mul(m).is_none_or(|p| p > i64::MAX as u64))
            {
                return Err(PluginError::invalid(format!(
                    "n-gram spec: multiplier {m} times the largest mapped id {top} overflows \
                     int64, where the Engram hash never does"
                )));
            }
        }
        Ok(())
    }

    /// The id token `t` hashes as.
    fn mapped(&self, t: u32) -> u64 {
        if self.token_map.is_empty() {
            return u64::from(t);
        }
        u64::from(*self.token_map.get(t as usize).unwrap_or(&self.end_id))
    }

    /// Appends the row ids of one token to `out` (`n_ids` values, table after table, head order):
    /// `context` is the token, then its predecessors newest first (as many as the sequence has,
    /// at most `ngram_size − 1` are read). The spec must have passed [`NgramSpec::check`].
    pub fn row_ids(&self, context: &[u32], out: &mut Vec<i32>) {
        let mut ctx = [u64::from(self.end_id); MAX_NGRAM as usize];
        let n = (self.ngram_size as usize).min(ctx.len());
        if let Some(&t) = context.first() {
            ctx[0] = self.mapped(t);
        }
        for (j, &t) in context.iter().enumerate().take(n).skip(1) {
            let id = self.mapped(t);
            if self.cut_at_end && id == u64::from(self.end_id) {
                break;
            }
            ctx[j] = id;
        }
        let hpn = self.heads_per_ngram as usize;
        for t in 0..self.tables as usize {
            let mult = &self.multipliers[t * n..(t + 1) * n];
            let first = t * self.per_table();
            let mut h = 0u64;
            for m in 1..n {
                h ^= ctx[m - 1].wrapping_mul(mult[m - 1]);
                let g = h ^ ctx[m].wrapping_mul(mult[m]);
                for k in first + (m - 1) * hpn..first + m * hpn {
                    out.push((g % self.head_sizes[k] + self.head_offsets[k]) as i32);
                }
            }
        }
    }

    /// Appends the row ids of the tokens `new` (`n_ids` each, token order), which follow
    /// `before` in their sequence: `before` is every token from the sequence start up to `new`
    /// (only its last `ngram_size − 1` are read).
    pub fn extend_rows(&self, before: &[u32], new: &[u32], out: &mut Vec<i32>) {
        let back = self.ngram_size as usize - 1;
        let mut window: Vec<u32> = before[before.len().saturating_sub(back)..].to_vec();
        window.extend_from_slice(new);
        let first = window.len() - new.len();
        let mut ctx = Vec::with_capacity(back + 1);
        for i in first..window.len() {
            ctx.clear();
            ctx.extend(window[i.saturating_sub(back)..=i].iter().rev());
            self.row_ids(&ctx, out);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The tiny qwen4exp preset's constants (3-grams, 8 heads a size, end id 270).
    fn spec() -> NgramSpec {
        let sizes: Vec<u64> = vec![
            1009, 1013, 1019, 1021, 1031, 1033, 1039, 1049, 1051, 1061, 1063, 1069, 1087, 1091,
            1093, 1097,
        ];
        let offsets = sizes.iter().scan(0, |o, &s| {
            let at = *o;
            *o += s;
            Some(at)
        });
        NgramSpec {
            ngram_size: 3,
            heads_per_ngram: 8,
            end_id: 270,
            cut_at_end: true,
            tables: 1,
            token_map: RVec::new(),
            multipliers: vec![
                2_175_817_888_646_129,
                31_215_934_654_987_533,
                4_449_929_463_106_639,
            ]
            .into(),
            head_offsets: offsets.collect::<Vec<_>>().into(),
            head_sizes: sizes.into(),
        }
    }

    /// A sequence hashed in chunks (the scheduler's prompt chunks and generated tokens) gives the
    /// ids of the whole sequence hashed at once, wherever the chunks split it.
    #[test]
    fn chunks_hash_as_the_whole_sequence() {
        let n = spec();
        n.check().unwrap();
        let seq: Vec<u32> = vec![5, 9, 270, 7, 7, 270, 270, 1, 2, 3, 4, 200, 100, 270, 9];
        let mut whole = Vec::new();
        n.extend_rows(&[], &seq, &mut whole);
        assert_eq!(whole.len(), seq.len() * 16);
        for cuts in [[1, 2], [3, 4], [2, 9], [6, 7], [13, 14]] {
            let mut parts = Vec::new();
            let mut at = 0;
            for end in cuts.into_iter().chain([seq.len()]) {
                n.extend_rows(&seq[..at], &seq[at..end], &mut parts);
                at = end;
            }
            assert_eq!(parts, whole, "cut at {cuts:?}");
        }
    }

    #[test]
    fn a_spec_whose_counts_disagree_is_refused() {
        let mut n = spec();
        n.multipliers.pop();
        assert!(n.check().is_err());
        let mut n = spec();
        n.head_sizes[3] = 0;
        assert!(n.check().is_err());
        // Two tables need twice the constants.
        let mut n = spec();
        n.tables = 2;
        assert!(n.check().is_err());
        n.tables = 0;
        assert!(n.check().is_err());
    }

    /// With a token map (the Engram), a multiplier whose product with the largest mapped id
    /// passes int64 is refused; at the bound it is taken.
    #[test]
    fn an_engram_multiplier_that_overflows_int64_is_refused() {
        let mut n = spec();
        n.cut_at_end = false;
        n.token_map = vec![0, 7, 3].into();
        n.end_id = 2;
        let bound = i64::MAX as u64 / 7;
        n.multipliers = vec![1, bound, 5].into();
        n.check().unwrap();
        n.multipliers[1] = bound + 2;
        let e = n.check().unwrap_err().to_string();
        assert!(e.contains("overflows"), "{e}");
        // Without a map (Qwen3.8's PLE) the hash wraps in u64 as its references do.
        n.token_map = RVec::new();
        n.check().unwrap();
    }
}
