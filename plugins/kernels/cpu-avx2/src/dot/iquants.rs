//! The grid i-quants IQ1_S, IQ1_M, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS and IQ3_S against Q8_K
//! activations.
//!
//! Each 8 (IQ2) or 4 (IQ3) weights are one row of a magnitude grid plus sign bits. Per 32
//! elements the kernel gathers the grid rows into one vector of unsigned magnitudes, moves the
//! signs onto the activations (`sign_epi8` with ±1 bytes), multiplies with `maddubs` and weights
//! by the integer sub-block scale (`2s + 1`, as the reference folds it) with `madd`. The IQ1 grids
//! hold -1, 0 and 1, and their weights `8·g ± 1` are signed bytes used directly. The float factor
//! (`d/8`, `d/4` or `d`) is applied once per super-block. Layouts as in
//! `bloomery_kernels_cpu::quant::iquants`; lengths are checked by the caller. Hot path: nothing
//! allocates.

use std::arch::x86_64::*;

use bloomery_kernels_cpu::quant::iq_tables::{
    IQ1S_GRID, IQ2S_GRID, IQ2XS_GRID, IQ2XXS_GRID, IQ3S_GRID, IQ3XXS_GRID,
};
use bloomery_kernels_cpu::quant::iquants::iq1_m_scale;

use super::simd::{bits32, dot_i8_i16, f32_at, hsum, load256, scaled_f16x8, u32_at};

/// The sign byte of a 7-bit sign index: the index plus an eighth bit making the count of set
/// bits even (the reference's `KSIGNS` table).
const fn ksigns(i: usize) -> u8 {
    (i as u8) | (((i.count_ones() & 1) as u8) << 7)
}

/// For each 7-bit sign index, 8 bytes of ±1 (−1 where the sign bit is set), for `sign_epi8`.
static SIGNS: [u64; 128] = {
    let mut t = [0u64; 128];
    let mut i = 0;
    while i < 128 {
        let s = ksigns(i);
        let mut k = 0;
        while k < 8 {
            let byte: u64 = if (s >> k) & 1 == 1 { 0xff } else { 0x01 };
            t[i] |= byte << (8 * k);
            k += 1;
        }
        i += 1;
    }
    t
};

/// ±1 bytes from 32 sign bits (bit `j` set: element `j` negative).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn signs_from_bits(bits: u32) -> __m256i {
    _mm256_or_si256(bits32(bits), _mm256_set1_epi8(1))
}

/// Four 8-byte rows as one vector (row 0 in the low bytes).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn rows(r: [u64; 4]) -> __m256i {
    _mm256_set_epi64x(r[3] as i64, r[2] as i64, r[1] as i64, r[0] as i64)
}

/// `Σ mag·sign·a` over 32 elements as 16 i16 pair sums.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn signed_products(mag: __m256i, signs: __m256i, a: &[u8], off: usize) -> __m256i {
    _mm256_maddubs_epi16(mag, _mm256_sign_epi8(load256(a, off), signs))
}

/// A scale per 16 elements for `madd`: `lo` in lanes 0..8, `hi` in lanes 8..16.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn scales16(lo: i16, hi: i16) -> __m256i {
    _mm256_set_m128i(_mm_set1_epi16(hi), _mm_set1_epi16(lo))
}

/// `d_a · d_w · factor · Σ lanes` folded into `acc`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn finish(acc: __m256, b: &[u8], a: &[u8], factor: f32, sumi: __m256i) -> __m256 {
    let d = scaled_f16x8(f32_at(a, 0) * factor, b, 0);
    _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sumi), acc)
}

/// IQ2_XXS weights · Q8_K activations.
#[target_feature(enable = "avx2,fma,f16c")]
pub fn iq2_xxs(w: &[u8], act: &[u8]) -> f32 {
    let mut acc = _mm256_setzero_ps();
    for (b, a) in w.chunks_exact(66).zip(act.chunks_exact(292)) {
        let mut sumi = _mm256_setzero_si256();
        for ib in 0..8 {
            let q = &b[2 + 8 * ib..][..8];
            let aux = u32_at(q, 4);
            let grid = |l: usize| IQ2XXS_GRID[usize::from(q[l])];
            let sign = |l: usize| SIGNS[((aux >> (7 * l)) & 0x7f) as usize];
            let mag = rows([grid(0), grid(1), grid(2), grid(3)]);
            let signs = rows([sign(0), sign(1), sign(2), sign(3)]);
            let p = signed_products(mag, signs, a, 4 + 32 * ib);
            let s = (2 * (aux >> 28) + 1) as i16;
            sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(p, _mm256_set1_epi16(s)));
        }
        acc = finish(acc, b, a, 0.125, sumi);
    }
    hsum(acc)
}

