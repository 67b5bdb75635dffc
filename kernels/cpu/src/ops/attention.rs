//! Causal grouped-query attention over a per-layer KV cache (f32 or f16), for a batch of rows from
//! several sequences, and the store that writes new K/V rows into that cache.
//!
//! Cache layout: `[width, cache_len, n_slots]` where `width = head_dim * n_head_kv`; the token of
//! sequence slot `s` at position `p` lives at cache row `p % cache_len` of slot `s` (a ring when
//! the cache is shorter than the context, as for sliding-window layers). Query head `h` reads KV
//! head `h / (n_head / n_head_kv)`, as ggml broadcasts. Per head, every score is computed, then
//! softmaxed, then applied to V, as ggml's unfused path does (per-thread scratch, grown once). The
//! query heads that share a KV head are computed together, so each cached K and V row is read
//! (and widened from f16) once for all of them; [`attention_group`] computes one such group of one
//! row, so that callers can spread a row's groups over threads.

use half::f16;

use super::{check_len, mul_dims, positive, whole_rows, OpError};

/// One layer's K or V cache, read-only: `[width, cache_len, n_slots]`.
#[derive(Debug, Clone, Copy)]
pub enum KvCache<'a> {
    /// f32 values.
    F32(&'a [f32]),
    /// f16 values, widened to f32 when read.
    F16(&'a [f16]),
}

/// One layer's K or V cache, writable: `[width, cache_len, n_slots]`.
#[derive(Debug)]
pub enum KvCacheMut<'a> {
    /// f32 values.
    F32(&'a mut [f32]),
    /// f16 values, rounded to nearest even from f32 when written.
    F16(&'a mut [f16]),
}

impl KvCache<'_> {
    fn len(&self) -> usize {
        match self {
            KvCache::F32(c) => c.len(),
            KvCache::F16(c) => c.len(),
        }
    }
}

/// The shape and options of one attention call.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AttentionParams<'a> {
    /// Query heads.
    pub n_head: usize,
    /// KV heads; divides `n_head`.
    pub n_head_kv: usize,
    /// Per-head width of Q and K (`dk`).
    pub head_dim_k: usize,
    /// Per-head width of V and of the output (`dv`).
    pub head_dim_v: usize,
    /// Rows per slot in the cache.
    pub cache_len: usize,
    /// Sequence slots in the cache.
    pub n_slots: usize,
    /// Factor on `q · k` (usually `1 / sqrt(head_dim_k)`).
    pub scale: f32,
    /// Logit soft-cap `c`: the scaled score `s` becomes `c * tanh(s / c)`. `None` for no cap.
    pub softcap: Option<f32>,
    /// Sliding window `w`: a row at position `p` sees positions `max(0, p - w + 1)..=p`. `None` for
    /// full causal attention (`0..=p`).
    pub window: Option<usize>,
    /// `[n_head]` per-head sink logits: an extra term `exp(sink_h)` in the softmax denominator with
    /// no value (not scaled or capped). `None` for no sinks.
    pub sinks: Option<&'a [f32]>,
}

/// Attention of `q`, `[head_dim_k, n_head, n_rows]` f32, over the cache, into `out`,
/// `[head_dim_v, n_head, n_rows]` f32.
///
/// Row `r` belongs to sequence slot `slots[r]` at position `positions[r]` and attends to that
/// slot's cache rows for the positions its window covers, its own included: the caller stores the
/// batch's K/V (with [`store_kv`]) before calling. A visible span longer than `cache_len` (those
/// rows were overwritten) is refused. No allocation.
pub fn attention(
    q: &[f32],
    slots: &[u32],
    positions: &[i32],
    k_cache: KvCache,
    v_cache: KvCache,
    p: &AttentionParams,
    out: &mut [f32],
) -> Result<(), OpError> {
    const OP: &str = "attention";
    check_params(p)?;
    let n_rows = slots.len();
    check_len(OP, "positions", positions.len(), n_rows)?;
    let (dk, dv) = (p.head_dim_k, p.head_dim_v);
    check_heads(q, out, p, mul_dims(OP, p.n_head, n_rows)?)?;
    check_caches(k_cache, v_cache, p)?;
    // Validate every row before writing anything.
    for (&slot, &pos) in slots.iter().zip(positions) {
        visible(slot, pos, p)?;
    }
    let group = p.n_head / p.n_head_kv;
    for (r, (&slot, &pos)) in slots.iter().zip(positions).enumerate() {
        let span = visible(slot, pos, p)?;
        for kvh in 0..p.n_head_kv {
            let heads = r * p.n_head + kvh * group;
            attend_group(
                &q[heads * dk..][..group * dk],
                span,
                kvh,
                k_cache,
                v_cache,
                p,
                &mut out[heads * dv..][..group * dv],
            );
        }
    }
    Ok(())
}

