//! Dequantization of the i-quants (IQ1_S, IQ1_M, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ4_NL,
//! IQ4_XS), repeating gguf's float operations in gguf's order so that results are bit-identical.
//!
//! The grid formats pick rows of 8 (IQ2, IQ1) or 4 (IQ3) magnitudes from [`super::iq_tables`] and
//! apply sign bits; the IQ4 formats index a 16-entry non-linear table. Layouts are given beside each
//! function; all multi-byte fields are little-endian.

use super::bits::{read_f16, read_u16, read_u32};
use super::iq_tables::{
    IQ1S_GRID, IQ2S_GRID, IQ2XS_GRID, IQ2XXS_GRID, IQ3S_GRID, IQ3XXS_GRID, KSIGNS, KVALUES_IQ4NL,
};
use super::kquants::QK_K;

/// Byte `k` of a packed grid row.
#[inline]
pub fn grid_byte(row: u64, k: usize) -> u8 {
    (row >> (8 * k)) as u8
}

/// `+1.0` or `-1.0` from bit `k` of `signs`.
#[inline]
fn sign(signs: u8, k: usize) -> f32 {
    if (signs >> k) & 1 == 0 {
        1.0
    } else {
        -1.0
    }
}

/// IQ2_XXS to f32. Block (66 bytes): `d:f16`, then 8 × (`aux0:u32` four grid indices, `aux1:u32`
/// four 7-bit sign indices into [`KSIGNS`] and a 4-bit scale in the top bits) for 32 elements each.
pub fn dequantize_iq2_xxs(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(66).zip(dst.chunks_exact_mut(QK_K)) {
        let d = read_f16(b, 0);
        for (ib, y) in y.chunks_exact_mut(32).enumerate() {
            let aux1 = read_u32(b, 6 + 8 * ib);
            let db = d * (0.5 + (aux1 >> 28) as f32) * 0.25;
            for (l, y) in y.chunks_exact_mut(8).enumerate() {
                let row = IQ2XXS_GRID[usize::from(b[2 + 8 * ib + l])];
                let signs = KSIGNS[((aux1 >> (7 * l)) & 0x7f) as usize];
                for (k, y) in y.iter_mut().enumerate() {
                    *y = db * f32::from(grid_byte(row, k)) * sign(signs, k);
                }
            }
        }
    }
}

/// The 16 four-bit scales of IQ2_XS and IQ2_S (byte `i`: low nibble scale `2i`, high `2i + 1`).
#[inline]
fn nibble_scale(scales: &[u8], s: usize) -> f32 {
    f32::from((scales[s / 2] >> (4 * (s % 2))) & 0x0f)
}

/// IQ2_XS to f32. Block (74 bytes): `d:f16`, `qs:u16[32]` (9-bit grid index, 7-bit sign index),
/// `scales[8]` (a 4-bit scale per 16 elements).
pub fn dequantize_iq2_xs(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(74).zip(dst.chunks_exact_mut(QK_K)) {
        let d = read_f16(b, 0);
        for (g, y) in y.chunks_exact_mut(8).enumerate() {
            let db = d * (0.5 + nibble_scale(&b[66..74], g / 2)) * 0.25;
            let q = read_u16(b, 2 + 2 * g);
            let row = IQ2XS_GRID[usize::from(q & 511)];
            let signs = KSIGNS[usize::from(q >> 9)];
            for (k, y) in y.iter_mut().enumerate() {
                *y = db * f32::from(grid_byte(row, k)) * sign(signs, k);
            }
        }
    }
}

/// IQ2_S to f32. Block (82 bytes): `d:f16`, `qs[32]` (low 8 bits of the grid indices), `signs[32]`
/// (one bit per element), `qh[8]` (2 high index bits per group), `scales[8]` (as IQ2_XS).
pub fn dequantize_iq2_s(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(82).zip(dst.chunks_exact_mut(QK_K)) {
        let d = read_f16(b, 0);
        for (g, y) in y.chunks_exact_mut(8).enumerate() {
            let db = d * (0.5 + nibble_scale(&b[74..82], g / 2)) * 0.25;
            let hi = (b[66 + g / 4] >> (2 * (g % 4))) & 3;
            let row = IQ2S_GRID[usize::from(b[2 + g]) | (usize::from(hi) << 8)];
            let signs = b[34 + g];
            for (k, y) in y.iter_mut().enumerate() {
                *y = db * f32::from(grid_byte(row, k)) * sign(signs, k);
            }
        }
    }
}

