//! The k-pool indexer's selection (`Op::KPoolSelect`): which cache positions each row's sparse
//! attention reads, for GLM-5.3's DSA ([`Pooling::SoftmaxGate`]) and Qwen3.8-Flash-Next's QSA
//! ([`Pooling::MeanNormRope`]).
//!
//! A slot's cache rows are `[key | gate | pooled]` (DSA) or `[raw key | pooled]` (QSA), `dh`
//! values each, at their position. Pool `g` is positions `g·kpool .. g·kpool + kpool`; the call
//! first pools, once each, the pools its rows complete (a row at the pool's last position) and
//! writes each pooled key into that row's pooled section, then scores every complete pool a row
//! sees, `Σ_h w_h·relu(q_h·pooled)`, and lists the best pools' positions (see [`kpool_select`]).
//! Softmaxes, means, products and sums run in f64 (the QSA key's rope in f32); the pooled key is
//! rounded to the cache's type and each score to f32 before ranking, so another device that takes
//! its sums in f64 ranks the same pools in the same order.

use half::f16;

use super::rope::{rope, RopeParams};
use super::{check_len, mul_dims, OpError, SharedMut};
use crate::linear::Parallel;

/// The shape of one call (see [`kpool_select`]).
#[derive(Clone, Copy, Debug)]
pub struct KPoolShape {
    /// Indexer heads.
    pub n_head: usize,
    /// Head width `dh` (each of a cache row's sections).
    pub head_dim: usize,
    /// Positions per pool.
    pub kpool: usize,
    /// Pools kept per row.
    pub n_top: usize,
    /// The positions after the last complete pool are listed too.
    pub tail: bool,
    /// Cache rows per slot.
    pub len: usize,
    /// Slots of the cache.
    pub n_slots: usize,
}

impl KPoolShape {
    /// Entries of each row's output: `kpool·n_top`, plus `kpool − 1` with the tail.
    pub fn n_sel(&self) -> usize {
        self.kpool * self.n_top
            + if self.tail {
                self.kpool.saturating_sub(1)
            } else {
                0
            }
    }

    /// The most complete pools a row can see: `len / kpool` (the scratch per row).
    pub fn max_pools(&self) -> usize {
        self.len / self.kpool.max(1)
    }
}

/// How a pool's keys are pooled and the heads weighed.
#[derive(Clone, Copy, Debug)]
pub enum Pooling<'a> {
    /// GLM-5.3's DSA: rows `[key | gate | pooled]`; per dimension `d` the pooled key is
    /// `Σ_t softmax_t(gate[t, d] + ape[d, t])·key[t, d]`; head `h` of row `r` weighs `w[h, r]`.
    SoftmaxGate {
        /// Head weights `[n_head, rows]`.
        w: &'a [f32],
        /// The pool's position embedding `[dh, kpool]`.
        ape: &'a [f32],
    },
    /// Qwen3.8-Flash-Next's QSA: rows `[raw key | pooled]`; the pooled key is
    /// `rope(RmsNorm(mean of the raw keys)·k_norm)` roped at the pool's first position; every
    /// head weighs `scale`.
    MeanNormRope {
        /// The RMS norm's gamma `[dh]`.
        k_norm: &'a [f32],
        /// The RMS norm's ε.
        eps: f32,
        /// The pooled key's rope.
        rope: RopeParams,
        /// Every head's weight.
        scale: f32,
    },
}

impl Pooling<'_> {
    /// Sections of `dh` values in a cache row.
    fn sections(&self) -> usize {
        match self {
            Pooling::SoftmaxGate { .. } => 3,
            Pooling::MeanNormRope { .. } => 2,
        }
    }
}

/// One call's read-only inputs (see [`kpool_select`]).
#[derive(Clone, Copy, Debug)]
pub struct KPoolInputs<'a> {
    /// Queries `[dh, n_head, rows]`.
    pub q: &'a [f32],
    /// The pooling and head weights.
    pub pooling: Pooling<'a>,
    /// Each row's slot.
    pub slots: &'a [u32],
    /// Each row's position.
    pub positions: &'a [i32],
}

/// A cache element the op reads and writes (the cache is f32 or f16).
pub trait CacheValue: Copy + Send + Sync {
    /// The value as f64.
    fn get(self) -> f64;
    /// `v` rounded to this type (to nearest f32, then to nearest of this type).
    fn put(v: f64) -> Self;
}

impl CacheValue for f32 {
    fn get(self) -> f64 {
        f64::from(self)
    }
    fn put(v: f64) -> Self {
        v as f32
    }
}

