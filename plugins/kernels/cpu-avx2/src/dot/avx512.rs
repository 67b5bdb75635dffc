//! AVX-512 (F, BW, VL, VNNI) kernel for Q6_K (against Q8_K activations), chosen by `rows_dot`
//! when the CPU has those features. (A Q8_0 kernel, `vpdpbusd` over two blocks per vector with
//! each i32 lane scaled in f32, was 23% faster on the H200 machine's Xeon but moved the tiny
//! Qwen3.5 Q8_0 file's logits 1.6e-2 away from llama.cpp's (the AVX2 order stays within 2e-7) and
//! was taken out. A Q4_K kernel in the same style, `vpdpbusd`
//! per 64 quants and `vpdpwssd` for the scales, measured 3 to 11% slower than the AVX2 one on
//! an AMD Zen 4, whose 512-bit units are 256 bits wide, and no faster on the H200 machine's
//! Xeon (13.5–13.9 against 13.6 GB/s in cache), so it was left out. A second one, one
//! `maddubs` and one `vpdpwssd` per 64 quants with the AVX2 kernel's i32 lanes, bit for bit its
//! result, two rows sharing each activation load, was 14–15% faster on Zen 4 but equal on the
//! Xeon through the rows loop (12.7 against 12.7 GB/s for 768-element rows) and slower end to end
//! with every expert on the host (tg64 74 against 79): the Xeon issues 512-bit vector work on
//! two ports against three for 256-bit, so the fewer instructions took as many cycles.)
//!
//! The arithmetic is the AVX2 kernels': integer products inside each block, one float scaling
//! per block. The differences are in how the integers are formed: 64 quants per 512-bit vector
//! (a whole 256-element super-block in four steps), and VNNI's `vpdpwssd` multiplying the `maddubs`
//! pair sums by their i16 sub-block scales and adding them to the i32 lanes in one instruction
//! (`madd` + `add` in AVX2). Integer sums stay exact; only the order of the f32 additions differs from the reference.
//! Hot path: nothing allocates.

use std::arch::x86_64::*;

use super::simd::{broadcast_sum_i32, f32_at, load128, load256, scaled_f16x8};

/// Loads `b[off..off + 64]` (panics if out of range; callers use offsets inside fixed blocks).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
fn load512(b: &[u8], off: usize) -> __m512i {
    let s = &b[off..off + 64];
    // SAFETY: `s` is exactly 64 readable bytes; the load is unaligned.
    unsafe { _mm512_loadu_si512(s.as_ptr().cast()) }
}

/// `b[off..off + 32]` in both 256-bit halves.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
fn twice256(b: &[u8], off: usize) -> __m512i {
    _mm512_broadcast_i64x4(load256(b, off))
}

/// A vector of 32 i16 from a table (index vectors for `_mm512_permutexvar_epi16`).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
fn words(t: &[u16; 32]) -> __m512i {
    // SAFETY: `t` is 64 readable bytes; the load is unaligned.
    unsafe { _mm512_loadu_si512(t.as_ptr().cast()) }
}

/// Word-index tables: entry `i` gives each 128-bit lane `l` word `4i + l` (Q6_K: the scale of
/// the 16 elements whose pair sums that lane holds in step `i`).
const K6_SCALE_IDX: [[u16; 32]; 4] = {
    let mut t = [[0u16; 32]; 4];
    let mut i = 0;
    while i < 4 {
        let mut w = 0;
        while w < 32 {
            t[i][w] = (4 * i + w / 8) as u16;
            w += 1;
        }
        i += 1;
    }
    t
};

/// Per-word shift counts: `a` in the lower 256 bits, `b` in the upper.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
fn halves_epi16(a: i16, b: i16) -> __m512i {
    _mm512_inserti64x4::<1>(
        _mm512_castsi256_si512(_mm256_set1_epi16(a)),
        _mm256_set1_epi16(b),
    )
}

/// `a | (b & c)` bitwise (`vpternlogd`).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
fn or_and(a: __m512i, b: __m512i, c: __m512i) -> __m512i {
    _mm512_ternarylogic_epi32::<0xf8>(a, b, c)
}

/// Q6_K weights · Q8_K activations: `u = q + 32` in 0..64, then `− 32·Σ scale·bsum`. Each half
/// (128 elements) is two steps of 64 contiguous elements: the 64 low-bit bytes once, their low
/// nibbles then their high nibbles, with the 32 high-bit bytes in both 256-bit halves shifted
/// per half into bits 4 and 5.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub fn q6_k(w: &[u8], act: &[u8]) -> f32 {
    let (m4, m30) = (_mm512_set1_epi8(0x0f), _mm512_set1_epi8(0x30));
    let (shl, shr) = (halves_epi16(4, 2), halves_epi16(0, 2));
    let idx = K6_SCALE_IDX.map(|t| words(&t));
    let mut acc = _mm256_setzero_ps();
    for (b, a) in w.chunks_exact(210).zip(act.chunks_exact(292)) {
        let scales = load128(b, 192);
        let sc16 = _mm256_cvtepi8_epi16(scales);
        let sc = _mm512_castsi256_si512(sc16);
        let mut sumi = _mm512_setzero_si512();
        for c in 0..2 {
            let l = load512(b, 64 * c);
            let h = twice256(b, 128 + 32 * c);
            let lo = or_and(_mm512_and_si512(l, m4), _mm512_sllv_epi16(h, shl), m30);
            let hi = _mm512_and_si512(_mm512_srli_epi16::<4>(l), m4);
            let hi = or_and(hi, _mm512_srlv_epi16(h, shr), m30);
            let p_lo = _mm512_maddubs_epi16(lo, load512(a, 4 + 128 * c));
            let p_hi = _mm512_maddubs_epi16(hi, load512(a, 68 + 128 * c));
            let s_lo = _mm512_permutexvar_epi16(idx[2 * c], sc);
            let s_hi = _mm512_permutexvar_epi16(idx[2 * c + 1], sc);
            sumi = _mm512_dpwssd_epi32(sumi, p_lo, s_lo);
            sumi = _mm512_dpwssd_epi32(sumi, p_hi, s_hi);
        }
        let half = _mm256_add_epi32(
            _mm512_castsi512_si256(sumi),
            _mm512_extracti64x4_epi64::<1>(sumi),
        );
        let offset = _mm256_madd_epi16(sc16, load256(a, 260));
        let half = _mm256_sub_epi32(half, _mm256_slli_epi32::<5>(offset));
        // The offset was removed per lane from other elements' lanes: only the block total is
        // the exact integer (all-zero weights must give exactly zero), so sum the lanes first.
        let total = _mm256_cvtepi32_ps(broadcast_sum_i32(half));
        acc = _mm256_fmadd_ps(scaled_f16x8(f32_at(a, 0), b, 208), total, acc);
    }
    _mm256_cvtss_f32(acc) // all lanes equal
}