/// Attention of one row's query heads that read KV head `kvh` (heads `kvh · G .. (kvh + 1) · G`,
/// `G = n_head / n_head_kv`): `q`, `[head_dim_k, G]` f32, over the cache, into `out`,
/// `[head_dim_v, G]` f32; the row is in sequence slot `slot` at position `pos`, as in
/// [`attention`]. No allocation once this thread's scratch has grown.
#[allow(clippy::too_many_arguments)]
pub fn attention_group(
    q: &[f32],
    slot: u32,
    pos: i32,
    kvh: usize,
    k_cache: KvCache,
    v_cache: KvCache,
    p: &AttentionParams,
    out: &mut [f32],
) -> Result<(), OpError> {
    const OP: &str = "attention";
    check_params(p)?;
    check_heads(q, out, p, p.n_head / p.n_head_kv)?;
    if kvh >= p.n_head_kv {
        return Err(OpError::Index {
            op: OP,
            what: "kv head",
            index: kvh as i64,
            bound: p.n_head_kv,
        });
    }
    check_caches(k_cache, v_cache, p)?;
    let span = visible(slot, pos, p)?;
    attend_group(q, span, kvh, k_cache, v_cache, p, out);
    Ok(())
}

/// `q` and `out` hold `heads` query heads (of `head_dim_k` and `head_dim_v` values).
fn check_heads(q: &[f32], out: &[f32], p: &AttentionParams, heads: usize) -> Result<(), OpError> {
    const OP: &str = "attention";
    check_len(OP, "q", q.len(), mul_dims(OP, p.head_dim_k, heads)?)?;
    check_len(OP, "out", out.len(), mul_dims(OP, p.head_dim_v, heads)?)
}

/// The caches' and the sinks' lengths against the parameters.
fn check_caches(k_cache: KvCache, v_cache: KvCache, p: &AttentionParams) -> Result<(), OpError> {
    const OP: &str = "attention";
    let rows = mul_dims(OP, p.cache_len, p.n_slots)?;
    let (k_width, v_width) = (p.head_dim_k * p.n_head_kv, p.head_dim_v * p.n_head_kv);
    check_len(OP, "k_cache", k_cache.len(), mul_dims(OP, k_width, rows)?)?;
    check_len(OP, "v_cache", v_cache.len(), mul_dims(OP, v_width, rows)?)?;
    if let Some(s) = p.sinks {
        check_len(OP, "sinks", s.len(), p.n_head)?;
    }
    Ok(())
}

/// A row's checked slot and visible positions `lo..=hi`, refused when longer than the cache.
fn visible(slot: u32, pos: i32, p: &AttentionParams) -> Result<(usize, usize, usize), OpError> {
    let (slot, lo, hi) = locate("attention", slot, pos, p)?;
    if hi - lo >= p.cache_len {
        let what = format!(
            "position {pos} sees {} cache rows but the cache holds {} per slot",
            hi - lo + 1,
            p.cache_len
        );
        return Err(OpError::Parameter {
            op: "attention",
            what,
        });
    }
    Ok((slot, lo, hi))
}

/// [`attend`] for the cache element types at hand.
fn attend_group(
    q: &[f32],
    span: (usize, usize, usize),
    kvh: usize,
    k_cache: KvCache,
    v_cache: KvCache,
    p: &AttentionParams,
    out: &mut [f32],
) {
    match (k_cache, v_cache) {
        (KvCache::F32(k), KvCache::F32(v)) => attend(q, span, kvh, k, v, p, out),
        (KvCache::F32(k), KvCache::F16(v)) => attend(q, span, kvh, k, v, p, out),
        (KvCache::F16(k), KvCache::F32(v)) => attend(q, span, kvh, k, v, p, out),
        (KvCache::F16(k), KvCache::F16(v)) => attend(q, span, kvh, k, v, p, out),
    }
}

