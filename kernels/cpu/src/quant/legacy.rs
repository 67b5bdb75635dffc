//! The 32-element legacy formats Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 and the activation format Q8_1.
//!
//! Layouts (little-endian): Q4_0 `d:f16, qs[16]`; Q4_1 `d:f16, m:f16, qs[16]`; Q5_0 `d:f16,
//! qh:u32, qs[16]`; Q5_1 `d:f16, m:f16, qh:u32, qs[16]`; Q8_0 `d:f16, qs:i8[32]`; Q8_1 `d:f16,
//! s:f16, qs:i8[32]` with `s = d · Σqs`. Nibble `j` of the low halves is element `j`, of the high
//! halves element `j + 16`; bit `j` of `qh` is the fifth bit of element `j`.

use super::bits::{f32_to_f16, read_f16, read_u32, round_away, write_u16};

const QK: usize = 32;

/// Q4_0 to f32. Expects `src.len() == dst.len() / 32 * 18`.
pub fn dequantize_q4_0(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(18).zip(dst.chunks_exact_mut(QK)) {
        let d = read_f16(b, 0);
        for j in 0..16 {
            y[j] = d * f32::from((b[2 + j] & 0x0f) as i8 - 8);
            y[j + 16] = d * f32::from((b[2 + j] >> 4) as i8 - 8);
        }
    }
}

/// Q4_1 to f32. Expects `src.len() == dst.len() / 32 * 20`.
pub fn dequantize_q4_1(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(20).zip(dst.chunks_exact_mut(QK)) {
        let (d, m) = (read_f16(b, 0), read_f16(b, 2));
        for j in 0..16 {
            y[j] = d * f32::from(b[4 + j] & 0x0f) + m;
            y[j + 16] = d * f32::from(b[4 + j] >> 4) + m;
        }
    }
}

/// The 5-bit values of a Q5 block (unsigned, 0..32) given `qh` and the 16 nibble bytes.
#[inline]
fn q5_values(qh: u32, qs: &[u8]) -> [u8; QK] {
    let mut q = [0u8; QK];
    for j in 0..16 {
        q[j] = (qs[j] & 0x0f) | ((((qh >> j) & 1) as u8) << 4);
        q[j + 16] = (qs[j] >> 4) | ((((qh >> (j + 16)) & 1) as u8) << 4);
    }
    q
}

/// Q5_0 to f32. Expects `src.len() == dst.len() / 32 * 22`.
pub fn dequantize_q5_0(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(22).zip(dst.chunks_exact_mut(QK)) {
        let d = read_f16(b, 0);
        let q = q5_values(read_u32(b, 2), &b[6..22]);
        for (y, q) in y.iter_mut().zip(q) {
            *y = d * f32::from(q as i8 - 16);
        }
    }
}

/// Q5_1 to f32. Expects `src.len() == dst.len() / 32 * 24`.
pub fn dequantize_q5_1(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(24).zip(dst.chunks_exact_mut(QK)) {
        let (d, m) = (read_f16(b, 0), read_f16(b, 2));
        let q = q5_values(read_u32(b, 4), &b[8..24]);
        for (y, q) in y.iter_mut().zip(q) {
            *y = d * f32::from(q) + m;
        }
    }
}

/// Q8_0 to f32. Expects `src.len() == dst.len() / 32 * 34`.
pub fn dequantize_q8_0(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(34).zip(dst.chunks_exact_mut(QK)) {
        let d = read_f16(b, 0);
        for (y, &q) in y.iter_mut().zip(&b[2..]) {
            *y = f32::from(q as i8) * d;
        }
    }
}

/// Q8_1 to f32 (`d · q`; the stored sum is not needed). Expects `src.len() == dst.len() / 32 * 36`.
pub fn dequantize_q8_1(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(36).zip(dst.chunks_exact_mut(QK)) {
        let d = read_f16(b, 0);
        for (y, &q) in y.iter_mut().zip(&b[4..]) {
            *y = f32::from(q as i8) * d;
        }
    }
}

/// The element of largest magnitude (the first one on ties), as numpy's `argmax(abs(x))`.
#[inline]
fn signed_absmax(x: &[f32]) -> f32 {
    let mut best = x[0];
    for &v in &x[1..] {
        if v.abs() > best.abs() {
            best = v;
        }
    }
    best
}

#[inline]
fn max_min(x: &[f32]) -> (f32, f32) {
    x.iter()
        .fold((x[0], x[0]), |(hi, lo), &v| (hi.max(v), lo.min(v)))
}

#[inline]
fn inverse(d: f32) -> f32 {
    if d == 0.0 {
        0.0
    } else {
        1.0 / d
    }
}

/// `trunc(v)` as numpy's `astype(uint8)` then `clip(0, hi)` (v is never negative here).
#[inline]
fn trunc_clip(v: f32, hi: u8) -> u8 {
    (v.trunc() as i32).clamp(0, i32::from(hi)) as u8
}

