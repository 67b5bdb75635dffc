//! Matrix products over quantized weights: the dense `MatMul` and the routed-expert FFN.
//!
//! Activations are quantized once per call into the weight type's dot-product partner
//! ([`quant::vec_dot_type`]), then every output row is a dot product of a weight row with each
//! activation column; output rows are split across the worker pool. The row kernel is a parameter
//! so that a SIMD plugin can pass its own.

use bloomery_plugin_api::{DType, PluginError};

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use crate::quant;

/// Runs `f(task)` for every task index in `0..n`, possibly in parallel; returns when all are done.
/// Tasks start in index order (a task may wait for one before it, as [`moe_experts`]' down
/// products wait for their expert's gate/up tasks): each starts only once every lower index has
/// started.
pub trait Parallel: Sync {
    /// Runs the tasks.
    fn for_each(&self, n: usize, f: &(dyn Fn(usize) + Sync));
    /// Workers available (for choosing task sizes).
    fn workers(&self) -> usize;
}

/// Runs tasks one after another on the calling thread.
pub struct Serial;

impl Parallel for Serial {
    fn for_each(&self, n: usize, f: &(dyn Fn(usize) + Sync)) {
        (0..n).for_each(f);
    }
    fn workers(&self) -> usize {
        1
    }
}

/// Dot products of consecutive weight rows with one activation row: `out[i] = W_i · act` for
/// `i < out.len()`, where row `i` is the `n` elements of the weight type at `w[i·stride..]` and
/// `act` is `n` activations in [`quant::vec_dot_type`] of it. A SIMD plugin passes its own; the
/// type is dispatched once per call, not per row.
pub type RowsDot =
    fn(DType, usize, &[u8], usize, &[u8], &mut [f32]) -> Result<(), quant::QuantError>;

/// Bytes of weights asked for ahead of the row being multiplied. A routed expert's rows stream
/// from DRAM and one row's dot product is too short for the hardware prefetcher to hide the wait;
/// a fixed distance in bytes (rather than in rows) keeps short rows (a down product's 432 bytes)
/// as far ahead as long ones. 4 KiB into L2 read 10–15% faster than two rows into L1 with 16
/// threads on the H200 machine's Xeon (`moe_bench`, docs/performance.md).
const PREFETCH_AHEAD: usize = 4096;

/// Hints the CPU to start loading `bytes` into the second-level cache.
#[inline(always)]
fn prefetch(bytes: &[u8]) {
    #[cfg(target_arch = "x86_64")]
    for line in bytes.chunks(64) {
        // SAFETY: a prefetch is only a hint; the address lies in a live slice and is not read.
        unsafe {
            core::arch::x86_64::_mm_prefetch::<{ core::arch::x86_64::_MM_HINT_T1 }>(
                line.as_ptr().cast(),
            )
        };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = bytes;
}

/// The loop of every [`RowsDot`]: `out[i] = dot(row i)` for the `out.len()` rows of `w`
/// (`w_row` bytes each, `stride` bytes apart), asking for the bytes [`PREFETCH_AHEAD`] past each
/// row's start as it goes (never past the last row). Generic so that the row kernel inlines into
/// it. The caller checked the lengths ([`weight_rows_fit`]); a short `w` panics.
#[inline(always)]
pub fn for_each_row(
    w: &[u8],
    stride: usize,
    w_row: usize,
    out: &mut [f32],
    mut dot: impl FnMut(&[u8]) -> f32,
) {
    let Some(last) = out.len().checked_sub(1) else {
        return;
    };
    let end = last * stride + w_row;
    prefetch(&w[..PREFETCH_AHEAD.min(end)]);
    for (i, o) in out.iter_mut().enumerate() {
        let ahead = (i * stride + PREFETCH_AHEAD).min(end);
        prefetch(&w[ahead..(ahead + w_row).min(end)]);
        *o = dot(&w[i * stride..i * stride + w_row]);
    }
}

/// The portable rows kernel: [`quant::vec_dot`] per row.
pub fn reference_rows_dot(
    t: DType,
    n: usize,
    w: &[u8],
    stride: usize,
    act: &[u8],
    out: &mut [f32],
) -> Result<(), quant::QuantError> {
    let w_row = weight_rows_fit(t, n, w, stride, out.len())?;
    let mut err = None;
    for_each_row(w, stride, w_row, out, |r| {
        quant::vec_dot(t, n, r, act).unwrap_or_else(|e| {
            err.get_or_insert(e);
            f32::NAN
        })
    });
    err.map_or(Ok(()), Err)
}

/// The bytes of one row of `n` elements of `t`, after checking that `w` holds `rows` such rows
/// `stride` bytes apart: the length check every [`RowsDot`] makes first.
pub fn weight_rows_fit(
    t: DType,
    n: usize,
    w: &[u8],
    stride: usize,
    rows: usize,
) -> Result<usize, quant::QuantError> {
    let w_row = quant::row_bytes(t, n, "vec_dot")?;
    let need = if rows == 0 {
        0
    } else {
        (rows - 1) * stride + w_row
    };
    if w.len() < need || (rows > 1 && stride < w_row) {
        return Err(quant::QuantError::LengthMismatch {
            dtype: t,
            what: "weight rows",
            expected: need.max(rows * w_row),
            found: w.len(),
        });
    }
    Ok(w_row)
}

fn quant_err(e: quant::QuantError) -> PluginError {
    PluginError::invalid(e.to_string())
}

/// Sets its flag when dropped: held across a task and forgotten at its end, so that the flag is
/// set only by a task that unwinds.
struct FailOnUnwind<'a>(&'a AtomicBool);

