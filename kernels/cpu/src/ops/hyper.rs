//! Hyper-connections: Sinkhorn normalisation of each token's stream mixing matrix (GLM-5.3's
//! manifold hyper-connections), the weighted sum of a token's residual streams (the block input;
//! per stream, or per element for Qwen3.8-Flash-Next's gated mean), the streams' update from the
//! block output (by a mixing matrix, or the identity), and the sigmoid gate of a group's dot
//! product (Qwen3.8-Flash-Next's n-gram table layer). Layouts and steps are those of
//! `Op::Sinkhorn`, `Op::StreamMix`, `Op::StreamUpdate` and `Op::GroupDotGate` (plugin-api); the
//! arithmetic is f32 in the order
//! llama.cpp b11434's unfused graph takes it (`build_hc_sinkhorn`, `build_hc_pre`,
//! `build_hc_post`), with ggml's f64 row sums. No allocation.

use super::softmax::softmax_shifted;
use super::{check_len, mul_dims, sigmoid_f32, whole_rows, OpError, SharedMut};
use crate::linear::Parallel;

/// Sinkhorn normalisation in place of `x`, `[n, n, m]` f32 matrices with element `(i, j)` of
/// matrix `r` at `i + n·j + n²·r` (`i` the destination stream, `j` the source): per matrix a
/// softmax over `i` for each `j`, `+ eps`, a normalisation over `j` (`x / (Σ_j x + eps)`), then
/// `iters − 1` times a normalisation over `i` followed by one over `j`. `iters` ≥ 1.
pub fn sinkhorn(x: &mut [f32], n: usize, iters: u32, eps: f32) -> Result<(), OpError> {
    const OP: &str = "sinkhorn";
    if iters == 0 {
        return Err(OpError::Parameter {
            op: OP,
            what: "0 iterations (the first normalisation is iteration 1)".into(),
        });
    }
    whole_rows(OP, "x", x.len(), mul_dims(OP, n, n)?)?;
    for mat in x.chunks_exact_mut(n * n) {
        for col in mat.chunks_exact_mut(n) {
            let max = col.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            softmax_shifted(col, max);
            col.iter_mut().for_each(|v| *v += eps);
        }
        over_sources(mat, n, eps);
        for _ in 1..iters {
            for col in mat.chunks_exact_mut(n) {
                let total = sum(col.iter().copied()) + eps;
                col.iter_mut().for_each(|v| *v /= total);
            }
            over_sources(mat, n, eps);
        }
    }
    Ok(())
}

/// `x / (Σ_j x + eps)` for each destination `i` of one `[n, n]` matrix.
fn over_sources(mat: &mut [f32], n: usize, eps: f32) {
    for i in 0..n {
        let total = sum((0..n).map(|j| mat[i + n * j])) + eps;
        (0..n).for_each(|j| mat[i + n * j] /= total);
    }
}

/// The sum of `v` accumulated in f64 and rounded to f32 (ggml's `sum_rows`).
fn sum(v: impl Iterator<Item = f32>) -> f32 {
    v.map(f64::from).sum::<f64>() as f32
}

/// Rows per task when `rows` rows are split over the pool: about four tasks a worker.
fn rows_per_task(par: &dyn Parallel, rows: usize) -> usize {
    rows.div_ceil(par.workers().max(1) * 4).max(1)
}

/// Runs `f(r, out_row)` for every row `r` of `out` (rows of `width` values), rows split over the
/// pool.
pub(crate) fn each_row(
    par: &dyn Parallel,
    out: &mut [f32],
    width: usize,
    f: &(dyn Fn(usize, &mut [f32]) + Sync),
) {
    let rows = out.len().checked_div(width).unwrap_or(0);
    let per = rows_per_task(par, rows);
    let o = SharedMut::new(out);
    par.for_each(rows.div_ceil(per), &|t| {
        for r in t * per..rows.min((t + 1) * per) {
            // SAFETY: row r belongs to task t alone, and each part is dropped before the next.
            f(r, unsafe { o.part(r * width, width) });
        }
    });
}

/// How [`stream_mix`] weighs the streams.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MixWeights {
    /// `w` `[s, rows]`: one weight per stream and row.
    PerStream,
    /// `w` `[n, s, rows]`: one weight per element.
    PerElement,
}