/// A cache element read as f32.
/// A cache element type whose rows can be read as f32.
trait CacheRow: Copy {
    /// `src` as f32: itself for f32, converted into `scratch` (F16C when the CPU has it) for f16.
    fn as_f32<'a>(src: &'a [Self], scratch: &'a mut [f32]) -> &'a [f32];
}

impl CacheRow for f32 {
    #[inline]
    fn as_f32<'a>(src: &'a [Self], _scratch: &'a mut [f32]) -> &'a [f32] {
        src
    }
}

impl CacheRow for f16 {
    #[inline]
    fn as_f32<'a>(src: &'a [Self], scratch: &'a mut [f32]) -> &'a [f32] {
        use half::slice::HalfFloatSliceExt;
        let dst = &mut scratch[..src.len()];
        src.convert_to_f32_slice(dst);
        dst
    }
}

/// `Σ a·b` with eight independent partial sums (so the compiler vectorises it), combined
/// pairwise.
#[inline]
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for i in 0..8 {
            acc[i] += x[i] * y[i];
        }
    }
    let mut tail = 0f32;
    for (x, y) in ra.iter().zip(rb) {
        tail += x * y;
    }
    ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7])) + tail
}

thread_local! {
    /// Per-thread scratch: scores (a run per head of the group), one converted K row, one
    /// converted V row, each head's running max then its normaliser.
    static SCRATCH: std::cell::RefCell<[Vec<f32>; 4]> =
        const { std::cell::RefCell::new([Vec::new(), Vec::new(), Vec::new(), Vec::new()]) };
}

/// The attention loop proper for one group of query heads sharing KV head `kvh`, monomorphised
/// per cache element type; every length and index was checked by the caller. Two passes per
/// head, as ggml's unfused path computes it: every score (`q·k · scale`, softcapped), then
/// `softmax` (max, exponentials, the sum in f64), then `Σ p·v` with the normalised weights; each
/// cached row is widened once for every head of the group. Scratch grows per thread and is then
/// reused.
fn attend<K: CacheRow, V: CacheRow>(
    q: &[f32],
    (slot, lo, hi): (usize, usize, usize),
    kvh: usize,
    k_cache: &[K],
    v_cache: &[V],
    p: &AttentionParams,
    out: &mut [f32],
) {
    let (dk, dv) = (p.head_dim_k, p.head_dim_v);
    let (k_width, v_width) = (dk * p.n_head_kv, dv * p.n_head_kv);
    let group = p.n_head / p.n_head_kv;
    let n = hi - lo + 1;
    SCRATCH.with(|cell| {
        let mut guard = cell.borrow_mut();
        let [scores, krow, vrow, per_head] = &mut *guard;
        let grow = |v: &mut Vec<f32>, len: usize| {
            if v.len() < len {
                v.resize(len, 0.0);
            }
        };
        grow(scores, group * n);
        grow(krow, dk);
        grow(vrow, dv);
        grow(per_head, group);
        let sink = |g: usize| p.sinks.map(|s| s[kvh * group + g]);
        for (g, max) in per_head[..group].iter_mut().enumerate() {
            *max = sink(g).unwrap_or(f32::NEG_INFINITY);
        }
        for (i, t) in (lo..=hi).enumerate() {
            let cache_row = slot * p.cache_len + t % p.cache_len;
            let kr = K::as_f32(&k_cache[cache_row * k_width + kvh * dk..][..dk], krow);
            for (g, max) in per_head[..group].iter_mut().enumerate() {
                let mut s = dot(&q[g * dk..][..dk], kr) * p.scale;
                if let Some(c) = p.softcap {
                    s = c * (s / c).tanh();
                }
                scores[g * n + i] = s;
                *max = max.max(s);
            }
        }
        for (g, head) in per_head[..group].iter_mut().enumerate() {
            let max = *head;
            let mut sum = sink(g).map_or(0.0, |s| f64::from((s - max).exp()));
            for s in &mut scores[g * n..][..n] {
                *s = (*s - max).exp();
                sum += f64::from(*s);
            }
            *head = if sum > 0.0 { (1.0 / sum) as f32 } else { 0.0 };
        }
        out.fill(0.0);
        for (i, t) in (lo..=hi).enumerate() {
            let cache_row = slot * p.cache_len + t % p.cache_len;
            let vr = V::as_f32(&v_cache[cache_row * v_width + kvh * dv..][..dv], vrow);
            for (g, &inv) in per_head[..group].iter().enumerate() {
                let w = scores[g * n + i] * inv;
                if w == 0.0 || w.is_nan() {
                    continue;
                }
                out[g * dv..][..dv]
                    .iter_mut()
                    .zip(vr.iter())
                    .for_each(|(a, &b)| *a += w * b);
            }
        }
    })
}

