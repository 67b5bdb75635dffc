//! Row norms, in place: RMSNorm, LayerNorm and L2 norm over every row of `[row_len, n_rows]`.
//!
//! A row can be a whole hidden state (`row_len = n_embd`) or one head (`row_len = head_dim`, the
//! `[head_dim, n_head, n_rows]` tensor seen as `n_head * n_rows` rows), which is how QK-norm and
//! the GDN/KDA q/k L2 norms are applied. Sums are accumulated in f64. Nothing allocates.

use super::{check_len, whole_rows, OpError};

/// How the L2 norm's epsilon enters the denominator.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum L2Epsilon {
    /// `x / max(‖x‖, eps)`, as ggml's `ggml_l2_norm`.
    Max,
    /// `x / sqrt(‖x‖² + eps)`, as FLA's `l2norm` (and llama.cpp's GDN/KDA graphs, which build it from
    /// `rms_norm(x, eps / n) / sqrt(n)`).
    AddSquared,
}

fn check_affine(
    op: &'static str,
    what: &'static str,
    v: Option<&[f32]>,
    row_len: usize,
) -> Result<(), OpError> {
    match v {
        Some(v) => check_len(op, what, v.len(), row_len),
        None => Ok(()),
    }
}

/// RMSNorm of every row in place: `x / sqrt(mean(x²) + eps)`, then `* weight` when given.
///
/// `x` is `[row_len, n_rows]` f32 (any row count, including zero); `weight`, when given, is
/// `[row_len]` and is shared by every row. `eps` is added to the mean square. No allocation.
pub fn rms_norm(
    x: &mut [f32],
    row_len: usize,
    eps: f32,
    weight: Option<&[f32]>,
) -> Result<(), OpError> {
    const OP: &str = "rms_norm";
    whole_rows(OP, "x", x.len(), row_len)?;
    check_affine(OP, "weight", weight, row_len)?;
    for row in x.chunks_exact_mut(row_len) {
        // ggml's rounding: squares in f32, summed in f64, the mean and the root in f32.
        let sum_sq: f64 = row.iter().map(|&v| f64::from(v * v)).sum();
        let mean_sq = (sum_sq / row_len as f64) as f32;
        let inv = 1.0 / (mean_sq + eps).sqrt();
        match weight {
            Some(w) => row.iter_mut().zip(w).for_each(|(v, &w)| *v = *v * inv * w),
            None => row.iter_mut().for_each(|v| *v *= inv),
        }
    }
    Ok(())
}

/// LayerNorm of every row in place: `(x - mean) / sqrt(var + eps)`, then `* weight` and `+ bias`
/// when given.
///
/// `x` is `[row_len, n_rows]` f32; `weight` and `bias`, when given, are `[row_len]` each. `var` is
/// the population variance of the row (divided by `row_len`). No allocation.
pub fn layer_norm(
    x: &mut [f32],
    row_len: usize,
    eps: f32,
    weight: Option<&[f32]>,
    bias: Option<&[f32]>,
) -> Result<(), OpError> {
    const OP: &str = "layer_norm";
    whole_rows(OP, "x", x.len(), row_len)?;
    check_affine(OP, "weight", weight, row_len)?;
    check_affine(OP, "bias", bias, row_len)?;
    let n = row_len as f64;
    for row in x.chunks_exact_mut(row_len) {
        let mean = row.iter().map(|&v| f64::from(v)).sum::<f64>() / n;
        let var = row
            .iter()
            .map(|&v| (f64::from(v) - mean).powi(2))
            .sum::<f64>()
            / n;
        let inv = 1.0 / (var + f64::from(eps)).sqrt();
        for (i, v) in row.iter_mut().enumerate() {
            let mut y = ((f64::from(*v) - mean) * inv) as f32;
            if let Some(w) = weight {
                y *= w[i];
            }
            if let Some(b) = bias {
                y += b[i];
            }
            *v = y;
        }
    }
    Ok(())
}

