//! The hand-written kernels against the portable reference `quant::vec_dot`, on seeded random
//! weight rows (random payload, sane scales) and quantized random activations.
//!
//! Both paths are tested where the CPU has them: the AVX2 kernels through `rows_dot_avx2`, the
//! AVX-512 ones (`AVX512`) directly through `rows_dot_avx512`, and `rows_dot`'s choice.
//!
//! Tolerance: `|kernel − reference| ≤ 1e-5 · Σ|w·a|` (dequantized products). The integer sums are
//! exact in both; only the f32 scaling and the order of the f32 additions differ (and the float
//! types sum in f32 here, in f64 in the reference).

use bloomery_kernels_cpu::quant::bits::f32_to_f16;
use bloomery_kernels_cpu::quant::{self, QuantError};
use bloomery_plugin_api::DType;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::{row_dot, rows_dot, rows_dot_avx2, rows_dot_avx512, rows_dot_v3, AVX512, HAND_WRITTEN};

const REL_TOL: f64 = 1e-5;

fn have_v3() -> bool {
    super::has_v3()
}

fn have_avx512() -> bool {
    super::has_v3() && super::has_avx512()
}

/// One row through `rows_dot_avx2`.
fn row_dot_avx2(t: DType, n: usize, w: &[u8], act: &[u8]) -> f32 {
    let mut out = [0f32];
    rows_dot_avx2(t, n, w, w.len(), act, &mut out).unwrap();
    out[0]
}

/// One row through the AVX-512 kernel of `t` (which must have one; lengths must fit).
fn row_dot_avx512(t: DType, _n: usize, w: &[u8], act: &[u8]) -> f32 {
    assert!(have_avx512());
    let mut out = [0f32];
    // SAFETY: the CPU has AVX-512 F, BW, VL, VNNI, AVX2, FMA and F16C (asserted above).
    let ran = unsafe { rows_dot_avx512(t, w, w.len(), w.len(), act, &mut out) };
    assert!(ran, "{t} has no AVX-512 kernel");
    out[0]
}

/// A one-row kernel under test.
type RowFn = fn(DType, usize, &[u8], &[u8]) -> f32;

/// Byte offsets of the f16 scales inside one block of `t` (to overwrite with sane values).
fn f16_scale_offsets(t: DType) -> &'static [usize] {
    match t {
        DType::Q4_0
        | DType::Q5_0
        | DType::Q8_0
        | DType::IQ4_NL
        | DType::IQ4_XS
        | DType::IQ2_XXS
        | DType::IQ2_XS
        | DType::IQ2_S
        | DType::IQ3_XXS
        | DType::IQ3_S
        | DType::IQ1_S => &[0],
        DType::Q4_1 | DType::Q5_1 | DType::Q4_K | DType::Q5_K => &[0, 2],
        DType::Q2_K => &[80, 82],
        DType::Q3_K => &[108],
        DType::Q6_K => &[208],
        DType::TQ2_0 => &[64],
        _ => &[],
    }
}

/// A random weight row of `n` elements of `t`: random payload bytes, f16 scales of magnitude
/// 2^-10..2^-4 with random sign, E8M0 exponents near 1.
pub(super) fn random_weights(t: DType, n: usize, rng: &mut StdRng) -> Vec<u8> {
    if matches!(t, DType::F32 | DType::F16 | DType::BF16) {
        let x: Vec<f32> = (0..n).map(|_| rng.gen_range(-1.0f32..1.0)).collect();
        let mut w = vec![0u8; t.row_bytes(n as u64).unwrap() as usize];
        quant::quantize_row(t, &x, &mut w).unwrap();
        return w;
    }
    let l = t.layout().unwrap();
    let mut w = vec![0u8; t.row_bytes(n as u64).unwrap() as usize];
    rng.fill(&mut w[..]);
    for b in w.chunks_exact_mut(l.bytes as usize) {
        for &o in f16_scale_offsets(t) {
            let d = rng.gen_range(1.0f32..2.0) * 2f32.powi(rng.gen_range(-10..-4));
            let d = if rng.gen() { d } else { -d };
            b[o..o + 2].copy_from_slice(&f32_to_f16(d).to_le_bytes());
        }
        if t == DType::MXFP4 {
            b[0] = rng.gen_range(118..=130);
        }
        if t == DType::IQ1_M {
            // The f16 block scale lives in the top nibbles of the four scale words.
            let d = f32_to_f16(rng.gen_range(1.0f32..2.0) * 2f32.powi(rng.gen_range(-10..-4)));
            for k in 0..4 {
                b[49 + 2 * k] = (b[49 + 2 * k] & 0x0f) | ((((d >> (4 * k)) & 0x0f) as u8) << 4);
            }
        }
    }
    w
}

