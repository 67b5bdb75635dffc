//! Calls launched as one kernel when consecutive calls of a pass form a pattern (as llama.cpp's
//! CUDA backend fuses add + rms_norm): a residual `Add` and the `RmsNorm` of its result; a
//! `Unary` and the `Mul` of its result with a same-shape tensor (output gates); a strided `Copy`
//! and the `L2Norm` of its result (q and k split out of the DeltaNet convolution); the router's
//! logits and the choice of experts from them; a run of small contiguous copies (the tiered
//! executor's packing of a layer's inputs and its signal to the host). Those kernels still write
//! the first call's result,
//! so any later reader sees what it would have, and each thread reads back only what it wrote, so
//! tensors sharing reused memory stay safe. Two patterns skip results instead, taken only when no
//! later call reads them ([`skipped_read_later`]): a sigmoid-gated shared expert's sum (its gate's
//! product, the sigmoid, the Mul and the Add), and a Gated DeltaNet mixer's decode step (`gdn`).

use bloomery_plugin_api::op::{Op, RopeParams, RouterParams, UnaryFn};
use bloomery_plugin_api::tensor::{OpCall, TensorRef};
use bloomery_plugin_api::{DType, PluginError};
use cudarc::driver::{DeviceRepr, LaunchConfig};

use super::{
    driver_err, gating_code, quantized_reader, rope_args, unary_code, weight_code, Buffers,
    Launcher, Quantized, RopeArgs,
};

/// A contiguous f32 tensor of extents `ne`.
pub(super) fn plain(t: &TensorRef, ne: [u64; 4]) -> bool {
    t.dtype == DType::F32 && t.is_contiguous() && t.ne == ne
}

/// Threads of a row kernel with `ncols` columns: a thread per 2 columns, 32 to 1024.
fn row_threads(ncols: u64) -> u32 {
    (ncols as u32).div_ceil(64).clamp(1, 32) * 32
}

/// Quads (4 floats) per thread of the norms' register form (`NORM_QUADS` in cu/kernels.cu).
pub(crate) const NORM_QUADS: u64 = 4;

/// Threads per row of `bl_rms_norm_f32` / `bl_add_rms_norm_f32` and their `quads` argument: the
/// register form (`rms_norm_quads`) when rows are whole quads that 1,024 threads can hold and
/// every row pointer is 16-byte aligned, else a thread per 2 columns.
pub(crate) fn norm_shape(ncols: u64, ptrs: &[u64]) -> (u32, i32) {
    let quads = ncols.is_multiple_of(4)
        && ncols <= 4 * NORM_QUADS * 1024
        && ptrs.iter().all(|p| p.is_multiple_of(16));
    if quads {
        let threads = (ncols / 4).div_ceil(NORM_QUADS).div_ceil(32).clamp(1, 32) as u32 * 32;
        (threads, 1)
    } else {
        (row_threads(ncols), 0)
    }
}

