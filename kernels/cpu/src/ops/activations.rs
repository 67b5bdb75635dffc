//! Activations: SwiGLU (with the two clamp rules llama.cpp uses), GELU (tanh approximation and
//! exact erf), SiLU and sigmoid. Elementwise over any length; no allocation.

use std::sync::OnceLock;

use super::{check_len, positive, sigmoid_f32, OpError};
use crate::quant::bits::{f16_to_f32, f32_to_f16};

/// The clamp of a clamped SwiGLU (GGUF `swiglu_clamp_exp` / `swiglu_clamp_shexp`; llama.cpp treats a
/// limit at or below `1e-6` as no clamp). Both rules clamp `up` to `[-limit, limit]`; they differ in
/// where the upper bound on the gate side goes, which is why the rule is explicit.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum SwigluClamp {
    /// Plain `silu(gate) * up`.
    None,
    /// `silu(min(gate, limit)) * clamp(up, -limit, limit)`: the gate is clamped before SiLU. This is
    /// ggml's fused `ggml_swiglu_clamp`, which llama.cpp uses for DeepSeek-V4 (and HY-V4).
    GateInput {
        /// The limit, positive.
        limit: f32,
    },
    /// `min(silu(gate), limit) * clamp(up, -limit, limit)`: SiLU's output is clamped. This is
    /// llama.cpp's `build_moe_ffn`/`build_ffn` path for the other architectures that set a clamp
    /// (e.g. Step-3.5, GLM).
    SiluOutput {
        /// The limit, positive.
        limit: f32,
    },
}

/// SiLU `x * sigmoid(x)` of one value.
#[inline]
pub fn silu_scalar(x: f32) -> f32 {
    x * sigmoid_f32(x)
}

/// SwiGLU: `out[i] = silu(gate[i]) * up[i]` with `clamp` applied, for `gate`, `up` and `out` of
/// the same length (e.g. `[n_ff, n_rows]` f32). No allocation.
pub fn swiglu(
    gate: &[f32],
    up: &[f32],
    out: &mut [f32],
    clamp: SwigluClamp,
) -> Result<(), OpError> {
    const OP: &str = "swiglu";
    check_len(OP, "up", up.len(), gate.len())?;
    check_len(OP, "out", out.len(), gate.len())?;
    if let SwigluClamp::GateInput { limit } | SwigluClamp::SiluOutput { limit } = clamp {
        if !positive(limit) {
            return Err(OpError::Parameter {
                op: OP,
                what: format!("clamp limit {limit} must be positive"),
            });
        }
    }
    for ((o, &g), &u) in out.iter_mut().zip(gate).zip(up) {
        *o = match clamp {
            SwigluClamp::None => silu_scalar(g) * u,
            SwigluClamp::GateInput { limit } => silu_scalar(g.min(limit)) * u.clamp(-limit, limit),
            SwigluClamp::SiluOutput { limit } => silu_scalar(g).min(limit) * u.clamp(-limit, limit),
        };
    }
    Ok(())
}

/// SiLU in place: `x * sigmoid(x)`. Any length.
pub fn silu(x: &mut [f32]) {
    x.iter_mut().for_each(|v| *v = silu_scalar(*v));
}

/// Logistic sigmoid in place: `1 / (1 + e^-x)`, overflow-free for large `|x|`. Any length.
pub fn sigmoid(x: &mut [f32]) {
    x.iter_mut().for_each(|v| *v = sigmoid_f32(*v));
}

/// GELU, tanh approximation, in place, as ggml's CPU path computes it (`GGML_GELU_FP16`): `0` at
/// or below -10, `x` at or above 10, otherwise `0.5 x (1 + tanh(sqrt(2/π) x (1 + 0.044715 x²)))`
/// evaluated in f32 at `x` rounded to f16, and the result rounded to f16 (a 65,536-entry table).
/// Matching llama.cpp here keeps greedy output identical on models such as gemma3; the f16
/// rounding costs at most about 5e-4 relative. Any length.
pub fn gelu_tanh(x: &mut [f32]) {
    let table = gelu_f16_table();
    for v in x.iter_mut() {
        if *v <= -10.0 {
            *v = 0.0;
        } else if *v < 10.0 {
            *v = f16_to_f32(table[usize::from(f32_to_f16(*v))]);
        }
    }
}

