//! Means of spans of rows (a decision head's question and option spans).

use super::{check_len, OpError};

/// `out[:, s] = mean of x[:, start_s..end_s]` for `x` `[n, rows]` and `spans` `[2, n_spans]` (start,
/// end exclusive). A span must be non-empty and inside `x`. Sums in f64; no allocation.
pub fn span_mean(x: &[f32], n: usize, spans: &[i32], out: &mut [f32]) -> Result<(), OpError> {
    const OP: &str = "span_mean";
    if n == 0 || !x.len().is_multiple_of(n) || !spans.len().is_multiple_of(2) {
        return Err(OpError::Parameter {
            op: OP,
            what: format!(
                "{} values in rows of {n}, {} span bounds",
                x.len(),
                spans.len()
            ),
        });
    }
    let rows = x.len() / n;
    check_len(OP, "out", out.len(), spans.len() / 2 * n)?;
    for (span, o) in spans.chunks_exact(2).zip(out.chunks_exact_mut(n)) {
        let (start, end) = (span[0], span[1]);
        if start < 0 || end <= start || end as usize > rows {
            return Err(OpError::Parameter {
                op: OP,
                what: format!("span {start}..{end} of {rows} rows"),
            });
        }
        let (start, end) = (start as usize, end as usize);
        let count = (end - start) as f64;
        for (c, oc) in o.iter_mut().enumerate() {
            let sum: f64 = (start..end).map(|r| f64::from(x[r * n + c])).sum();
            *oc = (sum / count) as f32;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn means_each_span_and_refuses_empty_or_outside_spans() {
        let x = [1.0, 10.0, 3.0, 30.0, 5.0, 50.0];
        let mut out = [0.0; 4];
        span_mean(&x, 2, &[0, 2, 2, 3], &mut out).unwrap();
        assert_eq!(out, [2.0, 20.0, 5.0, 50.0]);
        assert!(span_mean(&x, 2, &[1, 1, 0, 1], &mut out).is_err());
        assert!(span_mean(&x, 2, &[0, 4, 0, 1], &mut out).is_err());
    }
}