fn launch_cfg(blocks: u32, threads: u32) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (blocks, 1, 1),
        block_dim: (threads, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// What the routing kernels take of a RouterTopK + RouterWeights pair: device addresses (bias 0
/// when none) and the parameters as kernel arguments.
struct RouterArgs {
    logits: u64,
    bias: u64,
    ids: u64,
    weights: u64,
    n: u32,
    k: u32,
    rows: u64,
    gating: i32,
    norm: i32,
    norm_min: f32,
    scale: f32,
}

/// One product of `bl_matmul_q_parts`: weights, row stride, output, rows (cu/kernels.cu's
/// `MatmulPart`).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
struct MatmulPart {
    w: u64,
    stride: i64,
    y: u64,
    n: i32,
    pad: i32,
}

// SAFETY: plain old data laid out as the kernel's struct (two 8-byte words, a pointer, an int
// and padding to 8-byte alignment).
unsafe impl DeviceRepr for MatmulPart {}

/// Most copies one `bl_copy_words` launch takes (`COPY_RUN_MAX` in cu/kernels.cu).
const COPY_RUN_MAX: usize = 8;

/// Most 4-byte words one `bl_copy_words` launch moves (its one block's threads loop over them).
const COPY_RUN_WORDS: u64 = 16 * 1024;

/// One copy of `bl_copy_words`: source, destination, words (cu/kernels.cu's `CopyWords`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
struct CopyWords {
    src: u64,
    dst: u64,
    n: i64,
}

/// The copies of one `bl_copy_words` launch (cu/kernels.cu's `CopyRun`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
struct CopyRun {
    c: [CopyWords; COPY_RUN_MAX],
}

// SAFETY: plain old data laid out as the kernel's struct (eight triples of 8-byte words).
unsafe impl DeviceRepr for CopyRun {}

/// The leading run of `calls` that `bl_copy_words` takes in one launch, as (source,
/// destination) pairs: at least two copies of contiguous 4-byte values (F32 or I32, the type
/// kept), at most [`COPY_RUN_MAX`] and [`COPY_RUN_WORDS`] words in all, none of whose bytes
/// meets another's source or destination (so their order does not matter, except that the
/// kernel writes the last copy after every other one is visible, as a signal needs).
pub(super) fn copy_run(calls: &[OpCall]) -> Vec<(TensorRef, TensorRef)> {
    let mut run: Vec<(TensorRef, TensorRef)> = Vec::new();
    let mut words = 0;
    for c in calls.iter().take(COPY_RUN_MAX) {
        if c.op != Op::Copy || c.n_srcs != 1 {
            break;
        }
        let (x, d) = (c.srcs()[0], c.dst);
        let plain_words = |t: &TensorRef| {
            matches!(t.dtype, DType::F32 | DType::I32)
                && t.is_contiguous()
                && t.span_bytes().is_some()
        };
        let n = x.elements();
        let fits = x.dtype == d.dtype
            && x.ne == d.ne
            && plain_words(&x)
            && plain_words(&d)
            && n > 0
            && words + n <= COPY_RUN_WORDS;
        let apart = !x.shares_bytes(&d)
            && run.iter().all(|(a, b)| {
                [a, b]
                    .into_iter()
                    .all(|t| !t.shares_bytes(&x) && !t.shares_bytes(&d))
            });
        if !(fits && apart) {
            break;
        }
        words += n;
        run.push((x, d));
    }
    if run.len() < 2 {
        run.clear();
    }
    run
}

/// One (RmsNorm, Rope) pair that `bl_norm_rope_*` runs, with the K and V cache stores that follow
/// it: device addresses, the rope's kernel arguments, and the byte spans it reads and writes.
struct NormRopeGroup {
    x: u64,
    w: u64,
    normed: u64,
    out: u64,
    pos: TensorRef,
    pos_addr: u64,
    rope: RopeArgs,
    /// K cache, slots, cache length, slots in the cache, cache type.
    k_store: Option<(u64, u64, i32, i32, DType)>,
    /// V rows, V cache, V row width.
    v_store: Option<(u64, u64, i32)>,
    /// Byte ranges written, and every range read or written.
    writes: Vec<(u64, u64)>,
    touches: Vec<(u64, u64)>,
    /// Calls the group covers.
    taken: usize,
}

/// The tensors of two adds and an RMS norm at the head of `calls` that `bl_add2_rms_norm_f32`
/// runs (a MoE layer's parts summed, then the residual and the next norm): `m = a + b`, `d = c + m`
/// (the second Add reading `m` as either source), `out = rms_norm(d) · w`, all contiguous f32 of
/// one shape (`w` one row, or none). Each of `m`, `d` and `out` is an input exactly or meets none
/// of them (a thread reads an index's inputs before it writes that index). Returns
/// `[a, b, c, m, d, out]` and `w`.
pub(super) fn add2_norm_calls(calls: &[OpCall]) -> Option<([TensorRef; 6], Option<TensorRef>)> {
    let [first, second, norm, ..] = calls else {
        return None;
    };
    let Op::RmsNorm { .. } = norm.op else {
        return None;
    };
    if first.op != Op::Add || second.op != Op::Add || first.n_srcs != 2 || second.n_srcs != 2 {
        return None;
    }
    let (a, b, m) = (first.srcs()[0], first.srcs()[1], first.dst);
    let c = match (second.srcs()[0] == m, second.srcs()[1] == m) {
        (true, false) => second.srcs()[1],
        (false, true) => second.srcs()[0],
        _ => return None,
    };
    let (d, out) = (second.dst, norm.dst);
    if norm.srcs().first() != Some(&d) {
        return None;
    }
    let w = match norm.srcs().get(1) {
        Some(w) if w.dtype == DType::F32 && w.is_contiguous() && w.elements() == d.ne[0] => {
            Some(*w)
        }
        Some(_) => return None,
        None => None,
    };
    let ne = d.ne;
    let clear = |t: &TensorRef, inputs: &[&TensorRef]| {
        inputs
            .iter()
            .all(|u| !t.shares_bytes(u) || (t.buffer == u.buffer && t.offset == u.offset))
    };
    let holds = [&a, &b, &c, &m, &d, &out].into_iter().all(|t| plain(t, ne))
        && clear(&m, &[&a, &b, &c])
        && clear(&d, &[&a, &b, &c, &m])
        && clear(&out, &[&a, &b, &c, &m, &d])
        && w.is_none_or(|w| !out.shares_bytes(&w))
        && d.ne[0] <= i32::MAX as u64;
    holds.then_some(([a, b, c, m, d, out], w))
}

/// Whether a call of `later` (the rest of the pass, in order) reads memory of `t` before other
/// calls have overwritten all of it. Byte ranges within `t`'s buffer are followed: a later
/// tensor that the planner placed over part of `t` stops that part being `t`'s once written.
pub(super) fn read_later(t: &TensorRef, later: &[OpCall]) -> bool {
    let Some(len) = t.span_bytes() else {
        return true;
    };
    let mut live = vec![(t.offset, t.offset + len)];
    for c in later {
        let meets = |u: &TensorRef| {
            u.buffer == t.buffer
                && u.span_bytes()
                    .is_none_or(|n| live.iter().any(|&(s, e)| u.offset < e && s < u.offset + n))
        };
        if c.srcs().iter().any(meets) {
            return true;
        }
        if c.dst.buffer == t.buffer {
            let Some(n) = c.dst.span_bytes() else {
                return true;
            };
            let (ws, we) = (c.dst.offset, c.dst.offset + n);
            live = live
                .into_iter()
                .flat_map(|(s, e)| [(s, e.min(ws)), (s.max(we), e)])
                .filter(|(s, e)| s < e)
                .collect();
            if live.is_empty() {
                return false;
            }
        }
    }
    false
}

/// A byte range of one buffer: buffer, start, end.
type Range = (u64, u64, u64);

/// The bytes of `t` (`None` without a layout).
fn range(t: &TensorRef) -> Option<Range> {
    t.span_bytes().map(|n| (t.buffer, t.offset, t.offset + n))
}

/// `live` less the bytes of `w`.
fn without(live: Vec<Range>, (b, ws, we): Range) -> Vec<Range> {
    live.into_iter()
        .flat_map(|(lb, s, e)| {
            if lb == b {
                [(lb, s, e.min(ws)), (lb, s.max(we), e)]
            } else {
                [(lb, s, e), (lb, 0, 0)]
            }
        })
        .filter(|&(_, s, e)| s < e)
        .collect()
}

/// Whether `t` touches a byte of `live` (a tensor without a layout touches all of its buffer).
fn touches(t: &TensorRef, live: &[Range]) -> bool {
    let (b, s, e) = range(t).unwrap_or((t.buffer, 0, u64::MAX));
    live.iter().any(|&(lb, ls, le)| lb == b && s < le && ls < e)
}

/// Whether a call of `later` reads bytes that the calls of `group`, run one by one, would leave
/// holding a result the fused kernels do not write (every result not in `written`), before a call
/// writes over them. Reads of `copy_of` by the first later call do not count: it takes that
/// result's Q8_1 copy instead. A result without a layout counts as read.
pub(super) fn skipped_read_later(
    group: &[OpCall],
    written: &[TensorRef],
    later: &[OpCall],
    copy_of: Option<&TensorRef>,
) -> bool {
    let mut stale = Vec::new();
    for c in group {
        let Some(r) = range(&c.dst) else {
            return true;
        };
        stale = without(stale, r);
        if !written.contains(&c.dst) {
            stale.push(r);
        }
    }
    for (i, c) in later.iter().enumerate() {
        if stale.is_empty() {
            return false;
        }
        let takes_copy = |u: &TensorRef| {
            i == 0 && copy_of.is_some_and(|o| u.buffer == o.buffer && u.offset == o.offset)
        };
        if c.srcs()
            .iter()
            .any(|u| !takes_copy(u) && touches(u, &stale))
        {
            return true;
        }
        let Some(r) = range(&c.dst) else {
            return true;
        };
        stale = without(stale, r);
    }
    false
}

/// The weights, input, shared expert, routed sum and output of a sigmoid-gated shared expert's
/// sum at the head of `calls` (`out = moe + sh · sigmoid(w · x)` per row: a one-output F32
/// product, its sigmoid, the Mul and the Add), which `bl_gated_add_f32` runs writing only `out`:
/// taken when no later call reads the three results it skips, and `out` is each input exactly or
/// meets none of them (each thread writes only indices its row has read).
pub(super) fn gated_add_calls(calls: &[OpCall]) -> Option<[TensorRef; 5]> {
    let [mm, sig, mul, add, rest @ ..] = calls else {
        return None;
    };
    if mm.op != Op::MatMul
        || mm.n_srcs != 2
        || sig.op
            != (Op::Unary {
                f: UnaryFn::Sigmoid,
            })
        || sig.n_srcs != 1
        || mul.op != Op::Mul
        || mul.n_srcs != 2
        || add.op != Op::Add
        || add.n_srcs != 2
    {
        return None;
    }
    let (w, x) = (mm.srcs()[0], mm.srcs()[1]);
    let (k, rows) = (x.ne[0], x.rows());
    let (ne, one) = ([k, rows, 1, 1], [1, rows, 1, 1]);
    let other = |c: &OpCall, t: &TensorRef| match (c.srcs()[0] == *t, c.srcs()[1] == *t) {
        (true, false) => Some(c.srcs()[1]),
        (false, true) => Some(c.srcs()[0]),
        _ => None,
    };
    let (sh, moe) = (other(mul, &sig.dst)?, other(add, &mul.dst)?);
    let out = add.dst;
    let clear =
        |t: &TensorRef| !t.shares_bytes(&out) || (t.buffer == out.buffer && t.offset == out.offset);
    let holds = w.dtype == DType::F32
        && w.is_contiguous()
        && w.ne[0] == k
        && w.elements() == k
        && plain(&x, ne)
        && plain(&mm.dst, one)
        && sig.srcs()[0] == mm.dst
        && plain(&sig.dst, one)
        && [&sh, &mul.dst, &moe, &out]
            .into_iter()
            .all(|t| plain(t, ne))
        && [&x, &sh, &moe].into_iter().all(clear)
        && (1..=u64::from(u32::MAX)).contains(&rows)
        && k <= i32::MAX as u64;
    (holds && !skipped_read_later(&calls[..4], &[out], rest, None)).then_some([w, x, sh, moe, out])
}

/// Where the calls of a pass start a run of copies that the bundles launch as one kernel
/// ([`copy_run`]: the tiered executor's packing and signal), with the copies each takes; runs are
/// found as the launcher meets them, from the first call on.
pub fn copy_runs(calls: &[OpCall]) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < calls.len() {
        match copy_run(&calls[i..]).len() {
            0 => i += 1,
            n => {
                out.push((i, n));
                i += n;
            }
        }
    }
    out
}

