//! `vec_dot` for every weight type against dequantized references, and the activation quantizers
//! (Q8_0, Q8_1, Q8_K) against their definitions.
//!
//! Tolerances: `vec_dot(w, quantize(x))` must equal the f64 sum of `dequant(w)·dequant(act)` within
//! `1e-5 · Σ|dequant(w)·dequant(act)|` (the integer sums are exact; only the f32 scaling and the
//! per-block f32 accumulation round), and must be within `Σ|dequant(w)|·|dequant(act) - x|` (the
//! activation quantization error, plus the same 1e-5 slack) of `dequant(w)·x`.

mod quant_common;

use bloomery_kernels_cpu::quant::{
    dequantize_row, quantize_row, vec_dot, vec_dot_type, QuantError,
};
use bloomery_plugin_api::DType;
use quant_common::dequant_fixture;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const REL_TOL: f64 = 1e-5;

/// Random activations: uniform in ±1 times a scale that changes every 32 values.
fn activations(rng: &mut StdRng, n: usize) -> Vec<f32> {
    let mut x = vec![0f32; n];
    for c in x.chunks_mut(32) {
        let s = 2f32.powi(rng.gen_range(-6..6));
        c.iter_mut()
            .for_each(|v| *v = rng.gen_range(-1.0f32..1.0) * s);
    }
    x
}

fn dequant(t: DType, b: &[u8], n: usize) -> Vec<f32> {
    let mut y = vec![0f32; n];
    dequantize_row(t, b, &mut y).unwrap();
    y
}

/// For Q8_1 activations the dot uses the stored f16 sum `s` rather than `d·Σq`: the difference
/// each block contributes, `m_w·(s - d·Σq)`, summed (zero for the other formats).
fn q8_1_sum_correction(t: DType, w: &[u8], act: &[u8]) -> f64 {
    if vec_dot_type(t) != Some(DType::Q8_1) {
        return 0.0;
    }
    let wb = t.layout().unwrap().bytes as usize;
    let f16 = |b: &[u8], i: usize| {
        let mut y = [0f32];
        dequantize_row(DType::F16, &b[i..i + 2], &mut y).unwrap();
        f64::from(y[0])
    };
    w.chunks_exact(wb)
        .zip(act.chunks_exact(36))
        .map(|(b, a)| {
            let sum_q: i32 = a[4..].iter().map(|&q| i32::from(q as i8)).sum();
            f16(b, 2) * (f16(a, 2) - f16(a, 0) * f64::from(sum_q))
        })
        .sum()
}

fn check_dot(t: DType, w: &[u8], n: usize, rng: &mut StdRng) {
    let at = vec_dot_type(t).unwrap();
    let x = activations(rng, n);
    let mut act = vec![0u8; at.row_bytes(n as u64).unwrap() as usize];
    quantize_row(at, &x, &mut act).unwrap();
    let got = f64::from(vec_dot(t, n, w, &act).unwrap());

    let wd = dequant(t, w, n);
    let ad = dequant(at, &act, n);
    let exact: f64 = wd
        .iter()
        .zip(&ad)
        .map(|(&a, &b)| f64::from(a) * f64::from(b))
        .sum::<f64>()
        + q8_1_sum_correction(t, w, &act);
    let mag: f64 = wd
        .iter()
        .zip(&ad)
        .map(|(&a, &b)| (f64::from(a) * f64::from(b)).abs())
        .sum();
    assert!(
        (got - exact).abs() <= REL_TOL * mag,
        "{t}: vec_dot {got} vs dequantized product {exact} (scale {mag})"
    );

    let float_ref: f64 = wd
        .iter()
        .zip(&x)
        .map(|(&a, &b)| f64::from(a) * f64::from(b))
        .sum();
    let act_err: f64 = wd
        .iter()
        .zip(ad.iter().zip(&x))
        .map(|(&w, (&a, &x))| f64::from(w).abs() * f64::from(a - x).abs())
        .sum();
    assert!(
        (got - float_ref).abs() <= act_err + REL_TOL * mag + q8_1_sum_correction(t, w, &act).abs(),
        "{t}: vec_dot {got} vs float {float_ref}: more than the activation error {act_err}"
    );
}

#[test]
fn vec_dot_matches_dequantized_products_for_every_quantized_weight_type() {
    let mut rng = StdRng::seed_from_u64(7);
    let types = [
        DType::Q4_0,
        DType::Q4_1,
        DType::Q5_0,
        DType::Q5_1,
        DType::Q8_0,
        DType::Q2_K,
        DType::Q3_K,
        DType::Q4_K,
        DType::Q5_K,
        DType::Q6_K,
        DType::TQ1_0,
        DType::TQ2_0,
        DType::IQ1_S,
        DType::IQ1_M,
        DType::IQ2_XXS,
        DType::IQ2_XS,
        DType::IQ2_S,
        DType::IQ3_XXS,
        DType::IQ3_S,
        DType::IQ4_NL,
        DType::IQ4_XS,
        DType::MXFP4,
        DType::NVFP4,
    ];
    for t in types {
        // The fixture rows: random payloads with sane scales.
        let (w, y) = dequant_fixture(t);
        for _ in 0..4 {
            check_dot(t, &w, y.len(), &mut rng);
        }
        // A single block too.
        let l = t.layout().unwrap();
        check_dot(t, &w[..l.bytes as usize], l.block as usize, &mut rng);
    }
}