impl CacheValue for f16 {
    fn get(self) -> f64 {
        f64::from(self.to_f32())
    }
    fn put(v: f64) -> Self {
        // Through f32, each step to nearest even: `half`'s from_f64 goes through f32 where the
        // CPU has F16C and drops the low 32 bits first where not, so this is the one rounding
        // that every machine and the card share.
        f16::from_f32(v as f32)
    }
}

/// Pools a task scores for one row (decode's single row spreads over the workers this way).
const POOL_CHUNK: usize = 256;

/// The ranking key of a pool: its score's f32 bits in value order (−0 as +0), then the lower pool
/// first. Keys sorted in descending order list pools by descending score, ties by ascending pool.
fn rank_key(score: f64, pool: usize) -> u64 {
    let s = score as f32;
    let bits = if s == 0.0 { 0.0f32 } else { s }.to_bits();
    let ordered = if bits >> 31 == 1 {
        !bits
    } else {
        bits | 0x8000_0000
    };
    (u64::from(ordered) << 32) | u64::from(u32::MAX - pool as u32)
}

/// The pool of a ranking key.
fn key_pool(key: u64) -> usize {
    (u32::MAX - key as u32) as usize
}

/// The pooled key of the pool whose first row is `rows[0]` and first position `first`, into the
/// pooled section of its last row.
fn pool_into<T: CacheValue>(
    rows: &mut [T],
    pooling: &Pooling<'_>,
    (dh, kpool, first): (usize, usize, usize),
) -> Result<(), OpError> {
    match *pooling {
        Pooling::SoftmaxGate { ape, .. } => softmax_gate_into(rows, ape, dh, kpool),
        Pooling::MeanNormRope {
            k_norm, eps, rope, ..
        } => return mean_norm_rope_into(rows, (k_norm, eps, &rope), dh, kpool, first),
    }
    Ok(())
}

/// The QSA pooled key: per dimension the mean of the `kpool` raw keys (rows of `2·dh`), the RMS
/// norm over the `dh` means (f64, `eps` inside the root) times `k_norm`, rounded to f32, roped at
/// position `first`, then rounded to the cache's type.
fn mean_norm_rope_into<T: CacheValue>(
    rows: &mut [T],
    (k_norm, eps, p): (&[f32], f32, &RopeParams),
    dh: usize,
    kpool: usize,
    first: usize,
) -> Result<(), OpError> {
    let width = 2 * dh;
    let mean: Vec<f64> = (0..dh)
        .map(|d| (0..kpool).map(|t| rows[t * width + d].get()).sum::<f64>() / kpool as f64)
        .collect();
    let ms = mean.iter().map(|m| m * m).sum::<f64>() / dh as f64;
    let inv = 1.0 / (ms + f64::from(eps)).sqrt();
    let mut key: Vec<f32> = mean
        .iter()
        .zip(k_norm)
        .map(|(&m, &g)| (m * inv * f64::from(g)) as f32)
        .collect();
    let pos = i32::try_from(first).map_err(|_| OpError::Parameter {
        op: "kpool_select",
        what: format!("position {first} does not fit the rope's i32"),
    })?;
    rope(&mut key, dh, 1, &[pos], p)?;
    let pooled = &mut rows[(kpool - 1) * width + dh..kpool * width];
    for (o, &v) in pooled.iter_mut().zip(&key) {
        *o = T::put(f64::from(v));
    }
    Ok(())
}

/// The DSA pooled key of the pool whose first row is `rows[0]` (`kpool` rows of `3·dh` values),
/// per dimension `d`: `Σ_t softmax_t(gate[t, d] + ape[d, t])·key[t, d]`, in f64.
fn softmax_gate_into<T: CacheValue>(rows: &mut [T], ape: &[f32], dh: usize, kpool: usize) {
    let width = 3 * dh;
    for d in 0..dh {
        let logit = |t: usize| rows[t * width + dh + d].get() + f64::from(ape[t * dh + d]);
        let m = (0..kpool).map(logit).fold(f64::NEG_INFINITY, f64::max);
        let (mut num, mut den) = (0f64, 0f64);
        for t in 0..kpool {
            let e = (logit(t) - m).exp();
            den += e;
            num += e * rows[t * width + d].get();
        }
        rows[(kpool - 1) * width + 2 * dh + d] = T::put(num / den);
    }
}

