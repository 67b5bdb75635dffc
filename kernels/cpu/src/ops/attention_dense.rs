//! Dense attention between tensors of a graph (no cache): every query row against every key row
//! of the same call, as decision heads and cross-attention use it.

use super::{check_len, mul_dims, OpError};

/// The extents of one dense attention call.
#[derive(Clone, Copy, Debug)]
pub struct DenseShape {
    /// Key (and query) width per head.
    pub dk: usize,
    /// Value width per head.
    pub dv: usize,
    /// Query heads.
    pub n_head: usize,
    /// Key/value heads (a divisor of `n_head`; query head `h` reads key head `h / (n_head /
    /// n_head_kv)`).
    pub n_head_kv: usize,
    /// Query rows.
    pub n_q: usize,
    /// Key/value rows.
    pub n_k: usize,
    /// Logit scale.
    pub scale: f32,
    /// Query `i` sees keys `0..=i` only.
    pub causal: bool,
}

/// `out[:, h, i] = Σ_j softmax_j(scale · q[:, h, i]·k[:, g, j]) v[:, g, j]` with `q` `[dk,
/// n_head, n_q]`, `k` `[dk, n_head_kv, n_k]`, `v` `[dv, n_head_kv, n_k]` and `out` `[dv, n_head,
/// n_q]` (`scale` and `causal` from the shape). Scores and sums in f64; `scores` is
/// caller-owned scratch of at least `n_k` values, so nothing allocates.
pub fn attention_dense(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    out: &mut [f32],
    s: DenseShape,
    scores: &mut [f64],
) -> Result<(), OpError> {
    const OP: &str = "attention_dense";
    if s.n_head_kv == 0 || !s.n_head.is_multiple_of(s.n_head_kv) || s.n_k == 0 {
        return Err(OpError::Parameter {
            op: OP,
            what: format!(
                "{} query heads, {} key heads, {} keys",
                s.n_head, s.n_head_kv, s.n_k
            ),
        });
    }
    let rows = |w: usize, h: usize, n: usize| mul_dims(OP, w, h).and_then(|x| mul_dims(OP, x, n));
    check_len(OP, "q", q.len(), rows(s.dk, s.n_head, s.n_q)?)?;
    check_len(OP, "k", k.len(), rows(s.dk, s.n_head_kv, s.n_k)?)?;
    check_len(OP, "v", v.len(), rows(s.dv, s.n_head_kv, s.n_k)?)?;
    check_len(OP, "out", out.len(), rows(s.dv, s.n_head, s.n_q)?)?;
    if scores.len() < s.n_k {
        return Err(OpError::Length {
            op: OP,
            what: "scores",
            found: scores.len(),
            expected: s.n_k,
        });
    }
    let group = s.n_head / s.n_head_kv;
    for i in 0..s.n_q {
        let seen = if s.causal { (i + 1).min(s.n_k) } else { s.n_k };
        for h in 0..s.n_head {
            let g = h / group;
            let qr = &q[(i * s.n_head + h) * s.dk..][..s.dk];
            let mut max = f64::NEG_INFINITY;
            for (j, sc) in scores[..seen].iter_mut().enumerate() {
                let kr = &k[(j * s.n_head_kv + g) * s.dk..][..s.dk];
                let dot: f64 = qr
                    .iter()
                    .zip(kr)
                    .map(|(a, b)| f64::from(*a) * f64::from(*b))
                    .sum();
                *sc = dot * f64::from(s.scale);
                max = max.max(*sc);
            }
            let mut sum = 0.0;
            for sc in scores[..seen].iter_mut() {
                *sc = (*sc - max).exp();
                sum += *sc;
            }
            let o = &mut out[(i * s.n_head + h) * s.dv..][..s.dv];
            for (d, od) in o.iter_mut().enumerate() {
                let acc: f64 = (0..seen)
                    .map(|j| scores[j] * f64::from(v[(j * s.n_head_kv + g) * s.dv + d]))
                    .sum();
                *od = (acc / sum) as f32;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_key_returns_its_value_and_equal_keys_average_the_values() {
        let s = DenseShape {
            dk: 2,
            dv: 1,
            n_head: 2,
            n_head_kv: 1,
            n_q: 1,
            n_k: 2,
            scale: 1.0,
            causal: false,
        };
        let q = [1.0, 0.0, 0.0, 1.0];
        let k = [1.0, 0.0, 1.0, 0.0];
        let v = [2.0, 4.0];
        let mut out = [0.0; 2];
        let mut scratch = [0.0; 2];
        attention_dense(&q, &k, &v, &mut out, s, &mut scratch).unwrap();
        assert_eq!(out, [3.0, 3.0]);
        let causal = DenseShape { causal: true, ..s };
        attention_dense(&q, &k, &v, &mut out, causal, &mut scratch).unwrap();
        assert_eq!(out, [2.0, 2.0]);
        // Head 0 against a larger first key: softmax weights e/(e+1) and 1/(e+1).
        let k = [2.0, 0.0, 1.0, 0.0];
        attention_dense(&q, &k, &v, &mut out, s, &mut scratch).unwrap();
        let e = std::f64::consts::E;
        assert!((f64::from(out[0]) - (2.0 * e + 4.0) / (e + 1.0)).abs() < 1e-6);
        assert_eq!(out[1], 3.0);
    }
}