/// f32 to Q4_0, as gguf: `d = max / -8` with `max` the element of largest magnitude.
pub fn quantize_q4_0(src: &[f32], dst: &mut [u8]) {
    for (x, b) in src.chunks_exact(QK).zip(dst.chunks_exact_mut(18)) {
        let d = signed_absmax(x) / -8.0;
        let id = inverse(d);
        write_u16(b, 0, f32_to_f16(d));
        for j in 0..16 {
            let lo = trunc_clip(x[j] * id + 8.5, 15);
            let hi = trunc_clip(x[j + 16] * id + 8.5, 15);
            b[2 + j] = lo | (hi << 4);
        }
    }
}

/// f32 to Q4_1, as gguf: `d = (max - min) / 15`, `m = min`.
pub fn quantize_q4_1(src: &[f32], dst: &mut [u8]) {
    for (x, b) in src.chunks_exact(QK).zip(dst.chunks_exact_mut(20)) {
        let (max, min) = max_min(x);
        let d = (max - min) / 15.0;
        let id = inverse(d);
        write_u16(b, 0, f32_to_f16(d));
        write_u16(b, 2, f32_to_f16(min));
        for j in 0..16 {
            let lo = trunc_clip((x[j] - min) * id + 0.5, 15);
            let hi = trunc_clip((x[j + 16] - min) * id + 0.5, 15);
            b[4 + j] = lo | (hi << 4);
        }
    }
}

/// Packs 5-bit values into `qh` (bit j = fifth bit of element j) and 16 nibble bytes.
#[inline]
fn pack_q5(q: &[u8; QK], qh: &mut [u8], qs: &mut [u8]) {
    let mut h = 0u32;
    for (j, &v) in q.iter().enumerate() {
        h |= u32::from(v >> 4) << j;
    }
    qh.copy_from_slice(&h.to_le_bytes());
    for j in 0..16 {
        qs[j] = (q[j] & 0x0f) | (q[j + 16] << 4);
    }
}

/// f32 to Q5_0, as gguf: `d = max / -16` with `max` the element of largest magnitude.
pub fn quantize_q5_0(src: &[f32], dst: &mut [u8]) {
    for (x, b) in src.chunks_exact(QK).zip(dst.chunks_exact_mut(22)) {
        let d = signed_absmax(x) / -16.0;
        let id = inverse(d);
        write_u16(b, 0, f32_to_f16(d));
        let mut q = [0u8; QK];
        for (q, &v) in q.iter_mut().zip(x) {
            *q = trunc_clip(v * id + 16.5, 31);
        }
        let (qh, qs) = b[2..].split_at_mut(4);
        pack_q5(&q, qh, qs);
    }
}

/// f32 to Q5_1, as gguf: `d = (max - min) / 31`, `m = min`.
pub fn quantize_q5_1(src: &[f32], dst: &mut [u8]) {
    for (x, b) in src.chunks_exact(QK).zip(dst.chunks_exact_mut(24)) {
        let (max, min) = max_min(x);
        let d = (max - min) / 31.0;
        let id = inverse(d);
        write_u16(b, 0, f32_to_f16(d));
        write_u16(b, 2, f32_to_f16(min));
        let mut q = [0u8; QK];
        for (q, &v) in q.iter_mut().zip(x) {
            *q = trunc_clip((v - min) * id + 0.5, 31);
        }
        let (qh, qs) = b[4..].split_at_mut(4);
        pack_q5(&q, qh, qs);
    }
}

/// Fills 32 signed bytes with `round(x / d)` for `d = max|x| / 127`; returns `d`.
#[inline]
fn quantize_i8_block(x: &[f32], qs: &mut [u8]) -> f32 {
    let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
    let d = amax / 127.0;
    let id = inverse(d);
    for (q, &v) in qs.iter_mut().zip(x) {
        *q = round_away(v * id) as i8 as u8;
    }
    d
}

/// f32 to Q8_0, as ggml's reference (and gguf): `d = max|x| / 127`, `q = round(x / d)`.
pub fn quantize_q8_0(src: &[f32], dst: &mut [u8]) {
    for (x, b) in src.chunks_exact(QK).zip(dst.chunks_exact_mut(34)) {
        let d = quantize_i8_block(x, &mut b[2..]);
        write_u16(b, 0, f32_to_f16(d));
    }
}

/// f32 to Q8_1, as ggml's reference: Q8_0's quants, and `s = f16(d · Σq)`.
pub fn quantize_q8_1(src: &[f32], dst: &mut [u8]) {
    for (x, b) in src.chunks_exact(QK).zip(dst.chunks_exact_mut(36)) {
        let d = quantize_i8_block(x, &mut b[4..]);
        let sum: i32 = b[4..].iter().map(|&q| i32::from(q as i8)).sum();
        write_u16(b, 0, f32_to_f16(d));
        write_u16(b, 2, f32_to_f16(sum as f32 * d));
    }
}

