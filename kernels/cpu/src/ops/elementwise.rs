//! Elementwise arithmetic in place: add and multiply (same shape, one row broadcast over many rows,
//! or one value per row broadcast over its row) and scale. No allocation.

use super::{check_len, whole_rows, OpError};

fn broadcast(
    op: &'static str,
    dst: &mut [f32],
    src: &[f32],
    f: impl Fn(&mut f32, f32),
) -> Result<(), OpError> {
    if src.is_empty() {
        return if dst.is_empty() {
            Ok(())
        } else {
            Err(OpError::Length {
                op,
                what: "src",
                found: 0,
                expected: dst.len(),
            })
        };
    }
    whole_rows(op, "dst", dst.len(), src.len())?;
    for row in dst.chunks_exact_mut(src.len()) {
        row.iter_mut().zip(src).for_each(|(d, &s)| f(d, s));
    }
    Ok(())
}

/// `dst += src`. `src` has the length of `dst` (elementwise) or is one row that `dst` is a whole
/// number of (`dst` `[n, n_rows]`, `src` `[n]`, added to every row). f32.
pub fn add(dst: &mut [f32], src: &[f32]) -> Result<(), OpError> {
    broadcast("add", dst, src, |d, s| *d += s)
}

/// `dst *= src`, with the same broadcasting as [`add`]. f32.
pub fn mul(dst: &mut [f32], src: &[f32]) -> Result<(), OpError> {
    broadcast("mul", dst, src, |d, s| *d *= s)
}

fn per_row(
    op: &'static str,
    dst: &mut [f32],
    src: &[f32],
    f: impl Fn(&mut f32, f32),
) -> Result<(), OpError> {
    if src.is_empty() {
        return check_len(op, "dst", dst.len(), 0);
    }
    let n = whole_rows(op, "dst", dst.len(), src.len())?;
    for (row, &s) in dst.chunks_exact_mut(n).zip(src) {
        row.iter_mut().for_each(|d| f(d, s));
    }
    Ok(())
}

/// `dst[:, r] += src[r]`: `src` `[1, m]` holds one value per row of `dst` `[n, m]`. f32.
pub fn add_per_row(dst: &mut [f32], src: &[f32]) -> Result<(), OpError> {
    per_row("add", dst, src, |d, s| *d += s)
}

/// `dst[:, r] *= src[r]`, broadcasting as [`add_per_row`]. f32.
pub fn mul_per_row(dst: &mut [f32], src: &[f32]) -> Result<(), OpError> {
    per_row("mul", dst, src, |d, s| *d *= s)
}

/// `x *= factor` for every element. f32, any length.
pub fn scale(x: &mut [f32], factor: f32) {
    x.iter_mut().for_each(|v| *v *= factor);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn add_and_mul_same_shape_and_broadcast() {
        let src: Vec<f32> = (0..21).map(|i| i as f32 * 0.5 - 3.0).collect();
        let mut a = vec![1.5f32; 21];
        add(&mut a, &src).unwrap();
        for i in 0..21 {
            assert_eq!(a[i] as f64, 1.5 + src[i] as f64);
        }
        let row = [2.0f32, -1.0, 0.5];
        let mut m: Vec<f32> = (0..21).map(|i| i as f32).collect();
        mul(&mut m, &row).unwrap();
        for i in 0..21 {
            assert_eq!(m[i] as f64, i as f64 * row[i % 3] as f64);
        }
        let mut b: Vec<f32> = (0..21).map(|i| i as f32).collect();
        add(&mut b, &row).unwrap();
        assert_eq!(b[4] as f64, 4.0 - 1.0);
        let mut s = vec![2.0f32, -4.0];
        scale(&mut s, 0.25);
        assert_eq!(s, vec![0.5, -1.0]);
    }

    #[test]
    fn one_value_per_row_broadcasts_over_its_row() {
        let per_row: [f32; 3] = [2.0, -1.0, 0.5];
        let mut m: Vec<f32> = (0..12).map(|i| i as f32).collect();
        mul_per_row(&mut m, &per_row).unwrap();
        for i in 0..12 {
            assert_eq!(m[i], i as f32 * per_row[i / 4]);
        }
        let mut a: Vec<f32> = (0..12).map(|i| i as f32).collect();
        add_per_row(&mut a, &per_row).unwrap();
        for i in 0..12 {
            assert_eq!(a[i], i as f32 + per_row[i / 4]);
        }
        // Rows of one value: the same as the elementwise product.
        let mut one = vec![3.0f32; 3];
        mul_per_row(&mut one, &per_row).unwrap();
        assert_eq!(one, vec![6.0, -3.0, 1.5]);
        assert!(matches!(
            add_per_row(&mut a, &[1.0; 5]),
            Err(OpError::NotWholeRows { .. })
        ));
        assert!(matches!(
            mul_per_row(&mut a, &[]),
            Err(OpError::Length { .. })
        ));
    }

    #[test]
    fn shape_mismatch_is_a_named_error() {
        let mut a = vec![0.0f32; 10];
        assert!(matches!(
            add(&mut a, &[1.0; 3]),
            Err(OpError::NotWholeRows { .. })
        ));
        assert!(matches!(mul(&mut a, &[]), Err(OpError::Length { .. })));
        let mut empty: Vec<f32> = vec![];
        assert!(add(&mut empty, &[]).is_ok());
        assert!(add(&mut empty, &[1.0, 2.0]).is_ok());
    }
}