/// The weighted sum of residual streams: `out[i, r] = Σ_j w·streams[i, j, r]` for `streams`
/// `[n, s, rows]` and `out` `[n, rows]`, `w` `w[j, r]` ([`MixWeights::PerStream`]) or
/// `w[i, j, r]` ([`MixWeights::PerElement`]), summed in order of `j`.
pub fn stream_mix(
    par: &dyn Parallel,
    streams: &[f32],
    w: &[f32],
    (n, s, form): (usize, usize, MixWeights),
    out: &mut [f32],
) -> Result<(), OpError> {
    const OP: &str = "stream_mix";
    let rows = whole_rows(OP, "streams", streams.len(), mul_dims(OP, n, s)?)?;
    let per_row = match form {
        MixWeights::PerStream => s,
        MixWeights::PerElement => n * s,
    };
    check_len(OP, "w", w.len(), mul_dims(OP, per_row, rows)?)?;
    check_len(OP, "out", out.len(), mul_dims(OP, n, rows)?)?;
    if n == 0 {
        return Ok(());
    }
    each_row(par, out, n, &|r, o| {
        let (x, wr) = (&streams[r * s * n..][..s * n], &w[r * per_row..][..per_row]);
        o.fill(0.0);
        for (j, xj) in x.chunks_exact(n).enumerate() {
            match form {
                MixWeights::PerStream => {
                    let wj = wr[j];
                    o.iter_mut().zip(xj).for_each(|(o, &v)| *o += v * wj);
                }
                MixWeights::PerElement => o
                    .iter_mut()
                    .zip(xj.iter().zip(&wr[j * n..][..n]))
                    .for_each(|(o, (&v, &wj))| *o += v * wj),
            }
        }
    });
    Ok(())
}

/// The sources of [`stream_update`], f32: `streams` `[n, s, rows]`, `comb` `[s, s, rows]`
/// (element `(i, j)` at `i + s·j + s²·r`, as [`sinkhorn`] lays it) or `None` for the identity,
/// `post` `[s, rows]` and the block output `y` `[n, rows]`.
#[derive(Clone, Copy, Debug)]
pub struct UpdateInputs<'a> {
    /// The residual streams before the block.
    pub streams: &'a [f32],
    /// The mixing matrices (`None`: the identity).
    pub comb: Option<&'a [f32]>,
    /// The block output's weight on each stream.
    pub post: &'a [f32],
    /// The block output.
    pub y: &'a [f32],
}

/// The streams' update: `out[:, i, r] = post[i, r]·y[:, r] + Σ_j comb[i, j, r]·streams[:, j, r]`
/// for `out` `[n, s, rows]` (the sources' shapes at [`UpdateInputs`]); the products added in
/// order of `j` after the block output's. Without a comb, `out[:, i, r] = streams[:, i, r] +
/// post[i, r]·y[:, r]`.
pub fn stream_update(
    par: &dyn Parallel,
    inputs: &UpdateInputs<'_>,
    n: usize,
    s: usize,
    out: &mut [f32],
) -> Result<(), OpError> {
    const OP: &str = "stream_update";
    let UpdateInputs {
        streams,
        comb,
        post,
        y,
    } = *inputs;
    let rows = whole_rows(OP, "streams", streams.len(), mul_dims(OP, n, s)?)?;
    if let Some(comb) = comb {
        check_len(
            OP,
            "comb",
            comb.len(),
            mul_dims(OP, mul_dims(OP, s, s)?, rows)?,
        )?;
    }
    check_len(OP, "post", post.len(), mul_dims(OP, s, rows)?)?;
    check_len(OP, "y", y.len(), mul_dims(OP, n, rows)?)?;
    check_len(OP, "out", out.len(), streams.len())?;
    if n == 0 || s == 0 {
        return Ok(());
    }
    each_row(par, out, n, &|row, o| {
        let (r, i) = (row / s, row % s);
        let x = &streams[r * s * n..][..s * n];
        o.iter_mut()
            .zip(&y[r * n..][..n])
            .for_each(|(o, &v)| *o = v * post[r * s + i]);
        let Some(comb) = comb else {
            let xi = &x[i * n..][..n];
            o.iter_mut().zip(xi).for_each(|(o, &v)| *o += v);
            return;
        };
        for (j, xj) in x.chunks_exact(n).enumerate() {
            let c = comb[r * s * s + i + s * j];
            o.iter_mut().zip(xj).for_each(|(o, &v)| *o += v * c);
        }
    });
    Ok(())
}

