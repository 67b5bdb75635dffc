//! Delta-rule linear attention (Gated DeltaNet; Kimi Delta Attention with a per-dim gate) over a
//! per-sequence recurrent state.
//!
//! Shapes in ggml order: q, k `[dk, hk, rows]`, v `[dv, hv, rows]`, gate (log decay) `[hv, rows]`
//! (or `[dk, hv, rows]` per dim), beta `[hv, rows]`, state `[dk·dv·hv, n_slots]`, out `[dv, hv,
//! rows]`. Value head `h` reads key head `h mod hk`. The state `S` of a head is `[dk, dv]` with
//! element `(i, j)` at `(h·dv + j)·dk + i`, so column `j` of `S` is a contiguous row here. Per row:
//!
//! `S ← exp(gate)·S;  δ = beta_scale·β·(v − Sᵀk);  S ← S + k·δᵀ;  out = scale·Sᵀq`
//!
//! Rows of one sequence are consecutive in the batch; a row at position 0 starts from a zero state.
//! Two forms compute it:
//!
//! - step-wise, row by row: one pass over each head's state per row (decode);
//! - chunked, [`CHUNK`] rows at a time in the WY/UT form: for a per-head gate, with `γ_t` the
//!   decay from the chunk's start through row `t` (`γ_t = exp(Σ_{s≤t} g_s)`) and `S0` the state
//!   at the chunk's start, `δ_t = β_t(v_t − γ_t·S0ᵀk_t) − Σ_{s<t} β_t(γ_t/γ_s)(k_t·k_s)·δ_s` (a
//!   unit lower-triangular solve by forward substitution), `out_t = scale·(γ_t·S0ᵀq_t +
//!   Σ_{s≤t} (γ_t/γ_s)(q_t·k_s)·δ_s)` and the next state `γ_c·S0 + Σ_s (γ_c/γ_s)·k_s·δ_sᵀ`. It
//!   reads the state twice per chunk instead of once per row. Decay ratios are taken as
//!   `exp(difference)`, so nothing overflows over a chunk. A per-dim gate (KDA) has its own
//!   chunk (`delta_rule_chunk_dim.rs`): the same three steps with the decays as diagonal
//!   matrices, carried as running products of each row's decays so that none overflows either.
//!
//! Columns of `S` never mix (column `j` sees only `v[j]`), so tasks split the value heads and, when
//! there are fewer heads than twice the workers, each head's columns; a task runs every sequence
//! of the batch for its share. Scratch is per thread, grown once.

use std::cell::RefCell;

use super::{check_len, mul_dims, OpError, SharedMut};
use crate::linear::Parallel;

#[path = "delta_rule_chunk.rs"]
mod chunk;
#[path = "delta_rule_chunk_dim.rs"]
mod chunk_dim;

/// Rows per chunk of the chunked form. Measured at dk = dv = 128 over 512 rows, 16 beats 32 and
/// 64 (the in-chunk pair products grow with the chunk while the state passes they save do not).
pub const CHUNK: usize = 16;

/// Sequences of at least this many rows in a batch take the chunked form under [`Form::Auto`]:
/// measured at dk = dv = 128, it breaks even with the step-wise form at 4 rows and is about 1.5
/// times as fast from 8.
pub const CHUNKED_FROM: usize = 8;

/// Which form computes a sequence's rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Form {
    /// Chunked for sequences of at least [`CHUNKED_FROM`] rows, step-wise otherwise.
    Auto,
    /// Row by row, as the definition reads.
    Steps,
    /// Chunks of [`CHUNK`] rows (the last one shorter).
    Chunks,
}

/// The shape and options of one delta-rule call.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DeltaRuleParams {
    /// Key heads (divides `n_head_v`).
    pub n_head_k: usize,
    /// Value heads.
    pub n_head_v: usize,
    /// Key dim per head.
    pub dk: usize,
    /// Value dim per head.
    pub dv: usize,
    /// Sequence slots in the state.
    pub n_slots: usize,
    /// Multiplies the output (`Sᵀq`).
    pub scale: f32,
    /// Multiplies β.
    pub beta_scale: f32,
    /// The gate is `[dk, hv, rows]` (one decay per key dim) instead of `[hv, rows]`.
    pub per_dim_gate: bool,
    /// Step-wise or chunked.
    pub form: Form,
}

