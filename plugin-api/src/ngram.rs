//! Hashed n-gram table row ids (Qwen3.8-Flash-Next's PLE table), computed by the host.
//!
//! A model whose graph reads [`crate::graph::BatchInput::NgramRows`] declares an [`NgramSpec`] in
//! its [`crate::model::ModelSpec`]; the host fills that input with [`NgramSpec::row_ids`] from its
//! record of each row's sequence (llama.cpp b11434 computes the same ids on the host, in
//! `llm_graph_input_qwen4exp_ple::set_input`). The host needs the ids of the token it is about to
//! feed anyway, to fetch those table rows ahead of the pass.
//!
//! The hash: `ctx_0` is the row's token and `ctx_j` the token `j` positions back. Once a
//! predecessor is missing (before the sequence start) or equals the end id, it and every older one
//! read as the end id (the row's own token being the end id cuts nothing). For each n-gram size
//! `m = 2 ..= ngram_size`, `h = XOR_{j<m} ctx_j·multipliers[j]` in u64, and each of that size's
//! heads `k = (m − 2)·heads_per_ngram + g` reads row `h mod head_sizes[k] + head_offsets[k]`.

use abi_stable::std_types::RVec;
use abi_stable::StableAbi;

use crate::PluginError;

/// The longest n-gram a spec may name (llama.cpp b11434's `LLAMA_MAX_PLE_NGRAM`).
pub const MAX_NGRAM: u32 = 8;

/// The constants of a hashed n-gram table's row ids.
#[repr(C)]
#[derive(StableAbi, Clone, Debug, PartialEq)]
pub struct NgramSpec {
    /// Longest n-gram (at least 2): the row reads its token and `ngram_size − 1` predecessors.
    pub ngram_size: u32,
    /// Heads per n-gram size.
    pub heads_per_ngram: u32,
    /// The id a missing or cut predecessor hashes as.
    pub end_id: u32,
    /// One multiplier per context position, `ngram_size` values.
    pub multipliers: RVec<u64>,
    /// Each head's row count (the modulus), `(ngram_size − 1)·heads_per_ngram` values.
    pub head_sizes: RVec<u64>,
    /// Each head's first row, as many values.
    pub head_offsets: RVec<u64>,
}

impl NgramSpec {
    /// Row ids per token: `(ngram_size − 1)·heads_per_ngram`.
    pub fn n_ids(&self) -> usize {
        self.ngram_size.saturating_sub(1) as usize * self.heads_per_ngram as usize
    }

    /// Checks the counts and that every row id fits an i32 (a plugin's declaration is checked
    /// by the host before it computes with it).
    pub fn check(&self) -> Result<(), PluginError> {
        let n = self.n_ids();
        if !(2..=MAX_NGRAM).contains(&self.ngram_size)
            || self.heads_per_ngram == 0
            || self.multipliers.len() != self.ngram_size as usize
            || self.head_sizes.len() != n
            || self.head_offsets.len() != n
        {
            return Err(PluginError::invalid(format!(
                "n-gram spec: size {} (2 to {MAX_NGRAM}) with {} heads each needs {} multipliers \
                 and {n} head sizes and offsets; it has {}, {} and {}",
                self.ngram_size,
                self.heads_per_ngram,
                self.ngram_size,
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
        Ok(())
    }

    /// Appends the row ids of one token to `out` (`n_ids` values, head order): `context` is the
    /// token, then its predecessors newest first (as many as the sequence has, at most
    /// `ngram_size − 1` are read). The spec must have passed [`NgramSpec::check`].
    pub fn row_ids(&self, context: &[u32], out: &mut Vec<i32>) {
        let mut ctx = [u64::from(self.end_id); MAX_NGRAM as usize];
        let n = (self.ngram_size as usize).min(ctx.len());
        if let Some(&t) = context.first() {
            ctx[0] = u64::from(t);
        }
        for (j, &t) in context.iter().enumerate().take(n).skip(1) {
            if t == self.end_id {
                break;
            }
            ctx[j] = u64::from(t);
        }
        let mut h = 0u64;
        let hpn = self.heads_per_ngram as usize;
        for m in 1..n {
            h ^= ctx[m - 1].wrapping_mul(self.multipliers[m - 1]);
            let g = h ^ ctx[m].wrapping_mul(self.multipliers[m]);
            for k in (m - 1) * hpn..m * hpn {
                out.push((g % self.head_sizes[k] + self.head_offsets[k]) as i32);
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