/// Random activations (a scale changing every 32) quantized into `vec_dot_type(t)`.
pub(super) fn random_activations(t: DType, n: usize, rng: &mut StdRng) -> Vec<u8> {
    let at = quant::vec_dot_type(t).unwrap();
    let mut x = vec![0f32; n];
    for c in x.chunks_mut(32) {
        let s = 2f32.powi(rng.gen_range(-6..6));
        c.iter_mut()
            .for_each(|v| *v = rng.gen_range(-1.0f32..1.0) * s);
    }
    let mut act = vec![0u8; at.row_bytes(n as u64).unwrap() as usize];
    quant::quantize_row(at, &x, &mut act).unwrap();
    act
}

/// Σ|w·a| over the dequantized rows.
fn magnitude(t: DType, n: usize, w: &[u8], act: &[u8]) -> f64 {
    let at = quant::vec_dot_type(t).unwrap();
    let (mut wd, mut ad) = (vec![0f32; n], vec![0f32; n]);
    quant::dequantize_row(t, w, &mut wd).unwrap();
    quant::dequantize_row(at, act, &mut ad).unwrap();
    wd.iter()
        .zip(&ad)
        .map(|(&x, &y)| (f64::from(x) * f64::from(y)).abs())
        .sum()
}

/// `rows_dot`'s choice and the AVX2 path against the reference.
fn check(t: DType, n: usize, w: &[u8], act: &[u8]) {
    check_kernel(
        "rows_dot",
        |t, n, w, a| row_dot(t, n, w, a).unwrap(),
        t,
        n,
        w,
        act,
    );
    check_kernel("avx2", row_dot_avx2, t, n, w, act);
}

fn check_kernel(name: &str, dot: RowFn, t: DType, n: usize, w: &[u8], act: &[u8]) {
    let want = quant::vec_dot(t, n, w, act).unwrap();
    let got = dot(t, n, w, act);
    let mag = magnitude(t, n, w, act);
    let err = (f64::from(got) - f64::from(want)).abs();
    assert!(
        err <= REL_TOL * mag,
        "{t}, n = {n}: {name} {got} vs reference {want}: error {err:e} over {REL_TOL:e} · {mag:e}"
    );
}

#[test]
fn hand_written_kernels_match_the_reference_on_random_rows() {
    if !have_v3() {
        return;
    }
    random_rows(HAND_WRITTEN, check);
}

#[test]
fn avx512_kernels_match_the_reference_on_random_rows() {
    if !have_avx512() {
        return;
    }
    random_rows(AVX512, |t, n, w, a| {
        check_kernel("avx512", row_dot_avx512, t, n, w, a)
    });
}

fn random_rows(types: &[DType], check: fn(DType, usize, &[u8], &[u8])) {
    let mut rng = StdRng::seed_from_u64(0x5eed);
    for &t in types {
        let block = t.layout().unwrap().block as usize;
        let sizes: &[usize] = if block == 1 {
            &[1, 7, 8, 31, 32, 33, 256, 1000, 4096]
        } else {
            &[block, 2 * block, 4096, 16 * 256 + block * 3]
        };
        for &n in sizes {
            for _ in 0..8 {
                let w = random_weights(t, n, &mut rng);
                let act = random_activations(t, n, &mut rng);
                check(t, n, &w, &act);
            }
        }
    }
}

/// Payloads of all-equal bytes reach the extreme quants (e.g. Q8_0's −128, the largest nibbles
/// and high bits everywhere), where a saturating or sign-wrong product would show.
#[test]
fn hand_written_kernels_match_the_reference_on_extreme_payloads() {
    if !have_v3() {
        return;
    }
    extreme_payloads(HAND_WRITTEN, check);
}

#[test]
fn avx512_kernels_match_the_reference_on_extreme_payloads() {
    if !have_avx512() {
        return;
    }
    extreme_payloads(AVX512, |t, n, w, a| {
        check_kernel("avx512", row_dot_avx512, t, n, w, a)
    });
}

