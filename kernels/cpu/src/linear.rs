//! Matrix products over quantized weights: the dense `MatMul` and the routed-expert FFN.
//!
//! Activations are quantized once per call into the weight type's dot-product partner
//! ([`quant::vec_dot_type`]), then every output row is a dot product of a weight row with each
//! activation column; output rows are split across the worker pool. The row kernel is a parameter
//! so that a SIMD plugin can pass its own.

use bloomery_plugin_api::{DType, PluginError};

use crate::quant;

/// Runs `f(task)` for every task index in `0..n`, possibly in parallel; returns when all are done.
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

/// A dot product of one weight row (`n` elements of the weight type) with one activation row in
/// the partner type: `quant::vec_dot` or a faster equivalent.
pub type RowDot = fn(DType, usize, &[u8], &[u8]) -> Result<f32, quant::QuantError>;

/// The portable row kernel.
pub fn reference_row_dot(
    t: DType,
    n: usize,
    w: &[u8],
    act: &[u8],
) -> Result<f32, quant::QuantError> {
    quant::vec_dot(t, n, w, act)
}

fn quant_err(e: quant::QuantError) -> PluginError {
    PluginError::invalid(e.to_string())
}

/// A pointer that may be shared by tasks writing disjoint elements.
#[derive(Clone, Copy)]
struct SharedOut(*mut f32);
// SAFETY: tasks given a `SharedOut` write disjoint elements only (see each use).
unsafe impl Send for SharedOut {}
// SAFETY: as above.
unsafe impl Sync for SharedOut {}

impl SharedOut {
    /// The address of element `i` (a method, so closures capture the whole wrapper).
    fn at(&self, i: usize) -> *mut f32 {
        self.0.wrapping_add(i)
    }
}

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

