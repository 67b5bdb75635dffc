//! DeepSeek-V4.1-Flash's Engram gated read (`Op::EngramGate`, plugin-api): every residual stream
//! adds the table value scaled by a sigmoid gate of its own normed dot product with its key. f32
//! arithmetic with the RMS norms' squares and the dot product summed in f64 (ggml's `sum_rows`
//! and `rms_norm` rounding). No allocation.

use super::hyper::{each_row, signed_sqrt_gate};
use super::{check_len, mul_dims, whole_rows, OpError};
use crate::linear::Parallel;

/// The sources of [`engram_gate`], f32: `streams` `[n, s, rows]`, `kv` `[n·(s+1), rows]` laid out
/// `[key_0 | … | key_{s−1} | value]` per row, and the per-stream norm weights `q_norm`, `k_norm`
/// `[n, s]`.
#[derive(Clone, Copy, Debug)]
pub struct EngramInputs<'a> {
    /// The residual streams before the layer's attention block.
    pub streams: &'a [f32],
    /// `engram_wkv` applied to the row's gathered table rows.
    pub kv: &'a [f32],
    /// The stream norm's weights.
    pub q_norm: &'a [f32],
    /// The key norm's weights.
    pub k_norm: &'a [f32],
}

/// The constants of [`engram_gate`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct EngramGate {
    /// ε inside both RMS norms.
    pub eps: f32,
    /// Multiplies the dot product (`1/√n` in the model).
    pub scale: f32,
    /// Least magnitude under the square root (1e-6 in the model).
    pub floor: f32,
}

/// `1/√(mean(x²) + eps)`, squares in f32 summed in f64, the mean and the root in f32.
fn inv_rms(x: &[f32], eps: f32) -> f32 {
    let sum_sq: f64 = x.iter().map(|&v| f64::from(v * v)).sum();
    let mean_sq = (sum_sq / x.len() as f64) as f32;
    1.0 / (mean_sq + eps).sqrt()
}

/// `out[:, j, r] = streams[:, j, r] + g·value_r` for every stream `j` and row `r` of `out`
/// `[n, s, rows]`, `g = σ(sign(d)·√max(|d|, floor))`, `d = scale·Σ_i rms(h)[i]·q_norm[i, j]·
/// k_norm[i, j]·rms(key_j)[i]` (`Op::EngramGate`).
pub fn engram_gate(
    par: &dyn Parallel,
    inputs: &EngramInputs<'_>,
    (n, s): (usize, usize),
    c: EngramGate,
    out: &mut [f32],
) -> Result<(), OpError> {
    const OP: &str = "engram_gate";
    let EngramInputs {
        streams,
        kv,
        q_norm,
        k_norm,
    } = *inputs;
    let rows = whole_rows(OP, "streams", streams.len(), mul_dims(OP, n, s)?)?;
    let kv_row = mul_dims(OP, n, s + 1)?;
    check_len(OP, "kv", kv.len(), mul_dims(OP, kv_row, rows)?)?;
    check_len(OP, "q_norm", q_norm.len(), n * s)?;
    check_len(OP, "k_norm", k_norm.len(), n * s)?;
    check_len(OP, "out", out.len(), streams.len())?;
    if !(c.floor.is_finite() && c.floor >= 0.0) {
        let what = format!("floor {} (must be finite and not negative)", c.floor);
        return Err(OpError::Parameter { op: OP, what });
    }
    if n == 0 || s == 0 {
        return Ok(());
    }
    each_row(par, out, n, &|row, o| {
        let (r, j) = (row / s, row % s);
        let h = &streams[row * n..][..n];
        let kv_r = &kv[r * kv_row..][..kv_row];
        let (key, value) = (&kv_r[j * n..][..n], &kv_r[s * n..]);
        let (qw, kw) = (&q_norm[j * n..][..n], &k_norm[j * n..][..n]);
        let (ih, ik) = (inv_rms(h, c.eps), inv_rms(key, c.eps));
        let dot: f64 = h
            .iter()
            .zip(key)
            .zip(qw.iter().zip(kw))
            .map(|((&x, &k), (&q, &w))| f64::from(x * ih * q * w * (k * ik)))
            .sum();
        let g = signed_sqrt_gate(dot as f32 * c.scale, c.floor);
        o.iter_mut()
            .zip(h.iter().zip(value))
            .for_each(|(o, (&x, &v))| *o = x + g * v);
    });
    Ok(())
}