/// The per-row inputs of one call (f32 except the indices).
#[derive(Debug, Clone, Copy)]
pub struct DeltaRuleInputs<'a> {
    /// Queries `[dk, hk, rows]`.
    pub q: &'a [f32],
    /// Keys `[dk, hk, rows]`.
    pub k: &'a [f32],
    /// Values `[dv, hv, rows]`.
    pub v: &'a [f32],
    /// Log decay `[hv, rows]`, or `[dk, hv, rows]` per dim.
    pub gate: &'a [f32],
    /// Write strength `[hv, rows]`.
    pub beta: &'a [f32],
    /// Sequence slot of each row.
    pub slots: &'a [u32],
    /// Position of each row (0 starts the sequence from a zero state).
    pub positions: &'a [i32],
}

/// Runs the recurrence over every row (see the module docs), writing `out` and updating `state`.
/// Every length and index is checked before anything is written. No allocation once each pool
/// thread's scratch has grown to the shape.
pub fn delta_rule(
    par: &dyn Parallel,
    x: &DeltaRuleInputs<'_>,
    p: &DeltaRuleParams,
    state: &mut [f32],
    out: &mut [f32],
) -> Result<(), OpError> {
    delta_rule_rows(par, x, p, state, out, None)
}

/// As [`delta_rule`], with `row_states` (`[dk·dv·hv, rows]`) receiving each row's state after
/// the row. Every sequence then runs step-wise, whatever `p.form` says, so that a row's state
/// is the one a pass ending at that row leaves (the chunked form never forms it).
pub fn delta_rule_rows(
    par: &dyn Parallel,
    x: &DeltaRuleInputs<'_>,
    p: &DeltaRuleParams,
    state: &mut [f32],
    out: &mut [f32],
    row_states: Option<&mut [f32]>,
) -> Result<(), OpError> {
    check(x, p, state.len(), out.len())?;
    if let Some(rs) = &row_states {
        let per_row = mul_dims(
            "delta_rule",
            mul_dims("delta_rule", p.dk, p.dv)?,
            p.n_head_v,
        )?;
        let want = mul_dims("delta_rule", per_row, x.slots.len())?;
        check_len("delta_rule", "row states", rs.len(), want)?;
    }
    let p = &DeltaRuleParams {
        form: match row_states {
            Some(_) => Form::Steps,
            None => p.form,
        },
        ..*p
    };
    let (st, o) = (SharedMut::new(state), SharedMut::new(out));
    let rs = row_states.map(SharedMut::new);
    let width = columns_per_task(p.dv, p.n_head_v, par.workers());
    let blocks = p.dv.div_ceil(width);
    par.for_each(p.n_head_v * blocks, &|task| {
        let (h, j0) = (task / blocks, task % blocks * width);
        let part = Part {
            h,
            j0,
            w: width.min(p.dv - j0),
        };
        SCRATCH.with(|cell| {
            let mut scratch = cell.borrow_mut();
            run_part(x, p, part, (&st, rs.as_ref()), &o, &mut scratch);
        })
    });
    Ok(())
}

/// What one task computes: value head `h`, value columns `j0..j0 + w`. Columns of the state (and
/// of the values and outputs) never mix, so a head's columns can be split between tasks; only the
/// key-side work (the chunked form's pairs) is repeated per task.
#[derive(Debug, Clone, Copy)]
struct Part {
    h: usize,
    j0: usize,
    w: usize,
}

/// Value columns per task: all of them while the heads alone give every worker two tasks, else
/// blocks of at least 16 columns (a multiple of 4).
fn columns_per_task(dv: usize, hv: usize, workers: usize) -> usize {
    let blocks = (2 * workers).div_ceil(hv).clamp(1, (dv / 16).max(1));
    (dv.div_ceil(blocks).div_ceil(4) * 4).min(dv)
}

