//! The 256-element formats Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS and TQ2_0 against Q8_K activations
//! (292 bytes: `d:f32`, `qs:i8[256]`, `bsums:i16[16]`).
//!
//! Quants are brought to unsigned bytes where the format allows (Q3_K as `q + 4`, Q6_K as
//! `q + 32`), multiplied with `maddubs`, weighted by their sub-block scale with `madd`, and the
//! offsets removed through the activation block sums: `Σ s·(u − o)·a = Σ s·u·a − o·Σ s·bsum`.
//! Per super-block the i32 lanes are converted once and accumulated with an FMA. Layouts as in
//! `bloomery_kernels_cpu::quant::kquants`; lengths are checked by the caller. Hot path: nothing
//! allocates.

use std::arch::x86_64::*;

use bloomery_kernels_cpu::quant::iq_tables::KVALUES_IQ4NL;

use super::simd::{
    broadcast_sum_i32, dot_i8_i16, f32_at, hsum, load128, load256, scaled_f16x8, table16, u32_at,
};

/// `_mm256_shuffle_epi8` masks on 8 i16 scales held in both 128-bit lanes: mask `m` fills lane 0
/// with word `2m` and lane 1 with word `2m + 1`, the two 16-element scales of a 32-element group
/// (as `madd` pairs them after `maddubs`).
const WORD_PAIR: [[u8; 32]; 4] = {
    let mut t = [[0u8; 32]; 4];
    let mut m = 0;
    while m < 4 {
        let mut j = 0;
        while j < 32 {
            let word = 2 * m + j / 16;
            t[m][j] = (2 * word + j % 2) as u8;
            j += 1;
        }
        m += 1;
    }
    t
};

/// `_mm256_shuffle_epi8` masks on 8 i16 scales held in both 128-bit lanes: mask `k` repeats word
/// `k` everywhere.
const WORD_SPLAT: [[u8; 32]; 8] = {
    let mut t = [[0u8; 32]; 8];
    let mut k = 0;
    while k < 8 {
        let mut j = 0;
        while j < 32 {
            t[k][j] = (2 * k + j % 2) as u8;
            j += 1;
        }
        k += 1;
    }
    t
};

/// A 32-byte shuffle mask as a vector.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn mask(m: &[u8; 32]) -> __m256i {
    // SAFETY: `m` is 32 readable bytes; the load is unaligned.
    unsafe { _mm256_loadu_si256(m.as_ptr().cast()) }
}

/// The 16 signed byte scales (one per 16 elements) as two vectors of 8 i16, each in both
/// 128-bit lanes: scales 0..8, then 8..16.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn words_i8(scales: __m128i) -> [__m256i; 2] {
    let hi = _mm_unpackhi_epi64(scales, scales);
    [
        _mm256_broadcastsi128_si256(_mm_cvtepi8_epi16(scales)),
        _mm256_broadcastsi128_si256(_mm_cvtepi8_epi16(hi)),
    ]
}

/// The 16 i16 `madd` scales of 32-element group `g` from [`words_i8`]'s vectors.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn group_scales(words: &[__m256i; 2], g: usize) -> __m256i {
    _mm256_shuffle_epi8(words[g / 4], mask(&WORD_PAIR[g % 4]))
}

/// The 8 scales and 8 minimums (6-bit) of a Q4_K/Q5_K block (`scale_min_k4` of the reference,
/// on words): scales in bytes 0..8, minimums in bytes 8..16.
///
/// A plain function so that it can be `inline(always)`: out of line, the call spills the
/// accumulators every block.
#[inline(always)]
fn k4_scales(b: &[u8]) -> [u32; 4] {
    let (u0, u1, u2) = (u32_at(b, 4), u32_at(b, 8), u32_at(b, 12));
    [
        u0 & 0x3f3f_3f3f,
        (u2 & 0x0f0f_0f0f) | ((u0 >> 2) & 0x3030_3030),
        u1 & 0x3f3f_3f3f,
        ((u2 >> 4) & 0x0f0f_0f0f) | ((u1 >> 2) & 0x3030_3030),
    ]
}

/// [`k4_scales`] as a vector.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn k4_scales_v(b: &[u8]) -> __m128i {
    let [sc_lo, sc_hi, mn_lo, mn_hi] = k4_scales(b);
    _mm_set_epi32(mn_hi as i32, mn_lo as i32, sc_hi as i32, sc_lo as i32)
}

