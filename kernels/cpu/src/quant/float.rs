//! The plain float types F32, F16 and BF16: conversion to and from f32, and dot products with f32.

use super::bits::{f16_to_f32, f32_to_f16, read_f32, read_u16};

/// F32 bytes to f32 (a copy). Expects `src.len() == 4 * dst.len()`.
pub fn dequantize_f32(src: &[u8], dst: &mut [f32]) {
    for (d, s) in dst.iter_mut().zip(src.chunks_exact(4)) {
        *d = read_f32(s, 0);
    }
}

/// F16 bytes to f32 (exact; NaN payloads kept, as numpy). Expects `src.len() == 2 * dst.len()`.
pub fn dequantize_f16(src: &[u8], dst: &mut [f32]) {
    for (d, s) in dst.iter_mut().zip(src.chunks_exact(2)) {
        *d = f16_to_f32(read_u16(s, 0));
    }
}

/// BF16 bytes to f32 (the bits shifted up). Expects `src.len() == 2 * dst.len()`.
pub fn dequantize_bf16(src: &[u8], dst: &mut [f32]) {
    for (d, s) in dst.iter_mut().zip(src.chunks_exact(2)) {
        *d = f32::from_bits(u32::from(read_u16(s, 0)) << 16);
    }
}

/// f32 to F32 bytes. Expects `dst.len() == 4 * src.len()`.
pub fn quantize_f32(src: &[f32], dst: &mut [u8]) {
    for (s, d) in src.iter().zip(dst.chunks_exact_mut(4)) {
        d.copy_from_slice(&s.to_le_bytes());
    }
}

/// f32 to F16 bytes, rounding to nearest even. Expects `dst.len() == 2 * src.len()`.
pub fn quantize_f16(src: &[f32], dst: &mut [u8]) {
    for (s, d) in src.iter().zip(dst.chunks_exact_mut(2)) {
        d.copy_from_slice(&f32_to_f16(*s).to_le_bytes());
    }
}

/// f32 to BF16 bits as ggml's `ggml_compute_fp32_to_bf16`: NaN is forced quiet, the rest rounds to
/// nearest even.
#[inline]
pub fn f32_to_bf16(x: f32) -> u16 {
    let n = x.to_bits();
    if n & 0x7fff_ffff > 0x7f80_0000 {
        return ((n >> 16) | 64) as u16;
    }
    ((u64::from(n) + 0x7fff + u64::from((n >> 16) & 1)) >> 16) as u16
}

/// f32 to BF16 bytes. Expects `dst.len() == 2 * src.len()`.
pub fn quantize_bf16(src: &[f32], dst: &mut [u8]) {
    for (s, d) in src.iter().zip(dst.chunks_exact_mut(2)) {
        d.copy_from_slice(&f32_to_bf16(*s).to_le_bytes());
    }
}

/// Dot product of F32 weights with f32 activations (both as bytes), summed in f64.
pub fn vec_dot_f32(w: &[u8], act: &[u8]) -> f32 {
    let mut sum = 0f64;
    for (a, b) in w.chunks_exact(4).zip(act.chunks_exact(4)) {
        sum += f64::from(read_f32(a, 0)) * f64::from(read_f32(b, 0));
    }
    sum as f32
}

/// Dot product of F16 weights with f32 activations, summed in f64.
pub fn vec_dot_f16(w: &[u8], act: &[u8]) -> f32 {
    let mut sum = 0f64;
    for (a, b) in w.chunks_exact(2).zip(act.chunks_exact(4)) {
        sum += f64::from(f16_to_f32(read_u16(a, 0))) * f64::from(read_f32(b, 0));
    }
    sum as f32
}

/// Dot product of BF16 weights with f32 activations, summed in f64.
pub fn vec_dot_bf16(w: &[u8], act: &[u8]) -> f32 {
    let mut sum = 0f64;
    for (a, b) in w.chunks_exact(2).zip(act.chunks_exact(4)) {
        let x = f32::from_bits(u32::from(read_u16(a, 0)) << 16);
        sum += f64::from(x) * f64::from(read_f32(b, 0));
    }
    sum as f32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bf16_rounds_to_nearest_even_and_quiets_nan() {
        assert_eq!(f32_to_bf16(f32::from_bits(0x3f80_8000)), 0x3f80); // tie, even stays
        assert_eq!(f32_to_bf16(f32::from_bits(0x3f81_8000)), 0x3f82); // tie, odd rounds up
        assert_eq!(f32_to_bf16(f32::from_bits(0x7f80_0001)), 0x7fc0);
        assert_eq!(f32_to_bf16(f32::INFINITY), 0x7f80);
    }
}