fn extreme_payloads(types: &[DType], check: fn(DType, usize, &[u8], &[u8])) {
    let mut rng = StdRng::seed_from_u64(11);
    for &t in types {
        let n = 4096;
        let bytes = t.layout().unwrap().bytes as usize;
        for fill in [0x00u8, 0xff, 0x80, 0x7f, 0x55, 0xaa] {
            let mut w = random_weights(t, n, &mut rng);
            let offsets = f16_scale_offsets(t);
            if t.is_quantized() {
                for b in w.chunks_exact_mut(bytes) {
                    for (i, v) in b.iter_mut().enumerate() {
                        let scale = offsets.iter().any(|&o| i == o || i == o + 1);
                        let kept = scale
                            || (t == DType::MXFP4 && i == 0)
                            || (t == DType::IQ1_M && i >= 48);
                        if !kept {
                            *v = fill;
                        }
                    }
                }
            }
            // Activations at full range: every block's largest quant is ±127.
            let act = random_activations(t, n, &mut rng);
            check(t, n, &w, &act);
        }
    }
}

#[test]
fn other_types_go_to_the_reference() {
    if !have_v3() {
        return;
    }
    let mut rng = StdRng::seed_from_u64(12);
    for &t in DType::ALL {
        let Some(at) = quant::vec_dot_type(t) else {
            continue;
        };
        let l = t.layout().unwrap();
        let n = 256 * l.block as usize;
        let w: Vec<u8> = (0..t.row_bytes(n as u64).unwrap())
            .map(|_| rng.gen())
            .collect();
        let act = vec![0u8; at.row_bytes(n as u64).unwrap() as usize];
        let mut out = [0f32];
        // SAFETY: the CPU has AVX2, FMA and F16C (checked above).
        let kernel = unsafe { rows_dot_v3(t, &w, w.len(), w.len(), &act, &mut out) };
        assert_eq!(kernel, HAND_WRITTEN.contains(&t), "{t}");
        if !kernel {
            let act = random_activations(t, n, &mut rng);
            // Bit patterns, since random payloads may hold NaN scales.
            let bits = |r: Result<f32, QuantError>| r.map(f32::to_bits);
            assert_eq!(
                bits(row_dot(t, n, &w, &act)),
                bits(quant::vec_dot(t, n, &w, &act)),
                "{t}"
            );
        }
    }
}

#[test]
fn length_errors_are_the_reference_errors() {
    for &t in HAND_WRITTEN {
        let l = t.layout().unwrap();
        let n = 2 * l.block as usize;
        let at = quant::vec_dot_type(t).unwrap();
        let w = vec![0u8; t.row_bytes(n as u64).unwrap() as usize];
        let act = vec![0u8; at.row_bytes(n as u64).unwrap() as usize];
        let short = &w[..w.len() - 1];
        assert!(matches!(
            row_dot(t, n, short, &act),
            Err(QuantError::LengthMismatch { .. })
        ));
        assert_eq!(
            row_dot(t, n, short, &act),
            quant::vec_dot(t, n, short, &act),
            "{t}"
        );
        assert_eq!(
            row_dot(t, n, &w, &act[1..]),
            quant::vec_dot(t, n, &w, &act[1..]),
            "{t}"
        );
        if l.block > 1 {
            assert!(matches!(
                row_dot(t, n + 1, &w, &act),
                Err(QuantError::NotWholeBlocks { .. })
            ));
        }
        assert_eq!(row_dot(t, n, &w, &act), Ok(0.0), "{t}: zero rows");
    }
}