/// The sigmoid gate of each group's dot product: for `a` and `b` `[n, groups]` and `out`
/// `[groups]`, `d = scale·Σ_i a[i]·b[i]` (f32 products summed in f64, rounded to f32, then
/// scaled) and `out = σ(sign(d)·√max(|d|, floor))`, `sign(0)` = 0 (`Op::GroupDotGate`).
pub fn group_dot_gate(
    a: &[f32],
    b: &[f32],
    n: usize,
    (scale, floor): (f32, f32),
    out: &mut [f32],
) -> Result<(), OpError> {
    const OP: &str = "group_dot_gate";
    if n == 0 {
        let what = "groups of 0 values".to_owned();
        return Err(OpError::Parameter { op: OP, what });
    }
    let groups = whole_rows(OP, "a", a.len(), n)?;
    check_len(OP, "b", b.len(), a.len())?;
    check_len(OP, "out", out.len(), groups)?;
    for ((o, ag), bg) in out.iter_mut().zip(a.chunks_exact(n)).zip(b.chunks_exact(n)) {
        let d = sum(ag.iter().zip(bg).map(|(&x, &y)| x * y)) * scale;
        *o = signed_sqrt_gate(d, floor);
    }
    Ok(())
}

/// `σ(sign(d)·√max(|d|, floor))` with `sign(0)` = 0 (so `d` = 0 gives ½): the gate of
/// [`group_dot_gate`] and of the Engram ([`super::engram`]).
pub(crate) fn signed_sqrt_gate(d: f32, floor: f32) -> f32 {
    let signed = if d == 0.0 {
        0.0
    } else {
        d.signum() * d.abs().max(floor).sqrt()
    };
    sigmoid_f32(signed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::linear::Serial;

    #[test]
    fn sinkhorn_of_equal_logits_is_uniform_and_counts_iterations() {
        // Equal logits: every step keeps the matrix uniform, 1/n up to eps.
        let mut x = vec![3.0f32; 2 * 16];
        sinkhorn(&mut x, 4, 20, 1e-6).unwrap();
        assert!(x.iter().all(|&v| (v - 0.25).abs() < 1e-6), "{x:?}");
        // One iteration of a 2x2: softmax over i, + eps, then over j only.
        let mut x = vec![0.0f32, 2f32.ln(), 0.0, 0.0];
        sinkhorn(&mut x, 2, 1, 0.0).unwrap();
        // Softmax columns: [1/3, 2/3], [1/2, 1/2]; rows i = 0: 1/3 + 1/2, i = 1: 2/3 + 1/2.
        let want = [
            (1.0 / 3.0) / (5.0 / 6.0),
            (2.0 / 3.0) / (7.0 / 6.0),
            0.5 / (5.0 / 6.0),
            0.5 / (7.0 / 6.0),
        ];
        for (g, w) in x.iter().zip(want) {
            assert!((g - w).abs() < 1e-6, "{x:?} against {want:?}");
        }
        assert!(sinkhorn(&mut x, 2, 0, 0.0).is_err());
        assert!(sinkhorn(&mut x[..3], 2, 1, 0.0).is_err());
    }

    #[test]
    fn mix_and_update_follow_the_index_order() {
        // Two streams of 2 values, one row.
        let streams = [1.0, 2.0, 10.0, 20.0];
        let mut out = [0.0; 2];
        let per_stream = (2, 2, MixWeights::PerStream);
        stream_mix(&Serial, &streams, &[0.5, 2.0], per_stream, &mut out).unwrap();
        assert_eq!(out, [20.5, 41.0]);
        let per_element = (2, 2, MixWeights::PerElement);
        stream_mix(
            &Serial,
            &streams,
            &[0.5, 1.0, 2.0, 3.0],
            per_element,
            &mut out,
        )
        .unwrap();
        assert_eq!(out, [20.5, 62.0]);
        // comb (i, j) at i + 2j: stream 0 takes 1·s0 + 3·s1, stream 1 takes 2·s0 + 4·s1.
        let mut out = [0.0; 4];
        let mut inputs = UpdateInputs {
            streams: &streams,
            comb: Some(&[1.0, 2.0, 3.0, 4.0]),
            post: &[10.0, 100.0],
            y: &[1.0, -1.0],
        };
        stream_update(&Serial, &inputs, 2, 2, &mut out).unwrap();
        assert_eq!(out, [41.0, 52.0, 142.0, -16.0]);
        // The identity comb: stream i takes s_i + post_i·y.
        let identity = UpdateInputs {
            comb: None,
            ..inputs
        };
        stream_update(&Serial, &identity, 2, 2, &mut out).unwrap();
        assert_eq!(out, [11.0, -8.0, 110.0, -80.0]);
        assert!(stream_mix(&Serial, &streams, &[0.5], per_stream, &mut [0.0; 2]).is_err());
        assert!(stream_mix(&Serial, &streams, &[0.5; 2], per_element, &mut [0.0; 2]).is_err());
        inputs.comb = Some(&[1.0; 3]);
        assert!(stream_update(&Serial, &inputs, 2, 2, &mut out).is_err());
    }
}
