//! Causal grouped-query attention over a per-layer KV cache (f32, f16 or a 32-element block
//! quantization: Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL, K and V of independent types), for a batch
//! of rows from several sequences, and the store that writes new K/V rows into that cache.
//!
//! Cache layout: `[width, cache_len, n_slots]` where `width = head_dim * n_head_kv`; the token of
//! sequence slot `s` at position `p` lives at cache row `p % cache_len` of slot `s` (a ring when
//! the cache is shorter than the context, as for sliding-window layers). Query head `h` reads KV
//! head `h / (n_head / n_head_kv)`, as ggml broadcasts. Per head, every score is computed, then
//! softmaxed, then applied to V, as ggml's unfused path does (per-thread scratch, grown once). The
//! query heads that share a KV head are computed together, so each cached K and V row is read
//! (and widened from f16, or dequantized block by block) once for all of them; [`attention_group`]
//! computes one such group of one row, so that callers can spread a row's groups over threads.
//!
//! Quantized caches are read as llama.cpp's CPU flash attention reads them: each query head is
//! quantized to the key type's dot-product format (Q8_0 or Q8_1) and scored by the integer dot
//! product of [`crate::quant::vec_dot`]; value rows are dequantized to f32. A quantized cache's
//! head width must be a whole number of blocks. As llama.cpp does, a quantized cache may hold its
//! rows rotated by the Walsh-Hadamard transform ([`super::hadamard`]): the store rotates each row
//! in chunks of `rot` values before quantizing it, attention rotates the queries the same way
//! before scoring them (`rot_k`) and each head's output back (`rot_v`).

use bloomery_plugin_api::DType;
use half::f16;

use super::attention_select::{selected_positions, Selection};
use super::{check_len, mul_dims, positive, whole_rows, OpError};
use crate::quant;

