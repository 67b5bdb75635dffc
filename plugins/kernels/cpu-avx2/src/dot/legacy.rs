//! The 32-element formats against Q8_0 (Q4_0, Q5_0, Q8_0, IQ4_NL, MXFP4) and Q8_1 (Q4_1, Q5_1)
//! activations. Each block's integer dot product is formed as 8 i32 lanes, converted to f32 and
//! accumulated with one FMA against the product of the two block scales.
//!
//! Layouts as in `bloomery_kernels_cpu::quant::{legacy, iquants, fp4}`. Lengths are checked by
//! the caller. Hot path: nothing allocates.

use std::arch::x86_64::*;

use bloomery_kernels_cpu::quant::bits::e8m0_to_f32_half;
use bloomery_kernels_cpu::quant::iq_tables::{KVALUES_E2M1, KVALUES_IQ4NL};

use super::simd::{
    bits32, dot_i8, dot_u8, f16x8_at, hsum, load256, nibbles32, scaled_f16x8, table16, u32_at,
};

/// Q8_0 weights · Q8_0 activations.
#[target_feature(enable = "avx2,fma,f16c")]
pub fn q8_0(w: &[u8], act: &[u8]) -> f32 {
    let mut acc = _mm256_setzero_ps();
    for (b, a) in w.chunks_exact(34).zip(act.chunks_exact(34)) {
        let s = dot_i8(load256(b, 2), load256(a, 2));
        let d = _mm256_mul_ps(f16x8_at(b, 0), f16x8_at(a, 0));
        acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(s), acc);
    }
    hsum(acc)
}

/// Q4_0 weights (nibble − 8) · Q8_0 activations.
#[target_feature(enable = "avx2,fma,f16c")]
pub fn q4_0(w: &[u8], act: &[u8]) -> f32 {
    let mut acc = _mm256_setzero_ps();
    let eight = _mm256_set1_epi8(8);
    for (b, a) in w.chunks_exact(18).zip(act.chunks_exact(34)) {
        let q = _mm256_sub_epi8(nibbles32(b, 2), eight);
        let s = dot_i8(q, load256(a, 2));
        let d = _mm256_mul_ps(f16x8_at(b, 0), f16x8_at(a, 0));
        acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(s), acc);
    }
    hsum(acc)
}

/// Q5_0 weights (5-bit − 16) · Q8_0 activations.
#[target_feature(enable = "avx2,fma,f16c")]
pub fn q5_0(w: &[u8], act: &[u8]) -> f32 {
    let mut acc = _mm256_setzero_ps();
    for (b, a) in w.chunks_exact(22).zip(act.chunks_exact(34)) {
        // nibble | 16·bit − 16: the nibble itself where the bit is set, nibble | 0xF0 (as i8,
        // nibble − 16) where it is clear.
        let clear = _mm256_andnot_si256(bits32(u32_at(b, 2)), _mm256_set1_epi8(0xf0u8 as i8));
        let q = _mm256_or_si256(nibbles32(b, 6), clear);
        let s = dot_i8(q, load256(a, 2));
        let d = _mm256_mul_ps(f16x8_at(b, 0), f16x8_at(a, 0));
        acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(s), acc);
    }
    hsum(acc)
}

/// Q4_1 weights · Q8_1 activations: `d_w·d_a·Σq·a + m_w·s_a` per block.
#[target_feature(enable = "avx2,fma,f16c")]
pub fn q4_1(w: &[u8], act: &[u8]) -> f32 {
    let mut acc = _mm256_setzero_ps();
    let mut mins = _mm256_setzero_ps(); // all lanes equal
    for (b, a) in w.chunks_exact(20).zip(act.chunks_exact(36)) {
        let s = dot_u8(nibbles32(b, 4), load256(a, 4));
        let d = _mm256_mul_ps(f16x8_at(b, 0), f16x8_at(a, 0));
        acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(s), acc);
        mins = _mm256_fmadd_ps(f16x8_at(b, 2), f16x8_at(a, 2), mins);
    }
    hsum(acc) + _mm256_cvtss_f32(mins)
}

/// Q5_1 weights · Q8_1 activations: `d_w·d_a·Σq·a + m_w·s_a` per block.
#[target_feature(enable = "avx2,fma,f16c")]
pub fn q5_1(w: &[u8], act: &[u8]) -> f32 {
    let mut acc = _mm256_setzero_ps();
    let mut mins = _mm256_setzero_ps(); // all lanes equal
    for (b, a) in w.chunks_exact(24).zip(act.chunks_exact(36)) {
        let high = _mm256_and_si256(bits32(u32_at(b, 4)), _mm256_set1_epi8(0x10));
        let q = _mm256_or_si256(nibbles32(b, 8), high);
        let s = dot_u8(q, load256(a, 4));
        let d = _mm256_mul_ps(f16x8_at(b, 0), f16x8_at(a, 0));
        acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(s), acc);
        mins = _mm256_fmadd_ps(f16x8_at(b, 2), f16x8_at(a, 2), mins);
    }
    hsum(acc) + _mm256_cvtss_f32(mins)
}

/// IQ4_NL weights (nibbles through the non-linear table) · Q8_0 activations.
#[target_feature(enable = "avx2,fma,f16c")]
pub fn iq4_nl(w: &[u8], act: &[u8]) -> f32 {
    let table = table16(&KVALUES_IQ4NL);
    let mut acc = _mm256_setzero_ps();
    for (b, a) in w.chunks_exact(18).zip(act.chunks_exact(34)) {
        let q = _mm256_shuffle_epi8(table, nibbles32(b, 2));
        let s = dot_i8(q, load256(a, 2));
        let d = _mm256_mul_ps(f16x8_at(b, 0), f16x8_at(a, 0));
        acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(s), acc);
    }
    hsum(acc)
}

/// MXFP4 weights (doubled E2M1 codes, half the E8M0 scale) · Q8_0 activations.
#[target_feature(enable = "avx2,fma,f16c")]
pub fn mxfp4(w: &[u8], act: &[u8]) -> f32 {
    let table = table16(&KVALUES_E2M1);
    let mut acc = _mm256_setzero_ps();
    for (b, a) in w.chunks_exact(17).zip(act.chunks_exact(34)) {
        let q = _mm256_shuffle_epi8(table, nibbles32(b, 1));
        let s = dot_i8(q, load256(a, 2));
        let d = scaled_f16x8(e8m0_to_f32_half(b[0]), a, 0);
        acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(s), acc);
    }
    hsum(acc)
}