/// IQ3_XXS to f32. Block (98 bytes): `d:f16`, `qs[64]` (grid indices, 4 elements each), then
/// 8 × `u32` (four 7-bit sign indices and a 4-bit scale per 32 elements).
pub fn dequantize_iq3_xxs(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(98).zip(dst.chunks_exact_mut(QK_K)) {
        let d = read_f16(b, 0);
        for (ib, y) in y.chunks_exact_mut(32).enumerate() {
            let aux = read_u32(b, 66 + 4 * ib);
            let db = d * (0.5 + (aux >> 28) as f32) * 0.5;
            for (l, y) in y.chunks_exact_mut(8).enumerate() {
                let signs = KSIGNS[((aux >> (7 * l)) & 0x7f) as usize];
                for (k, y) in y.iter_mut().enumerate() {
                    let row = IQ3XXS_GRID[usize::from(b[2 + 8 * ib + 2 * l + k / 4])];
                    *y = db * f32::from(grid_byte(u64::from(row), k % 4)) * sign(signs, k);
                }
            }
        }
    }
}

/// IQ3_S to f32. Block (110 bytes): `d:f16`, `qs[64]` (low 8 index bits), `qh[8]` (the ninth bits),
/// `signs[32]` (one bit per element), `scales[4]` (a 4-bit scale per 32 elements, used as `1 + 2s`).
pub fn dequantize_iq3_s(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(110).zip(dst.chunks_exact_mut(QK_K)) {
        let d = read_f16(b, 0);
        for (ib, y) in y.chunks_exact_mut(32).enumerate() {
            let s = (b[106 + ib / 2] >> (4 * (ib % 2))) & 0x0f;
            let db = d * f32::from(1 + 2 * s);
            for (e, y) in y.iter_mut().enumerate() {
                let g = 8 * ib + e / 4;
                let hi = (b[66 + g / 8] >> (g % 8)) & 1;
                let row = IQ3S_GRID[usize::from(b[2 + g]) | (usize::from(hi) << 8)];
                let signs = b[74 + 4 * ib + e / 8];
                *y = db * f32::from(grid_byte(u64::from(row), e % 4)) * sign(signs, e % 8);
            }
        }
    }
}

/// The ±1/8 shift of the IQ1 formats: `+1/8` when the flag bit is clear.
#[inline]
fn iq1_delta(negative: bool) -> f32 {
    if negative {
        -0.125
    } else {
        0.125
    }
}

/// IQ1_S to f32. Block (50 bytes): `d:f16`, `qs[32]` (low 8 bits of 11-bit grid indices),
/// `qh:u16[8]` (per 32 elements: 4 × 3 high index bits, a 3-bit scale, the sign of the delta).
pub fn dequantize_iq1_s(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(50).zip(dst.chunks_exact_mut(QK_K)) {
        let d = read_f16(b, 0);
        for (ib, y) in y.chunks_exact_mut(32).enumerate() {
            let qh = read_u16(b, 34 + 2 * ib);
            let dl = d * f32::from(2 * ((qh >> 12) & 7) + 1);
            let delta = iq1_delta(qh & 0x8000 != 0);
            for (l, y) in y.chunks_exact_mut(8).enumerate() {
                let idx = usize::from(b[2 + 4 * ib + l]) | (usize::from((qh >> (3 * l)) & 7) << 8);
                let row = IQ1S_GRID[idx];
                for (k, y) in y.iter_mut().enumerate() {
                    *y = dl * (f32::from(grid_byte(row, k) as i8) + delta);
                }
            }
        }
    }
}

/// The f16 scale of an IQ1_M block, spread over the top nibbles of its four scale words.
#[inline]
pub fn iq1_m_scale(b: &[u8]) -> f32 {
    let mut h = 0u16;
    for w in 0..4 {
        h |= (read_u16(b, 48 + 2 * w) >> 12) << (4 * w);
    }
    super::bits::f16_to_f32(h)
}

/// IQ1_M to f32. Block (56 bytes): `qs[32]` (low 8 index bits), `qh[16]` (per nibble: 3 high index
/// bits and the delta sign of one 8-group), `scales:u16[4]` (12 bits of 3-bit scales per 16
/// elements, and one nibble of the f16 block scale each).
pub fn dequantize_iq1_m(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(56).zip(dst.chunks_exact_mut(QK_K)) {
        let d = iq1_m_scale(b);
        for (g, y) in y.chunks_exact_mut(8).enumerate() {
            let s = g / 2;
            let ls = (read_u16(b, 48 + 2 * (s / 4)) >> (3 * (s % 4))) & 7;
            let dl = d * f32::from(2 * ls + 1);
            let qh = b[32 + g / 2] >> (4 * (g % 2));
            let row = IQ1S_GRID[usize::from(b[g]) | (usize::from(qh & 7) << 8)];
            let delta = iq1_delta(qh & 0x08 != 0);
            for (k, y) in y.iter_mut().enumerate() {
                *y = dl * (f32::from(grid_byte(row, k) as i8) + delta);
            }
        }
    }
}

