//! F32, F16 and BF16 weights against f32 activations: 32 products per step in four FMA
//! accumulators, a scalar tail for the last `n % 32`. Sums are f32 (the reference sums in f64),
//! so results differ from it by rounding only. Hot path: nothing allocates.

use std::arch::x86_64::*;

use super::simd::{f32_at, hsum, load128};

/// Σ w·a with weights widened to f32 by `widen` (8 weights from their bytes at `off`), over
/// 32-element steps, then the tail through `scalar`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn dot_widened(
    w: &[u8],
    act: &[u8],
    wbytes: usize,
    widen: impl Fn(&[u8], usize) -> __m256,
    scalar: impl Fn(&[u8]) -> f32,
) -> f32 {
    let mut acc = [_mm256_setzero_ps(); 4];
    let steps = w.chunks_exact(32 * wbytes).zip(act.chunks_exact(128));
    for (wc, ac) in steps {
        for (k, acc) in acc.iter_mut().enumerate() {
            let x = widen(wc, 8 * wbytes * k);
            let s = &ac[32 * k..32 * k + 32];
            // SAFETY: `s` is exactly 32 readable bytes (8 f32); the load is unaligned.
            let y = unsafe { _mm256_loadu_ps(s.as_ptr().cast()) };
            *acc = _mm256_fmadd_ps(x, y, *acc);
        }
    }
    let sum = _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3]));
    let done = w.len() / (32 * wbytes) * 32;
    let tail = w[done * wbytes..]
        .chunks_exact(wbytes)
        .zip(act[4 * done..].chunks_exact(4))
        .fold(0f32, |s, (x, y)| scalar(x).mul_add(f32_at(y, 0), s));
    hsum(sum) + tail
}

/// F32 weights · f32 activations.
#[target_feature(enable = "avx2,fma,f16c")]
pub fn f32_f32(w: &[u8], act: &[u8]) -> f32 {
    dot_widened(
        w,
        act,
        4,
        |b, off| {
            let s = &b[off..off + 32];
            // SAFETY: `s` is exactly 32 readable bytes (8 f32); the load is unaligned.
            unsafe { _mm256_loadu_ps(s.as_ptr().cast()) }
        },
        |x| f32_at(x, 0),
    )
}

/// F16 weights · f32 activations (F16C conversion, exact).
#[target_feature(enable = "avx2,fma,f16c")]
pub fn f16_f32(w: &[u8], act: &[u8]) -> f32 {
    dot_widened(
        w,
        act,
        2,
        |b, off| f16x8(b, off),
        |x| bloomery_kernels_cpu::quant::bits::read_f16(x, 0),
    )
}

/// BF16 weights · f32 activations (the 16 bits shifted up).
#[target_feature(enable = "avx2,fma,f16c")]
pub fn bf16_f32(w: &[u8], act: &[u8]) -> f32 {
    dot_widened(
        w,
        act,
        2,
        |b, off| bf16x8(b, off),
        |x| f32::from_bits(u32::from(u16::from_le_bytes([x[0], x[1]])) << 16),
    )
}

/// 8 f16 at `b[off..off + 16]` as f32.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn f16x8(b: &[u8], off: usize) -> __m256 {
    _mm256_cvtph_ps(load128(b, off))
}

/// 8 bf16 at `b[off..off + 16]` as f32.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn bf16x8(b: &[u8], off: usize) -> __m256 {
    let wide = _mm256_cvtepu16_epi32(load128(b, off));
    _mm256_castsi256_ps(_mm256_slli_epi32::<16>(wide))
}
