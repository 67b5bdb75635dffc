//! Numerically stable softmax over rows, in place, with an optional scale and additive mask (the
//! semantics of ggml's `ggml_soft_max_ext` without ALiBi).

use super::{check_len, whole_rows, OpError};

/// Softmax of every row of `x`, `[n_cols, n_rows]` f32, in place: `softmax(x * scale + mask)`.
///
/// `mask`, when given, is `[n_cols, n_mask_rows]` f32 added after scaling, where `n_mask_rows`
/// divides `n_rows` and row `r` uses mask row `r % n_mask_rows` (so a `[n_cols, n_tokens]` mask is
/// shared by every head of `[n_cols, n_tokens, n_head]` scores). `-inf` entries exclude a column; a
/// row whose every column is `-inf` becomes all zeros instead of NaN. The maximum is subtracted
/// before exponentiating and the sum is accumulated in f64. No allocation.
pub fn softmax(
    x: &mut [f32],
    n_cols: usize,
    scale: f32,
    mask: Option<&[f32]>,
) -> Result<(), OpError> {
    const OP: &str = "softmax";
    let n_rows = whole_rows(OP, "x", x.len(), n_cols)?;
    let n_mask_rows = match mask {
        Some(m) => {
            let k = whole_rows(OP, "mask", m.len(), n_cols)?;
            if k == 0 || !n_rows.is_multiple_of(k) {
                return Err(OpError::Parameter {
                    op: OP,
                    what: format!("mask has {k} rows, which must divide the {n_rows} rows of x"),
                });
            }
            k
        }
        None => 1,
    };
    for (r, row) in x.chunks_exact_mut(n_cols).enumerate() {
        let m = mask.map(|m| &m[(r % n_mask_rows) * n_cols..][..n_cols]);
        let mut max = f32::NEG_INFINITY;
        for (i, v) in row.iter_mut().enumerate() {
            *v *= scale;
            if let Some(m) = m {
                *v += m[i];
            }
            max = max.max(*v);
        }
        softmax_shifted(row, max);
    }
    Ok(())
}

/// Replaces `row` by `exp(row - max) / sum`, or zeros when `max` is `-inf` (nothing visible).
pub(crate) fn softmax_shifted(row: &mut [f32], max: f32) {
    if max == f32::NEG_INFINITY || max.is_nan() {
        row.iter_mut()
            .for_each(|v| *v = if max.is_nan() { f32::NAN } else { 0.0 });
        return;
    }
    let mut sum = 0.0f64;
    for v in row.iter_mut() {
        *v = (*v - max).exp();
        sum += f64::from(*v);
    }
    let inv = (1.0 / sum) as f32;
    row.iter_mut().for_each(|v| *v *= inv);
}

/// Softmax of one row in place without scale or mask; `Err` only when `row` is empty.
pub fn softmax_row(row: &mut [f32]) -> Result<(), OpError> {
    if row.is_empty() {
        return check_len("softmax_row", "row", 0, 1);
    }
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    softmax_shifted(row, max);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{rngs::StdRng, Rng, SeedableRng};

    fn reference(x: &[f32], n_cols: usize, scale: f32, mask: Option<&[f32]>) -> Vec<f64> {
        let mut out = Vec::new();
        let n_mask = mask.map_or(1, |m| m.len() / n_cols);
        for (r, row) in x.chunks(n_cols).enumerate() {
            let z: Vec<f64> = row
                .iter()
                .enumerate()
                .map(|(i, &v)| {
                    v as f64 * scale as f64
                        + mask.map_or(0.0, |m| m[(r % n_mask) * n_cols + i] as f64)
                })
                .collect();
            let mx = z.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let e: Vec<f64> = z.iter().map(|&v| (v - mx).exp()).collect();
            let s: f64 = e.iter().sum();
            out.extend(e.iter().map(|v| v / s));
        }
        out
    }

    #[test]
    fn matches_f64_with_scale_and_broadcast_mask() {
        let mut rng = StdRng::seed_from_u64(11);
        for (n_cols, n_rows, n_mask) in [(1, 1, 1), (13, 7, 7), (5, 6, 3), (33, 2, 1)] {
            let x: Vec<f32> = (0..n_cols * n_rows)
                .map(|_| rng.gen_range(-30.0f32..30.0))
                .collect();
            let mut m: Vec<f32> = (0..n_cols * n_mask)
                .map(|_| rng.gen_range(-2.0f32..2.0))
                .collect();
            if n_cols > 1 {
                m[0] = f32::NEG_INFINITY;
            }
            let mut got = x.clone();
            softmax(&mut got, n_cols, 0.7, Some(&m)).unwrap();
            let want = reference(&x, n_cols, 0.7, Some(&m));
            for (a, b) in got.iter().zip(&want) {
                assert!((*a as f64 - b).abs() < 1e-6, "{a} vs {b}");
            }
            let mut plain = x.clone();
            softmax(&mut plain, n_cols, 1.0, None).unwrap();
            for (a, b) in plain.iter().zip(reference(&x, n_cols, 1.0, None)) {
                assert!((*a as f64 - b).abs() < 1e-6);
            }
        }
    }

    #[test]
    fn stable_for_huge_logits_and_fully_masked_rows() {
        let mut x = vec![1e30f32, 1e30, -1e30, 0.0, 0.0, 0.0];
        let mask = [
            0.0f32,
            0.0,
            0.0,
            f32::NEG_INFINITY,
            f32::NEG_INFINITY,
            f32::NEG_INFINITY,
        ];
        softmax(&mut x, 3, 1.0, Some(&mask)).unwrap();
        assert_eq!(x, vec![0.5, 0.5, 0.0, 0.0, 0.0, 0.0]);
        let mut r = vec![1000.0f32, 999.0];
        softmax_row(&mut r).unwrap();
        assert!((r[0] - 1.0 / (1.0 + (-1f32).exp())).abs() < 1e-6);
    }

    #[test]
    fn bad_mask_is_a_named_error() {
        let mut x = vec![0.0f32; 12];
        assert!(matches!(
            softmax(&mut x, 3, 1.0, Some(&[0.0; 9])),
            Err(OpError::Parameter { .. })
        ));
        assert!(matches!(
            softmax(&mut x, 3, 1.0, Some(&[0.0; 4])),
            Err(OpError::NotWholeRows { .. })
        ));
        assert!(matches!(
            softmax(&mut x, 5, 1.0, None),
            Err(OpError::NotWholeRows { .. })
        ));
    }
}