/// `Σ_h w(h)·relu(q_h·pooled)` for one row's heads `q [dh, n_head]`, in f64.
fn score<T: CacheValue>(q: &[f32], w: impl Fn(usize) -> f32, pooled: &[T], dh: usize) -> f64 {
    q.chunks_exact(dh)
        .enumerate()
        .map(|(h, qh)| {
            let wh = w(h);
            let dot: f64 = qh
                .iter()
                .zip(pooled)
                .map(|(&a, &b)| f64::from(a) * b.get())
                .sum();
            f64::from(wh) * dot.max(0.0)
        })
        .sum()
}

/// Checks every length, slot and position of a call; returns the rows.
fn check<T>(
    x: &KPoolInputs<'_>,
    cache: &[T],
    s: &KPoolShape,
    out: &[i32],
) -> Result<usize, OpError> {
    const OP: &str = "kpool_select";
    let (slots, positions) = (x.slots, x.positions);
    if s.n_head == 0 || s.head_dim == 0 || s.kpool == 0 || s.n_top == 0 {
        let what = format!(
            "{} heads of {}, pools of {}, {} kept (all must be positive)",
            s.n_head, s.head_dim, s.kpool, s.n_top
        );
        return Err(OpError::Parameter { op: OP, what });
    }
    if s.len > u32::MAX as usize {
        let what = format!("a cache of {} rows per slot", s.len);
        return Err(OpError::Parameter { op: OP, what });
    }
    let rows = slots.len();
    check_len(OP, "positions", positions.len(), rows)?;
    let per_row = mul_dims(OP, s.head_dim, s.n_head)?;
    check_len(OP, "q", x.q.len(), mul_dims(OP, per_row, rows)?)?;
    let sections = x.pooling.sections();
    match x.pooling {
        Pooling::SoftmaxGate { w, ape } => {
            check_len(OP, "w", w.len(), mul_dims(OP, s.n_head, rows)?)?;
            check_len(OP, "ape", ape.len(), mul_dims(OP, s.head_dim, s.kpool)?)?;
        }
        Pooling::MeanNormRope { k_norm, .. } => check_len(OP, "k_norm", k_norm.len(), s.head_dim)?,
    }
    let slot_values = mul_dims(OP, mul_dims(OP, sections, s.head_dim)?, s.len)?;
    check_len(
        OP,
        "cache",
        cache.len(),
        mul_dims(OP, slot_values, s.n_slots)?,
    )?;
    check_len(OP, "out", out.len(), mul_dims(OP, s.n_sel(), rows)?)?;
    for (&slot, &p) in slots.iter().zip(positions) {
        if slot as usize >= s.n_slots {
            let (index, bound) = (i64::from(slot), s.n_slots);
            return Err(OpError::Index {
                op: OP,
                what: "slot",
                index,
                bound,
            });
        }
        if p < 0 || p as usize >= s.len {
            let (index, bound) = (i64::from(p), s.len);
            return Err(OpError::Index {
                op: OP,
                what: "position",
                index,
                bound,
            });
        }
    }
    Ok(rows)
}