/// IQ2_XS weights · Q8_K activations.
#[target_feature(enable = "avx2,fma,f16c")]
pub fn iq2_xs(w: &[u8], act: &[u8]) -> f32 {
    let mut acc = _mm256_setzero_ps();
    for (b, a) in w.chunks_exact(74).zip(act.chunks_exact(292)) {
        let mut sumi = _mm256_setzero_si256();
        for ib in 0..8 {
            let q = |l: usize| u16::from_le_bytes([b[2 + 8 * ib + 2 * l], b[3 + 8 * ib + 2 * l]]);
            let grid = |l: usize| IQ2XS_GRID[usize::from(q(l) & 511)];
            let sign = |l: usize| SIGNS[usize::from(q(l) >> 9)];
            let mag = rows([grid(0), grid(1), grid(2), grid(3)]);
            let signs = rows([sign(0), sign(1), sign(2), sign(3)]);
            let p = signed_products(mag, signs, a, 4 + 32 * ib);
            let sc = b[66 + ib];
            let s = scales16(2 * i16::from(sc & 0x0f) + 1, 2 * i16::from(sc >> 4) + 1);
            sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(p, s));
        }
        acc = finish(acc, b, a, 0.125, sumi);
    }
    hsum(acc)
}

/// IQ2_S weights · Q8_K activations.
#[target_feature(enable = "avx2,fma,f16c")]
pub fn iq2_s(w: &[u8], act: &[u8]) -> f32 {
    let mut acc = _mm256_setzero_ps();
    for (b, a) in w.chunks_exact(82).zip(act.chunks_exact(292)) {
        let mut sumi = _mm256_setzero_si256();
        for ib in 0..8 {
            let qh = usize::from(b[66 + ib]);
            let grid =
                |l: usize| IQ2S_GRID[usize::from(b[2 + 4 * ib + l]) | ((qh >> (2 * l)) & 3) << 8];
            let mag = rows([grid(0), grid(1), grid(2), grid(3)]);
            let signs = signs_from_bits(u32_at(b, 34 + 4 * ib));
            let p = signed_products(mag, signs, a, 4 + 32 * ib);
            let sc = b[74 + ib];
            let s = scales16(2 * i16::from(sc & 0x0f) + 1, 2 * i16::from(sc >> 4) + 1);
            sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(p, s));
        }
        acc = finish(acc, b, a, 0.125, sumi);
    }
    hsum(acc)
}

/// IQ3_XXS weights · Q8_K activations.
#[target_feature(enable = "avx2,fma,f16c")]
pub fn iq3_xxs(w: &[u8], act: &[u8]) -> f32 {
    let mut acc = _mm256_setzero_ps();
    for (b, a) in w.chunks_exact(98).zip(act.chunks_exact(292)) {
        let mut sumi = _mm256_setzero_si256();
        for ib in 0..8 {
            let q = &b[2 + 8 * ib..][..8];
            let g = |k: usize| IQ3XXS_GRID[usize::from(q[k])] as i32;
            let mag = _mm256_setr_epi32(g(0), g(1), g(2), g(3), g(4), g(5), g(6), g(7));
            let aux = u32_at(b, 66 + 4 * ib);
            let sign = |l: usize| SIGNS[((aux >> (7 * l)) & 0x7f) as usize];
            let signs = rows([sign(0), sign(1), sign(2), sign(3)]);
            let p = signed_products(mag, signs, a, 4 + 32 * ib);
            let s = (2 * (aux >> 28) + 1) as i16;
            sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(p, _mm256_set1_epi16(s)));
        }
        acc = finish(acc, b, a, 0.25, sumi);
    }
    hsum(acc)
}

