//! The ternary formats TQ1_0 and TQ2_0: 256 values in {-1, 0, 1} times one f16 scale.
//!
//! TQ1_0 (54 bytes): `qs[48]` and `qh[4]` hold base-3 digits, five (four in `qh`) per byte as a
//! fixed-point fraction `⌈digits · 256 / 243⌉`; then `d:f16`. Byte `j < 32` holds elements
//! `p·32 + j` (p = 0..5), byte `32 + j` elements `160 + p·16 + j`, byte `48 + j` elements
//! `240 + p·4 + j` (p = 0..4). TQ2_0 (66 bytes): `qs[64]`, element `c·128 + p·32 + j` in bits `2p`
//! of byte `c·32 + j`, stored plus one; then `d:f16`.

use super::bits::{f32_to_f16, read_f16, round_away, write_u16};
use super::kquants::{unpack_2bit, QK_K};

const POW3: [u8; 5] = [1, 3, 9, 27, 81];

/// The (byte index, digit index) holding element `e` of a TQ1_0 block.
#[inline]
pub fn tq1_position(e: usize) -> (usize, usize) {
    if e < 160 {
        (e % 32, e / 32)
    } else if e < 240 {
        (32 + (e - 160) % 16, (e - 160) / 16)
    } else {
        (48 + (e - 240) % 4, (e - 240) / 4)
    }
}

/// The ternary digit (-1, 0, 1) at position `p` of a TQ1_0 byte.
#[inline]
pub fn tq1_digit(byte: u8, p: usize) -> i8 {
    let q = byte.wrapping_mul(POW3[p]);
    ((u16::from(q) * 3) >> 8) as i8 - 1
}

/// TQ1_0 to f32. Expects `src.len() == dst.len() / 256 * 54`.
pub fn dequantize_tq1_0(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(54).zip(dst.chunks_exact_mut(QK_K)) {
        let d = read_f16(b, 52);
        for (e, y) in y.iter_mut().enumerate() {
            let (i, p) = tq1_position(e);
            *y = d * f32::from(tq1_digit(b[i], p));
        }
    }
}

/// TQ2_0 to f32. Expects `src.len() == dst.len() / 256 * 66`.
pub fn dequantize_tq2_0(src: &[u8], dst: &mut [f32]) {
    let mut q = [0i8; QK_K];
    for (b, y) in src.chunks_exact(66).zip(dst.chunks_exact_mut(QK_K)) {
        let d = read_f16(b, 64);
        unpack_2bit(&b[..64], &mut q);
        for (y, &q) in y.iter_mut().zip(&q) {
            *y = d * f32::from(q - 1);
        }
    }
}

/// `round(x / max|x|) + 1` (0, 1 or 2) for each element; returns `max|x|`.
#[inline]
fn ternary_digits(x: &[f32], q: &mut [u8; QK_K]) -> f32 {
    let d = x.iter().fold(0f32, |m, v| m.max(v.abs()));
    let id = if d == 0.0 { 0.0 } else { 1.0 / d };
    for (q, &v) in q.iter_mut().zip(x) {
        *q = (round_away(v * id) as i8 + 1) as u8;
    }
    d
}

/// f32 to TQ1_0, as gguf.
pub fn quantize_tq1_0(src: &[f32], dst: &mut [u8]) {
    for (x, b) in src.chunks_exact(QK_K).zip(dst.chunks_exact_mut(54)) {
        let mut q = [0u8; QK_K];
        let d = ternary_digits(x, &mut q);
        let mut acc = [0u8; 52];
        for (e, &v) in q.iter().enumerate() {
            let (i, p) = tq1_position(e);
            // Most significant digit first: weights 81, 27, 9, 3, 1 (sums stay below 256).
            acc[i] += v * POW3[4 - p];
        }
        for (o, a) in b[..52].iter_mut().zip(acc) {
            *o = (u16::from(a) * 256).div_ceil(243) as u8;
        }
        write_u16(b, 52, f32_to_f16(d));
    }
}

/// f32 to TQ2_0, as gguf.
pub fn quantize_tq2_0(src: &[f32], dst: &mut [u8]) {
    for (x, b) in src.chunks_exact(QK_K).zip(dst.chunks_exact_mut(66)) {
        let mut q = [0u8; QK_K];
        let d = ternary_digits(x, &mut q);
        b[..64].fill(0);
        for (e, &v) in q.iter().enumerate() {
            b[(e / 128) * 32 + e % 32] |= v << (2 * ((e / 32) % 4));
        }
        write_u16(b, 64, f32_to_f16(d));
    }
}