impl Drop for FailOnUnwind<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// A buffer's start that may be shared by tasks writing disjoint elements.
struct Shared<T>(*mut T);

impl<T> Clone for Shared<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for Shared<T> {}
// SAFETY: tasks given a `Shared` touch disjoint elements only, or read what others finished
// writing before a synchronization (see each use).
unsafe impl<T> Send for Shared<T> {}
// SAFETY: as above.
unsafe impl<T> Sync for Shared<T> {}

impl<T> Shared<T> {
    /// Elements `at..at + len` (a method, so closures capture the whole wrapper).
    ///
    /// # Safety
    /// The range lies inside the buffer, and no one else touches it while the slice lives.
    #[allow(clippy::mut_from_ref)]
    unsafe fn slice<'a>(&self, at: usize, len: usize) -> &'a mut [T] {
        // SAFETY: the caller's contract.
        unsafe { std::slice::from_raw_parts_mut(self.0.add(at), len) }
    }

    /// Elements `at..at + len`, read only.
    ///
    /// # Safety
    /// The range lies inside the buffer, and no one writes it while the slice lives.
    unsafe fn read<'a>(&self, at: usize, len: usize) -> &'a [T] {
        // SAFETY: the caller's contract.
        unsafe { std::slice::from_raw_parts(self.0.add(at), len) }
    }
}

type SharedOut = Shared<f32>;

/// Activation columns quantized for a weight type.
pub struct QuantizedActs {
    /// The partner type.
    pub dtype: DType,
    /// Bytes per column.
    pub row_bytes: usize,
    /// `cols · row_bytes` bytes.
    pub data: Vec<u8>,
}

/// Quantizes `cols` columns of `k` f32 values each for dot products with weight type `wt`.
pub fn quantize_acts(
    wt: DType,
    k: usize,
    x: &[f32],
    cols: usize,
) -> Result<QuantizedActs, PluginError> {
    let dtype = quant::vec_dot_type(wt)
        .ok_or_else(|| PluginError::unsupported(format!("MatMul with {wt} weights"), &[]))?;
    let row_bytes = dtype.row_bytes(k as u64).ok_or_else(|| {
        PluginError::invalid(format!("{k} values do not fill whole {dtype} blocks"))
    })? as usize;
    let mut data = vec![0u8; row_bytes * cols];
    for c in 0..cols {
        quant::quantize_act_row(
            dtype,
            &x[c * k..(c + 1) * k],
            &mut data[c * row_bytes..(c + 1) * row_bytes],
        )
        .map_err(quant_err)?;
    }
    Ok(QuantizedActs {
        dtype,
        row_bytes,
        data,
    })
}

impl QuantizedActs {
    /// Column `c`'s bytes.
    fn column(&self, c: usize) -> &[u8] {
        &self.data[c * self.row_bytes..(c + 1) * self.row_bytes]
    }
}