fn check(
    x: &DeltaRuleInputs<'_>,
    p: &DeltaRuleParams,
    state: usize,
    out: usize,
) -> Result<(), OpError> {
    const OP: &str = "delta_rule";
    let bad = |what: String| Err(OpError::Parameter { op: OP, what });
    let (hk, hv, dk, dv) = (p.n_head_k, p.n_head_v, p.dk, p.dv);
    if hk == 0 || !hv.is_multiple_of(hk) || dk == 0 || dv == 0 {
        return bad(format!(
            "{hk} key heads must divide {hv} value heads, dk {dk} and dv {dv} be positive"
        ));
    }
    let rows = x.slots.len();
    let hk_rows = mul_dims(OP, hk, rows)?;
    let hv_rows = mul_dims(OP, hv, rows)?;
    check_len(OP, "positions", x.positions.len(), rows)?;
    check_len(OP, "q", x.q.len(), mul_dims(OP, dk, hk_rows)?)?;
    check_len(OP, "k", x.k.len(), mul_dims(OP, dk, hk_rows)?)?;
    check_len(OP, "v", x.v.len(), mul_dims(OP, dv, hv_rows)?)?;
    let gate = if p.per_dim_gate {
        mul_dims(OP, dk, hv_rows)?
    } else {
        hv_rows
    };
    check_len(OP, "gate", x.gate.len(), gate)?;
    check_len(OP, "beta", x.beta.len(), hv_rows)?;
    check_len(OP, "out", out, mul_dims(OP, dv, hv_rows)?)?;
    let per_slot = mul_dims(OP, mul_dims(OP, dk, dv)?, hv)?;
    check_len(OP, "state", state, mul_dims(OP, per_slot, p.n_slots)?)?;
    for (&s, &pos) in x.slots.iter().zip(x.positions) {
        if s as usize >= p.n_slots {
            return Err(OpError::Index {
                op: OP,
                what: "slot",
                index: i64::from(s),
                bound: p.n_slots,
            });
        }
        if pos < 0 {
            return bad(format!("position {pos} is negative"));
        }
    }
    Ok(())
}

thread_local! {
    /// Per-thread scratch of the step and chunk kernels.
    static SCRATCH: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// Every sequence of the batch for one task's part: runs of consecutive rows of one slot, a new
/// run at each position 0. With row states (`rs`), each row's state of the part after it is
/// copied there.
fn run_part(
    x: &DeltaRuleInputs<'_>,
    p: &DeltaRuleParams,
    part: Part,
    (st, rs): (&SharedMut<'_>, Option<&SharedMut<'_>>),
    o: &SharedMut<'_>,
    scratch: &mut Vec<f32>,
) {
    let rows = x.slots.len();
    let mut r = 0;
    while r < rows {
        let slot = x.slots[r] as usize;
        let mut end = r + 1;
        while end < rows && x.slots[end] as usize == slot && x.positions[end] != 0 {
            end += 1;
        }
        let at = (part.h * p.dv + part.j0) * p.dk;
        let per_slot = p.n_head_v * p.dv * p.dk;
        // SAFETY: these state columns of (slot, head) are touched only by this task, and this
        // part is dropped before the next run takes one.
        let s = unsafe { st.part(slot * per_slot + at, part.w * p.dk) };
        if x.positions[r] == 0 {
            s.fill(0.0);
        }
        let chunked = match p.form {
            Form::Steps => false,
            Form::Chunks => true,
            Form::Auto => end - r >= CHUNKED_FROM,
        };
        if chunked {
            let run = if p.per_dim_gate {
                chunk_dim::chunk
            } else {
                chunk::chunk
            };
            for t0 in (r..end).step_by(CHUNK) {
                run(x, p, part, t0..(t0 + CHUNK).min(end), s, o, scratch);
            }
        } else {
            for t in r..end {
                step(x, p, part, t, s, o, scratch);
                if let Some(rs) = rs {
                    // SAFETY: row t's copy of these columns is written by this task only.
                    unsafe { rs.part(t * per_slot + at, part.w * p.dk) }.copy_from_slice(s);
                }
            }
        }
        r = end;
    }
}

/// Row `t`'s query and key of value head `part.h`, and the part's values.
fn qkv<'a>(x: &DeltaRuleInputs<'a>, p: &DeltaRuleParams, part: Part, t: usize) -> [&'a [f32]; 3] {
    let kh = t * p.n_head_k + part.h % p.n_head_k;
    [
        &x.q[kh * p.dk..][..p.dk],
        &x.k[kh * p.dk..][..p.dk],
        &x.v[(t * p.n_head_v + part.h) * p.dv + part.j0..][..part.w],
    ]
}