/// Where the calls of a pass start two adds and an RMS norm that the bundles launch as one kernel
/// ([`add2_norm_calls`]: a tiered layer's parts summed, then the residual and the next norm).
pub fn add2_norms(calls: &[OpCall]) -> Vec<usize> {
    (0..calls.len())
        .filter(|&i| add2_norm_calls(&calls[i..]).is_some())
        .collect()
}

/// Where the calls of a pass start a sigmoid-gated shared expert's sum that the bundles launch as
/// one kernel (for tests of the graphs and memory plans that must keep these calls in this form).
pub fn gated_adds(calls: &[OpCall]) -> Vec<usize> {
    (0..calls.len())
        .filter(|&i| gated_add_calls(&calls[i..]).is_some())
        .collect()
}

/// Whether no range of `a` meets a range of `b`.
fn disjoint(a: &[(u64, u64)], b: &[(u64, u64)]) -> bool {
    a.iter()
        .all(|&(s, e)| b.iter().all(|&(s2, e2)| e <= s2 || e2 <= s))
}

/// The (RmsNorm, Rope [, K store [, V store]]) group at the head of `calls`, or `None` when they
/// do not form one.
fn norm_rope_group(
    addr: &dyn Fn(&TensorRef) -> Result<u64, PluginError>,
    calls: &[OpCall],
    p: RopeParams,
) -> Result<Option<NormRopeGroup>, PluginError> {
    let (norm, rope) = (&calls[0], &calls[1]);
    if rope.n_srcs != 2 || norm.n_srcs == 0 {
        return Ok(None);
    }
    let (x, out) = (norm.srcs()[0], rope.dst);
    let ne = out.ne;
    if rope.srcs()[0] != norm.dst || ![&x, &norm.dst, &out].into_iter().all(|t| plain(t, ne)) {
        return Ok(None);
    }
    let pos = rope.srcs()[1];
    let Ok(r) = rope_args(&p, &norm.dst, &pos, &out) else {
        return Ok(None);
    };
    let (hd, nh, rows) = (ne[0], ne[1], ne[2] * ne[3]);
    let threads = (hd / 2).div_ceil(32) * 32;
    if r.rows == 0 || threads > 1024 || !pos.is_contiguous() {
        return Ok(None);
    }
    let span = |t: &TensorRef| -> Result<(u64, u64), PluginError> {
        let a = addr(t)?;
        Ok((a, a + t.span_bytes().unwrap_or(u64::MAX - a)))
    };
    let mut touches = vec![span(&x)?, span(&pos)?];
    let w = match norm.srcs().get(1) {
        Some(w) if plain(w, [hd, 1, 1, 1]) => {
            touches.push(span(w)?);
            addr(w)?
        }
        Some(_) => return Ok(None),
        None => 0u64,
    };
    // The norm's own result is written only when a later call reads it.
    let normed_read = read_later(&norm.dst, &calls[2..]);
    let mut writes = vec![span(&out)?];
    if normed_read {
        writes.push(span(&norm.dst)?);
    }
    // A store of `out` (reshaped to [hd·nh, rows]) into a cache.
    let store_of = |c: &OpCall, rows_ok: &dyn Fn(&TensorRef) -> bool| -> Option<TensorRef> {
        if !matches!(c.op, Op::CacheStore) || c.n_srcs != 4 {
            return None;
        }
        let (t, cache, slots, at) = (c.srcs()[0], c.srcs()[1], c.srcs()[2], c.srcs()[3]);
        let ok = rows_ok(&t)
            && cache == c.dst
            && matches!(cache.dtype, DType::F32 | DType::F16)
            && cache.is_contiguous()
            && cache.ne[0] == t.ne[0]
            && at == pos
            && slots.dtype == DType::I32
            && slots.is_contiguous()
            && slots.elements() == rows;
        ok.then_some(cache)
    };
    let k_rows = |t: &TensorRef| {
        t.buffer == out.buffer && t.offset == out.offset && plain(t, [hd * nh, rows, 1, 1])
    };
    let k_cache = calls.get(2).and_then(|c| store_of(c, &k_rows));
    let v = match (k_cache, calls.get(3)) {
        (Some(kc), Some(c)) => {
            let v_rows =
                |t: &TensorRef| t.dtype == DType::F32 && t.is_contiguous() && t.rows() == rows;
            store_of(c, &v_rows)
                .filter(|vc| vc.dtype == kc.dtype && c.srcs()[2] == calls[2].srcs()[2])
                .map(|vc| (c.srcs()[0], vc))
        }
        _ => None,
    };
    let k_store = match k_cache {
        Some(kc) => {
            let slots = calls[2].srcs()[2];
            touches.push(span(&slots)?);
            writes.push(span(&kc)?);
            Some((
                addr(&kc)?,
                addr(&slots)?,
                kc.ne[1] as i32,
                kc.ne[2] as i32,
                kc.dtype,
            ))
        }
        None => None,
    };
    let v_store = match v {
        Some((v, vc)) => {
            touches.push(span(&v)?);
            writes.push(span(&vc)?);
            Some((addr(&v)?, addr(&vc)?, v.ne[0] as i32))
        }
        None => None,
    };
    touches.extend_from_slice(&writes);
    Ok(Some(NormRopeGroup {
        x: addr(&x)?,
        w,
        normed: if normed_read { addr(&norm.dst)? } else { 0 },
        out: addr(&out)?,
        pos,
        pos_addr: addr(&pos)?,
        rope: r,
        k_store,
        v_store,
        writes,
        touches,
        taken: 2 + usize::from(k_store.is_some()) + usize::from(v_store.is_some()),
    }))
}

impl Launcher {
    /// Launches the leading calls of `calls` as one kernel when they form a pattern of this
    /// module, returning how many it took.
    pub fn fused(
        &self,
        bufs: &dyn Buffers,
        calls: &[OpCall],
    ) -> Result<Option<usize>, PluginError> {
        let [first, second, ..] = calls else {
            return Ok(None);
        };
        if second.srcs().is_empty() {
            return Ok(None);
        }
        let addr = |t: &TensorRef| -> Result<u64, PluginError> {
            let span = t
                .span_bytes()
                .ok_or_else(|| PluginError::invalid("a fused call's tensor has no layout"))?;
            bufs.address(t.buffer, t.offset, span)
        };
        let held = *self
            .quantized
            .lock()
            .map_err(|_| PluginError::device("quantized-input record poisoned"))?;
        // The Q8_1 copy the scratch holds after the fused kernel, if any.
        let mut copy = None;
        let pair = |launched: bool| if launched { 2 } else { 0 };
        // The copy `held` after a kernel that wrote the first n calls' results and not the
        // scratch: kept unless one of those results overlaps the quantized activations.
        let kept = |n: usize| -> Result<Option<Quantized>, PluginError> {
            let Some(h) = held else {
                return Ok(None);
            };
            for c in &calls[..n] {
                if !h.clear_of(addr(&c.dst)?, c.dst.span_bytes().unwrap_or(u64::MAX)) {
                    return Ok(None);
                }
            }
            Ok(Some(h))
        };
        let taken = match (first.op, second.op) {
            (Op::Add, Op::Add) => match self.add2_rms_norm(&addr, calls)? {
                Some(launched) => {
                    copy = launched;
                    3
                }
                None => 0,
            },
            (Op::Add, Op::RmsNorm { eps }) => {
                let quantize = quantized_reader(&second.dst, &calls[2..]);
                let launched = self.add_rms_norm(&addr, first, second, eps, quantize)?;
                copy = launched.flatten();
                pair(launched.is_some())
            }
            (Op::Unary { f }, Op::Mul) => {
                pair(self.unary_mul(&addr, first, second, unary_code(f))?)
            }
            (Op::Copy, Op::L2Norm { eps }) => {
                pair(self.copy_l2_norm(bufs, &addr, first, second, eps)?)
            }
            (Op::Copy, Op::Copy) => {
                let taken = self.copy_words(&addr, calls)?;
                // Copies leave the scratch alone, and the activations unless they wrote there.
                if taken > 0 {
                    copy = kept(taken)?;
                }
                taken
            }
            (Op::RouterTopK(p), Op::RouterWeights(q)) if p == q => {
                let launched = self.router(&addr, first, second, p)?;
                // Routing leaves the scratch alone, and the activations unless it wrote there.
                if launched {
                    copy = kept(2)?;
                }
                pair(launched)
            }
            (Op::MatMul, Op::RouterTopK(p)) => {
                let launched = self.router_logits(&addr, calls, p)?;
                // As for the routing pair alone; the logits are not in the scratch either.
                if launched {
                    copy = kept(3)?;
                }
                if launched {
                    3
                } else {
                    0
                }
            }
            (
                Op::MatMul,
                Op::Unary {
                    f: UnaryFn::Sigmoid,
                },
            ) => match self.gated_add(&addr, calls)? {
                // The kernel writes only the sum, one of the four results.
                true => {
                    copy = kept(4)?;
                    4
                }
                false => 0,
            },
            (Op::RmsNorm { eps }, Op::Rope(p)) => self.norm_rope(&addr, calls, eps, p)?,
            (
                Op::Unary {
                    f: UnaryFn::Sigmoid,
                },
                Op::Add,
            ) => match self.gdn_step(&addr, calls)? {
                Some((n, c)) => {
                    copy = c;
                    n
                }
                None => 0,
            },
            (Op::MatMul, Op::MatMul) => match self.gdn_step(&addr, calls)? {
                Some((n, c)) => {
                    copy = c;
                    n
                }
                // The shared expert's products start its group with the routed experts; the
                // group leaves no copy (its output may be over the activations).
                None => match self.moe_shared(bufs, calls, held)? {
                    0 => match self.matmul_parts(&addr, calls, held)? {
                        Some((n, c)) => {
                            copy = c;
                            n
                        }
                        None => 0,
                    },
                    n => n,
                },
            },
            _ => 0,
        };
        if taken == 0 {
            return Ok(None);
        }
        // Unless a copy was kept or written, a quantized product after this quantizes afresh.
        *self
            .quantized
            .lock()
            .map_err(|_| PluginError::device("quantized-input record poisoned"))? = copy;
        Ok(Some(taken))
    }