/// The k-pool indexer's selection for `rows` rows: `x` (`q [dh, n_head, rows]`, the pooling's
/// sources, each row's slot and position, below `len`), `cache [sections·dh, len, n_slots]`
/// (`[key | gate | pooled]` or `[raw key | pooled]` rows, updated in place) → `out [n_sel,
/// rows]`.
///
/// The pooled key of every pool that a row completes (a row at the pool's last position) is
/// computed once and written into the pooled section of that row before any row is scored, so a
/// row reads the pools of earlier rows of the same call as well as those of earlier calls. A row
/// at position `p` ranks its slot's complete pools (those ending at or before `p`) by score (f32,
/// ties to the lower pool) and lists the first `min(n_top, complete)`: their positions, pools in
/// descending order, each pool ascending, then −1 up to `kpool·n_top`; with `tail`, then the
/// `(p + 1) % kpool` positions after the last complete pool, ascending, then −1 up to `n_sel`.
///
/// `keys` is the caller's scratch of at least `max_pools()` values: rows are scored in passes of
/// `keys.len() / max_pools()`. Every length, slot and position is checked before anything is
/// written.
pub fn kpool_select<T: CacheValue>(
    par: &dyn Parallel,
    x: &KPoolInputs<'_>,
    cache: &mut [T],
    s: &KPoolShape,
    keys: &mut [u64],
    out: &mut [i32],
) -> Result<(), OpError> {
    let rows = check(x, cache, s, out)?;
    let KPoolInputs {
        q,
        pooling,
        slots,
        positions,
    } = *x;
    let (dh, kpool) = (s.head_dim, s.kpool);
    let width = pooling.sections() * dh;
    let pooled_at = width - dh;
    let max_pools = s.max_pools().max(1);
    let pass = keys.len() / max_pools;
    if pass == 0 {
        return Err(OpError::Length {
            op: "kpool_select",
            what: "keys",
            found: keys.len(),
            expected: max_pools,
        });
    }
    // The pools this call completes, one after another: a pool's rows are few and a call
    // completes at most one in kpool of its rows.
    for (&slot, &p) in slots.iter().zip(positions) {
        let p = p as usize;
        if (p + 1).is_multiple_of(kpool) {
            let start = p + 1 - kpool;
            let first = (slot as usize * s.len + start) * width;
            pool_into(
                &mut cache[first..first + kpool * width],
                &pooling,
                (dh, kpool, start),
            )?;
        }
    }
    let cache: &[T] = cache;
    let per_q = dh * s.n_head;
    let n_sel = s.n_sel();
    let chunks = max_pools.div_ceil(POOL_CHUNK);
    for r0 in (0..rows).step_by(pass) {
        let n = pass.min(rows - r0);
        let shared = SharedMut::new(&mut keys[..n * max_pools]);
        par.for_each(n * chunks, &|task| {
            let (i, chunk) = (task / chunks, task % chunks);
            let r = r0 + i;
            let (slot, p) = (slots[r] as usize, positions[r] as usize);
            let complete = (p + 1) / kpool;
            let g0 = chunk * POOL_CHUNK;
            let g1 = (g0 + POOL_CHUNK).min(complete);
            if g0 >= g1 {
                return;
            }
            // SAFETY: task (i, chunk) writes only row i's keys of pools g0..g1, disjoint from
            // every other task's.
            let k = unsafe { shared.part(i * max_pools + g0, g1 - g0) };
            let qr = &q[r * per_q..(r + 1) * per_q];
            let w = |h: usize| match pooling {
                Pooling::SoftmaxGate { w, .. } => w[r * s.n_head + h],
                Pooling::MeanNormRope { scale, .. } => scale,
            };
            for (g, key) in (g0..g1).zip(k.iter_mut()) {
                let last = (slot * s.len + g * kpool + kpool - 1) * width;
                *key = rank_key(score(qr, w, &cache[last + pooled_at..last + width], dh), g);
            }
        });
        let (shared, outs) = (
            SharedMut::new(&mut keys[..n * max_pools]),
            SharedMut::new(&mut out[r0 * n_sel..(r0 + n) * n_sel]),
        );
        par.for_each(n, &|i| {
            let r = r0 + i;
            let p = positions[r] as usize;
            let complete = (p + 1) / kpool;
            // SAFETY: task i reads and writes only row i's keys and output row.
            let (k, o) = unsafe {
                (
                    shared.part(i * max_pools, complete),
                    outs.part(i * n_sel, n_sel),
                )
            };
            write_row(k, p, s, o);
        });
    }
    Ok(())
}

/// One row's output from its pools' keys `k` (reordered here): the best `n_top` pools in
/// descending key order, then the tail.
fn write_row(k: &mut [u64], p: usize, s: &KPoolShape, o: &mut [i32]) {
    let kpool = s.kpool;
    let kept = s.n_top.min(k.len());
    if kept > 0 && kept < k.len() {
        k.select_nth_unstable_by(kept - 1, |a, b| b.cmp(a));
    }
    k[..kept].sort_unstable_by(|a, b| b.cmp(a));
    o.fill(-1);
    for (j, &key) in k[..kept].iter().enumerate() {
        let first = key_pool(key) * kpool;
        for (t, e) in o[j * kpool..(j + 1) * kpool].iter_mut().enumerate() {
            *e = (first + t) as i32;
        }
    }
    if s.tail {
        let n_tail = (p + 1) % kpool;
        let tail = &mut o[kpool * s.n_top..];
        for (t, e) in tail[..n_tail].iter_mut().enumerate() {
            *e = (p + 1 - n_tail + t) as i32;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{key_pool, rank_key};

    #[test]
    fn keys_rank_by_score_then_lower_pool() {
        let mut k = vec![
            rank_key(0.5, 3),
            rank_key(-0.0, 1),
            rank_key(2.0, 4),
            rank_key(0.5, 0),
            rank_key(0.0, 0),
            rank_key(-1.0, 2),
        ];
        k.sort_unstable_by(|a, b| b.cmp(a));
        let pools: Vec<usize> = k.into_iter().map(key_pool).collect();
        // −0 ties with +0 (a row whose every head is zeroed by relu, some weights negative).
        assert_eq!(pools, [4, 0, 3, 0, 1, 2]);
    }
}