/// The part's outputs of row `t`.
///
/// # Safety
///
/// Only the task of `part` may call this, and not while an earlier result for the same row lives.
#[allow(clippy::mut_from_ref)] // unsafe: the contract keeps parts disjoint
unsafe fn out_row<'a>(
    o: &'a SharedMut<'_>,
    p: &DeltaRuleParams,
    part: Part,
    t: usize,
) -> &'a mut [f32] {
    // SAFETY: parts of different tasks are disjoint (different heads or columns), and the caller
    // holds no other slice of this one.
    unsafe { o.part((t * p.n_head_v + part.h) * p.dv + part.j0, part.w) }
}

/// `Σ a·b` with eight independent partial sums (so the compiler vectorises it), combined
/// pairwise.
#[inline]
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let tail: f32 = ca
        .remainder()
        .iter()
        .zip(cb.remainder())
        .map(|(x, y)| x * y)
        .sum();
    for (x, y) in ca.zip(cb) {
        for l in 0..8 {
            acc[l] += x[l] * y[l];
        }
    }
    ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7])) + tail
}

/// The scratch vector grown to `n` values.
fn grown(scratch: &mut Vec<f32>, n: usize) -> &mut [f32] {
    if scratch.len() < n {
        scratch.resize(n, 0.0);
    }
    &mut scratch[..n]
}

/// One row of one head: with `D` the decay, `m = (DS)ᵀk`, `δ = β(v − m)`, `S ← DS + kδᵀ` and
/// `out = scale·((DS)ᵀq + δ(k·q))`, one column of `S` at a time (it stays in L1).
fn step(
    x: &DeltaRuleInputs<'_>,
    p: &DeltaRuleParams,
    part: Part,
    t: usize,
    s: &mut [f32],
    o: &SharedMut<'_>,
    scratch: &mut Vec<f32>,
) {
    let dk = p.dk;
    let h = part.h;
    let [q, k, v] = qkv(x, p, part, t);
    let beta = p.beta_scale * x.beta[t * p.n_head_v + h];
    let buf = grown(scratch, 3 * dk);
    let (decay, rest) = buf.split_at_mut(dk);
    let (decayed_k, decayed_q) = rest.split_at_mut(dk);
    if p.per_dim_gate {
        let g = &x.gate[(t * p.n_head_v + h) * dk..][..dk];
        decay.iter_mut().zip(g).for_each(|(d, &g)| *d = g.exp());
    } else {
        decay.fill(x.gate[t * p.n_head_v + h].exp());
    }
    for i in 0..dk {
        decayed_k[i] = decay[i] * k[i];
        decayed_q[i] = decay[i] * q[i];
    }
    let kq = dot(k, q);
    // SAFETY: this task's part, and no other slice of the row is alive.
    let out = unsafe { out_row(o, p, part, t) };
    for ((row, y), &vj) in s.chunks_exact_mut(dk).zip(out).zip(v) {
        // Two dot products rather than one fused pass: the fused loop defeats the vectoriser.
        let (m, mq) = (dot(row, decayed_k), dot(row, decayed_q));
        let d = beta * (vj - m);
        *y = p.scale * (mq + d * kq);
        for ((r, &dc), &kc) in row.iter_mut().zip(decay.iter()).zip(k) {
            *r = dc * *r + d * kc;
        }
    }
}

#[cfg(test)]
#[path = "delta_rule_tests.rs"]
mod tests;
