//! Causal depthwise convolution over time with a per-sequence state, optionally dilated: the short
//! convolution in front of Gated DeltaNet layers (dilation 1), and the n-gram table layer's of
//! Qwen3.8-Flash-Next (dilation `ngram_size`).
//!
//! Shapes in ggml order: x `[ch, rows]`, weights `[taps, ch]` (tap `j` of channel `c` at
//! `c·taps + j`, the last tap weighing the current row, tap `j` the input `(taps-1-j)·dilation`
//! rows back), state `[ch·(taps-1)·dilation, n_slots]`: the last `(taps-1)·dilation` inputs of
//! each sequence, oldest first (input `i` of channel `c` at `i·ch + c`). Rows
//! are taken in batch order; each one reads its slot's window and then shifts its own input in, so
//! the state *is* the sliding window: a batch may hold several sequences, and afterwards every slot
//! of the batch holds its last `taps-1` inputs. A row at position 0 clears its slot's window first.
//! No activation (the graph applies SiLU after). Tasks split the channels.

use super::{check_len, mul_dims, OpError, SharedMut};
use crate::linear::Parallel;

/// The shape of one convolution call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConvParams {
    /// Channels.
    pub ch: usize,
    /// Kernel taps (at least 1).
    pub taps: usize,
    /// Rows between taps (at least 1).
    pub dilation: usize,
    /// Sequence slots in the state.
    pub n_slots: usize,
}

/// Channels per task.
const BLOCK: usize = 256;

/// `out[t, c] = Σ_j w[j, c]·x[t - (taps-1-j)·dilation, c]`, the taps added in order of `j`, with
/// the window of each row's slot in `state`
/// (see the module docs), updating `state`. Every length and index is checked before anything is
/// written. No allocation.
#[allow(clippy::too_many_arguments)]
pub fn conv_causal(
    par: &dyn Parallel,
    x: &[f32],
    w: &[f32],
    state: &mut [f32],
    slots: &[u32],
    positions: &[i32],
    p: &ConvParams,
    out: &mut [f32],
) -> Result<(), OpError> {
    conv_causal_rows(par, x, w, state, slots, positions, p, out, None)
}

/// As [`conv_causal`], with `row_states` (`[ch·(taps-1)·dilation, rows]`) receiving each row's
/// window after the row shifted its input in: the state a pass ending at that row leaves.
#[allow(clippy::too_many_arguments)]
pub fn conv_causal_rows(
    par: &dyn Parallel,
    x: &[f32],
    w: &[f32],
    state: &mut [f32],
    slots: &[u32],
    positions: &[i32],
    p: &ConvParams,
    out: &mut [f32],
    row_states: Option<&mut [f32]>,
) -> Result<(), OpError> {
    const OP: &str = "conv_causal";
    let (ch, taps, dil) = (p.ch, p.taps, p.dilation);
    if ch == 0 || taps == 0 || dil == 0 {
        let what = format!("{ch} channels, {taps} taps and dilation {dil} (all must be positive)");
        return Err(OpError::Parameter { op: OP, what });
    }
    let rows = slots.len();
    let hist = mul_dims(OP, taps - 1, dil)?;
    let width = mul_dims(OP, hist, ch)?;
    check_len(OP, "positions", positions.len(), rows)?;
    check_len(OP, "x", x.len(), mul_dims(OP, ch, rows)?)?;
    check_len(OP, "out", out.len(), mul_dims(OP, ch, rows)?)?;
    check_len(OP, "w", w.len(), mul_dims(OP, taps, ch)?)?;
    check_len(OP, "state", state.len(), mul_dims(OP, width, p.n_slots)?)?;
    if let Some(rs) = &row_states {
        check_len(OP, "row states", rs.len(), mul_dims(OP, width, rows)?)?;
    }
    for (&s, &pos) in slots.iter().zip(positions) {
        if s as usize >= p.n_slots {
            return Err(OpError::Index {
                op: OP,
                what: "slot",
                index: i64::from(s),
                bound: p.n_slots,
            });
        }
        if pos < 0 {
            let what = format!("position {pos} is negative");
            return Err(OpError::Parameter { op: OP, what });
        }
    }
    let (st, o) = (SharedMut::new(state), SharedMut::new(out));
    let rs = row_states.map(SharedMut::new);
    par.for_each(ch.div_ceil(BLOCK), &|b| {
        let c0 = b * BLOCK;
        let n = BLOCK.min(ch - c0);
        let wb = &w[c0 * taps..(c0 + n) * taps];
        for (r, (&s, &pos)) in slots.iter().zip(positions).enumerate() {
            let base = s as usize * width + c0;
            let xr = &x[r * ch + c0..][..n];
            // SAFETY: this task owns channels c0..c0+n of every output row and of every window
            // row; no other task touches them, and each part below is dropped before the next
            // overlapping one is taken.
            let y = unsafe { o.part(r * ch + c0, n) };
            y.fill(0.0);
            if pos == 0 {
                for j in 0..hist {
                    // SAFETY: as above.
                    unsafe { st.part(base + j * ch, n) }.fill(0.0);
                }
            }
            for j in 0..taps - 1 {
                // SAFETY: as above; tap j reads window row j·dilation.
                let win = unsafe { st.part(base + j * dil * ch, n) };
                for (i, (yi, &xi)) in y.iter_mut().zip(win.iter()).enumerate() {
                    *yi += wb[i * taps + j] * xi;
                }
            }
            for (i, (yi, &xi)) in y.iter_mut().zip(xr).enumerate() {
                *yi += wb[i * taps + taps - 1] * xi;
            }
            for j in 0..hist {
                // SAFETY: as above; `win` and `next` are different window rows (j < j + 1).
                let win = unsafe { st.part(base + j * ch, n) };
                if j + 1 < hist {
                    // SAFETY: as above.
                    win.copy_from_slice(unsafe { st.part(base + (j + 1) * ch, n) });
                } else {
                    win.copy_from_slice(xr);
                }
            }
            if let Some(rs) = &rs {
                for j in 0..hist {
                    // SAFETY: as above; row r's column of the row states is this row's alone,
                    // and of it this task touches only its channels.
                    let dst = unsafe { rs.part(r * width + j * ch + c0, n) };
                    // SAFETY: as above.
                    dst.copy_from_slice(unsafe { st.part(base + j * ch, n) });
                }
            }
        }
    });
    Ok(())
}

#[cfg(test)]
#[path = "conv_tests.rs"]
mod tests;