/// `min[k]·(bsum[2k] + bsum[2k+1])` for the 8 minimums of a Q4_K/Q5_K block, as 8 f32 lanes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn k4_mins_dot(scales: __m128i, a: &[u8]) -> __m256 {
    // Each minimum twice, for the two 16-element sums of its 32 elements.
    let twice = _mm_setr_epi8(8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13, 14, 14, 15, 15);
    let mins = _mm256_cvtepu8_epi16(_mm_shuffle_epi8(scales, twice));
    _mm256_cvtepi32_ps(_mm256_madd_epi16(mins, load256(a, 260)))
}

/// The scale of 32-element group `k` of a Q4_K/Q5_K block in all 16 i16 lanes, from the 8
/// scales widened into both lanes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn k4_scale(words: __m256i, k: usize) -> __m256i {
    _mm256_shuffle_epi8(words, mask(&WORD_SPLAT[k]))
}

/// Q4_K weights · Q8_K activations.
#[target_feature(enable = "avx2,fma,f16c")]
pub fn q4_k(w: &[u8], act: &[u8]) -> f32 {
    let m4 = _mm256_set1_epi8(0x0f);
    let (mut acc, mut acc_m) = (_mm256_setzero_ps(), _mm256_setzero_ps());
    for (b, a) in w.chunks_exact(144).zip(act.chunks_exact(292)) {
        let da = f32_at(a, 0);
        let scales = k4_scales_v(b);
        let dmin = scaled_f16x8(da, b, 2);
        acc_m = _mm256_fmadd_ps(dmin, k4_mins_dot(scales, a), acc_m);
        let words = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(scales));
        let mut sumi = _mm256_setzero_si256();
        for j in 0..4 {
            let q = load256(b, 16 + 32 * j);
            let lo = _mm256_maddubs_epi16(_mm256_and_si256(q, m4), load256(a, 4 + 64 * j));
            let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(q), m4);
            let hi = _mm256_maddubs_epi16(hi, load256(a, 36 + 64 * j));
            let lo = _mm256_madd_epi16(lo, k4_scale(words, 2 * j));
            let hi = _mm256_madd_epi16(hi, k4_scale(words, 2 * j + 1));
            sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(lo, hi));
        }
        let d = scaled_f16x8(da, b, 0);
        acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sumi), acc);
    }
    hsum(acc) - hsum(acc_m)
}

/// Q5_K weights · Q8_K activations.
#[target_feature(enable = "avx2,fma,f16c")]
pub fn q5_k(w: &[u8], act: &[u8]) -> f32 {
    let (m4, bit4) = (_mm256_set1_epi8(0x0f), _mm256_set1_epi8(0x10));
    let (mut acc, mut acc_m) = (_mm256_setzero_ps(), _mm256_setzero_ps());
    for (b, a) in w.chunks_exact(176).zip(act.chunks_exact(292)) {
        let da = f32_at(a, 0);
        let scales = k4_scales_v(b);
        let dmin = scaled_f16x8(da, b, 2);
        acc_m = _mm256_fmadd_ps(dmin, k4_mins_dot(scales, a), acc_m);
        let words = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(scales));
        // Bits 2j and 2j + 1 of each byte are the fifth bits of 32-element groups 2j, 2j + 1;
        // shifted down by 2 per step (bits leaking in from the byte above stay above bit 1).
        let mut hbits = load256(b, 16);
        let mut sumi = _mm256_setzero_si256();
        for j in 0..4 {
            let q = load256(b, 48 + 32 * j);
            let lo = _mm256_and_si256(q, m4);
            let lo = _mm256_or_si256(lo, _mm256_and_si256(_mm256_slli_epi16::<4>(hbits), bit4));
            let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(q), m4);
            let hi = _mm256_or_si256(hi, _mm256_and_si256(_mm256_slli_epi16::<3>(hbits), bit4));
            hbits = _mm256_srli_epi16::<2>(hbits);
            let lo = _mm256_maddubs_epi16(lo, load256(a, 4 + 64 * j));
            let hi = _mm256_maddubs_epi16(hi, load256(a, 36 + 64 * j));
            let lo = _mm256_madd_epi16(lo, k4_scale(words, 2 * j));
            let hi = _mm256_madd_epi16(hi, k4_scale(words, 2 * j + 1));
            sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(lo, hi));
        }
        let d = scaled_f16x8(da, b, 0);
        acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sumi), acc);
    }
    hsum(acc) - hsum(acc_m)
}