    /// `d = a + b; out = rms_norm(d) · w` for same-shape `a`, `b`; with `quantize`, also the
    /// Q8_1 copy of `out` in the scratch. `None`: the pattern does not hold; else the copy
    /// written, if any.
    fn add_rms_norm(
        &self,
        addr: &dyn Fn(&TensorRef) -> Result<u64, PluginError>,
        add: &OpCall,
        norm: &OpCall,
        eps: f32,
        quantize: bool,
    ) -> Result<Option<Option<Quantized>>, PluginError> {
        let ne = add.dst.ne;
        if add.n_srcs != 2 || norm.srcs()[0] != add.dst {
            return Ok(None);
        }
        let (a, b) = (&add.srcs()[0], &add.srcs()[1]);
        if ![a, b, &add.dst, &norm.dst]
            .into_iter()
            .all(|t| plain(t, ne))
        {
            return Ok(None);
        }
        let ncols = ne[0];
        let pw = match norm.srcs().get(1) {
            Some(w) if w.dtype == DType::F32 && w.is_contiguous() && w.elements() == ncols => {
                addr(w)?
            }
            Some(_) => return Ok(None),
            None => 0u64,
        };
        let (pa, pb, pd, po) = (addr(a)?, addr(b)?, addr(&add.dst)?, addr(&norm.dst)?);
        let n = ncols as i32;
        let f = self.func("bl_add_rms_norm_f32")?;
        let mut l = self.args(&f);
        // Each warp of the kernel holds whole 32-value blocks when rows are whole blocks.
        let copy = self.copy_slot(
            quantize && ncols.is_multiple_of(32),
            po,
            norm.dst.elements(),
        )?;
        let q = copy.map_or(0u64, |c| c.q);
        let (threads, quads) = norm_shape(ncols, &[pa, pb, pd, pw, po]);
        l.arg(&pa)
            .arg(&pb)
            .arg(&pd)
            .arg(&pw)
            .arg(&po)
            .arg(&q)
            .arg(&n)
            .arg(&eps)
            .arg(&quads);
        // SAFETY: one block per row of ncols contiguous f32 in each tensor, whose spans the
        // buffer table checked.
        unsafe { l.launch(launch_cfg(norm.dst.rows() as u32, threads)) }
            .map_err(driver_err("bl_add_rms_norm_f32"))?;
        Ok(Some(copy))
    }

    /// Two adds and an RMS norm (see [`add2_norm_calls`]) at the head of `calls` as one kernel,
    /// with the Q8_1 copy of the norm's output when a quantized product reads it next. `None`:
    /// the pattern does not hold; else the copy written, if any.
    fn add2_rms_norm(
        &self,
        addr: &dyn Fn(&TensorRef) -> Result<u64, PluginError>,
        calls: &[OpCall],
    ) -> Result<Option<Option<Quantized>>, PluginError> {
        let Some(([a, b, c, m, d, out], w)) = add2_norm_calls(calls) else {
            return Ok(None);
        };
        let Op::RmsNorm { eps } = calls[2].op else {
            return Ok(None);
        };
        let ncols = d.ne[0];
        let pw = w.map(|w| addr(&w)).transpose()?.unwrap_or(0);
        let (pa, pb, pc, pm, pd, po) = (
            addr(&a)?,
            addr(&b)?,
            addr(&c)?,
            addr(&m)?,
            addr(&d)?,
            addr(&out)?,
        );
        let quantize = quantized_reader(&out, &calls[3..]);
        let copy = self.copy_slot(quantize && ncols.is_multiple_of(32), po, out.elements())?;
        let q = copy.map_or(0u64, |c| c.q);
        let (threads, quads) = norm_shape(ncols, &[pa, pb, pc, pm, pd, pw, po]);
        let n = ncols as i32;
        let f = self.func("bl_add2_rms_norm_f32")?;
        let mut l = self.args(&f);
        l.arg(&pa)
            .arg(&pb)
            .arg(&pc)
            .arg(&pm)
            .arg(&pd)
            .arg(&pw)
            .arg(&po)
            .arg(&q)
            .arg(&n)
            .arg(&eps)
            .arg(&quads);
        // SAFETY: one block per row of ncols contiguous f32 in each tensor, whose spans the
        // buffer table checked.
        unsafe { l.launch(launch_cfg(out.rows() as u32, threads)) }
            .map_err(driver_err("bl_add2_rms_norm_f32"))?;
        Ok(Some(copy))
    }

