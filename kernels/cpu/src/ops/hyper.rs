//! Manifold hyper-connections (mHC, GLM-5.3): Sinkhorn normalisation of each token's stream
//! mixing matrix, the weighted sum of a token's residual streams (the block input), and the
//! streams' update from the block output. Layouts and steps are those of `Op::Sinkhorn`,
//! `Op::StreamMix` and `Op::StreamUpdate` (plugin-api); the arithmetic is f32 in the order
//! llama.cpp b11434's unfused graph takes it (`build_hc_sinkhorn`, `build_hc_pre`,
//! `build_hc_post`), with ggml's f64 row sums. No allocation.

use super::softmax::softmax_shifted;
use super::{check_len, mul_dims, whole_rows, OpError, SharedMut};
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
fn each_row(
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

/// The weighted sum of residual streams: `out[:, r] = Σ_j w[j, r]·streams[:, j, r]` for
/// `streams` `[n, s, rows]`, `w` `[s, rows]` and `out` `[n, rows]`, summed in order of `j`.
pub fn stream_mix(
    par: &dyn Parallel,
    streams: &[f32],
    w: &[f32],
    n: usize,
    s: usize,
    out: &mut [f32],
) -> Result<(), OpError> {
    const OP: &str = "stream_mix";
    let rows = whole_rows(OP, "streams", streams.len(), mul_dims(OP, n, s)?)?;
    check_len(OP, "w", w.len(), mul_dims(OP, s, rows)?)?;
    check_len(OP, "out", out.len(), mul_dims(OP, n, rows)?)?;
    if n == 0 {
        return Ok(());
    }
    each_row(par, out, n, &|r, o| {
        let (x, wr) = (&streams[r * s * n..][..s * n], &w[r * s..][..s]);
        o.fill(0.0);
        for (xj, &wj) in x.chunks_exact(n).zip(wr) {
            o.iter_mut().zip(xj).for_each(|(o, &v)| *o += v * wj);
        }
    });
    Ok(())
}

/// The sources of [`stream_update`], f32: `streams` `[n, s, rows]`, `comb` `[s, s, rows]`
/// (element `(i, j)` at `i + s·j + s²·r`, as [`sinkhorn`] lays it), `post` `[s, rows]` and the
/// block output `y` `[n, rows]`.
#[derive(Clone, Copy, Debug)]
pub struct UpdateInputs<'a> {
    /// The residual streams before the block.
    pub streams: &'a [f32],
    /// The mixing matrices.
    pub comb: &'a [f32],
    /// The block output's weight on each stream.
    pub post: &'a [f32],
    /// The block output.
    pub y: &'a [f32],
}

/// The streams' update: `out[:, i, r] = post[i, r]·y[:, r] + Σ_j comb[i, j, r]·streams[:, j, r]`
/// for `out` `[n, s, rows]` (the sources' shapes at [`UpdateInputs`]); the products added in
/// order of `j` after the block output's.
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
    check_len(OP, "comb", comb.len(), mul_dims(OP, s * s, rows)?)?;
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
        for (j, xj) in x.chunks_exact(n).enumerate() {
            let c = comb[r * s * s + i + s * j];
            o.iter_mut().zip(xj).for_each(|(o, &v)| *o += v * c);
        }
    });
    Ok(())
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
        stream_mix(&Serial, &streams, &[0.5, 2.0], 2, 2, &mut out).unwrap();
        assert_eq!(out, [20.5, 41.0]);
        // comb (i, j) at i + 2j: stream 0 takes 1·s0 + 3·s1, stream 1 takes 2·s0 + 4·s1.
        let mut out = [0.0; 4];
        let mut inputs = UpdateInputs {
            streams: &streams,
            comb: &[1.0, 2.0, 3.0, 4.0],
            post: &[10.0, 100.0],
            y: &[1.0, -1.0],
        };
        stream_update(&Serial, &inputs, 2, 2, &mut out).unwrap();
        assert_eq!(out, [41.0, 52.0, 142.0, -16.0]);
        assert!(stream_mix(&Serial, &streams, &[0.5], 2, 2, &mut [0.0; 2]).is_err());
        inputs.comb = &[1.0; 3];
        assert!(stream_update(&Serial, &inputs, 2, 2, &mut out).is_err());
    }
}