/// Q6_K weights · Q8_K activations: `u = q + 32` in 0..64, then `− 32·Σ scale·bsum`.
#[target_feature(enable = "avx2,fma,f16c")]
pub fn q6_k(w: &[u8], act: &[u8]) -> f32 {
    let (m4, m30) = (_mm256_set1_epi8(0x0f), _mm256_set1_epi8(0x30));
    let mut acc = _mm256_setzero_ps();
    for (b, a) in w.chunks_exact(210).zip(act.chunks_exact(292)) {
        let scales = load128(b, 192);
        let words = words_i8(scales);
        let mut sumi = _mm256_setzero_si256();
        for c in 0..2 {
            let (l0, l1) = (load256(b, 64 * c), load256(b, 64 * c + 32));
            let h = load256(b, 128 + 32 * c);
            let u = [
                (_mm256_and_si256(l0, m4), _mm256_slli_epi16::<4>(h)),
                (_mm256_and_si256(l1, m4), _mm256_slli_epi16::<2>(h)),
                (_mm256_and_si256(_mm256_srli_epi16::<4>(l0), m4), h),
                (
                    _mm256_and_si256(_mm256_srli_epi16::<4>(l1), m4),
                    _mm256_srli_epi16::<2>(h),
                ),
            ];
            for (k, (low, high)) in u.into_iter().enumerate() {
                let g = 4 * c + k;
                let u = _mm256_or_si256(low, _mm256_and_si256(high, m30));
                let p = _mm256_maddubs_epi16(u, load256(a, 4 + 32 * g));
                sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(p, group_scales(&words, g)));
            }
        }
        let offset = _mm256_madd_epi16(_mm256_cvtepi8_epi16(scales), load256(a, 260));
        sumi = _mm256_sub_epi32(sumi, _mm256_slli_epi32::<5>(offset));
        // The offset was removed per lane from other elements' lanes: only the block total is
        // the exact integer (all-zero weights must give exactly zero), so sum the lanes first.
        let total = _mm256_cvtepi32_ps(broadcast_sum_i32(sumi));
        acc = _mm256_fmadd_ps(scaled_f16x8(f32_at(a, 0), b, 208), total, acc);
    }
    _mm256_cvtss_f32(acc) // all lanes equal
}

/// The 16 signed Q3_K scales (offset 32 removed) from their 12 bytes at `b[96..108]`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn q3_k_scales(b: &[u8]) -> __m128i {
    let (a0, a1, a2) = (u32_at(b, 96), u32_at(b, 100), u32_at(b, 104));
    let (lo, hi) = (0x0f0f_0f0f, 0x0303_0303);
    let s0 = (a0 & lo) | ((a2 & hi) << 4);
    let s1 = (a1 & lo) | (((a2 >> 2) & hi) << 4);
    let s2 = ((a0 >> 4) & lo) | (((a2 >> 4) & hi) << 4);
    let s3 = ((a1 >> 4) & lo) | (((a2 >> 6) & hi) << 4);
    let s = _mm_set_epi32(s3 as i32, s2 as i32, s1 as i32, s0 as i32);
    _mm_sub_epi8(s, _mm_set1_epi8(32))
}

/// Q3_K weights · Q8_K activations: `u = q + 4` (2 low bits | high bit · 4), then `− 4·Σ
/// scale·bsum`.
#[target_feature(enable = "avx2,fma,f16c")]
pub fn q3_k(w: &[u8], act: &[u8]) -> f32 {
    let (m3, bit2) = (_mm256_set1_epi8(3), _mm256_set1_epi8(4));
    let mut acc = _mm256_setzero_ps();
    for (b, a) in w.chunks_exact(110).zip(act.chunks_exact(292)) {
        let scales = q3_k_scales(b);
        let words = words_i8(scales);
        // Bit g of each hmask byte is the high bit of group g; shifted down one per group.
        let mut hbits = load256(b, 0);
        let mut sumi = _mm256_setzero_si256();
        for c in 0..2 {
            let mut q = load256(b, 32 + 32 * c);
            for p in 0..4 {
                let g = 4 * c + p;
                let high = _mm256_and_si256(_mm256_slli_epi16::<2>(hbits), bit2);
                let u = _mm256_or_si256(_mm256_and_si256(q, m3), high);
                q = _mm256_srli_epi16::<2>(q);
                hbits = _mm256_srli_epi16::<1>(hbits);
                let prod = _mm256_maddubs_epi16(u, load256(a, 4 + 32 * g));
                sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(prod, group_scales(&words, g)));
            }
        }
        let offset = _mm256_madd_epi16(_mm256_cvtepi8_epi16(scales), load256(a, 260));
        sumi = _mm256_sub_epi32(sumi, _mm256_slli_epi32::<2>(offset));
        // The offset was removed per lane from other elements' lanes: only the block total is
        // the exact integer (all-zero weights must give exactly zero), so sum the lanes first.
        let total = _mm256_cvtepi32_ps(broadcast_sum_i32(sumi));
        acc = _mm256_fmadd_ps(scaled_f16x8(f32_at(a, 0), b, 108), total, acc);
    }
    _mm256_cvtss_f32(acc) // all lanes equal
}

