//! The 32-element formats against Q8_0 (Q4_0, Q5_0, Q8_0, IQ4_NL, MXFP4, and NVFP4 as two
//! 32-element halves) and Q8_1 (Q4_1, Q5_1) activations. Each block's integer dot product is formed as 8 i32 lanes, converted to f32,
//! scaled by the product of the two block scales, and added to one of two accumulators (two, so
//! that consecutive blocks do not wait on each other's addition).
//!
//! Layouts as in `bloomery_kernels_cpu::quant::{legacy, iquants, fp4}`. Lengths are checked by
//! the caller. Hot path: nothing allocates.

use std::arch::x86_64::*;

use bloomery_kernels_cpu::quant::bits::e8m0_to_f32_half;
use bloomery_kernels_cpu::quant::fp4::ue4m3_to_f32_half;
use bloomery_kernels_cpu::quant::iq_tables::{KVALUES_E2M1, KVALUES_IQ4NL};

use super::simd::{
    bits32, dot_i8, dot_u8, f16x8_at, hsum, load256, nibbles32, scaled_f16x8, table16, u32_at,
};

/// Σ over blocks of `block(weight block, activation block)` (8 lanes each), in two accumulators
/// taking alternate blocks; `wb` and `ab` are the block sizes in bytes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn sum_blocks(
    w: &[u8],
    act: &[u8],
    wb: usize,
    ab: usize,
    block: impl Fn(&[u8], &[u8]) -> __m256,
) -> f32 {
    let (mut acc0, mut acc1) = (_mm256_setzero_ps(), _mm256_setzero_ps());
    let pairs = w.chunks_exact(2 * wb).zip(act.chunks_exact(2 * ab));
    for (b, a) in pairs {
        acc0 = _mm256_add_ps(acc0, block(&b[..wb], &a[..ab]));
        acc1 = _mm256_add_ps(acc1, block(&b[wb..], &a[ab..]));
    }
    let blocks = w.len() / wb;
    if blocks % 2 == 1 {
        let (b, a) = (&w[(blocks - 1) * wb..], &act[(blocks - 1) * ab..]);
        acc0 = _mm256_add_ps(acc0, block(b, a));
    }
    hsum(_mm256_add_ps(acc0, acc1))
}

/// `d_w · d_a · s` for f16 scales at `b[0..2]` and `a[0..2]` and integer lanes `s`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn scale_q8_0(b: &[u8], a: &[u8], s: __m256i) -> __m256 {
    let d = _mm256_mul_ps(f16x8_at(b, 0), f16x8_at(a, 0));
    _mm256_mul_ps(d, _mm256_cvtepi32_ps(s))
}

/// `d_w · d_a · s + m_w · s_a` for Q4_1/Q5_1 against Q8_1 (the minimum term spread as an eighth
/// over the 8 lanes; exact, a power of two).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn scale_q8_1(b: &[u8], a: &[u8], s: __m256i) -> __m256 {
    let d = _mm256_mul_ps(f16x8_at(b, 0), f16x8_at(a, 0));
    let m = _mm256_mul_ps(f16x8_at(b, 2), f16x8_at(a, 2));
    let m8 = _mm256_mul_ps(m, _mm256_set1_ps(0.125));
    _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(s), m8)
}

/// Q8_0 weights · Q8_0 activations.
#[target_feature(enable = "avx2,fma,f16c")]
pub fn q8_0(w: &[u8], act: &[u8]) -> f32 {
    sum_blocks(w, act, 34, 34, |b, a| {
        scale_q8_0(b, a, dot_i8(load256(b, 2), load256(a, 2)))
    })
}

/// Q4_0 weights (nibble − 8) · Q8_0 activations.
#[target_feature(enable = "avx2,fma,f16c")]
pub fn q4_0(w: &[u8], act: &[u8]) -> f32 {
    let eight = _mm256_set1_epi8(8);
    sum_blocks(w, act, 18, 34, |b, a| {
        let q = _mm256_sub_epi8(nibbles32(b, 2), eight);
        scale_q8_0(b, a, dot_i8(q, load256(a, 2)))
    })
}