/// `y[c·n + j] = W_j · x_c` for every output row `j < n` and column `c`: `w` holds `n` rows of `k`
/// elements of `wt`, row stride `w_stride` bytes.
#[allow(clippy::too_many_arguments)]
pub fn matmul(
    par: &dyn Parallel,
    dot: RowDot,
    wt: DType,
    w: &[u8],
    w_stride: usize,
    k: usize,
    n: usize,
    acts: &QuantizedActs,
    y: &mut [f32],
) -> Result<(), PluginError> {
    let cols = acts.data.len() / acts.row_bytes.max(1);
    let w_row = wt
        .row_bytes(k as u64)
        .ok_or_else(|| PluginError::invalid(format!("{k} is not whole {wt} blocks")))?
        as usize;
    if y.len() < n * cols || (n > 0 && w.len() < (n - 1) * w_stride + w_row) {
        return Err(PluginError::invalid(format!(
            "matmul buffers too small: y {} < {n}x{cols} or w {} bytes",
            y.len(),
            w.len()
        )));
    }
    let rows_per_task = (n / (par.workers() * 4)).clamp(1, 64);
    let tasks = n.div_ceil(rows_per_task);
    let out = SharedOut(y.as_mut_ptr());
    let failed = std::sync::atomic::AtomicBool::new(false);
    par.for_each(tasks, &|t| {
        let start = t * rows_per_task;
        let end = (start + rows_per_task).min(n);
        // SAFETY: elements c·n + j < y.len() (checked above); rows start..end belong to this task.
        if !unsafe { dot_rows(dot, wt, k, w, w_stride, w_row, start, end, n, acts, out, 0) } {
            failed.store(true, std::sync::atomic::Ordering::Relaxed);
        }
    });
    if failed.load(std::sync::atomic::Ordering::Relaxed) {
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

/// The weighted sum of each row's chosen experts: `out[:, r] = Σ_j w[j, r] · down_e(glu(gate_e
/// x_r, up_e x_r))` with `e = ids[j, r]` mapped through `map` (-1 skips the expert). Each expert's
/// weights are read once for all rows that chose it.
#[allow(clippy::too_many_arguments)]
pub fn moe_experts(
    par: &dyn Parallel,
    dot: RowDot,
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
    let gate_rows = if stacks.up.is_some() { ff } else { 2 * ff };
    let row_bytes = |t: DType, n: usize| {
        t.row_bytes(n as u64)
            .map(|b| b as usize)
            .ok_or_else(|| PluginError::invalid(format!("{n} is not whole {t} blocks")))
    };
    let gate_row = row_bytes(stacks.gate_t, e_dim)?;
    let down_row = row_bytes(stacks.down_t, ff)?;
    let up_ok = match stacks.up {
        Some((up, t)) => up.len() >= stacks.n_expert * ff * row_bytes(t, e_dim)?,
        None => true,
    };
    if stacks.gate.len() < stacks.n_expert * gate_rows * gate_row
        || stacks.down.len() < stacks.n_expert * e_dim * down_row
        || !up_ok
    {
        return Err(PluginError::invalid(
            "moe: expert stacks smaller than their shapes",
        ));
    }
    let mut chosen: Vec<Vec<(usize, f32)>> = vec![Vec::new(); stacks.n_expert];
    // Where pick (r, j) landed: its stack slot and its index in that slot's list.
    let mut pick_at: Vec<Option<(usize, usize)>> = vec![None; rows * k];
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
            if s >= stacks.n_expert {
                return Err(PluginError::invalid(format!(
                    "expert {id} (slot {slot}) of {}",
                    stacks.n_expert
                )));
            }
            pick_at[r * k + j] = Some((s, chosen[s].len()));
            chosen[s].push((r, weights[r * k + j]));
        }
    }
    out.fill(0.0);
    // The experts any row chose, with their rows gathered and quantized once.
    let mut active = Vec::new();
    for (e, picks) in chosen.iter().enumerate() {
        if picks.is_empty() {
            continue;
        }
        let nr = picks.len();
        let mut xs = Vec::with_capacity(nr * e_dim);
        for &(r, _) in picks {
            xs.extend_from_slice(&x[r * e_dim..(r + 1) * e_dim]);
        }
        let xq = quantize_acts(stacks.gate_t, e_dim, &xs, nr)?;
        let xq_up = match stacks.up {
            Some((_, t)) if t != stacks.gate_t => Some(quantize_acts(t, e_dim, &xs, nr)?),
            _ => None,
        };
        active.push((e, xq, xq_up));
    }
    // Offsets of each active expert's outputs in the shared buffers (per column of its rows).
    let cols = |a: usize| chosen[active[a].0].len();
    let offsets = |per_col: usize| -> Vec<usize> {
        let mut o = Vec::with_capacity(active.len() + 1);
        let mut at = 0;
        for a in 0..active.len() {
            o.push(at);
            at += per_col * cols(a);
        }
        o.push(at);
        o
    };
    let (g_off, u_off, y_off) = (offsets(gate_rows), offsets(ff), offsets(e_dim));
    let mut g = vec![0f32; g_off[active.len()]];
    let mut u = vec![
        0f32;
        if stacks.up.is_some() {
            u_off[active.len()]
        } else {
            0
        }
    ];
    // Gate and up products of every active expert in one parallel region: tasks are
    // (expert, stack, chunk of output rows), so a single decoded row keeps every worker busy.
    let up_row = match stacks.up {
        Some((_, t)) => row_bytes(t, e_dim)?,
        None => 0,
    };
    let chunk = |rows: usize| (rows * active.len() / (par.workers() * 4)).clamp(1, 64);
    let mut tasks: Vec<(usize, bool, usize, usize)> = Vec::new();
    for a in 0..active.len() {
        let c = chunk(gate_rows);
        tasks.extend(
            (0..gate_rows)
                .step_by(c)
                .map(|s| (a, false, s, (s + c).min(gate_rows))),
        );
        if stacks.up.is_some() {
            let c = chunk(ff);
            tasks.extend((0..ff).step_by(c).map(|s| (a, true, s, (s + c).min(ff))));
        }
    }
    let failed = std::sync::atomic::AtomicBool::new(false);
    let (gp, upp) = (SharedOut(g.as_mut_ptr()), SharedOut(u.as_mut_ptr()));
    par.for_each(tasks.len(), &|t| {
        let (a, is_up, lo, hi) = tasks[t];
        let (e, xq, xq_up) = &active[a];
        let (wt, w, stride, n, out, base, acts) = match (is_up, stacks.up) {
            (true, Some((up, up_t))) => (
                up_t,
                &up[e * ff * up_row..(e + 1) * ff * up_row],
                up_row,
                ff,
                upp,
                u_off[a],
                xq_up.as_ref().unwrap_or(xq),
            ),
            _ => (
                stacks.gate_t,
                &stacks.gate[e * gate_rows * gate_row..(e + 1) * gate_rows * gate_row],
                gate_row,
                gate_rows,
                gp,
                g_off[a],
                xq,
            ),
        };
        // SAFETY: rows lo..hi of expert a's block at `base` (n rows per column) belong to this
        // task alone; the block lies inside the buffer (offsets computed from the same sizes).
        if !unsafe {
            dot_rows(
                dot, wt, e_dim, w, stride, stride, lo, hi, n, acts, out, base,
            )
        } {
            failed.store(true, std::sync::atomic::Ordering::Relaxed);
        }
    });
    // The activation and its quantization, per expert.
    let mut hq = Vec::with_capacity(active.len());
    for a in 0..active.len() {
        let nr = cols(a);
        let mut h = vec![0f32; ff * nr];
        let ga = &g[g_off[a]..g_off[a + 1]];
        if stacks.up.is_some() {
            glu(ga, &u[u_off[a]..u_off[a + 1]], &mut h)?;
        } else {
            let (mut gs, mut us) = (Vec::with_capacity(ff * nr), Vec::with_capacity(ff * nr));
            for c in 0..nr {
                gs.extend_from_slice(&ga[c * 2 * ff..c * 2 * ff + ff]);
                us.extend_from_slice(&ga[c * 2 * ff + ff..(c + 1) * 2 * ff]);
            }
            glu(&gs, &us, &mut h)?;
        }
        hq.push(quantize_acts(stacks.down_t, ff, &h, nr)?);
    }
    // Down products, again one parallel region over (expert, chunk of output rows).
    let mut y = vec![0f32; y_off[active.len()]];
    let c = chunk(e_dim);
    let tasks: Vec<(usize, usize, usize)> = (0..active.len())
        .flat_map(|a| {
            (0..e_dim)
                .step_by(c)
                .map(move |s| (a, s, (s + c).min(e_dim)))
        })
        .collect();
    let yp = SharedOut(y.as_mut_ptr());
    par.for_each(tasks.len(), &|t| {
        let (a, lo, hi) = tasks[t];
        let e = active[a].0;
        let w = &stacks.down[e * e_dim * down_row..(e + 1) * e_dim * down_row];
        // SAFETY: as for the gate/up tasks: disjoint rows of expert a's block.
        let ok = unsafe {
            dot_rows(
                dot,
                stacks.down_t,
                ff,
                w,
                down_row,
                down_row,
                lo,
                hi,
                e_dim,
                &hq[a],
                yp,
                y_off[a],
            )
        };
        if !ok {
            failed.store(true, std::sync::atomic::Ordering::Relaxed);
        }
    });
    if failed.load(std::sync::atomic::Ordering::Relaxed) {
        return Err(PluginError::invalid("moe: a dot product failed"));
    }
    // The weighted sum of each row in the order of its picks, so the result does not depend on
    // where the experts sit in the stacks (a tier's arena slots, residency moves).
    let mut active_of = vec![usize::MAX; stacks.n_expert];
    for (a, (e, _, _)) in active.iter().enumerate() {
        active_of[*e] = a;
    }
    for r in 0..rows {
        let orow = &mut out[r * e_dim..(r + 1) * e_dim];
        for &(s, c) in pick_at[r * k..(r + 1) * k].iter().flatten() {
            let a = active_of[s];
            let w = chosen[s][c].1;
            let ye = &y[y_off[a] + c * e_dim..y_off[a] + (c + 1) * e_dim];
            for (o, v) in orow.iter_mut().zip(ye) {
                *o += w * v;
            }
        }
    }
    Ok(())
}