    /// `normed = rms_norm(x) · w` per head, `out = rope(normed)`, and when the next calls store
    /// `out` into a K cache and another tensor into a V cache of the same rows, those stores too:
    /// one kernel. A group without stores (Q) followed by another of the same rows, positions,
    /// norm and rope (K, with its stores) goes into the same launch. Returns how many calls it
    /// took (0: the pattern does not hold).
    fn norm_rope(
        &self,
        addr: &dyn Fn(&TensorRef) -> Result<u64, PluginError>,
        calls: &[OpCall],
        eps: f32,
        p: RopeParams,
    ) -> Result<usize, PluginError> {
        let Some(first) = norm_rope_group(addr, calls, p)? else {
            return Ok(0);
        };
        // The second group, when the first has no stores and the next calls form one with the
        // same shape and parameters whose tensors the first group's writes leave alone.
        let second = match (first.k_store, calls.get(2).map(|c| c.op)) {
            (None, Some(Op::RmsNorm { eps: e2 })) if e2 == eps => {
                match (calls.get(3).map(|c| c.op), calls.get(2..)) {
                    (Some(Op::Rope(p2)), Some(rest)) if p2 == p => norm_rope_group(addr, rest, p2)?
                        .filter(|g| {
                            g.rope.head_dim == first.rope.head_dim
                                && g.rope.rows == first.rope.rows
                                && g.pos == first.pos
                                && disjoint(&first.writes, &g.touches)
                                && disjoint(&g.writes, &first.touches)
                        }),
                    _ => None,
                }
            }
            _ => None,
        };
        let (q, main) = match second {
            Some(k) => (Some(first), k),
            None => (None, first),
        };
        let name = match main.k_store.map(|k| k.4) {
            Some(DType::F16) => "bl_norm_rope_f16",
            _ => "bl_norm_rope_f32",
        };
        let r = &main.rope;
        let (pk, slots, len, n_slots, _) = main.k_store.unwrap_or((0, 0, 0, 0, DType::F32));
        let (pv, pvc, vw) = main.v_store.unwrap_or((0, 0, 0));
        let (qx, qw, qn, qo, qnh) = q.as_ref().map_or((0, 0, 0, 0, 0), |g| {
            (g.x, g.w, g.normed, g.out, g.rope.n_head)
        });
        let err = self.error_word;
        let f = self.func(name)?;
        let mut l = self.args(&f);
        l.arg(&main.x)
            .arg(&main.w)
            .arg(&main.normed)
            .arg(&main.out)
            .arg(&main.pos_addr);
        l.arg(&r.head_dim).arg(&r.n_head).arg(&r.rows).arg(&eps);
        l.arg(&r.neox)
            .arg(&r.n_dims)
            .arg(&r.log2_base)
            .arg(&p.freq_scale);
        l.arg(&p.ext_factor)
            .arg(&r.corr[0])
            .arg(&r.corr[1])
            .arg(&r.mscale);
        l.arg(&pk).arg(&slots).arg(&len).arg(&n_slots);
        l.arg(&pv).arg(&pvc).arg(&vw).arg(&err);
        l.arg(&qx).arg(&qw).arg(&qn).arg(&qo).arg(&qnh);
        let rows = r.rows as u64;
        let blocks =
            rows * (main.rope.n_head + qnh) as u64 + if main.v_store.is_some() { rows } else { 0 };
        let threads = (r.head_dim as u32 / 2).div_ceil(32) * 32;
        // SAFETY: one block per (row, head) of the checked contiguous tensors of each group (and
        // per V row); slots and positions are checked on the card before any cache row is
        // written; the groups' writes were checked not to meet the other group's tensors.
        unsafe { l.launch(launch_cfg(blocks as u32, threads)) }.map_err(driver_err(name))?;
        Ok(q.map_or(0, |g| g.taken) + main.taken)
    }

    /// Two or three quantized products of the same activations with weights of one type (Q, K
    /// and V), for a single row, a few rows (Q8_0, Q4_K) or a batch of tiled products: the
    /// activations quantized once (unless `held` has them) and every row of every product in one
    /// launch. Returns the calls taken and the Q8_1 copy left, or `None`.
    fn matmul_parts(
        &self,
        addr: &dyn Fn(&TensorRef) -> Result<u64, PluginError>,
        calls: &[OpCall],
        held: Option<Quantized>,
    ) -> Result<Option<(usize, Option<Quantized>)>, PluginError> {
        let x = calls[0].srcs().get(1).copied();
        let Some(x) = x.filter(|x| x.dtype == DType::F32 && x.is_contiguous()) else {
            return Ok(None);
        };
        let (k, m) = (x.ne[0], x.rows());
        // A single row, a few (the few-column form, when every part's rows suit it) or a batch
        // the tiled products take (one launch over every part's tiles).
        let tiled = self.mmq.kernels(m).map(|k| k.2);
        if x.ne != [k, m, 1, 1] || m > i32::MAX as u64 {
            return Ok(None);
        }
        let w0 = calls[0].srcs()[0];
        let Some((wtype, block)) = weight_code(w0.dtype).filter(|(c, _)| *c >= 1) else {
            return Ok(None);
        };
        if k % block.max(32) != 0 || k > i32::MAX as u64 {
            return Ok(None);
        }
        let px = addr(&x)?;
        let x_len = k * 4 * m;
        let mut parts = Vec::with_capacity(3);
        for c in calls.iter().take(3) {
            let ok = matches!(c.op, Op::MatMul)
                && c.n_srcs == 2
                && c.srcs()[1] == x
                && c.srcs()[0].dtype == w0.dtype
                && c.srcs()[0].ne[0] == k
                && c.srcs()[0].ne[2] == 1
                && c.srcs()[0].ne[3] == 1
                && plain(&c.dst, [c.srcs()[0].ne[1], m, 1, 1])
                && c.srcs()[0].ne[1] <= i32::MAX as u64;
            if !ok {
                break;
            }
            let (w, y) = (addr(&c.srcs()[0])?, addr(&c.dst)?);
            let y_len = c.dst.elements() * 4;
            // A product writing over the activations ends the group.
            if !(y + y_len <= px || px + x_len <= y) {
                break;
            }
            parts.push(MatmulPart {
                w,
                stride: c.srcs()[0].nb[1] as i64,
                y,
                n: c.srcs()[0].ne[1] as i32,
                pad: 0,
            });
        }
        if parts.len() < 2 {
            return Ok(None);
        }
        let few = if m > 1 && tiled.is_none() {
            let widest = parts.iter().map(|p| p.n as u64).max().unwrap_or(0);
            let suits = parts
                .iter()
                .all(|p| super::pairs_ok(wtype, p.w, p.stride, 0, k));
            let Some(form) = super::few_cols(wtype, widest, m).filter(|_| suits) else {
                return Ok(None);
            };
            Some(form)
        } else {
            None
        };
        let taken = parts.len();
        let rows: u64 = parts.iter().map(|p| p.n as u64).sum();
        while parts.len() < 3 {
            parts.push(MatmulPart {
                w: 0,
                stride: 0,
                y: 0,
                n: 0,
                pad: 0,
            });
        }
        let copy = self.quantize_in_scratch(px, k / 32 * m, held)?;
        let q = copy.q;
        let ki = k as i32;
        if let Some(name) = tiled {
            let tiles: u64 = parts
                .iter()
                .map(|p| (p.n as u64).div_ceil(super::MMQ_TILE))
                .sum();
            let (x_row, mi) = ((k / 32 * 36) as i64, m as i32);
            let f = self.func(name)?;
            let mut l = self.args(&f);
            l.arg(&parts[0])
                .arg(&parts[1])
                .arg(&parts[2])
                .arg(&wtype)
                .arg(&q)
                .arg(&x_row)
                .arg(&ki)
                .arg(&mi);
            let launch = LaunchConfig {
                grid_dim: (tiles as u32, m.div_ceil(super::MMQ_TILE) as u32, 1),
                block_dim: (super::MMQ_THREADS, 1, 1),
                shared_mem_bytes: 0,
            };
            // SAFETY: one block per 64 x 64 tile of one part; rows and columns past a part's rows
            // and the batch are neither read nor written; all inside the checked spans.
            unsafe { l.launch(launch) }.map_err(driver_err(name))?;
            return Ok(Some((taken, Some(copy))));
        }
        if let Some(form) = few {
            let warps: u64 = parts.iter().map(|p| (p.n as u64).div_ceil(form.rows)).sum();
            let (x_row, mi) = ((k / 32 * 36) as i64, m as i32);
            let f = self.func(form.parts)?;
            let mut l = self.args(&f);
            l.arg(&parts[0])
                .arg(&parts[1])
                .arg(&parts[2])
                .arg(&q)
                .arg(&x_row)
                .arg(&ki)
                .arg(&mi);
            let block = super::FEW_BLOCK;
            let launch = LaunchConfig {
                grid_dim: (
                    warps.div_ceil(u64::from(block / 32)) as u32,
                    m.div_ceil(form.cols) as u32,
                    1,
                ),
                block_dim: (block, 1, 1),
                shared_mem_bytes: 0,
            };
            // SAFETY: one warp per `form.rows` rows of one part (none past its rows), each pass of
            // `form.cols` columns below m; weights and outputs inside the checked spans.
            unsafe { l.launch(launch) }.map_err(driver_err(form.parts))?;
            return Ok(Some((taken, Some(copy))));
        }
        let name = super::typed(&super::MATMUL_Q_PARTS, wtype)?;
        let f = self.func(name)?;
        let mut l = self.args(&f);
        l.arg(&parts[0])
            .arg(&parts[1])
            .arg(&parts[2])
            .arg(&q)
            .arg(&ki);
        let launch = LaunchConfig {
            shared_mem_bytes: super::stage_bytes(wtype, k, 1),
            ..launch_cfg(rows.div_ceil(8) as u32, 256)
        };
        // SAFETY: one warp per row of the products, whose weights and outputs lie inside the
        // checked spans; q holds the activations' blocks.
        unsafe { l.launch(launch) }.map_err(driver_err(name))?;
        Ok(Some((taken, Some(copy))))
    }

