//! `MatMul` over a stack of per-head weight matrices: `w [k, n, h]` times `x [k, h, m]` →
//! `y [n, h, m]`, one product per head (`y[:, j, r] = W_j·x[:, j, r]`), as latent attention's
//! absorbed `attn_k_b`/`attn_v_b` need. Each head is the plain [`linear::matmul`] over that head's
//! matrix and its gathered activation columns, so a head's result equals the single-matrix
//! product bit for bit.

use bloomery_plugin_api::{DType, PluginError};

use crate::linear::{self, Parallel, RowsDot};

/// The shape of one per-head product.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeadsShape {
    /// Input width per head (`k`, `ne0` of `w` and `x`).
    pub k: usize,
    /// Output width per head (`n`, `ne1` of `w`).
    pub n: usize,
    /// Heads (`h`, `ne2` of `w`, `ne1` of `x`).
    pub heads: usize,
    /// Columns (`m`, `ne2` of `x`).
    pub cols: usize,
}

/// The weight stack as bytes: head `j`'s matrix starts at byte `j·head_stride`, its rows
/// `row_stride` bytes apart.
#[derive(Debug, Clone, Copy)]
pub struct HeadStack<'a> {
    /// Weight type.
    pub dtype: DType,
    /// All heads' bytes.
    pub bytes: &'a [u8],
    /// Bytes between consecutive rows of one head.
    pub row_stride: usize,
    /// Bytes between consecutive heads.
    pub head_stride: usize,
}