/// L2 normalisation of every row in place: `x / ‖x‖`, with `eps` entering as [`L2Epsilon`] says.
///
/// `x` is `[row_len, n_rows]` f32. No allocation.
pub fn l2_norm(x: &mut [f32], row_len: usize, eps: f32, mode: L2Epsilon) -> Result<(), OpError> {
    whole_rows("l2_norm", "x", x.len(), row_len)?;
    for row in x.chunks_exact_mut(row_len) {
        let sum_sq: f64 = row.iter().map(|&v| f64::from(v) * f64::from(v)).sum();
        let denom = match mode {
            L2Epsilon::Max => sum_sq.sqrt().max(f64::from(eps)),
            L2Epsilon::AddSquared => (sum_sq + f64::from(eps)).sqrt(),
        };
        let inv = (1.0 / denom) as f32;
        row.iter_mut().for_each(|v| *v *= inv);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{rngs::StdRng, Rng, SeedableRng};

    fn random(n: usize, seed: u64) -> Vec<f32> {
        let mut rng = StdRng::seed_from_u64(seed);
        (0..n).map(|_| rng.gen_range(-3.0f32..3.0)).collect()
    }

    fn close(a: &[f32], b: &[f64], tol: f64) {
        assert_eq!(a.len(), b.len());
        for (i, (&x, &y)) in a.iter().zip(b).enumerate() {
            assert!(
                (f64::from(x) - y).abs() <= tol * (1.0 + y.abs()),
                "at {i}: {x} vs {y}"
            );
        }
    }

    #[test]
    fn rms_norm_matches_f64_for_awkward_shapes() {
        for (row_len, n_rows) in [(1, 1), (7, 1), (13, 7), (129, 3)] {
            let x = random(row_len * n_rows, row_len as u64);
            let w = random(row_len, 99);
            let eps = 1e-5;
            for weighted in [false, true] {
                let mut got = x.clone();
                rms_norm(&mut got, row_len, eps, weighted.then_some(&w[..])).unwrap();
                let mut want = Vec::new();
                for r in x.chunks(row_len) {
                    let ms = r.iter().map(|&v| (v as f64).powi(2)).sum::<f64>() / row_len as f64;
                    for (i, &v) in r.iter().enumerate() {
                        let wi = if weighted { w[i] as f64 } else { 1.0 };
                        want.push(v as f64 / (ms + eps as f64).sqrt() * wi);
                    }
                }
                close(&got, &want, 1e-6);
            }
        }
    }

    #[test]
    fn rms_norm_per_head_equals_each_head_alone() {
        let (head_dim, n_head, n_rows) = (9, 3, 7);
        let x = random(head_dim * n_head * n_rows, 5);
        let mut all = x.clone();
        rms_norm(&mut all, head_dim, 1e-6, None).unwrap();
        for (h, chunk) in x.chunks(head_dim).enumerate() {
            let mut one = chunk.to_vec();
            rms_norm(&mut one, head_dim, 1e-6, None).unwrap();
            assert_eq!(&all[h * head_dim..(h + 1) * head_dim], &one[..]);
        }
    }

    #[test]
    fn layer_norm_matches_f64() {
        let (row_len, n_rows) = (11, 7);
        let x = random(row_len * n_rows, 3);
        let w = random(row_len, 4);
        let b = random(row_len, 6);
        let eps = 1e-5;
        let mut got = x.clone();
        layer_norm(&mut got, row_len, eps, Some(&w), Some(&b)).unwrap();
        let mut want = Vec::new();
        for r in x.chunks(row_len) {
            let n = row_len as f64;
            let mean = r.iter().map(|&v| v as f64).sum::<f64>() / n;
            let var = r
                .iter()
                .map(|&v| (v as f64 - mean) * (v as f64 - mean))
                .sum::<f64>()
                / n;
            for (i, &v) in r.iter().enumerate() {
                want.push(
                    (v as f64 - mean) / (var + eps as f64).sqrt() * w[i] as f64 + b[i] as f64,
                );
            }
        }
        close(&got, &want, 1e-5);
        let mut plain = x.clone();
        layer_norm(&mut plain, row_len, eps, None, None).unwrap();
        let mean: f32 = plain[..row_len].iter().sum::<f32>() / row_len as f32;
        assert!(mean.abs() < 1e-5);
    }

    #[test]
    fn l2_norm_modes_match_f64() {
        let (row_len, n_rows) = (5, 7);
        let mut x = random(row_len * n_rows, 8);
        x[..row_len].iter_mut().for_each(|v| *v *= 1e-4); // a tiny row where eps matters
        let eps = 1e-6f32;
        for mode in [L2Epsilon::Max, L2Epsilon::AddSquared] {
            let mut got = x.clone();
            l2_norm(&mut got, row_len, eps, mode).unwrap();
            let mut want = Vec::new();
            for r in x.chunks(row_len) {
                let ss = r.iter().map(|&v| (v as f64).powi(2)).sum::<f64>();
                let d = match mode {
                    L2Epsilon::Max => ss.sqrt().max(eps as f64),
                    L2Epsilon::AddSquared => (ss + eps as f64).sqrt(),
                };
                want.extend(r.iter().map(|&v| v as f64 / d));
            }
            close(&got, &want, 1e-6);
        }
    }

    #[test]
    fn bad_shapes_are_named_errors() {
        let mut x = vec![0.0f32; 10];
        assert!(matches!(
            rms_norm(&mut x, 3, 1e-6, None),
            Err(OpError::NotWholeRows { .. })
        ));
        assert!(matches!(
            rms_norm(&mut x, 0, 1e-6, None),
            Err(OpError::Parameter { .. })
        ));
        let w = [1.0f32; 4];
        assert!(matches!(
            rms_norm(&mut x, 5, 1e-6, Some(&w)),
            Err(OpError::Length { .. })
        ));
        assert!(matches!(
            layer_norm(&mut x, 5, 1e-6, None, Some(&w)),
            Err(OpError::Length { .. })
        ));
        let mut empty: Vec<f32> = Vec::new();
        assert!(rms_norm(&mut empty, 5, 1e-6, None).is_ok());
    }
}