/// IQ4_NL to f32. Block (18 bytes): `d:f16`, `qs[16]` (element `j` low nibble, `j + 16` high).
pub fn dequantize_iq4_nl(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(18).zip(dst.chunks_exact_mut(32)) {
        let d = read_f16(b, 0);
        for j in 0..16 {
            y[j] = d * f32::from(KVALUES_IQ4NL[usize::from(b[2 + j] & 0x0f)]);
            y[j + 16] = d * f32::from(KVALUES_IQ4NL[usize::from(b[2 + j] >> 4)]);
        }
    }
}

/// The signed 6-bit scale (offset 32 removed) of sub-block `ib` of an IQ4_XS block.
#[inline]
pub fn iq4_xs_scale(b: &[u8], ib: usize) -> i8 {
    let lo = (b[4 + ib / 2] >> (4 * (ib % 2))) & 0x0f;
    let hi = ((read_u16(b, 2) >> (2 * ib)) & 3) as u8;
    (lo | (hi << 4)) as i8 - 32
}

/// IQ4_XS to f32. Block (136 bytes): `d:f16`, `scales_h:u16` (2 high bits per 32), `scales_l[4]`
/// (4 low bits per 32), `qs[128]` (sub-block `ib`: byte `16·ib + j` holds elements `j` and `j + 16`).
pub fn dequantize_iq4_xs(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(136).zip(dst.chunks_exact_mut(QK_K)) {
        let d = read_f16(b, 0);
        for (ib, y) in y.chunks_exact_mut(32).enumerate() {
            let dl = d * f32::from(iq4_xs_scale(b, ib));
            let qs = &b[8 + 16 * ib..][..16];
            for j in 0..16 {
                y[j] = dl * f32::from(KVALUES_IQ4NL[usize::from(qs[j] & 0x0f)]);
                y[j + 16] = dl * f32::from(KVALUES_IQ4NL[usize::from(qs[j] >> 4)]);
            }
        }
    }
}

/// The index of the IQ4_NL table value nearest `x` (ties to the lower index only where `x` lies
/// strictly nearer it), as ggml's reference quantizer searches the sorted table.
#[inline]
fn nearest_iq4nl(x: f32) -> usize {
    let v = |i: usize| f32::from(KVALUES_IQ4NL[i]);
    if x <= v(0) {
        return 0;
    }
    if x >= v(15) {
        return 15;
    }
    let (mut lo, mut hi) = (0usize, 15usize);
    while hi - lo > 1 {
        let mid = (lo + hi) / 2;
        if x < v(mid) {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    if x - v(hi - 1) < v(hi) - x {
        hi - 1
    } else {
        hi
    }
}

/// f32 to IQ4_NL as ggml's reference quantizer (`quantize_row_iq4_nl_ref`, no importance
/// weights): per block the value of largest magnitude `m` gives `d = m / -127`, each element
/// takes the nearest table value of `x / d`, then `d` becomes the least-squares scale
/// `Σ w·q·x / Σ w·q²` with `w = x²`. A block whose largest magnitude is below 1e-15 stores
/// `d = 0` (all-zero indices).
pub fn quantize_iq4_nl(src: &[f32], dst: &mut [u8]) {
    for (x, b) in src.chunks_exact(32).zip(dst.chunks_exact_mut(18)) {
        let (mut amax, mut max) = (0f32, 0f32);
        for &v in x {
            if v.abs() > amax {
                amax = v.abs();
                max = v;
            }
        }
        b[2..].fill(0);
        if amax < 1e-15 {
            super::bits::write_u16(b, 0, 0);
            continue;
        }
        let id = 1.0 / (max / f32::from(KVALUES_IQ4NL[0]));
        let (mut sumqx, mut sumq2) = (0f32, 0f32);
        let mut l = [0u8; 32];
        for (j, &v) in x.iter().enumerate() {
            let i = nearest_iq4nl(id * v);
            l[j] = i as u8;
            let q = f32::from(KVALUES_IQ4NL[i]);
            let w = v * v;
            sumqx += w * q * v;
            sumq2 += w * q * q;
        }
        let d = if sumq2 > 0.0 { sumqx / sumq2 } else { 0.0 };
        super::bits::write_u16(b, 0, super::bits::f32_to_f16(d));
        for j in 0..16 {
            b[2 + j] = l[j] | (l[j + 16] << 4);
        }
    }
}