/// `y[o + n·(j + h·r)] = W_j[o] · x[k·(j + h·r) ..][..k]` for every head `j`, column `r` and output
/// row `o`: `x` is `[k, h, m]` f32, `y` `[n, h, m]` f32. Activations are quantized per head (a
/// column's `k` values) for the weight type's dot product; each head's rows are split over the
/// pool. Allocates one head's activations and outputs per call.
pub fn matmul_heads(
    par: &dyn Parallel,
    dot: RowsDot,
    w: HeadStack<'_>,
    s: HeadsShape,
    x: &[f32],
    y: &mut [f32],
) -> Result<(), PluginError> {
    let HeadsShape { k, n, heads, cols } = s;
    let x_len = k.checked_mul(heads).and_then(|v| v.checked_mul(cols));
    let y_len = n.checked_mul(heads).and_then(|v| v.checked_mul(cols));
    if x_len != Some(x.len()) || y_len != Some(y.len()) {
        return Err(PluginError::invalid(format!(
            "per-head MatMul of {heads} heads [{k} -> {n}] over {cols} columns: x holds {} \
             values, y {}",
            x.len(),
            y.len()
        )));
    }
    let mut xs = vec![0f32; k * cols];
    let mut ys = vec![0f32; n * cols];
    for j in 0..heads {
        let start = j.saturating_mul(w.head_stride);
        let head = w.bytes.get(start..).ok_or_else(|| {
            PluginError::invalid(format!(
                "per-head MatMul: head {j} starts past the {} weight bytes",
                w.bytes.len()
            ))
        })?;
        for (r, col) in xs.chunks_exact_mut(k).enumerate() {
            col.copy_from_slice(&x[k * (j + heads * r)..][..k]);
        }
        let acts = linear::quantize_acts(w.dtype, k, &xs, cols)?;
        linear::matmul(par, dot, w.dtype, head, w.row_stride, k, n, &acts, &mut ys)?;
        for (r, col) in ys.chunks_exact(n).enumerate() {
            y[n * (j + heads * r)..][..n].copy_from_slice(col);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::linear::{reference_rows_dot, Serial};
    use crate::pool::Pool;
    use crate::quant;

    fn values(n: usize, seed: u32) -> Vec<f32> {
        let mut s = seed.wrapping_mul(2_654_435_761).wrapping_add(1);
        (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 17;
                s ^= s << 5;
                (s % 2001) as f32 / 1000.0 - 1.0
            })
            .collect()
    }

    /// `v` as rows of `k` values of type `t`, and those rows read back as f64.
    fn weights(t: DType, v: &[f32], k: usize) -> (Vec<u8>, Vec<f64>) {
        let row = t.row_bytes(k as u64).unwrap() as usize;
        let mut bytes = vec![0u8; v.len() / k * row];
        let mut back = vec![0f32; v.len()];
        for ((src, dst), b) in v
            .chunks_exact(k)
            .zip(bytes.chunks_exact_mut(row))
            .zip(back.chunks_exact_mut(k))
        {
            quant::quantize_row(t, src, dst).unwrap();
            quant::dequantize_row(t, dst, b).unwrap();
        }
        (bytes, back.iter().map(|&x| f64::from(x)).collect())
    }

    /// The per-head product in f64 from the weights as stored: `y[:, j, r] = W_j·x[:, j, r]`,
    /// and the bound `Σ|w·x|` of each element (for the tolerance).
    fn reference(w: &[f64], x: &[f32], s: HeadsShape) -> (Vec<f64>, Vec<f64>) {
        let HeadsShape { k, n, heads, cols } = s;
        let mut y = vec![0f64; n * heads * cols];
        let mut mag = vec![0f64; n * heads * cols];
        for r in 0..cols {
            for j in 0..heads {
                for o in 0..n {
                    let wr = &w[(j * n + o) * k..][..k];
                    let xc = &x[k * (j + heads * r)..][..k];
                    let at = o + n * (j + heads * r);
                    for (&a, &b) in wr.iter().zip(xc) {
                        y[at] += a * f64::from(b);
                        mag[at] += (a * f64::from(b)).abs();
                    }
                }
            }
        }
        (y, mag)
    }

    #[test]
    fn each_head_multiplies_its_own_columns_by_its_own_matrix() {
        // GLM-5.3's absorbed shapes, fewer heads: attn_k_b [256, 512, h] and attn_v_b
        // [512, 256, h], for a prompt of 3 columns and a decode column.
        let pool = Pool::new(crate::pool::PoolOptions::new(3)).unwrap();
        for (t, tol) in [
            (DType::F32, 1e-6),
            (DType::F16, 2e-3),
            (DType::BF16, 1e-2),
            (DType::Q8_0, 1e-2),
        ] {
            for (k, n, heads, cols) in [(256, 512, 3, 3), (512, 256, 4, 1), (64, 32, 5, 2)] {
                let s = HeadsShape { k, n, heads, cols };
                let (bytes, w64) = weights(t, &values(k * n * heads, 7), k);
                let x = values(k * heads * cols, 11);
                let row = t.row_bytes(k as u64).unwrap() as usize;
                let stack = HeadStack {
                    dtype: t,
                    bytes: &bytes,
                    row_stride: row,
                    head_stride: row * n,
                };
                let (want, mag) = reference(&w64, &x, s);
                for par in [&Serial as &dyn Parallel, &pool] {
                    let mut y = vec![f32::NAN; n * heads * cols];
                    matmul_heads(par, reference_rows_dot, stack, s, &x, &mut y).unwrap();
                    for (i, ((&g, &e), &m)) in y.iter().zip(&want).zip(&mag).enumerate() {
                        let err = (f64::from(g) - e).abs();
                        assert!(
                            err <= tol * m + 1e-9,
                            "{t} {s:?} element {i}: {g} vs {e} (bound {m})"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn wrong_lengths_are_refused_by_name() {
        let s = HeadsShape {
            k: 32,
            n: 2,
            heads: 2,
            cols: 1,
        };
        let w = vec![0u8; 32 * 2 * 2 * 4];
        let stack = HeadStack {
            dtype: DType::F32,
            bytes: &w,
            row_stride: 128,
            head_stride: 256,
        };
        let mut y = vec![0f32; 4];
        let e = matmul_heads(&Serial, reference_rows_dot, stack, s, &[0.0; 63], &mut y)
            .unwrap_err()
            .to_string();
        assert!(e.contains("per-head MatMul"), "{e}");
    }
}