/// ggml's GELU table: the f16 result for every f16 input bit pattern.
fn gelu_f16_table() -> &'static [u16] {
    static TABLE: OnceLock<Vec<u16>> = OnceLock::new();
    TABLE.get_or_init(|| {
        const SQRT_2_OVER_PI: f32 = 0.797_884_6;
        const COEF_A: f32 = 0.044_715;
        (0..=u16::MAX)
            .map(|h| {
                let x = f16_to_f32(h);
                let y = 0.5 * x * (1.0 + (SQRT_2_OVER_PI * x * (1.0 + COEF_A * x * x)).tanh());
                f32_to_f16(y)
            })
            .collect()
    })
}

/// GELU, exact, in place: `0.5 x (1 + erf(x / sqrt(2)))` (ggml's `ggml_gelu_erf`). Any length.
pub fn gelu_erf(x: &mut [f32]) {
    for v in x.iter_mut() {
        let z = f64::from(*v);
        *v = (0.5 * z * (1.0 + erf(z * std::f64::consts::FRAC_1_SQRT_2))) as f32;
    }
}

/// The error function in f64, accurate to about 1e-15 (std has no `erf`).
///
/// For `|x| < 3` the series `erf(x) = 2/√π e^{-x²} Σ (2x²)^n x / (1·3·…·(2n+1))` (all terms
/// positive, so no cancellation); beyond, the continued fraction of `erfc`, evaluated bottom-up.
fn erf(x: f64) -> f64 {
    let a = x.abs();
    let r = if a < 3.0 {
        let mut term = a;
        let mut sum = a;
        let mut n = 0.0;
        while term > sum * 1e-17 {
            n += 1.0;
            term *= 2.0 * a * a / (2.0 * n + 1.0);
            sum += term;
        }
        2.0 / std::f64::consts::PI.sqrt() * (-a * a).exp() * sum
    } else {
        // erfc(a) = e^{-a²}/√π · 1/(a + (1/2)/(a + 1/(a + (3/2)/(a + 2/(a + …)))))
        let mut f = a;
        for k in (1..60).rev() {
            f = a + (k as f64 / 2.0) / f;
        }
        1.0 - (-a * a).exp() / std::f64::consts::PI.sqrt() / f
    };
    r.copysign(x)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{rngs::StdRng, Rng, SeedableRng};

    fn random(n: usize, seed: u64, range: f32) -> Vec<f32> {
        let mut rng = StdRng::seed_from_u64(seed);
        (0..n).map(|_| rng.gen_range(-range..range)).collect()
    }

    fn silu64(x: f64) -> f64 {
        x / (1.0 + (-x).exp())
    }

    /// erf by Simpson's rule on 2/√π e^{-t²}, independent of the op's series.
    fn erf_simpson(x: f64) -> f64 {
        let n = 20_000;
        let h = x / n as f64;
        let f = |t: f64| (-t * t).exp();
        let mut s = f(0.0) + f(x);
        for i in 1..n {
            s += f(i as f64 * h) * if i % 2 == 1 { 4.0 } else { 2.0 };
        }
        s * h / 3.0 * 2.0 / std::f64::consts::PI.sqrt()
    }

    fn close(a: f32, b: f64, tol: f64) {
        assert!((a as f64 - b).abs() <= tol * (1.0 + b.abs()), "{a} vs {b}");
    }

    #[test]
    fn swiglu_plain_and_both_clamps_match_f64() {
        let g = random(37, 1, 15.0);
        let u = random(37, 2, 15.0);
        let limit = 7.0f32;
        let mut out = vec![0.0; 37];
        for clamp in [
            SwigluClamp::None,
            SwigluClamp::GateInput { limit },
            SwigluClamp::SiluOutput { limit },
        ] {
            swiglu(&g, &u, &mut out, clamp).unwrap();
            for i in 0..37 {
                let (gi, ui, l) = (g[i] as f64, u[i] as f64, limit as f64);
                let want = match clamp {
                    SwigluClamp::None => silu64(gi) * ui,
                    SwigluClamp::GateInput { .. } => silu64(gi.min(l)) * ui.max(-l).min(l),
                    SwigluClamp::SiluOutput { .. } => silu64(gi).min(l) * ui.max(-l).min(l),
                };
                close(out[i], want, 1e-6);
            }
        }
    }

    #[test]
    fn swiglu_clamp_rules_differ_where_they_should() {
        // gate 8 > limit 7: GateInput gives silu(7) * 1, SiluOutput gives min(silu(8), 7) = 7.
        let mut out = [0.0f32; 1];
        swiglu(
            &[8.0],
            &[1.0],
            &mut out,
            SwigluClamp::GateInput { limit: 7.0 },
        )
        .unwrap();
        close(out[0], silu64(7.0), 1e-7);
        swiglu(
            &[8.0],
            &[1.0],
            &mut out,
            SwigluClamp::SiluOutput { limit: 7.0 },
        )
        .unwrap();
        assert_eq!(out[0], 7.0);
        // a very negative gate is not clamped from below by either rule
        swiglu(
            &[-20.0],
            &[100.0],
            &mut out,
            SwigluClamp::GateInput { limit: 7.0 },
        )
        .unwrap();
        close(out[0], silu64(-20.0) * 7.0, 1e-6);
        let bad = swiglu(
            &[1.0],
            &[1.0],
            &mut out,
            SwigluClamp::SiluOutput { limit: 0.0 },
        );
        assert!(matches!(bad, Err(OpError::Parameter { .. })));
        assert!(matches!(
            swiglu(&[1.0], &[], &mut out, SwigluClamp::None),
            Err(OpError::Length { .. })
        ));
    }

    #[test]
    fn unary_activations_match_f64() {
        let x = random(101, 3, 12.0);
        let mut s = x.clone();
        silu(&mut s);
        let mut sg = x.clone();
        sigmoid(&mut sg);
        let mut gt = x.clone();
        gelu_tanh(&mut gt);
        let mut ge = x.clone();
        gelu_erf(&mut ge);
        for i in 0..x.len() {
            let v = x[i] as f64;
            close(s[i], silu64(v), 1e-6);
            close(sg[i], 1.0 / (1.0 + (-v).exp()), 1e-6);
            let t = (2.0 / std::f64::consts::PI).sqrt() * (v + 0.044715 * v.powi(3));
            close(gt[i], 0.5 * v * (1.0 + t.tanh()), 1e-3);
            close(ge[i], 0.5 * v * (1.0 + erf_simpson(v / 2f64.sqrt())), 1e-6);
        }
        let mut extreme = vec![-200.0f32, 200.0];
        sigmoid(&mut extreme);
        assert_eq!(extreme, vec![0.0, 1.0]);
        let mut g = vec![-10.0f32, -9.99, 9.99, 10.0, 123.25, 0.0];
        gelu_tanh(&mut g);
        assert_eq!((g[0], g[3], g[4], g[5]), (0.0, 10.0, 123.25, 0.0));
        assert!(g[1] <= 0.0 && g[1] > -1e-3 && (g[2] - 9.99).abs() < 1e-2);
    }

    #[test]
    fn erf_matches_quadrature_across_both_branches() {
        for x in [-5.0, -3.2, -2.9, -0.5, 0.0, 1e-3, 0.9, 2.99, 3.01, 4.5] {
            assert!((erf(x) - erf_simpson(x)).abs() < 1e-12, "erf({x})");
        }
    }
}