    /// The arguments of a RouterTopK + RouterWeights pair over the same logits that the routing
    /// kernels take, or `None` when the pair does not suit them.
    fn router_args(
        &self,
        addr: &dyn Fn(&TensorRef) -> Result<u64, PluginError>,
        topk: &OpCall,
        weights: &OpCall,
        p: RouterParams,
    ) -> Result<Option<RouterArgs>, PluginError> {
        let logits = topk.srcs()[0];
        let (n, k) = (p.n_expert, p.k);
        let rows = logits.rows();
        let fits = p.n_group <= 1 && n <= 512 && k <= 32 && k <= n && rows <= i32::MAX as u64;
        if !fits
            || weights.n_srcs != 2
            || weights.srcs()[0] != logits
            || weights.srcs()[1] != topk.dst
            || !plain(&logits, [u64::from(n), rows, 1, 1])
            || !plain(&weights.dst, [u64::from(k), rows, 1, 1])
            || topk.dst.dtype != DType::I32
            || !topk.dst.is_contiguous()
            || topk.dst.elements() != u64::from(k) * rows
        {
            return Ok(None);
        }
        let bias = if p.bias {
            match topk.srcs().get(1) {
                Some(b) if plain(b, [u64::from(n), 1, 1, 1]) => addr(b)?,
                _ => return Ok(None),
            }
        } else {
            0u64
        };
        Ok(Some(RouterArgs {
            logits: addr(&logits)?,
            bias,
            ids: addr(&topk.dst)?,
            weights: addr(&weights.dst)?,
            n,
            k,
            rows,
            gating: gating_code(p.gating),
            norm: i32::from(p.norm),
            norm_min: p.norm_min,
            scale: p.scale,
        }))
    }

    /// The chosen experts and their weights from the same logits in one kernel: a block per row.
    fn router(
        &self,
        addr: &dyn Fn(&TensorRef) -> Result<u64, PluginError>,
        topk: &OpCall,
        weights: &OpCall,
        p: RouterParams,
    ) -> Result<bool, PluginError> {
        let Some(a) = self.router_args(addr, topk, weights, p)? else {
            return Ok(false);
        };
        let (ni, ki, ri, err) = (a.n as i32, a.k as i32, a.rows as i32, self.error_word);
        let f = self.func("bl_router_topk_weights")?;
        let mut l = self.args(&f);
        l.arg(&a.logits)
            .arg(&a.bias)
            .arg(&a.ids)
            .arg(&a.weights)
            .arg(&ni)
            .arg(&ki)
            .arg(&ri);
        l.arg(&a.gating)
            .arg(&a.norm)
            .arg(&a.norm_min)
            .arg(&a.scale)
            .arg(&err);
        // SAFETY: one block per row of the checked logits, ids and weights, a thread per expert
        // (n <= 512 checked above).
        unsafe { l.launch(launch_cfg((a.rows as u32).max(1), a.n.div_ceil(32) * 32)) }
            .map_err(driver_err("bl_router_topk_weights"))?;
        Ok(true)
    }

    /// The router's logits (an F32 product with few outputs) and the RouterTopK + RouterWeights
    /// pair on them in one kernel (`bl_router_logits_topk`): a block per logit, the last of each
    /// row choosing its experts. Returns whether it launched.
    fn router_logits(
        &self,
        addr: &dyn Fn(&TensorRef) -> Result<u64, PluginError>,
        calls: &[OpCall],
        p: RouterParams,
    ) -> Result<bool, PluginError> {
        let [matmul, topk, weights, ..] = calls else {
            return Ok(false);
        };
        if !matches!(weights.op, Op::RouterWeights(q) if q == p) || matmul.n_srcs != 2 {
            return Ok(false);
        }
        let (w, x) = (matmul.srcs()[0], matmul.srcs()[1]);
        let (n_embd, rows) = (w.ne[0], x.rows());
        let few = u64::from(p.n_expert) * rows <= super::F32_SPLIT_MAX_TASKS
            && rows <= super::attention::SPLIT_COUNTERS;
        if !few
            || topk.srcs()[0] != matmul.dst
            || w.dtype != DType::F32
            || w.nb[0] != 4
            || w.ne != [n_embd, u64::from(p.n_expert), 1, 1]
            || !plain(&x, [n_embd, rows, 1, 1])
            || n_embd > i32::MAX as u64
        {
            return Ok(false);
        }
        let Some(a) = self.router_args(addr, topk, weights, p)? else {
            return Ok(false);
        };
        let (pw, px, stride) = (addr(&w)?, addr(&x)?, w.nb[1] as i64);
        let (ei, ni, ki, err) = (n_embd as i32, a.n as i32, a.k as i32, self.error_word);
        let f = self.func("bl_router_logits_topk")?;
        let mut l = self.args(&f);
        l.arg(&pw).arg(&stride).arg(&px).arg(&ei);
        l.arg(&a.logits)
            .arg(&a.bias)
            .arg(&a.ids)
            .arg(&a.weights)
            .arg(&ni)
            .arg(&ki);
        l.arg(&a.gating)
            .arg(&a.norm)
            .arg(&a.norm_min)
            .arg(&a.scale)
            .arg(&err)
            .arg(&self.split_counters);
        let threads = (a.n.div_ceil(32) * 32).max(super::F32_SPLIT_THREADS);
        // SAFETY: a block per (row, expert) of the checked weights, activations and logits, each
        // row's last block writing that row's ids and weights; rows <= the zeroed counters, which
        // the last blocks set back to zero.
        unsafe { l.launch(launch_cfg((u64::from(a.n) * a.rows) as u32, threads)) }
            .map_err(driver_err("bl_router_logits_topk"))?;
        Ok(true)
    }

    /// `u = f(x); out = other · u` for a `Mul` whose one operand is `u` and whose other has
    /// `u`'s shape.
    /// Launches the run of copies at the head of `calls` (see [`copy_run`]) as one
    /// `bl_copy_words`, returning how many it took (0: no run).
    fn copy_words(
        &self,
        addr: &dyn Fn(&TensorRef) -> Result<u64, PluginError>,
        calls: &[OpCall],
    ) -> Result<usize, PluginError> {
        let pairs = copy_run(calls);
        let mut run = CopyRun::default();
        for (slot, (x, d)) in run.c.iter_mut().zip(&pairs) {
            *slot = CopyWords {
                src: addr(x)?,
                dst: addr(d)?,
                n: x.elements() as i64,
            };
        }
        if pairs.is_empty() {
            return Ok(0);
        }
        let count = pairs.len() as i32;
        let f = self.func("bl_copy_words")?;
        let mut l = self.args(&f);
        l.arg(&run).arg(&count);
        // SAFETY: each copy's source and destination hold n contiguous 4-byte words (checked
        // spans); the slots past `count` are not read.
        unsafe { l.launch(launch_cfg(1, 512)) }.map_err(driver_err("bl_copy_words"))?;
        Ok(pairs.len())
    }