/// `y[c·n + j] = W_j · x_c` for every output row `j < n` and column `c`: `w` holds `n` rows of `k`
/// elements of `wt`, row stride `w_stride` bytes.
#[allow(clippy::too_many_arguments)]
pub fn matmul(
    par: &dyn Parallel,
    dot: RowsDot,
    wt: DType,
    w: &[u8],
    w_stride: usize,
    k: usize,
    n: usize,
    acts: &QuantizedActs,
    y: &mut [f32],
) -> Result<(), PluginError> {
    let cols = acts.data.len() / acts.row_bytes.max(1);
    weight_rows_fit(wt, k, w, w_stride, n).map_err(quant_err)?;
    if y.len() < n * cols {
        return Err(PluginError::invalid(format!(
            "matmul output too small: {} < {n}x{cols}",
            y.len()
        )));
    }
    let rows_per_task = (n / (par.workers() * 4)).clamp(1, 64);
    let tasks = n.div_ceil(rows_per_task);
    let out = Shared(y.as_mut_ptr());
    let failed = AtomicBool::new(false);
    let column = |c: usize| acts.column(c);
    par.for_each(tasks, &|t| {
        let (lo, hi) = (t * rows_per_task, ((t + 1) * rows_per_task).min(n));
        // SAFETY: elements c·n + j < y.len() (checked above); rows lo..hi belong to this task.
        let ok = unsafe { dot_rows(dot, wt, k, w, w_stride, lo..hi, n, cols, &column, out, 0) };
        if !ok {
            failed.store(true, Ordering::Relaxed);
        }
    });
    if failed.load(Ordering::Relaxed) {
        return Err(PluginError::invalid(format!("dot product failed for {wt}")));
    }
    Ok(())
}

/// The expert stacks of one layer as bytes, with their types and sizes.
pub struct ExpertStacks<'a> {
    /// Gate stack `[n_embd, n_ff, n_expert]`, or gate+up `[n_embd, 2·n_ff, n_expert]` when fused.
    pub gate: &'a [u8],
    /// Gate (or fused) type.
    pub gate_t: DType,
    /// Up stack, absent when fused.
    pub up: Option<(&'a [u8], DType)>,
    /// Down stack `[n_ff, n_embd, n_expert]`.
    pub down: &'a [u8],
    /// Down type.
    pub down_t: DType,
    /// Hidden width.
    pub n_embd: usize,
    /// Expert FFN width.
    pub n_ff: usize,
    /// Experts in the stacks.
    pub n_expert: usize,
}

/// The gated activation applied between up and down projections: `(gate, up, out)`.
pub type GluFn<'a> = &'a (dyn Fn(&[f32], &[f32], &mut [f32]) -> Result<(), PluginError> + Sync);

/// Which rows picked which stack slot: `chosen[s]` lists `(row, weight)` in row order, and
/// `pick_at[r·k + j]` says where row r's pick j landed (`(slot, index in chosen[slot])`).
struct Routes {
    chosen: Vec<Vec<(usize, f32)>>,
    pick_at: Vec<Option<(usize, usize)>>,
}

impl Routes {
    /// Maps each pick through `map` (-1 skips the expert) and checks it against the stacks.
    fn new(
        ids: &[i32],
        weights: &[f32],
        rows: usize,
        k: usize,
        map: Option<&[i32]>,
        n_expert: usize,
    ) -> Result<Routes, PluginError> {
        let mut chosen: Vec<Vec<(usize, f32)>> = vec![Vec::new(); n_expert];
        let mut pick_at = vec![None; rows * k];
        for r in 0..rows {
            for j in 0..k {
                let id = ids[r * k + j];
                let slot = match map {
                    Some(m) => m
                        .get(usize::try_from(id).unwrap_or(usize::MAX))
                        .copied()
                        .unwrap_or(-1),
                    None => id,
                };
                if slot < 0 {
                    continue;
                }
                let s = slot as usize;
                if s >= n_expert {
                    return Err(PluginError::invalid(format!(
                        "expert {id} (slot {slot}) of {n_expert}"
                    )));
                }
                pick_at[r * k + j] = Some((s, chosen[s].len()));
                chosen[s].push((r, weights[r * k + j]));
            }
        }
        Ok(Routes { chosen, pick_at })
    }
}

/// Start of each active expert's block in a buffer holding `per_col` values per column of its
/// rows, plus the total.
fn block_offsets(active: &[usize], routes: &Routes, per_col: usize) -> Vec<usize> {
    let mut o = Vec::with_capacity(active.len() + 1);
    let mut at = 0;
    for &e in active {
        o.push(at);
        at += per_col * routes.chosen[e].len();
    }
    o.push(at);
    o
}