#[test]
fn vec_dot_of_float_weights_matches_dequantized_products() {
    let mut rng = StdRng::seed_from_u64(8);
    for t in [DType::F32, DType::F16, DType::BF16] {
        for n in [1, 31, 256, 1000] {
            let x = activations(&mut rng, n);
            let mut w = vec![0u8; t.row_bytes(n as u64).unwrap() as usize];
            quantize_row(t, &x, &mut w).unwrap();
            check_dot(t, &w, n, &mut rng);
        }
    }
}

#[test]
fn quantize_q8_1_shares_q8_0_quants_and_stores_the_scaled_sum() {
    let mut rng = StdRng::seed_from_u64(9);
    let x = activations(&mut rng, 256);
    let (mut q0, mut q1) = (vec![0u8; 8 * 34], vec![0u8; 8 * 36]);
    quantize_row(DType::Q8_0, &x, &mut q0).unwrap();
    quantize_row(DType::Q8_1, &x, &mut q1).unwrap();
    for ((xb, b0), b1) in x
        .chunks_exact(32)
        .zip(q0.chunks_exact(34))
        .zip(q1.chunks_exact(36))
    {
        assert_eq!(b0[..2], b1[..2], "same d");
        assert_eq!(b0[2..], b1[4..], "same quants");
        // s uses the f32 scale, before its rounding to f16.
        let d = xb.iter().fold(0f32, |m, v| m.max(v.abs())) / 127.0;
        let sum: i32 = b1[4..].iter().map(|&q| i32::from(q as i8)).sum();
        let mut s = [0u8; 2];
        quantize_row(DType::F16, &[sum as f32 * d], &mut s).unwrap();
        assert_eq!(b1[2..4], s, "s = f16(d·Σq)");
    }
}

#[test]
fn quantize_q8_k_follows_ggml_reference() {
    let mut rng = StdRng::seed_from_u64(10);
    let x = activations(&mut rng, 512);
    let mut q = vec![0u8; 2 * 292];
    quantize_row(DType::Q8_K, &x, &mut q).unwrap();
    for (xb, b) in x.chunks_exact(256).zip(q.chunks_exact(292)) {
        let max = xb
            .iter()
            .fold(0f32, |m, &v| if v.abs() > m.abs() { v } else { m });
        let iscale = -127.0 / max;
        assert_eq!(b[..4], (1.0 / iscale).to_le_bytes(), "d = 1 / iscale");
        for (j, &v) in xb.iter().enumerate() {
            let want = (iscale * v).round_ties_even().min(127.0) as i8;
            assert_eq!(b[4 + j] as i8, want, "element {j}");
        }
        for g in 0..16 {
            let s: i16 = b[4 + 16 * g..][..16]
                .iter()
                .map(|&v| i16::from(v as i8))
                .sum();
            assert_eq!(
                i16::from_le_bytes([b[260 + 2 * g], b[261 + 2 * g]]),
                s,
                "bsum {g}"
            );
        }
    }
    // An all-zero block quantizes to zeros.
    let mut z = vec![0xffu8; 292];
    quantize_row(DType::Q8_K, &[0.0; 256], &mut z).unwrap();
    assert!(z.iter().all(|&b| b == 0));
}

#[test]
fn quant_errors_name_the_type_and_the_lengths() {
    let mut y = vec![0f32; 256];
    assert_eq!(
        dequantize_row(DType::Q1_0, &[0; 36], &mut y),
        Err(QuantError::Unsupported {
            dtype: DType::Q1_0,
            op: "dequantize"
        })
    );
    let e = dequantize_row(DType::Q4_K, &[0; 143], &mut y).unwrap_err();
    assert_eq!(
        e.to_string(),
        "Q4_K: source bytes has length 143, expected 144"
    );
    let e = dequantize_row(DType::Q4_K, &[0; 144], &mut y[..100]).unwrap_err();
    assert_eq!(
        e,
        QuantError::NotWholeBlocks {
            dtype: DType::Q4_K,
            n: 100,
            block: 256
        }
    );
    assert!(matches!(
        quantize_row(DType::Q4_K, &[0.0; 256], &mut [0; 144]),
        Err(QuantError::Unsupported {
            dtype: DType::Q4_K,
            ..
        })
    ));
    assert_eq!(
        vec_dot(DType::Q4_0, 32, &[0; 18], &[0; 36]),
        Err(QuantError::LengthMismatch {
            dtype: DType::Q8_0,
            what: "activation bytes",
            expected: 34,
            found: 36
        })
    );
    assert_eq!(vec_dot_type(DType::Q8_K), None);
    assert!(dequantize_row(DType(4), &[], &mut [])
        .unwrap_err()
        .to_string()
        .contains("type#4"));
}
