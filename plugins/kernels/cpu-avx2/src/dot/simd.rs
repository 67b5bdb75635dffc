//! Small AVX2 building blocks shared by the kernels: loads, f16 scalars, horizontal sums and the
//! byte-pair dot products.

use std::arch::x86_64::*;

/// Loads `b[off..off + 32]` (panics if out of range; callers use offsets inside fixed blocks).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub fn load256(b: &[u8], off: usize) -> __m256i {
    let s = &b[off..off + 32];
    // SAFETY: `s` is exactly 32 readable bytes; the load is unaligned.
    unsafe { _mm256_loadu_si256(s.as_ptr().cast()) }
}

/// Loads `b[off..off + 16]`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub fn load128(b: &[u8], off: usize) -> __m128i {
    let s = &b[off..off + 16];
    // SAFETY: `s` is exactly 16 readable bytes; the load is unaligned.
    unsafe { _mm_loadu_si128(s.as_ptr().cast()) }
}

/// The little-endian f16 at `b[i..i + 2]` in all 8 lanes, as f32 (F16C; exact).
///
/// Scales are converted as whole vectors on purpose: a scalar conversion loads the half into
/// one lane (`pinsrw`), merging into whatever register the compiler picks, often the FMA
/// accumulator, which makes every block wait for the previous one.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub fn f16x8_at(b: &[u8], i: usize) -> __m256 {
    _mm256_cvtph_ps(_mm_set1_epi16(i16::from_le_bytes([b[i], b[i + 1]])))
}

/// `x` times the f16 at `b[i..i + 2]`, in all 8 lanes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub fn scaled_f16x8(x: f32, b: &[u8], i: usize) -> __m256 {
    _mm256_mul_ps(_mm256_set1_ps(x), f16x8_at(b, i))
}

/// The little-endian f32 at `b[i..i + 4]`.
#[inline(always)]
pub fn f32_at(b: &[u8], i: usize) -> f32 {
    f32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]])
}

/// The little-endian u32 at `b[i..i + 4]`.
#[inline(always)]
pub fn u32_at(b: &[u8], i: usize) -> u32 {
    u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]])
}

/// The sum of the 8 lanes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub fn hsum(v: __m256) -> f32 {
    hsum128(_mm_add_ps(
        _mm256_castps256_ps128(v),
        _mm256_extractf128_ps::<1>(v),
    ))
}

/// The sum of the 4 lanes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub fn hsum128(v: __m128) -> f32 {
    let s = _mm_add_ps(v, _mm_movehl_ps(v, v));
    _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)))
}

/// The sum of the 8 i32 lanes, in every lane (wrapping as i32 addition does).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub fn broadcast_sum_i32(v: __m256i) -> __m256i {
    let t = _mm256_add_epi32(v, _mm256_permute2x128_si256::<1>(v, v));
    let t = _mm256_add_epi32(t, _mm256_shuffle_epi32::<0b01_00_11_10>(t));
    _mm256_add_epi32(t, _mm256_shuffle_epi32::<0b10_11_00_01>(t))
}

/// Sums adjacent i16 pairs into 8 i32.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub fn pairs_i32(v: __m256i) -> __m256i {
    _mm256_madd_epi16(v, _mm256_set1_epi16(1))
}

/// Σ x·y of signed bytes, as 16 i16 sums of adjacent pairs (`|x|·sign(y, x)` through `maddubs`).
/// Exact while no pair exceeds i16: `x` in -128..=127 and `y` in -127..=127.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub fn dot_i8_i16(x: __m256i, y: __m256i) -> __m256i {
    _mm256_maddubs_epi16(_mm256_sign_epi8(x, x), _mm256_sign_epi8(y, x))
}

/// Σ x·y of signed bytes as 8 i32 partial sums.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub fn dot_i8(x: __m256i, y: __m256i) -> __m256i {
    pairs_i32(dot_i8_i16(x, y))
}

/// Σ u·y of unsigned `u` (at most 127 here) and signed `y`, as 8 i32 partial sums.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub fn dot_u8(u: __m256i, y: __m256i) -> __m256i {
    pairs_i32(_mm256_maddubs_epi16(u, y))
}

/// The 32 nibbles of `b[off..off + 16]` as bytes: low nibbles (elements 0..16), then high ones.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub fn nibbles32(b: &[u8], off: usize) -> __m256i {
    let t = load128(b, off);
    let both = _mm256_set_m128i(_mm_srli_epi16::<4>(t), t);
    _mm256_and_si256(both, _mm256_set1_epi8(0x0f))
}

/// The 32 bits of `x` as bytes: byte `j` is 0xFF when bit `j` is set, else 0.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub fn bits32(x: u32) -> __m256i {
    let v = _mm256_set1_epi32(x as i32);
    // Byte j takes byte j / 8 of `x` (each 128-bit lane holds all of `x`).
    let spread = _mm256_shuffle_epi8(
        v,
        _mm256_setr_epi8(
            0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3,
            3, 3, 3,
        ),
    );
    // Set every bit but bit j % 8; the byte is all ones exactly when bit j % 8 was set.
    let others = _mm256_or_si256(spread, _mm256_set1_epi64x(0x7fbf_dfef_f7fb_fdfe));
    _mm256_cmpeq_epi8(others, _mm256_set1_epi64x(-1))
}

/// A 16-entry signed byte table in both 128-bit lanes, for `_mm256_shuffle_epi8` lookups.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub fn table16(t: &[i8; 16]) -> __m256i {
    // SAFETY: `t` is 16 readable bytes; the load is unaligned.
    let x = unsafe { _mm_loadu_si128(t.as_ptr().cast()) };
    _mm256_broadcastsi128_si256(x)
}
