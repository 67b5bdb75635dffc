//! The FP4 formats: MXFP4 (32 E2M1 values, one E8M0 scale) and NVFP4 (64 E2M1 values, an
//! unsigned E4M3 scale per 16).
//!
//! Both store E2M1 codes that index [`KVALUES_E2M1`] (the values doubled, so integers), and halve
//! the scale to compensate. MXFP4 block (17 bytes): `e:u8`, `qs[16]` (element `j` in the low
//! nibble of byte `j`, element `j + 16` in the high one). NVFP4 block (36 bytes): `scales:ue4m3[4]`,
//! `qs[32]` (sub-block `s`: byte `8s + j` holds element `16s + j` low and `16s + 8 + j` high).

use super::bits::{e8m0_to_f32_half, read_f16};
use super::iq_tables::KVALUES_E2M1;

/// MXFP4 to f32. Expects `src.len() == dst.len() / 32 * 17`.
pub fn dequantize_mxfp4(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(17).zip(dst.chunks_exact_mut(32)) {
        let d = e8m0_to_f32_half(b[0]);
        for j in 0..16 {
            y[j] = d * f32::from(KVALUES_E2M1[usize::from(b[1 + j] & 0x0f)]);
            y[j + 16] = d * f32::from(KVALUES_E2M1[usize::from(b[1 + j] >> 4)]);
        }
    }
}

/// Half of an unsigned E4M3 scale (bias 7), as gguf's `ue4m3_to_fp32`: codes 0 and 0x7F are zero,
/// and the top bit is ignored.
#[inline]
pub fn ue4m3_to_f32_half(x: u8) -> f32 {
    if x == 0 || x == 0x7f {
        return 0.0;
    }
    let exp = i32::from((x >> 3) & 0x0f);
    let man = f32::from(x & 0x07);
    let raw = if exp == 0 {
        man * f32::from_bits(0x3b00_0000) // 2^-9
    } else {
        (1.0 + man / 8.0) * f32::from_bits(((exp - 7 + 127) as u32) << 23)
    };
    raw * 0.5
}

/// NVFP4 to f32. Expects `src.len() == dst.len() / 64 * 36`.
pub fn dequantize_nvfp4(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(36).zip(dst.chunks_exact_mut(64)) {
        for (s, y) in y.chunks_exact_mut(16).enumerate() {
            let d = ue4m3_to_f32_half(b[s]);
            for j in 0..8 {
                let q = b[4 + 8 * s + j];
                y[j] = d * f32::from(KVALUES_E2M1[usize::from(q & 0x0f)]);
                y[j + 8] = d * f32::from(KVALUES_E2M1[usize::from(q >> 4)]);
            }
        }
    }
}

/// The E2M1 code nearest to `x / d` (the first on ties), as gguf's MXFP4 quantizer.
#[inline]
fn nearest_e2m1(x: f32, d: f32) -> u8 {
    let mut best = 0u8;
    let mut best_err = f32::INFINITY;
    for (i, &k) in KVALUES_E2M1.iter().enumerate() {
        let err = (d * f32::from(k) - x).abs();
        if err < best_err {
            best_err = err;
            best = i as u8;
        }
    }
    best
}

/// f32 to MXFP4, as gguf: `e = floor(log2(max|x|)) - 2 + 127` (0 for an all-zero block), then the
/// nearest code for each element.
pub fn quantize_mxfp4(src: &[f32], dst: &mut [u8]) {
    for (x, b) in src.chunks_exact(32).zip(dst.chunks_exact_mut(17)) {
        let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
        // As numpy's float-to-uint8 cast: through a wide integer, keeping the low byte.
        let e = if amax > 0.0 {
            (amax.log2().floor() - 2.0 + 127.0) as i32 as u8
        } else {
            0
        };
        b[0] = e;
        let d = e8m0_to_f32_half(e);
        for j in 0..16 {
            b[1 + j] = nearest_e2m1(x[j], d) | (nearest_e2m1(x[j + 16], d) << 4);
        }
    }
}

/// Σ k·a over 16 codes packed two per byte (low nibbles first) against 16 signed bytes.
#[inline]
fn dot_codes(qs: &[u8], a: &[u8], lo_first: usize) -> (i32, i32) {
    let (mut lo, mut hi) = (0i32, 0i32);
    for (j, &q) in qs.iter().enumerate() {
        lo += i32::from(KVALUES_E2M1[usize::from(q & 0x0f)]) * i32::from(a[j] as i8);
        hi += i32::from(KVALUES_E2M1[usize::from(q >> 4)]) * i32::from(a[j + lo_first] as i8);
    }
    (lo, hi)
}

/// MXFP4 weights · Q8_0 activations.
pub fn vec_dot_mxfp4_q8_0(w: &[u8], act: &[u8]) -> f32 {
    let mut sum = 0f32;
    for (b, a) in w.chunks_exact(17).zip(act.chunks_exact(34)) {
        let (lo, hi) = dot_codes(&b[1..17], &a[2..34], 16);
        sum += (lo + hi) as f32 * (e8m0_to_f32_half(b[0]) * read_f16(a, 0));
    }
    sum
}

/// NVFP4 weights · Q8_0 activations (two Q8_0 blocks per NVFP4 block; one scale per 16).
pub fn vec_dot_nvfp4_q8_0(w: &[u8], act: &[u8]) -> f32 {
    let mut sum = 0f32;
    for (b, a) in w.chunks_exact(36).zip(act.chunks_exact(68)) {
        for s in 0..4 {
            let q8 = &a[34 * (s / 2)..][..34];
            let (lo, hi) = dot_codes(&b[4 + 8 * s..][..8], &q8[2 + 16 * (s % 2)..][..16], 8);
            sum += (lo + hi) as f32 * (ue4m3_to_f32_half(b[s]) * read_f16(q8, 0));
        }
    }
    sum
}