    fn unary_mul(
        &self,
        addr: &dyn Fn(&TensorRef) -> Result<u64, PluginError>,
        unary: &OpCall,
        mul: &OpCall,
        code: i32,
    ) -> Result<bool, PluginError> {
        let u = unary.dst;
        let ne = u.ne;
        if mul.n_srcs != 2 || unary.n_srcs != 1 {
            return Ok(false);
        }
        let other = match (mul.srcs()[0] == u, mul.srcs()[1] == u) {
            (true, false) => mul.srcs()[1],
            (false, true) => mul.srcs()[0],
            _ => return Ok(false),
        };
        let x = unary.srcs()[0];
        if ![&x, &u, &other, &mul.dst].into_iter().all(|t| plain(t, ne)) {
            return Ok(false);
        }
        let n = u.elements() as i64;
        let (px, pu, po, pout) = (addr(&x)?, addr(&u)?, addr(&other)?, addr(&mul.dst)?);
        let f = self.func("bl_unary_mul_f32")?;
        let mut l = self.args(&f);
        l.arg(&px).arg(&pu).arg(&po).arg(&pout).arg(&n).arg(&code);
        let blocks = (n as u64).div_ceil(256).clamp(1, 4096) as u32;
        // SAFETY: the four tensors hold n contiguous f32 each (checked spans).
        unsafe { l.launch(launch_cfg(blocks, 256)) }.map_err(driver_err("bl_unary_mul_f32"))?;
        Ok(true)
    }