fn check_params(p: &AttentionParams) -> Result<(), OpError> {
    const OP: &str = "attention";
    let bad = |what: String| Err(OpError::Parameter { op: OP, what });
    if p.n_head_kv == 0 || !p.n_head.is_multiple_of(p.n_head_kv) {
        return bad(format!(
            "n_head_kv {} must divide n_head {}",
            p.n_head_kv, p.n_head
        ));
    }
    if p.cache_len == 0 {
        return bad("cache_len is zero".into());
    }
    if p.window == Some(0) {
        return bad("window is zero".into());
    }
    if let Some(c) = p.softcap.filter(|&c| !positive(c)) {
        return bad(format!("softcap {c} must be positive"));
    }
    Ok(())
}

/// The checked slot index and visible position range `lo..=hi` of a row.
fn locate(
    op: &'static str,
    slot: u32,
    pos: i32,
    p: &AttentionParams,
) -> Result<(usize, usize, usize), OpError> {
    let slot_i = usize::try_from(slot).unwrap_or(usize::MAX);
    if slot_i >= p.n_slots {
        return Err(OpError::Index {
            op,
            what: "slot",
            index: i64::from(slot),
            bound: p.n_slots,
        });
    }
    let hi = usize::try_from(pos).map_err(|_| OpError::Parameter {
        op,
        what: format!("position {pos} is negative"),
    })?;
    let lo = match p.window {
        Some(w) => (hi + 1).saturating_sub(w),
        None => 0,
    };
    Ok((slot_i, lo, hi))
}

/// Writes `rows`, `[width, n_rows]` f32, into `cache`, `[width, cache_len, n_slots]`, row `r` going
/// to cache row `positions[r] % cache_len` of slot `slots[r]` (converted to f16 for an f16 cache).
/// Every index is checked before anything is written. No allocation.
pub fn store_kv(
    rows: &[f32],
    width: usize,
    slots: &[u32],
    positions: &[i32],
    cache: KvCacheMut,
    cache_len: usize,
    n_slots: usize,
) -> Result<(), OpError> {
    const OP: &str = "store_kv";
    let n_rows = whole_rows(OP, "rows", rows.len(), width)?;
    check_len(OP, "slots", slots.len(), n_rows)?;
    check_len(OP, "positions", positions.len(), n_rows)?;
    if cache_len == 0 {
        return Err(OpError::Parameter {
            op: OP,
            what: "cache_len is zero".into(),
        });
    }
    let cache_size = mul_dims(OP, mul_dims(OP, width, cache_len)?, n_slots)?;
    let found = match &cache {
        KvCacheMut::F32(c) => c.len(),
        KvCacheMut::F16(c) => c.len(),
    };
    check_len(OP, "cache", found, cache_size)?;
    let index = |r: usize| -> Result<usize, OpError> {
        let slot = usize::try_from(slots[r]).unwrap_or(usize::MAX);
        if slot >= n_slots {
            return Err(OpError::Index {
                op: OP,
                what: "slot",
                index: i64::from(slots[r]),
                bound: n_slots,
            });
        }
        let pos = usize::try_from(positions[r]).map_err(|_| OpError::Parameter {
            op: OP,
            what: format!("position {} is negative", positions[r]),
        })?;
        Ok((slot * cache_len + pos % cache_len) * width)
    };
    for r in 0..n_rows {
        index(r)?;
    }
    match cache {
        KvCacheMut::F32(c) => {
            for (r, src) in rows.chunks_exact(width).enumerate() {
                c[index(r)?..][..width].copy_from_slice(src);
            }
        }
        KvCacheMut::F16(c) => {
            for (r, src) in rows.chunks_exact(width).enumerate() {
                let dst = &mut c[index(r)?..][..width];
                dst.iter_mut()
                    .zip(src)
                    .for_each(|(d, &s)| *d = f16::from_f32(s));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
#[path = "attention_tests.rs"]
mod tests;