/// Q5_0 weights (5-bit − 16) · Q8_0 activations.
#[target_feature(enable = "avx2,fma,f16c")]
pub fn q5_0(w: &[u8], act: &[u8]) -> f32 {
    let f0 = _mm256_set1_epi8(0xf0u8 as i8);
    sum_blocks(w, act, 22, 34, |b, a| {
        // nibble | 16·bit − 16: the nibble itself where the bit is set, nibble | 0xF0 (as i8,
        // nibble − 16) where it is clear.
        let clear = _mm256_andnot_si256(bits32(u32_at(b, 2)), f0);
        let q = _mm256_or_si256(nibbles32(b, 6), clear);
        scale_q8_0(b, a, dot_i8(q, load256(a, 2)))
    })
}

/// Q4_1 weights · Q8_1 activations: `d_w·d_a·Σq·a + m_w·s_a` per block.
#[target_feature(enable = "avx2,fma,f16c")]
pub fn q4_1(w: &[u8], act: &[u8]) -> f32 {
    sum_blocks(w, act, 20, 36, |b, a| {
        scale_q8_1(b, a, dot_u8(nibbles32(b, 4), load256(a, 4)))
    })
}

/// Q5_1 weights · Q8_1 activations: `d_w·d_a·Σq·a + m_w·s_a` per block.
#[target_feature(enable = "avx2,fma,f16c")]
pub fn q5_1(w: &[u8], act: &[u8]) -> f32 {
    let bit4 = _mm256_set1_epi8(0x10);
    sum_blocks(w, act, 24, 36, |b, a| {
        let high = _mm256_and_si256(bits32(u32_at(b, 4)), bit4);
        let q = _mm256_or_si256(nibbles32(b, 8), high);
        scale_q8_1(b, a, dot_u8(q, load256(a, 4)))
    })
}

/// IQ4_NL weights (nibbles through the non-linear table) · Q8_0 activations.
#[target_feature(enable = "avx2,fma,f16c")]
pub fn iq4_nl(w: &[u8], act: &[u8]) -> f32 {
    let table = table16(&KVALUES_IQ4NL);
    sum_blocks(w, act, 18, 34, |b, a| {
        let q = _mm256_shuffle_epi8(table, nibbles32(b, 2));
        scale_q8_0(b, a, dot_i8(q, load256(a, 2)))
    })
}

/// MXFP4 weights (doubled E2M1 codes, half the E8M0 scale) · Q8_0 activations.
#[target_feature(enable = "avx2,fma,f16c")]
pub fn mxfp4(w: &[u8], act: &[u8]) -> f32 {
    let table = table16(&KVALUES_E2M1);
    sum_blocks(w, act, 17, 34, |b, a| {
        let q = _mm256_shuffle_epi8(table, nibbles32(b, 1));
        let d = scaled_f16x8(e8m0_to_f32_half(b[0]), a, 0);
        _mm256_mul_ps(d, _mm256_cvtepi32_ps(dot_i8(q, load256(a, 2))))
    })
}

/// NVFP4 weights · Q8_0 activations: each 32-element half of a block (one Q8_0 block) has two
/// E4M3 scales, one per 16 elements.
#[target_feature(enable = "avx2,fma,f16c")]
pub fn nvfp4(w: &[u8], act: &[u8]) -> f32 {
    let table = table16(&KVALUES_E2M1);
    sum_blocks(w, act, 36, 68, |b, a| {
        let mut v = _mm256_setzero_ps();
        for half in 0..2 {
            // Bytes 0..8 hold elements 0..8 (low nibbles) and 8..16 (high), bytes 8..16 the
            // next 16: reorder the quarters of [low 0..16, high 0..16] to element order.
            let q = _mm256_permute4x64_epi64::<0b11_01_10_00>(nibbles32(b, 4 + 16 * half));
            let q = _mm256_shuffle_epi8(table, q);
            let q8 = &a[34 * half..][..34];
            let s = dot_i8(q, load256(q8, 2));
            // Lanes 0..4 sum the first 16 elements, lanes 4..8 the second.
            let (s0, s1) = (
                ue4m3_to_f32_half(b[2 * half]),
                ue4m3_to_f32_half(b[2 * half + 1]),
            );
            let scales = _mm256_setr_ps(s0, s0, s0, s0, s1, s1, s1, s1);
            let d = _mm256_mul_ps(scales, f16x8_at(q8, 0));
            v = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(s), v);
        }
        v
    })
}