    /// Launches a sigmoid-gated shared expert's sum (see [`gated_add_calls`]) at the head of
    /// `calls`, returning whether they formed one.
    fn gated_add(
        &self,
        addr: &dyn Fn(&TensorRef) -> Result<u64, PluginError>,
        calls: &[OpCall],
    ) -> Result<bool, PluginError> {
        let Some([w, x, sh, moe, out]) = gated_add_calls(calls) else {
            return Ok(false);
        };
        let (pw, px, psh, pm, po) = (addr(&w)?, addr(&x)?, addr(&sh)?, addr(&moe)?, addr(&out)?);
        let k = x.ne[0];
        // Blocks of 256 threads, each writing a slice of its row when out is not x's memory (a
        // block would otherwise write x while another of its row reads it).
        let slices = if x.shares_bytes(&out) {
            1
        } else {
            k.div_ceil(256)
        };
        let ki = k as i32;
        let f = self.func("bl_gated_add_f32")?;
        let mut l = self.args(&f);
        l.arg(&pw).arg(&px).arg(&psh).arg(&pm).arg(&po).arg(&ki);
        let launch = LaunchConfig {
            grid_dim: (x.rows() as u32, slices as u32, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: blocks (row, slice) read their row of k contiguous f32 in each tensor (checked
        // spans; w holds k) and write their slice of out's row; out meets x only with one slice.
        unsafe { l.launch(launch) }.map_err(driver_err("bl_gated_add_f32"))?;
        Ok(true)
    }

    /// `c = copy(x); out = l2_norm(c)` for an f32 source whose rows (ne0) are contiguous.
    fn copy_l2_norm(
        &self,
        bufs: &dyn Buffers,
        addr: &dyn Fn(&TensorRef) -> Result<u64, PluginError>,
        copy: &OpCall,
        norm: &OpCall,
        eps: f32,
    ) -> Result<bool, PluginError> {
        let (x, c) = (copy.srcs()[0], copy.dst);
        let ne = c.ne;
        if norm.srcs()[0] != c || !plain(&c, ne) || !plain(&norm.dst, ne) {
            return Ok(false);
        }
        if x.dtype != DType::F32 || x.ne != ne || x.nb[0] != 4 || x.offset % 4 != 0 {
            return Ok(false);
        }
        let rows = c.rows();
        let fits = |v: u64| v <= i32::MAX as u64;
        if x.nb[1..].iter().any(|b| b % 4 != 0) || rows == 0 || !fits(ne[1]) || !fits(ne[2]) {
            return Ok(false);
        }
        // The source spans up to its last element.
        let span = (0..4).fold(4u64, |end, d| end + x.nb[d] * (x.ne[d] - 1));
        let px = bufs.address(x.buffer, x.offset, span)?;
        let (pc, po) = (addr(&c)?, addr(&norm.dst)?);
        let (nb1, nb2, nb3) = (
            (x.nb[1] / 4) as i64,
            (x.nb[2] / 4) as i64,
            (x.nb[3] / 4) as i64,
        );
        let (ne1, ne2, ncols) = (ne[1] as i32, ne[2] as i32, ne[0] as i32);
        let f = self.func("bl_copy_l2_norm_f32")?;
        let mut l = self.args(&f);
        l.arg(&px)
            .arg(&nb1)
            .arg(&nb2)
            .arg(&nb3)
            .arg(&ne1)
            .arg(&ne2)
            .arg(&pc)
            .arg(&po)
            .arg(&ncols)
            .arg(&eps);
        // SAFETY: every source row lies inside the span the buffer table checked; c and out
        // hold rows × ncols contiguous f32.
        unsafe { l.launch(launch_cfg(rows as u32, row_threads(ne[0]))) }
            .map_err(driver_err("bl_copy_l2_norm_f32"))?;
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tensor(buffer: u64, dtype: DType, ne: [u64; 4]) -> TensorRef {
        TensorRef {
            buffer,
            offset: 0,
            dtype,
            ne,
            nb: TensorRef::contiguous_strides(dtype, ne).unwrap(),
        }
    }

    #[test]
    fn two_adds_and_a_norm_fuse_only_when_each_result_is_clear_of_the_inputs() {
        let row = [64, 1, 1, 1];
        let at = |buffer, offset| TensorRef {
            offset,
            ..tensor(buffer, DType::F32, row)
        };
        let add = |x: TensorRef, y: TensorRef, d: TensorRef| OpCall::new(Op::Add, &[x, y], d);
        let norm = |x: TensorRef, w: TensorRef, d: TensorRef| {
            OpCall::new(Op::RmsNorm { eps: 1e-6 }, &[x, w], d)
        };
        // A tiered layer's end: the bus share's part plus the host's (page-locked, buffer 9),
        // then the residual (the second Add reads the sum as its second source), then the norm.
        let (bus, host, res, w) = (at(1, 0), at(9, 0), at(2, 0), at(3, 0));
        let (sum, x, normed) = (at(4, 0), at(4, 256), at(4, 512));
        let calls = [add(bus, host, sum), add(res, sum, x), norm(x, w, normed)];
        let (t, weight) = add2_norm_calls(&calls).expect("the pattern");
        assert_eq!(t, [bus, host, res, sum, x, normed]);
        assert_eq!(weight, Some(w));
        // The sum as the second Add's first source: the same.
        let swapped = [calls[0], add(sum, res, x), calls[2]];
        assert_eq!(add2_norm_calls(&swapped).unwrap().0[2], res);
        // A result exactly over an input is fine; one partly over it is not.
        let over = [add(bus, host, bus), add(res, bus, x), norm(x, w, normed)];
        assert!(add2_norm_calls(&over).is_some());
        let partly = [
            add(bus, host, at(2, 128)),
            add(res, at(2, 128), x),
            norm(x, w, normed),
        ];
        assert!(add2_norm_calls(&partly).is_none());
        // The second Add not reading the sum, or the norm not reading the second Add's result.
        let apart = [calls[0], add(res, bus, x), calls[2]];
        assert!(add2_norm_calls(&apart).is_none());
        let other = [calls[0], calls[1], norm(res, w, normed)];
        assert!(add2_norm_calls(&other).is_none());
        // A broadcast add is not this kernel's.
        let one = TensorRef {
            ne: [1, 1, 1, 1],
            nb: [4, 4, 4, 4],
            ..at(5, 0)
        };
        let broadcast = [add(bus, one, sum), calls[1], calls[2]];
        assert!(add2_norm_calls(&broadcast).is_none());
    }

    #[test]
    fn a_run_of_copies_stops_where_order_would_matter() {
        let at = |buffer, offset, dtype, n| TensorRef {
            offset,
            ..tensor(buffer, dtype, [n, 1, 1, 1])
        };
        let copy = |x: TensorRef, d: TensorRef| OpCall::new(Op::Copy, &[x], d);
        // The tiered executor's packing: x, ids and weights into host memory (buffer 9), then
        // the signal word copied from the word before it.
        let x = copy(at(1, 0, DType::F32, 2048), at(9, 0, DType::F32, 2048));
        let ids = copy(at(2, 0, DType::I32, 8), at(9, 8192, DType::I32, 8));
        let w = copy(at(3, 0, DType::F32, 8), at(9, 8224, DType::F32, 8));
        let signal = copy(at(9, 8256, DType::I32, 1), at(9, 8260, DType::I32, 1));
        let add = OpCall::new(
            Op::Add,
            &[at(1, 0, DType::F32, 8), at(3, 0, DType::F32, 8)],
            at(4, 0, DType::F32, 8),
        );
        let pack = [x, ids, w, signal, add];
        let run = copy_run(&pack);
        assert_eq!(run.len(), 4);
        assert_eq!(run[3], (pack[3].srcs()[0], pack[3].dst));
        // A copy reading what an earlier one writes ends the run before it (it must see the
        // earlier result); so does one writing what an earlier one reads or writes.
        let reads_packed = copy(at(9, 0, DType::F32, 4), at(5, 0, DType::F32, 4));
        assert_eq!(copy_run(&[x, ids, reads_packed, w]).len(), 2);
        let over_source = copy(at(6, 0, DType::F32, 4), at(1, 64, DType::F32, 4));
        assert_eq!(copy_run(&[x, ids, over_source]).len(), 2);
        let over_dst = copy(at(6, 0, DType::I32, 4), at(9, 8200, DType::I32, 4));
        assert!(copy_run(&[ids, over_dst]).is_empty());
        // Conversions, strided views and runs too long for one block are not taken.
        let half = copy(at(1, 0, DType::F32, 8), at(7, 0, DType::F16, 8));
        assert!(copy_run(&[half, ids]).is_empty());
        let strided = OpCall::new(
            Op::Copy,
            &[TensorRef {
                ne: [4, 2, 1, 1],
                nb: [8, 32, 64, 64],
                ..at(1, 0, DType::F32, 8)
            }],
            tensor(7, DType::F32, [4, 2, 1, 1]),
        );
        assert!(copy_run(&[strided, ids]).is_empty());
        let big = copy(
            at(1, 0, DType::F32, 16 * 1024),
            at(8, 0, DType::F32, 16 * 1024),
        );
        assert!(copy_run(&[big, ids]).is_empty());
        assert!(copy_run(&[ids]).is_empty());
    }

    #[test]
    fn a_norm_result_counts_as_read_until_all_its_bytes_are_overwritten() {
        // q's normed rows: 4 heads of 8 floats (128 bytes) at offset 0 of buffer 1; k's normed
        // rows are later placed over its first 32 bytes.
        let at = |offset, ne: [u64; 4]| TensorRef {
            offset,
            ..tensor(1, DType::F32, ne)
        };
        let q_normed = at(0, [8, 4, 1, 1]);
        let k_normed = at(0, [8, 1, 1, 1]);
        let k_x = tensor(2, DType::F32, [8, 1, 1, 1]);
        let k_out = tensor(3, DType::F32, [8, 1, 1, 1]);
        let k_norm = OpCall::new(Op::RmsNorm { eps: 1e-6 }, &[k_x], k_normed);
        let k_rope = OpCall::new(Op::Add, &[k_normed, k_x], k_out);
        // Reading k's rows reads bytes k's norm wrote, not q's.
        assert!(!read_later(&q_normed, &[k_norm, k_rope]));
        // A read of q's other bytes is a read of q's rows...
        let tail = at(64, [8, 1, 1, 1]);
        let reader = OpCall::new(Op::Add, &[tail, k_x], k_out);
        assert!(read_later(&q_normed, &[k_norm, k_rope, reader]));
        // ...unless a write covered them first.
        let cover = OpCall::new(Op::Add, &[k_x, k_x], at(32, [24, 1, 1, 1]));
        assert!(!read_later(&q_normed, &[k_norm, cover, reader]));
        // Without the k norm's write, k's rope reads q's bytes.
        assert!(read_later(&q_normed, &[k_rope]));
    }

    #[test]
    fn a_norm_writes_q8_1_only_for_a_quantized_reader_past_routing() {
        let act = |b| tensor(b, DType::F32, [256, 1, 1, 1]);
        let (a, out) = (act(1), act(4));
        let q8 = tensor(6, DType::Q8_0, [256, 64, 1, 1]);
        let router = tensor(7, DType::F32, [256, 8, 1, 1]);
        let product = OpCall::new(Op::MatMul, &[q8, out], act(8));
        let logits = OpCall::new(
            Op::MatMul,
            &[router, out],
            tensor(9, DType::F32, [8, 1, 1, 1]),
        );
        assert!(quantized_reader(&out, &[product]));
        assert!(quantized_reader(&out, &[logits, product]));
        assert!(!quantized_reader(&out, &[logits]));
        // A quantized product of other activations, or an op that is not routing, comes first.
        let other = OpCall::new(Op::MatMul, &[q8, a], act(8));
        assert!(!quantized_reader(&out, &[other, product]));
        let add = OpCall::new(Op::Add, &[out, a], act(10));
        assert!(!quantized_reader(&out, &[add, product]));
        // A product of a reshape of `out` (attention's [dv, heads] output read as one row).
        let heads = tensor(4, DType::F32, [64, 4, 1, 1]);
        assert!(quantized_reader(&heads, &[product]));
    }

    /// A gated shared expert's sum over 8 values of 2 rows, its output at `out_at` of buffer 1
    /// (shared expert at 0, routed sum at 256, input at 512; the skipped results in buffer 2).
    fn gated_sum(out_at: u64) -> Vec<OpCall> {
        let at = |buffer, offset, ne| TensorRef {
            offset,
            ..tensor(buffer, DType::F32, ne)
        };
        let (x, sh, moe) = (
            at(1, 512, [8, 2, 1, 1]),
            at(1, 0, [8, 2, 1, 1]),
            at(1, 256, [8, 2, 1, 1]),
        );
        let w = tensor(3, DType::F32, [8, 1, 1, 1]);
        let (logit, gate, gated) = (
            at(2, 0, [1, 2, 1, 1]),
            at(2, 64, [1, 2, 1, 1]),
            at(2, 128, [8, 2, 1, 1]),
        );
        vec![
            OpCall::new(Op::MatMul, &[w, x], logit),
            OpCall::new(
                Op::Unary {
                    f: UnaryFn::Sigmoid,
                },
                &[logit],
                gate,
            ),
            OpCall::new(Op::Mul, &[sh, gate], gated),
            OpCall::new(Op::Add, &[moe, gated], at(1, out_at, [8, 2, 1, 1])),
        ]
    }

    #[test]
    fn a_gated_sum_is_taken_when_its_output_is_an_input_exactly_or_apart() {
        assert!(gated_add_calls(&gated_sum(1024)).is_some());
        // Over the shared expert's own memory (each thread reads where it writes)...
        assert!(gated_add_calls(&gated_sum(0)).is_some());
        // ...but not shifted against it, where a thread would write another's input.
        assert!(gated_add_calls(&gated_sum(4)).is_none());
        // Nor when a later call reads the sigmoid it skips.
        let mut calls = gated_sum(1024);
        let gate = calls[1].dst;
        calls.push(OpCall::new(
            Op::Add,
            &[gate, gate],
            tensor(4, DType::F32, gate.ne),
        ));
        assert!(gated_add_calls(&calls).is_none());
        assert_eq!(gated_adds(&gated_sum(1024)), vec![0]);
    }

    #[test]
    fn a_q8_1_copy_is_clear_only_of_writes_outside_its_activations() {
        let h = Quantized {
            x: 1024,
            nblocks: 2,
            q: 4096,
        };
        assert!(h.clear_of(0, 1024));
        assert!(h.clear_of(1024 + 256, 64));
        assert!(!h.clear_of(1024 + 252, 8));
        assert!(!h.clear_of(1000, 25));
    }
}