/// Weight rows loaded ahead of the one being multiplied: a routed expert's rows stream from DRAM
/// and one row's dot product is too short for the hardware prefetcher to hide the wait.
const PREFETCH_ROWS: usize = 2;

/// Hints the CPU to start loading `bytes` into cache.
#[inline]
fn prefetch(bytes: &[u8]) {
    #[cfg(target_arch = "x86_64")]
    for line in bytes.chunks(64) {
        // SAFETY: a prefetch is only a hint; the address lies in a live slice and is not read.
        unsafe {
            core::arch::x86_64::_mm_prefetch::<{ core::arch::x86_64::_MM_HINT_T0 }>(
                line.as_ptr().cast(),
            )
        };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = bytes;
}

/// Rows `lo..hi` of `w` (`n` rows of `k` elements of `wt`, `w_row` bytes each, `stride` bytes
/// apart) against every column of `acts`: `out[base + c·n + j]`. False when a dot product failed.
/// The row two ahead is prefetched.
///
/// # Safety
/// `out[base .. base + cols·n]` must be valid for writes and rows `lo..hi` of that block must be
/// written by no one else meanwhile.
#[allow(clippy::too_many_arguments)]
unsafe fn dot_rows(
    dot: RowDot,
    wt: DType,
    k: usize,
    w: &[u8],
    stride: usize,
    w_row: usize,
    lo: usize,
    hi: usize,
    n: usize,
    acts: &QuantizedActs,
    out: SharedOut,
    base: usize,
) -> bool {
    let cols = acts.data.len() / acts.row_bytes.max(1);
    let mut ok = true;
    for j in lo..hi {
        let Some(wr) = w.get(j * stride..j * stride + w_row) else {
            return false;
        };
        let ahead = (j + PREFETCH_ROWS) * stride;
        if let Some(next) = w.get(ahead..ahead + w_row) {
            prefetch(next);
        }
        for c in 0..cols {
            let a = &acts.data[c * acts.row_bytes..(c + 1) * acts.row_bytes];
            let v = dot(wt, k, wr, a).unwrap_or_else(|_| {
                ok = false;
                f32::NAN
            });
            // SAFETY: the caller owns rows lo..hi of this block (see the function's contract).
            unsafe { *out.at(base + c * n + j) = v };
        }
    }
    ok
}

impl Parallel for crate::pool::Pool {
    fn for_each(&self, n: usize, f: &(dyn Fn(usize) + Sync)) {
        self.parallel_for(n, f);
    }
    fn workers(&self) -> usize {
        self.threads()
    }
}