/// IQ3_S weights · Q8_K activations.
#[target_feature(enable = "avx2,fma,f16c")]
pub fn iq3_s(w: &[u8], act: &[u8]) -> f32 {
    let mut acc = _mm256_setzero_ps();
    for (b, a) in w.chunks_exact(110).zip(act.chunks_exact(292)) {
        let mut sumi = _mm256_setzero_si256();
        for ib in 0..8 {
            let qh = usize::from(b[66 + ib]);
            let g =
                |k: usize| IQ3S_GRID[usize::from(b[2 + 8 * ib + k]) | ((qh >> k) & 1) << 8] as i32;
            let mag = _mm256_setr_epi32(g(0), g(1), g(2), g(3), g(4), g(5), g(6), g(7));
            let signs = signs_from_bits(u32_at(b, 74 + 4 * ib));
            let p = signed_products(mag, signs, a, 4 + 32 * ib);
            let s = 1 + 2 * i16::from((b[106 + ib / 2] >> (4 * (ib % 2))) & 0x0f);
            sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(p, _mm256_set1_epi16(s)));
        }
        acc = finish(acc, b, a, 1.0, sumi);
    }
    hsum(acc)
}

/// IQ1 weights `8·g + delta` from grid rows of -1/0/1 bytes and per-row deltas of ±1 bytes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn iq1_values(grid: [u64; 4], delta: [u64; 4]) -> __m256i {
    // sign(8, g) is 8·g for g in {-1, 0, 1}.
    let g8 = _mm256_sign_epi8(_mm256_set1_epi8(8), rows(grid));
    _mm256_add_epi8(g8, rows(delta))
}

/// Eight bytes of +1, or of -1 when `negative`.
#[inline]
fn delta_row(negative: bool) -> u64 {
    if negative {
        u64::MAX
    } else {
        0x0101_0101_0101_0101
    }
}

/// IQ1_S weights · Q8_K activations.
#[target_feature(enable = "avx2,fma,f16c")]
pub fn iq1_s(w: &[u8], act: &[u8]) -> f32 {
    let mut acc = _mm256_setzero_ps();
    for (b, a) in w.chunks_exact(50).zip(act.chunks_exact(292)) {
        let mut sumi = _mm256_setzero_si256();
        for ib in 0..8 {
            let qh = u16::from_le_bytes([b[34 + 2 * ib], b[35 + 2 * ib]]);
            let grid = |l: usize| {
                let hi = usize::from((qh >> (3 * l)) & 7);
                IQ1S_GRID[usize::from(b[2 + 4 * ib + l]) | (hi << 8)]
            };
            let d = delta_row(qh & 0x8000 != 0);
            let q = iq1_values([grid(0), grid(1), grid(2), grid(3)], [d; 4]);
            let p = dot_i8_i16(q, load256(a, 4 + 32 * ib));
            let s = 2 * ((qh >> 12) & 7) as i16 + 1;
            sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(p, _mm256_set1_epi16(s)));
        }
        acc = finish(acc, b, a, 0.125, sumi);
    }
    hsum(acc)
}

/// IQ1_M weights · Q8_K activations.
#[target_feature(enable = "avx2,fma,f16c")]
pub fn iq1_m(w: &[u8], act: &[u8]) -> f32 {
    let mut acc = _mm256_setzero_ps();
    for (b, a) in w.chunks_exact(56).zip(act.chunks_exact(292)) {
        let mut sumi = _mm256_setzero_si256();
        for ib in 0..8 {
            // The 3-bit high index and the delta sign of 8-group g, one nibble each.
            let nib = |g: usize| b[32 + g / 2] >> (4 * (g % 2));
            let grid = |l: usize| {
                let g = 4 * ib + l;
                IQ1S_GRID[usize::from(b[g]) | (usize::from(nib(g) & 7) << 8)]
            };
            let delta = |l: usize| delta_row(nib(4 * ib + l) & 0x08 != 0);
            let q = iq1_values(
                [grid(0), grid(1), grid(2), grid(3)],
                [delta(0), delta(1), delta(2), delta(3)],
            );
            let p = dot_i8_i16(q, load256(a, 4 + 32 * ib));
            let word = u16::from_le_bytes([b[48 + 2 * (ib / 2)], b[49 + 2 * (ib / 2)]]);
            let scale = |s: usize| 2 * ((word >> (3 * (s % 4))) & 7) as i16 + 1;
            let s = scales16(scale(2 * ib), scale(2 * ib + 1));
            sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(p, s));
        }
        let d = _mm256_set1_ps(f32_at(a, 0) * (iq1_m_scale(b) * 0.125));
        acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sumi), acc);
    }
    hsum(acc)
}

#[cfg(test)]
mod tests {
    use bloomery_kernels_cpu::quant::iq_tables::KSIGNS;

    #[test]
    fn sign_bytes_follow_the_reference_table() {
        for (i, &k) in KSIGNS.iter().enumerate() {
            assert_eq!(super::ksigns(i), k, "index {i}");
        }
    }
}