/// One layer's K or V cache, read-only: `[width, cache_len, n_slots]`.
#[derive(Debug, Clone, Copy)]
pub enum KvCache<'a> {
    /// f32 values.
    F32(&'a [f32]),
    /// f16 values, widened to f32 when read.
    F16(&'a [f16]),
    /// Blocks of 32 elements of a quantized type (one of [`quant::KV_CACHE_TYPES`]), rows laid end
    /// to end.
    Quant(DType, &'a [u8]),
}

/// One layer's K or V cache, writable: `[width, cache_len, n_slots]`.
#[derive(Debug)]
pub enum KvCacheMut<'a> {
    /// f32 values.
    F32(&'a mut [f32]),
    /// f16 values, rounded to nearest even from f32 when written.
    F16(&'a mut [f16]),
    /// Blocks of 32 elements of a quantized type, quantized as [`quant::quantize_kv_row`] does.
    Quant(DType, &'a mut [u8]),
}

/// Elements of a quantized cache's `bytes` of type `t` (0 for a type without 32-element blocks).
fn quant_elements(t: DType, bytes: usize) -> usize {
    match t.layout() {
        Some(l) if l.block == 32 => bytes / l.bytes as usize * 32,
        _ => 0,
    }
}

impl KvCache<'_> {
    fn len(&self) -> usize {
        match self {
            KvCache::F32(c) => c.len(),
            KvCache::F16(c) => c.len(),
            KvCache::Quant(t, c) => quant_elements(*t, c.len()),
        }
    }

    /// The quantized type, if any.
    fn quant_type(&self) -> Option<DType> {
        match self {
            KvCache::Quant(t, _) => Some(*t),
            _ => None,
        }
    }

    /// Elements `start .. start + n` as f32: a slice of an f32 cache, else converted into
    /// `scratch` (`start` and `n` whole blocks for a quantized cache, as checked at the call).
    #[inline]
    fn row<'s>(&'s self, start: usize, n: usize, scratch: &'s mut [f32]) -> &'s [f32] {
        match self {
            KvCache::F32(c) => &c[start..][..n],
            KvCache::F16(c) => {
                use half::slice::HalfFloatSliceExt;
                let dst = &mut scratch[..n];
                c[start..][..n].convert_to_f32_slice(dst);
                dst
            }
            KvCache::Quant(t, c) => {
                let dst = &mut scratch[..n];
                let (b0, nb) = block_span(*t, start, n);
                // The span was checked against the cache's length and the type's blocks.
                let _ = quant::dequantize_row(*t, &c[b0..][..nb], dst);
                dst
            }
        }
    }

    /// The bytes of elements `start .. start + n` of a quantized cache (whole blocks).
    #[inline]
    fn quant_bytes(&self, start: usize, n: usize) -> &[u8] {
        match self {
            KvCache::Quant(t, c) => {
                let (b0, nb) = block_span(*t, start, n);
                &c[b0..][..nb]
            }
            _ => &[],
        }
    }
}

/// The byte offset and length of elements `start .. start + n` of type `t` (32-element blocks).
#[inline]
fn block_span(t: DType, start: usize, n: usize) -> (usize, usize) {
    let bytes = t.layout().map_or(0, |l| l.bytes as usize);
    (start / 32 * bytes, n / 32 * bytes)
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
    /// With a quantized K cache, each query head is rotated by the Walsh-Hadamard transform in
    /// chunks of this many values (a power of two dividing `head_dim_k`) before it is scored, as
    /// the keys were stored ([`store_kv_rotated`]); 0 = none.
    pub rot_k: usize,
    /// With a quantized V cache, each head's output is rotated back in chunks of this many values
    /// (a power of two dividing `head_dim_v`); 0 = none.
    pub rot_v: usize,
    /// Values are the first `head_dim_v` dims of each key head (latent attention, K = V): they
    /// are read from the K cache and the V cache argument must be that cache again. f32 and f16
    /// caches only.
    pub v_from_k: bool,
    /// Sparse selection: each row sees only its listed positions (plus its window when `window`
    /// is set), as [`selected_positions`] collects them. `None` for dense attention.
    pub selected: Option<Selection<'a>>,
    /// DeepSeek-V4's compressed rows, a second key source in the same softmax (needs
    /// `v_from_k`). `None` for none.
    pub comp: Option<CompRows<'a>>,
}

/// DeepSeek-V4's compressed-row cache as a second key source: `[head_dim_k · n_head_kv, len,
/// n_slots]` f32, row `j` of a slot (at `j`) pooling positions `j·ratio .. (j + 1)·ratio`. A row
/// at position `p` sees rows `j < (p + 1) / ratio`, or with `selected` only its listed ones
/// among them (−1 skipped, duplicates once). Values are each row's first `head_dim_v` dims.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CompRows<'a> {
    /// The rows.
    pub cache: &'a [f32],
    /// Rows per slot.
    pub len: usize,
    /// Positions per row.
    pub ratio: usize,
    /// The rows each query row reads, `n_sel` per row; `None` for every visible row.
    pub selected: Option<Selection<'a>>,
}

/// The cache positions one row sees: a span `lo..=hi`, or a sorted list.
#[derive(Debug, Clone, Copy)]
enum Seen<'s> {
    Span(usize, usize),
    List(&'s [usize]),
}

impl Seen<'_> {
    fn len(&self) -> usize {
        match self {
            Seen::Span(lo, hi) => hi - lo + 1,
            Seen::List(l) => l.len(),
        }
    }

    fn iter(
        &self,
    ) -> std::iter::Chain<
        std::ops::RangeInclusive<usize>,
        std::iter::Copied<std::slice::Iter<'_, usize>>,
    > {
        match *self {
            Seen::Span(lo, hi) => (lo..=hi).chain([].iter().copied()),
            #[allow(clippy::reversed_empty_ranges)]
            Seen::List(l) => (1..=0).chain(l.iter().copied()),
        }
    }
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
    if let Some(sel) = p.selected {
        check_len(
            OP,
            "selected",
            sel.ids.len(),
            mul_dims(OP, sel.n_sel, n_rows)?,
        )?;
    }
    // Validate every row before writing anything.
    for (r, (&slot, &pos)) in slots.iter().zip(positions).enumerate() {
        with_seen(r, slot, pos, p, |_, _, _| ())?;
    }
    let group = p.n_head / p.n_head_kv;
    for (r, (&slot, &pos)) in slots.iter().zip(positions).enumerate() {
        with_seen(r, slot, pos, p, |slot, seen, comp| {
            for kvh in 0..p.n_head_kv {
                let heads = r * p.n_head + kvh * group;
                attend_group(
                    &q[heads * dk..][..group * dk],
                    slot,
                    seen,
                    comp,
                    kvh,
                    k_cache,
                    v_cache,
                    p,
                    &mut out[heads * dv..][..group * dv],
                );
            }
        })?;
    }
    Ok(())
}

thread_local! {
    /// Per-thread scratch of a sparse row's visible positions.
    static SEEN: std::cell::RefCell<Vec<usize>> = const { std::cell::RefCell::new(Vec::new()) };
    /// Per-thread scratch of a row's visible compressed rows.
    static COMP_SEEN: std::cell::RefCell<Vec<usize>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Calls `f(slot, seen, comp)` with row `r`'s checked slot, the cache positions it sees (as
/// [`with_positions`]) and the compressed rows it sees ([`comp_rows`]).
fn with_seen<R>(
    r: usize,
    slot: u32,
    pos: i32,
    p: &AttentionParams,
    f: impl FnOnce(usize, Seen<'_>, &[usize]) -> R,
) -> Result<R, OpError> {
    COMP_SEEN.with(|cell| {
        let mut comp = cell.borrow_mut();
        comp_rows(r, pos, p, &mut comp)?;
        with_positions(r, slot, pos, p, |slot, seen| f(slot, seen, &comp))
    })
}

/// Writes into `out` (cleared first) the compressed rows row `r` at `pos` sees, ascending: none
/// without [`AttentionParams::comp`]. A visible row beyond the cache is refused.
fn comp_rows(r: usize, pos: i32, p: &AttentionParams, out: &mut Vec<usize>) -> Result<(), OpError> {
    const OP: &str = "attention";
    out.clear();
    let Some(c) = p.comp else {
        return Ok(());
    };
    let visible = usize::try_from(pos).map_or(0, |q| (q + 1) / c.ratio.max(1));
    if visible > c.len {
        return Err(OpError::Index {
            op: OP,
            what: "visible compressed rows",
            index: visible as i64,
            bound: c.len,
        });
    }
    match c.selected {
        None => out.extend(0..visible),
        Some(sel) => {
            if sel.n_sel == 0 || r >= sel.ids.len() / sel.n_sel {
                return Err(OpError::Index {
                    op: OP,
                    what: "compressed selection row",
                    index: r as i64,
                    bound: sel.ids.len().checked_div(sel.n_sel).unwrap_or(0),
                });
            }
            out.extend(
                sel.row(r)
                    .iter()
                    .filter_map(|&j| usize::try_from(j).ok())
                    .filter(|&j| j < visible),
            );
            out.sort_unstable();
            out.dedup();
        }
    }
    Ok(())
}

/// Calls `f(slot, seen)` with row `r`'s checked slot and the cache positions it sees: its
/// window's span (refused when longer than the cache), or with a selection its sorted list.
fn with_positions<R>(
    r: usize,
    slot: u32,
    pos: i32,
    p: &AttentionParams,
    f: impl FnOnce(usize, Seen<'_>) -> R,
) -> Result<R, OpError> {
    let Some(sel) = p.selected else {
        let (slot, lo, hi) = visible(slot, pos, p)?;
        return Ok(f(slot, Seen::Span(lo, hi)));
    };
    let (slot, _, hi) = locate("attention", slot, pos, p)?;
    if p.window.is_some_and(|w| w > p.cache_len) {
        return Err(OpError::Parameter {
            op: "attention",
            what: format!(
                "a window of {} positions over a cache of {} rows per slot",
                p.window.unwrap_or(0),
                p.cache_len
            ),
        });
    }
    if sel.n_sel == 0 || r >= sel.ids.len() / sel.n_sel {
        return Err(OpError::Index {
            op: "attention",
            what: "selection row",
            index: r as i64,
            bound: sel.ids.len().checked_div(sel.n_sel).unwrap_or(0),
        });
    }
    SEEN.with(|cell| {
        let mut list = cell.borrow_mut();
        selected_positions(sel.row(r), hi, p.window, p.cache_len, &mut list)?;
        Ok(f(slot, Seen::List(&list)))
    })
}

/// Attention of one row's query heads that read KV head `kvh` (heads `kvh · G .. (kvh + 1) · G`,
/// `G = n_head / n_head_kv`): `q`, `[head_dim_k, G]` f32, over the cache, into `out`,
/// `[head_dim_v, G]` f32; the row is in sequence slot `slot` at position `pos`, as in
/// [`attention`], and is row `row` of the call's selection when there is one. No allocation
/// once this thread's scratch has grown.
#[allow(clippy::too_many_arguments)]
pub fn attention_group(
    q: &[f32],
    row: usize,
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
    with_seen(row, slot, pos, p, |slot, seen, comp| {
        attend_group(q, slot, seen, comp, kvh, k_cache, v_cache, p, out)
    })
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
    let (k_width, v_width) = (p.head_dim_k * p.n_head_kv, v_row_width(p));
    check_len(OP, "k_cache", k_cache.len(), mul_dims(OP, k_width, rows)?)?;
    check_len(OP, "v_cache", v_cache.len(), mul_dims(OP, v_width, rows)?)?;
    if p.v_from_k {
        if p.head_dim_v > p.head_dim_k {
            return Err(OpError::Parameter {
                op: OP,
                what: format!(
                    "values taken from the keys (v_from_k) need dv {} <= dk {}",
                    p.head_dim_v, p.head_dim_k
                ),
            });
        }
        if let Some(t) = k_cache.quant_type() {
            return Err(OpError::Parameter {
                op: OP,
                what: format!("values taken from the keys (v_from_k) of a {t} cache"),
            });
        }
    }
    for (cache, d, what) in [(k_cache, p.head_dim_k, "K"), (v_cache, p.head_dim_v, "V")] {
        if let Some(t) = cache.quant_type() {
            if !d.is_multiple_of(32) {
                return Err(OpError::Parameter {
                    op: OP,
                    what: format!(
                        "a {t} {what} cache needs heads of a multiple of 32 values, not {d}"
                    ),
                });
            }
        }
    }
    if let Some(s) = p.sinks {
        check_len(OP, "sinks", s.len(), p.n_head)?;
    }
    if let Some(c) = p.comp {
        if !p.v_from_k || c.ratio == 0 {
            return Err(OpError::Parameter {
                op: OP,
                what: format!(
                    "compressed rows need values from the keys (v_from_k) and a ratio, not {}",
                    c.ratio
                ),
            });
        }
        let comp_rows = mul_dims(OP, c.len, p.n_slots)?;
        check_len(OP, "comp", c.cache.len(), mul_dims(OP, k_width, comp_rows)?)?;
    }
    Ok(())
}

/// Values per cache row of the V source: the K cache's row with `v_from_k`.
fn v_row_width(p: &AttentionParams) -> usize {
    if p.v_from_k {
        p.head_dim_k * p.n_head_kv
    } else {
        p.head_dim_v * p.n_head_kv
    }
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
    /// Per-thread scratch of a quantized key cache: the group's query heads in the keys' dot
    /// product format.
    static QUANT_Q: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
    /// Per-thread scratch of rotated rows: the group's query heads, or a row being stored.
    static ROTATED: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// `rows` rotated in chunks of `rot` into this thread's scratch, handed to `f` (`rows` itself
/// when `rot` is 0). Grows the scratch once, then does not allocate.
fn with_rotated<R>(rows: &[f32], rot: usize, f: impl FnOnce(&[f32]) -> R) -> R {
    if rot == 0 {
        return f(rows);
    }
    ROTATED.with(|cell| {
        let mut buf = cell.borrow_mut();
        if buf.len() < rows.len() {
            buf.resize(rows.len(), 0.0);
        }
        let r = &mut buf[..rows.len()];
        r.copy_from_slice(rows);
        // The chunk was checked against the row's width by the caller.
        let _ = super::hadamard::walsh_hadamard(r, rot);
        f(r)
    })
}

/// The attention loop proper for one group of query heads sharing KV head `kvh`; every length
/// and index was checked by the caller. Two passes per head, as ggml's unfused path computes it:
/// every score (`q·k · scale`, softcapped), then `softmax` (max, exponentials, the sum in f64),
/// then `Σ p·v` with the normalised weights; each cached row is widened (or dequantized) once for
/// every head of the group. A quantized key cache scores each head's query quantized to the
/// keys' dot-product format, as llama.cpp's CPU flash attention does. Scratch grows per thread
/// and is then reused.
#[allow(clippy::too_many_arguments)]
fn attend_group(
    q: &[f32],
    slot: usize,
    seen: Seen<'_>,
    comp: &[usize],
    kvh: usize,
    k_cache: KvCache,
    v_cache: KvCache,
    p: &AttentionParams,
    out: &mut [f32],
) {
    let (dk, dv) = (p.head_dim_k, p.head_dim_v);
    let (k_width, v_width) = (dk * p.n_head_kv, v_row_width(p));
    // Where KV head `kvh`'s values start in a V row: after the earlier heads' keys with v_from_k.
    let v_head = if p.v_from_k { dk } else { dv } * kvh;
    let group = p.n_head / p.n_head_kv;
    let n_seen = seen.len();
    let n = n_seen + comp.len();
    // The compressed rows' starts (f32, K = V): after the cache's positions in the scores.
    let comp_start = |j: usize| {
        p.comp
            .map(|c| ((slot * c.len + j) * k_width + kvh * dk, c.cache))
            .unwrap_or((0, &[]))
    };
    // A quantized key cache: the group's query heads in the keys' dot-product format.
    let k_dot = k_cache
        .quant_type()
        .and_then(|t| Some((t, quant::vec_dot_type(t)?)));
    let q_bytes = k_dot
        .and_then(|(_, at)| at.row_bytes(dk as u64))
        .map_or(0, |b| b as usize);
    QUANT_Q.with(|qcell| {
        let mut qq = qcell.borrow_mut();
        if let Some((_, at)) = k_dot {
            if qq.len() < group * q_bytes {
                qq.resize(group * q_bytes, 0);
            }
            // The queries rotated as the keys were stored (llama.cpp rotates them before
            // quantizing them for the dot products).
            with_rotated(&q[..group * dk], p.rot_k, |q| {
                for g in 0..group {
                    // Lengths were checked: dk is whole blocks.
                    let _ = quant::quantize_act_row(
                        at,
                        &q[g * dk..][..dk],
                        &mut qq[g * q_bytes..][..q_bytes],
                    );
                }
            });
        }
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
            for (i, t) in seen.iter().enumerate() {
                let start = (slot * p.cache_len + t % p.cache_len) * k_width + kvh * dk;
                let kq = k_dot.map(|_| k_cache.quant_bytes(start, dk));
                let kr = if kq.is_some() {
                    &krow[..0]
                } else {
                    k_cache.row(start, dk, krow)
                };
                for (g, max) in per_head[..group].iter_mut().enumerate() {
                    let raw = match (k_dot, kq) {
                        (Some((t, _)), Some(kb)) => {
                            quant::vec_dot(t, dk, kb, &qq[g * q_bytes..][..q_bytes]).unwrap_or(0.0)
                        }
                        _ => dot(&q[g * dk..][..dk], kr),
                    };
                    let mut s = raw * p.scale;
                    if let Some(c) = p.softcap {
                        s = c * (s / c).tanh();
                    }
                    scores[g * n + i] = s;
                    *max = max.max(s);
                }
            }
            for (i, &j) in comp.iter().enumerate() {
                let (start, rows) = comp_start(j);
                let kr = &rows[start..][..dk];
                for (g, max) in per_head[..group].iter_mut().enumerate() {
                    let mut s = dot(&q[g * dk..][..dk], kr) * p.scale;
                    if let Some(c) = p.softcap {
                        s = c * (s / c).tanh();
                    }
                    scores[g * n + n_seen + i] = s;
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
            for (i, t) in seen.iter().enumerate() {
                let start = (slot * p.cache_len + t % p.cache_len) * v_width + v_head;
                let vr = v_cache.row(start, dv, vrow);
                add_weighted(out, &scores[i..], n, &per_head[..group], vr);
            }
            for (i, &j) in comp.iter().enumerate() {
                let (start, rows) = comp_start(j);
                add_weighted(
                    out,
                    &scores[n_seen + i..],
                    n,
                    &per_head[..group],
                    &rows[start..][..dv],
                );
            }
            if v_cache.quant_type().is_some() && p.rot_v > 0 {
                // The values were stored rotated: rotate each head's output back. The chunk was
                // checked against dv.
                let _ = super::hadamard::walsh_hadamard(out, p.rot_v);
            }
        })
    })
}

/// `out[g] += scores[g·n]·inv[g]·v` for each head `g` of the group (`out` `[dv, G]`), skipping
/// zero and NaN weights.
fn add_weighted(out: &mut [f32], scores: &[f32], n: usize, inv: &[f32], v: &[f32]) {
    let dv = v.len();
    for (g, &inv) in inv.iter().enumerate() {
        let w = scores[g * n] * inv;
        if w == 0.0 || w.is_nan() {
            continue;
        }
        out[g * dv..][..dv]
            .iter_mut()
            .zip(v)
            .for_each(|(a, &b)| *a += w * b);
    }
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
    for (rot, d, what) in [
        (p.rot_k, p.head_dim_k, "rot_k"),
        (p.rot_v, p.head_dim_v, "rot_v"),
    ] {
        if rot != 0 && !(rot.is_power_of_two() && d.is_multiple_of(rot)) {
            return bad(format!(
                "{what} {rot} is not a power of two dividing the head width {d}"
            ));
        }
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
/// Every index is checked before anything is written. No allocation. [`store_kv_rotated`] with
/// no rotation.
pub fn store_kv(
    rows: &[f32],
    width: usize,
    slots: &[u32],
    positions: &[i32],
    cache: KvCacheMut,
    cache_len: usize,
    n_slots: usize,
) -> Result<(), OpError> {
    store_kv_rotated(rows, width, slots, positions, cache, cache_len, n_slots, 0)
}

/// [`store_kv`], a quantized cache's rows rotated by the Walsh-Hadamard transform in chunks of
/// `rot` values (a power of two dividing `width`; 0 = none) before they are quantized, as
/// llama.cpp stores them; f32 and f16 caches are not rotated. No allocation once this thread's
/// scratch has grown.
#[allow(clippy::too_many_arguments)]
pub fn store_kv_rotated(
    rows: &[f32],
    width: usize,
    slots: &[u32],
    positions: &[i32],
    cache: KvCacheMut,
    cache_len: usize,
    n_slots: usize,
    rot: usize,
) -> Result<(), OpError> {
    const OP: &str = "store_kv";
    if rot != 0 && !(rot.is_power_of_two() && width.is_multiple_of(rot)) {
        return Err(OpError::Parameter {
            op: OP,
            what: format!("rotation of {rot} values is not a power of two dividing {width}"),
        });
    }
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
        KvCacheMut::Quant(t, c) => {
            if !width.is_multiple_of(32) {
                return Err(OpError::Parameter {
                    op: OP,
                    what: format!("a {t} cache needs rows of a multiple of 32 values, not {width}"),
                });
            }
            quant_elements(*t, c.len())
        }
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
        KvCacheMut::Quant(t, c) => {
            let row = t.row_bytes(width as u64).map_or(0, |b| b as usize);
            for (r, src) in rows.chunks_exact(width).enumerate() {
                let at = index(r)? / width * row;
                with_rotated(src, rot, |src| {
                    quant::quantize_kv_row(t, src, &mut c[at..][..row])
                })
                .map_err(|e| OpError::Parameter {
                    op: OP,
                    what: e.to_string(),
                })?;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
#[path = "attention_tests.rs"]
mod tests;

#[cfg(test)]
#[path = "attention_latent_tests.rs"]
mod latent_tests;