/// Fills 32 signed bytes as ggml's x86 activation quantizer does (the SIMD `quantize_row_q8_0`
/// and `quantize_row_q8_1` llama.cpp runs on AVX2 CPUs): `q = round_half_even(x · (127 / max|x|))`,
/// which differs from the reference's `round_half_away(x · (1 / d))` in the last unit now and
/// then; returns `d = max|x| / 127`.
#[inline]
fn quantize_i8_block_act(x: &[f32], qs: &mut [u8]) -> f32 {
    let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
    let id = if amax == 0.0 { 0.0 } else { 127.0 / amax };
    for (q, &v) in qs.iter_mut().zip(x) {
        *q = (v * id).round_ties_even() as i8 as u8;
    }
    amax / 127.0
}

/// f32 activations to Q8_0 with the rounding of ggml's x86 path ([`quantize_i8_block_act`]).
pub fn quantize_q8_0_act(src: &[f32], dst: &mut [u8]) {
    for (x, b) in src.chunks_exact(QK).zip(dst.chunks_exact_mut(34)) {
        let d = quantize_i8_block_act(x, &mut b[2..]);
        write_u16(b, 0, f32_to_f16(d));
    }
}

/// f32 activations to Q8_1 with the rounding of ggml's x86 path, `s = f16(d · Σq)`.
pub fn quantize_q8_1_act(src: &[f32], dst: &mut [u8]) {
    for (x, b) in src.chunks_exact(QK).zip(dst.chunks_exact_mut(36)) {
        let d = quantize_i8_block_act(x, &mut b[4..]);
        let sum: i32 = b[4..].iter().map(|&q| i32::from(q as i8)).sum();
        write_u16(b, 0, f32_to_f16(d));
        write_u16(b, 2, f32_to_f16(sum as f32 * d));
    }
}

/// Σ w·a over 32 signed values.
#[inline]
fn idot(w: &[i8; QK], a: &[u8]) -> i32 {
    w.iter()
        .zip(a)
        .map(|(&w, &a)| i32::from(w) * i32::from(a as i8))
        .sum()
}

/// Q4_0 weights · Q8_0 activations (ggml's `vec_dot_q4_0_q8_0`). Lengths checked by the caller.
pub fn vec_dot_q4_0_q8_0(w: &[u8], act: &[u8]) -> f32 {
    let mut sum = 0f32;
    for (b, a) in w.chunks_exact(18).zip(act.chunks_exact(34)) {
        let mut q = [0i8; QK];
        for j in 0..16 {
            q[j] = (b[2 + j] & 0x0f) as i8 - 8;
            q[j + 16] = (b[2 + j] >> 4) as i8 - 8;
        }
        sum += idot(&q, &a[2..]) as f32 * (read_f16(b, 0) * read_f16(a, 0));
    }
    sum
}

/// Q5_0 weights · Q8_0 activations.
pub fn vec_dot_q5_0_q8_0(w: &[u8], act: &[u8]) -> f32 {
    let mut sum = 0f32;
    for (b, a) in w.chunks_exact(22).zip(act.chunks_exact(34)) {
        let q = q5_values(read_u32(b, 2), &b[6..22]).map(|v| v as i8 - 16);
        sum += idot(&q, &a[2..]) as f32 * (read_f16(b, 0) * read_f16(a, 0));
    }
    sum
}

/// Q8_0 weights · Q8_0 activations.
pub fn vec_dot_q8_0_q8_0(w: &[u8], act: &[u8]) -> f32 {
    let mut sum = 0f32;
    for (b, a) in w.chunks_exact(34).zip(act.chunks_exact(34)) {
        let s: i32 = b[2..]
            .iter()
            .zip(&a[2..])
            .map(|(&x, &y)| i32::from(x as i8) * i32::from(y as i8))
            .sum();
        sum += s as f32 * (read_f16(b, 0) * read_f16(a, 0));
    }
    sum
}

/// Q4_1 weights · Q8_1 activations: `d_w·d_a·Σq·a + m_w·s_a`.
pub fn vec_dot_q4_1_q8_1(w: &[u8], act: &[u8]) -> f32 {
    let mut sum = 0f32;
    for (b, a) in w.chunks_exact(20).zip(act.chunks_exact(36)) {
        let mut q = [0i8; QK];
        for j in 0..16 {
            q[j] = (b[4 + j] & 0x0f) as i8;
            q[j + 16] = (b[4 + j] >> 4) as i8;
        }
        let s = idot(&q, &a[4..]) as f32;
        sum += s * (read_f16(b, 0) * read_f16(a, 0)) + read_f16(b, 2) * read_f16(a, 2);
    }
    sum
}

/// Q5_1 weights · Q8_1 activations: `d_w·d_a·Σq·a + m_w·s_a`.
pub fn vec_dot_q5_1_q8_1(w: &[u8], act: &[u8]) -> f32 {
    let mut sum = 0f32;
    for (b, a) in w.chunks_exact(24).zip(act.chunks_exact(36)) {
        let q = q5_values(read_u32(b, 4), &b[8..24]).map(|v| v as i8);
        let s = idot(&q, &a[4..]) as f32;
        sum += s * (read_f16(b, 0) * read_f16(a, 0)) + read_f16(b, 2) * read_f16(a, 2);
    }
    sum
}