/// Rows whose quants all encode the weight 0 (scales left random) give exactly 0, as in the
/// reference: offsets removed through the block sums must cancel exactly.
#[test]
fn zero_weights_give_exactly_zero() {
    if !have_v3() {
        return;
    }
    let mut rng = StdRng::seed_from_u64(13);
    // Per type, the byte ranges of a block and the fill that encode zero weights.
    type Fills = &'static [(std::ops::Range<usize>, u8)];
    let cases: [(DType, Fills); 5] = [
        (DType::Q8_0, &[(2..34, 0x00)]),
        (DType::Q4_0, &[(2..18, 0x88)]),
        (DType::Q6_K, &[(0..128, 0x00), (128..192, 0xaa)]),
        (DType::Q3_K, &[(0..32, 0xff), (32..96, 0x00)]),
        (DType::TQ2_0, &[(0..64, 0x55)]),
    ];
    for (t, fills) in cases {
        let n = 4096;
        let mut w = random_weights(t, n, &mut rng);
        for b in w.chunks_exact_mut(t.layout().unwrap().bytes as usize) {
            for (r, v) in fills {
                b[r.clone()].fill(*v);
            }
        }
        let act = random_activations(t, n, &mut rng);
        assert_eq!(quant::vec_dot(t, n, &w, &act), Ok(0.0), "{t}: reference");
        assert_eq!(row_dot(t, n, &w, &act), Ok(0.0), "{t}");
        assert_eq!(row_dot_avx2(t, n, &w, &act), 0.0, "{t}: avx2");
        if have_avx512() && AVX512.contains(&t) {
            assert_eq!(row_dot_avx512(t, n, &w, &act), 0.0, "{t}: avx512");
        }
    }
}

/// Several rows with a stride wider than a row (a view into a larger matrix) give each row's own
/// dot product, and a buffer one byte short of the last row is refused without writing.
#[test]
fn strided_rows_match_row_by_row() {
    strided_rows(HAND_WRITTEN, rows_dot, row_dot_checked);
    strided_rows(HAND_WRITTEN, rows_dot_avx2, |t, n, w, a| {
        row_dot_avx2(t, n, w, a)
    });
}

/// The AVX-512 kernels on strided rows, row by row through the AVX-512 kernels (and the rows
/// again through `rows_dot`, which picks them here).
#[test]
fn avx512_strided_rows_match_row_by_row() {
    if !have_avx512() {
        return;
    }
    strided_rows(AVX512, rows_avx512, row_dot_avx512);
    strided_rows(AVX512, rows_dot, row_dot_avx512);
}

fn row_dot_checked(t: DType, n: usize, w: &[u8], act: &[u8]) -> f32 {
    row_dot(t, n, w, act).unwrap()
}

/// `rows_dot`'s length checks, then the AVX-512 kernel of `t` on every row.
fn rows_avx512(
    t: DType,
    n: usize,
    w: &[u8],
    stride: usize,
    act: &[u8],
    out: &mut [f32],
) -> Result<(), QuantError> {
    let w_row = bloomery_kernels_cpu::linear::weight_rows_fit(t, n, w, stride, out.len())?;
    assert!(have_avx512() && super::act_matches(t, n, act));
    // SAFETY: the CPU has AVX-512 F, BW, VL, VNNI, AVX2, FMA and F16C (asserted above).
    let ran = unsafe { rows_dot_avx512(t, w, stride, w_row, act, out) };
    assert!(ran, "{t} has no AVX-512 kernel");
    Ok(())
}

fn strided_rows(types: &[DType], rows_fn: bloomery_kernels_cpu::linear::RowsDot, row_fn: RowFn) {
    let mut rng = StdRng::seed_from_u64(14);
    for &t in types {
        let n = 512.max(t.layout().unwrap().block as usize);
        let row = t.row_bytes(n as u64).unwrap() as usize;
        let (rows, stride) = (7, row + 40);
        let one = random_weights(t, n * rows, &mut rng);
        let mut w = vec![0u8; (rows - 1) * stride + row];
        for r in 0..rows {
            w[r * stride..r * stride + row].copy_from_slice(&one[r * row..(r + 1) * row]);
        }
        let act = random_activations(t, n, &mut rng);
        let mut out = vec![f32::NAN; rows];
        rows_fn(t, n, &w, stride, &act, &mut out).unwrap();
        for (r, &got) in out.iter().enumerate() {
            let want = row_fn(t, n, &one[r * row..(r + 1) * row], &act);
            assert_eq!(got.to_bits(), want.to_bits(), "{t} row {r}");
        }
        let mut untouched = vec![f32::NAN; rows];
        assert!(matches!(
            rows_fn(t, n, &w[..w.len() - 1], stride, &act, &mut untouched),
            Err(QuantError::LengthMismatch { .. })
        ));
        assert!(
            untouched.iter().all(|v| v.is_nan()),
            "{t}: written on error"
        );
    }
}