/// Q2_K weights · Q8_K activations: `d·Σ scale·q·a − dmin·Σ min·bsum`.
#[target_feature(enable = "avx2,fma,f16c")]
pub fn q2_k(w: &[u8], act: &[u8]) -> f32 {
    let m3 = _mm256_set1_epi8(3);
    let (mut acc, mut acc_m) = (_mm256_setzero_ps(), _mm256_setzero_ps());
    for (b, a) in w.chunks_exact(84).zip(act.chunks_exact(292)) {
        let da = f32_at(a, 0);
        let raw = load128(b, 0);
        let scales = _mm_and_si128(raw, _mm_set1_epi8(0x0f));
        let words = words_i8(scales);
        let mins = _mm_and_si128(_mm_srli_epi16::<4>(raw), _mm_set1_epi8(0x0f));
        let summ = _mm256_madd_epi16(_mm256_cvtepu8_epi16(mins), load256(a, 260));
        let dmin = scaled_f16x8(da, b, 82);
        acc_m = _mm256_fmadd_ps(dmin, _mm256_cvtepi32_ps(summ), acc_m);
        let mut sumi = _mm256_setzero_si256();
        for c in 0..2 {
            let mut q = load256(b, 16 + 32 * c);
            for p in 0..4 {
                let g = 4 * c + p;
                let prod = _mm256_maddubs_epi16(_mm256_and_si256(q, m3), load256(a, 4 + 32 * g));
                q = _mm256_srli_epi16::<2>(q);
                // The scales are 0..16, so the signed widening is the unsigned one.
                sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(prod, group_scales(&words, g)));
            }
        }
        let d = scaled_f16x8(da, b, 80);
        acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sumi), acc);
    }
    hsum(acc) - hsum(acc_m)
}

/// IQ4_XS weights · Q8_K activations: table values times a signed 6-bit scale per 32.
#[target_feature(enable = "avx2,fma,f16c")]
pub fn iq4_xs(w: &[u8], act: &[u8]) -> f32 {
    let table = table16(&KVALUES_IQ4NL);
    let m4 = _mm_set1_epi8(0x0f);
    let mut acc = _mm256_setzero_ps();
    for (b, a) in w.chunks_exact(136).zip(act.chunks_exact(292)) {
        let scales_h = u16::from_le_bytes([b[2], b[3]]);
        let mut sumi = _mm256_setzero_si256();
        for ib in 0..8 {
            let lo = (b[4 + ib / 2] >> (4 * (ib % 2))) & 0x0f;
            let hi = ((scales_h >> (2 * ib)) & 3) as u8;
            let scale = i16::from(lo | (hi << 4)) - 32;
            let x = load128(b, 8 + 16 * ib);
            let idx = _mm256_set_m128i(
                _mm_and_si128(_mm_srli_epi16::<4>(x), m4),
                _mm_and_si128(x, m4),
            );
            let q = _mm256_shuffle_epi8(table, idx);
            let p = dot_i8_i16(q, load256(a, 4 + 32 * ib));
            sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(p, _mm256_set1_epi16(scale)));
        }
        let d = scaled_f16x8(f32_at(a, 0), b, 0);
        acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sumi), acc);
    }
    hsum(acc)
}

/// TQ2_0 weights · Q8_K activations: 2-bit `u` in Q2_K's layout, weight `u − 1` as a signed
/// byte (so that all-zero weights give exactly zero), one scale `d` per block.
#[target_feature(enable = "avx2,fma,f16c")]
pub fn tq2_0(w: &[u8], act: &[u8]) -> f32 {
    let (m3, one) = (_mm256_set1_epi8(3), _mm256_set1_epi8(1));
    let mut acc = _mm256_setzero_ps();
    for (b, a) in w.chunks_exact(66).zip(act.chunks_exact(292)) {
        let mut sum16 = _mm256_setzero_si256();
        for c in 0..2 {
            let mut q = load256(b, 32 * c);
            for p in 0..4 {
                let g = 4 * c + p;
                let v = _mm256_sub_epi8(_mm256_and_si256(q, m3), one);
                q = _mm256_srli_epi16::<2>(q);
                // At most 8 · 2·2·127 per lane: no i16 overflow.
                sum16 = _mm256_add_epi16(sum16, dot_i8_i16(v, load256(a, 4 + 32 * g)));
            }
        }
        let sumi = _mm256_madd_epi16(sum16, _mm256_set1_epi16(1));
        acc = _mm256_fmadd_ps(
            scaled_f16x8(f32_at(a, 0), b, 64),
            _mm256_cvtepi32_ps(sumi),
            acc,
        );
    }
    hsum(acc)
}