/// The most output rows of one product task.
const MAX_TASK_ROWS: usize = 64;

/// How many tasks share `len` output rows (every active expert's block laid end to end): a whole
/// number of rounds of the pool's workers, at least four, with at most [`MAX_TASK_ROWS`] rows a
/// task (none for no rows). Equal tasks in whole rounds keep a region from ending with one worker
/// busy and the others waiting (per-expert tasks of a decoded row's 5 host experts made 65 tasks
/// for 16 workers).
fn task_count(par: &dyn Parallel, len: usize) -> usize {
    let w = par.workers().max(1);
    let rounds = len.div_ceil(w * MAX_TASK_ROWS).max(4);
    (w * rounds).min(len)
}

/// The pieces `(block, lo, hi)` of task `t` of `n` over `blocks` blocks of `per` rows laid end to
/// end: rows `lo..hi` of each block the task's share of the rows overlaps.
fn task_pieces(
    t: usize,
    n: usize,
    blocks: usize,
    per: usize,
) -> impl Iterator<Item = (usize, usize, usize)> {
    let len = blocks * per;
    let (start, end) = (t * len / n, (t + 1) * len / n);
    (start / per..end.div_ceil(per)).map(move |a| {
        let base = a * per;
        (a, start.max(base) - base, end.min(base + per) - base)
    })
}

/// The weighted sum of each row's chosen experts: `out[:, r] = Σ_j w[j, r] · down_e(glu(gate_e
/// x_r, up_e x_r))` with `e = ids[j, r]` mapped through `map` (-1 skips the expert). Each expert's
/// weights are read once for all rows that chose it.
///
/// One parallel region: gate and up products with the activation applied (the task that
/// finishes an expert's last rows quantizes its activations for the down product and marks the
/// expert ready), then down products, each waiting for its expert. Every row's inputs are
/// quantized once, whatever experts it picked.
#[allow(clippy::too_many_arguments)]
pub fn moe_experts(
    par: &dyn Parallel,
    dot: RowsDot,
    stacks: &ExpertStacks<'_>,
    x: &[f32],
    ids: &[i32],
    weights: &[f32],
    k: usize,
    map: Option<&[i32]>,
    glu: GluFn<'_>,
    out: &mut [f32],
) -> Result<(), PluginError> {
    let (e_dim, ff) = (stacks.n_embd, stacks.n_ff);
    let rows = x.len() / e_dim.max(1);
    if ids.len() != k * rows || weights.len() != k * rows || out.len() != e_dim * rows {
        return Err(PluginError::invalid(format!(
            "moe: {rows} rows of {e_dim}, ids {} weights {} out {} for k={k}",
            ids.len(),
            weights.len(),
            out.len()
        )));
    }
    let fused = stacks.up.is_none();
    let gate_rows = if fused { 2 * ff } else { ff };
    let n_exp = stacks.n_expert;
    let row = |t: DType, n: usize| quant::row_bytes(t, n, "vec_dot").map_err(quant_err);
    let (gate_row, down_row) = (row(stacks.gate_t, e_dim)?, row(stacks.down_t, ff)?);
    let (up, up_t, up_row) = match stacks.up {
        Some((up, t)) => (up, t, row(t, e_dim)?),
        None => (stacks.gate, stacks.gate_t, gate_row),
    };
    if stacks.gate.len() < n_exp * gate_rows * gate_row
        || stacks.down.len() < n_exp * e_dim * down_row
        || (!fused && up.len() < n_exp * ff * up_row)
    {
        return Err(PluginError::invalid(
            "moe: expert stacks smaller than their shapes",
        ));
    }
    let routes = Routes::new(ids, weights, rows, k, map, n_exp)?;
    let active: Vec<usize> = (0..n_exp)
        .filter(|&e| !routes.chosen[e].is_empty())
        .collect();
    out.fill(0.0);
    if active.is_empty() {
        return Ok(());
    }
    // Every row quantized once for the gate product (and once more when up differs in type).
    let xq = quantize_acts(stacks.gate_t, e_dim, x, rows)?;
    let xq_up = match up_t == stacks.gate_t {
        true => None,
        false => Some(quantize_acts(up_t, e_dim, x, rows)?),
    };
    let xq_up = xq_up.as_ref().unwrap_or(&xq);
    let h_type = quant::vec_dot_type(stacks.down_t).ok_or_else(|| {
        PluginError::unsupported(format!("MatMul with {} weights", stacks.down_t), &[])
    })?;
    let h_row = quant::row_bytes(h_type, ff, "quantize").map_err(quant_err)?;
    // Per active expert: its first column (a row routed to it), and where its hidden and output
    // values start.
    let (col_off, h_off, y_off) = (
        block_offsets(&active, &routes, 1),
        block_offsets(&active, &routes, ff),
        block_offsets(&active, &routes, e_dim),
    );
    let mut h = vec![0f32; h_off[active.len()]];
    let mut hq = vec![0u8; col_off[active.len()] * h_row];
    let mut y = vec![0f32; y_off[active.len()]];
    let (hp, hqp, yp) = (
        Shared(h.as_mut_ptr()),
        Shared(hq.as_mut_ptr()),
        Shared(y.as_mut_ptr()),
    );
    let failed = AtomicBool::new(false);
    let fail = || failed.store(true, Ordering::Relaxed);

    // One parallel region: first the gate and up products, then the down products. Each kind's
    // tasks are equal shares of every active expert's rows laid end to end, so a single decoded
    // row keeps every worker busy. A gate/up task applies the activation to its rows, and the
    // last one of an expert quantizes the expert's hidden rows and marks it ready. Tasks are
    // claimed in order, so every gate/up task has started before any down task waits for its
    // expert: workers that finish early start on the down products of finished experts instead
    // of idling at a barrier.
    let blocks = active.len();
    let gu_tasks = task_count(par, blocks * ff);
    let down_tasks = task_count(par, blocks * e_dim);
    // Gate/up tasks still running per expert.
    let mut overlapping = vec![0usize; blocks];
    for t in 0..gu_tasks {
        for (a, _, _) in task_pieces(t, gu_tasks, blocks, ff) {
            overlapping[a] += 1;
        }
    }
    // Experts without gate/up rows (no FFN) have nothing to wait for.
    let ready: Vec<AtomicBool> = overlapping
        .iter()
        .map(|&n| AtomicBool::new(n == 0))
        .collect();
    let left: Vec<AtomicUsize> = overlapping.into_iter().map(AtomicUsize::new).collect();
    let gate_up = |t: usize| {
        for (a, lo, hi) in task_pieces(t, gu_tasks, blocks, ff) {
            let e = active[a];
            let picks = &routes.chosen[e];
            let gate = &stacks.gate[e * gate_rows * gate_row..(e + 1) * gate_rows * gate_row];
            let (up_w, up_lo) = match fused {
                true => (gate, ff + lo),
                false => (&up[e * ff * up_row..(e + 1) * ff * up_row], lo),
            };
            let (mut g, mut u) = ([0f32; MAX_TASK_ROWS], [0f32; MAX_TASK_ROWS]);
            let n = hi - lo;
            for (ci, &(r, _)) in picks.iter().enumerate() {
                let ok = dot(
                    stacks.gate_t,
                    e_dim,
                    &gate[lo * gate_row..],
                    gate_row,
                    xq.column(r),
                    &mut g[..n],
                )
                .and_then(|()| {
                    dot(
                        up_t,
                        e_dim,
                        &up_w[up_lo * up_row..],
                        up_row,
                        xq_up.column(r),
                        &mut u[..n],
                    )
                });
                // SAFETY: elements h_off[a] + ci·ff + lo..hi belong to this task alone and lie
                // inside `h` (offsets computed from the same sizes).
                let hs = unsafe { hp.slice(h_off[a] + ci * ff + lo, n) };
                if ok.is_err() || glu(&g[..n], &u[..n], hs).is_err() {
                    fail();
                }
            }
            // The last task of expert a quantizes its activations for the down products.
            if left[a].fetch_sub(1, Ordering::AcqRel) == 1 {
                for ci in 0..picks.len() {
                    let col = col_off[a] + ci;
                    // SAFETY: every task of expert a has finished writing its rows (the
                    // counter's acquire), and only this task reads them or writes this expert's
                    // bytes of hq until it marks the expert ready.
                    let (src, dst) = unsafe {
                        (
                            hp.slice(h_off[a] + ci * ff, ff),
                            hqp.slice(col * h_row, h_row),
                        )
                    };
                    if quant::quantize_act_row(h_type, src, dst).is_err() {
                        fail();
                    }
                }
                ready[a].store(true, Ordering::Release);
            }
        }
    };
    let down = |t: usize| {
        for (a, lo, hi) in task_pieces(t, down_tasks, blocks, e_dim) {
            // Every gate/up task was claimed before this one; a failed (or panicking) one sets
            // `failed`, after which the result is an error and nothing more is computed.
            while !ready[a].load(Ordering::Acquire) {
                if failed.load(Ordering::Relaxed) {
                    return;
                }
                std::hint::spin_loop();
            }
            let e = active[a];
            let w = &stacks.down[e * e_dim * down_row..(e + 1) * e_dim * down_row];
            let cols = routes.chosen[e].len();
            // SAFETY: expert a's columns of hq were written before it was marked ready (the
            // flag's acquire) and are only read from now on.
            let hq = unsafe { hqp.read(col_off[a] * h_row, cols * h_row) };
            let column = |ci: usize| &hq[ci * h_row..(ci + 1) * h_row];
            // SAFETY: disjoint rows of expert a's block of y, as for the gate/up tasks.
            let ok = unsafe {
                dot_rows(
                    dot,
                    stacks.down_t,
                    ff,
                    w,
                    down_row,
                    lo..hi,
                    e_dim,
                    cols,
                    &column,
                    yp,
                    y_off[a],
                )
            };
            if !ok {
                fail();
            }
        }
    };
    par.for_each(gu_tasks + down_tasks, &|t| {
        // A panicking task sets `failed` as it unwinds, so that no down task waits for an
        // expert it will never mark ready (the pool re-raises the panic).
        let guard = FailOnUnwind(&failed);
        match t.checked_sub(gu_tasks) {
            None => gate_up(t),
            Some(t) => down(t),
        }
        std::mem::forget(guard);
    });
    drop(h);
    if failed.load(Ordering::Relaxed) {
        return Err(PluginError::invalid("moe: a dot product failed"));
    }
    // The weighted sum of each row in the order of its picks, so the result does not depend on
    // where the experts sit in the stacks (a tier's arena slots, residency moves).
    let mut active_of = vec![usize::MAX; n_exp];
    for (a, &e) in active.iter().enumerate() {
        active_of[e] = a;
    }
    for r in 0..rows {
        let orow = &mut out[r * e_dim..(r + 1) * e_dim];
        for &(s, ci) in routes.pick_at[r * k..(r + 1) * k].iter().flatten() {
            let a = active_of[s];
            let w = routes.chosen[s][ci].1;
            let ye = &y[y_off[a] + ci * e_dim..y_off[a] + (ci + 1) * e_dim];
            for (o, v) in orow.iter_mut().zip(ye) {
                *o += w * v;
            }
        }
    }
    Ok(())
}

/// Output rows computed together for every column before moving on, so that their weights stay
/// in the first-level cache across columns.
const ROWS_PER_PASS: usize = 16;

/// Rows `rows` of `w` (`n` rows of `k` elements of `wt`, `stride` bytes apart) against columns
/// `0..cols` given by `column`: `out[base + c·n + j]`. False when a dot product failed.
///
/// # Safety
/// `out[base .. base + cols·n]` must be valid for writes and rows `rows` of that block must be
/// written by no one else meanwhile.
#[allow(clippy::too_many_arguments)]
unsafe fn dot_rows<'a>(
    dot: RowsDot,
    wt: DType,
    k: usize,
    w: &[u8],
    stride: usize,
    rows: std::ops::Range<usize>,
    n: usize,
    cols: usize,
    column: &dyn Fn(usize) -> &'a [u8],
    out: SharedOut,
    base: usize,
) -> bool {
    let pass = if cols == 1 { rows.len() } else { ROWS_PER_PASS };
    let mut lo = rows.start;
    while lo < rows.end {
        let hi = (lo + pass).min(rows.end);
        for c in 0..cols {
            // SAFETY: the caller owns rows lo..hi of this block (see the function's contract).
            let o = unsafe { out.slice(base + c * n + lo, hi - lo) };
            if dot(wt, k, &w[lo * stride..], stride, column(c), o).is_err() {
                return false;
            }
        }
        lo = hi;
    }
    true
}

impl Parallel for crate::pool::Pool {
    fn for_each(&self, n: usize, f: &(dyn Fn(usize) + Sync)) {
        self.parallel_for(n, f);
    }
    fn workers(&self) -> usize {
        self.threads()
    }
}
