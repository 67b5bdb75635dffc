//! Dot products of the 256-element formats with Q8_K activations, through one integer form.
//!
//! Each weight super-block is decoded into [`IntBlock`]: 256 small integers `q`, an integer scale
//! and minimum per 16 elements, and two float factors, such that weight `j` is
//! `d · scale[j/16] · q[j] - dmin · min[j/16]`. The dot product with a Q8_K block is then
//! `d_a · (d · Σ_s scale[s]·Σ q·a  -  dmin · Σ_s min[s]·bsum[s])`, all sums in i32, as ggml does.
//! The i-quants ([`super::iquants_dot`]) decode into the same form.

use super::bits::{read_f16, read_f32, read_u16};
use super::kquants::{scale_min_k4, scales_q3_k, unpack_2bit, unpack_q3_k, unpack_q6_k, QK_K};
use super::ternary::{tq1_digit, tq1_position};

/// One weight super-block as integers: weight `j` = `d · scale[j/16] · q[j] - dmin · min[j/16]`.
#[derive(Clone)]
pub struct IntBlock {
    /// The quants.
    pub q: [i8; QK_K],
    /// Integer scale per 16 elements.
    pub scale: [i32; 16],
    /// Integer minimum per 16 elements (zero for formats without one).
    pub min: [i32; 16],
    /// Scale factor.
    pub d: f32,
    /// Minimum factor.
    pub dmin: f32,
}

impl Default for IntBlock {
    fn default() -> Self {
        IntBlock {
            q: [0; QK_K],
            scale: [0; 16],
            min: [0; 16],
            d: 0.0,
            dmin: 0.0,
        }
    }
}

/// `IntBlock · Q8_K block` (292 bytes: `d:f32`, `qs:i8[256]`, `bsums:i16[16]`).
#[inline]
pub fn dot_int_block(w: &IntBlock, a: &[u8]) -> f32 {
    let qa = &a[4..260];
    let (mut sumi, mut summ) = (0i32, 0i32);
    for s in 0..16 {
        let isum: i32 = w.q[16 * s..16 * s + 16]
            .iter()
            .zip(&qa[16 * s..16 * s + 16])
            .map(|(&q, &a)| i32::from(q) * i32::from(a as i8))
            .sum();
        sumi += w.scale[s] * isum;
        summ += w.min[s] * i32::from(read_u16(a, 260 + 2 * s) as i16);
    }
    read_f32(a, 0) * (w.d * sumi as f32 - w.dmin * summ as f32)
}

/// Sums `dot_int_block` over a row, decoding each weight block of `bytes` bytes with `decode`.
#[inline]
pub fn dot_row(w: &[u8], act: &[u8], bytes: usize, decode: fn(&[u8], &mut IntBlock)) -> f32 {
    let mut blk = IntBlock::default();
    let mut sum = 0f32;
    for (b, a) in w.chunks_exact(bytes).zip(act.chunks_exact(292)) {
        decode(b, &mut blk);
        sum += dot_int_block(&blk, a);
    }
    sum
}

/// Decodes a Q2_K block (see [`super::kquants::dequantize_q2_k`]).
pub fn decode_q2_k(b: &[u8], o: &mut IntBlock) {
    for (s, &v) in b[..16].iter().enumerate() {
        o.scale[s] = i32::from(v & 0x0f);
        o.min[s] = i32::from(v >> 4);
    }
    unpack_2bit(&b[16..80], &mut o.q);
    o.d = read_f16(b, 80);
    o.dmin = read_f16(b, 82);
}

/// Decodes a Q3_K block.
pub fn decode_q3_k(b: &[u8], o: &mut IntBlock) {
    let sc = scales_q3_k(&b[96..108]);
    o.scale = sc.map(i32::from);
    o.min = [0; 16];
    unpack_q3_k(b, &mut o.q);
    o.d = read_f16(b, 108);
    o.dmin = 0.0;
}

/// Decodes a Q4_K block.
pub fn decode_q4_k(b: &[u8], o: &mut IntBlock) {
    let (sc, mn) = scale_min_k4(&b[4..16]);
    for s in 0..16 {
        o.scale[s] = i32::from(sc[s / 2]);
        o.min[s] = i32::from(mn[s / 2]);
    }
    for (s, q) in o.q.chunks_exact_mut(32).enumerate() {
        for (q, &v) in q.iter_mut().zip(&b[16 + (s / 2) * 32..][..32]) {
            *q = ((v >> (4 * (s % 2))) & 0x0f) as i8;
        }
    }
    o.d = read_f16(b, 0);
    o.dmin = read_f16(b, 2);
}

/// Decodes a Q5_K block.
pub fn decode_q5_k(b: &[u8], o: &mut IntBlock) {
    let (sc, mn) = scale_min_k4(&b[4..16]);
    for s in 0..16 {
        o.scale[s] = i32::from(sc[s / 2]);
        o.min[s] = i32::from(mn[s / 2]);
    }
    for (s, q) in o.q.chunks_exact_mut(32).enumerate() {
        let ql = &b[48 + (s / 2) * 32..][..32];
        for ((q, &l), &h) in q.iter_mut().zip(ql).zip(&b[16..48]) {
            *q = (((l >> (4 * (s % 2))) & 0x0f) | (((h >> s) & 1) << 4)) as i8;
        }
    }
    o.d = read_f16(b, 0);
    o.dmin = read_f16(b, 2);
}

/// Decodes a Q6_K block.
pub fn decode_q6_k(b: &[u8], o: &mut IntBlock) {
    for s in 0..16 {
        o.scale[s] = i32::from(b[192 + s] as i8);
        o.min[s] = 0;
    }
    unpack_q6_k(b, &mut o.q);
    o.d = read_f16(b, 208);
    o.dmin = 0.0;
}

/// Decodes a TQ1_0 block.
pub fn decode_tq1_0(b: &[u8], o: &mut IntBlock) {
    for (e, q) in o.q.iter_mut().enumerate() {
        let (i, p) = tq1_position(e);
        *q = tq1_digit(b[i], p);
    }
    o.scale = [1; 16];
    o.min = [0; 16];
    o.d = read_f16(b, 52);
    o.dmin = 0.0;
}

/// Decodes a TQ2_0 block.
pub fn decode_tq2_0(b: &[u8], o: &mut IntBlock) {
    unpack_2bit(&b[..64], &mut o.q);
    o.q.iter_mut().for_each(|q| *q -= 1);
    o.scale = [1; 16];
    o.min = [0; 16];
    o.d = read_f16(b, 64);
    o.dmin = 0.0;
}

/// Q2_K weights · Q8_K activations. Lengths checked by the caller.
pub fn vec_dot_q2_k_q8_k(w: &[u8], act: &[u8]) -> f32 {
    dot_row(w, act, 84, decode_q2_k)
}

/// Q3_K weights · Q8_K activations.
pub fn vec_dot_q3_k_q8_k(w: &[u8], act: &[u8]) -> f32 {
    dot_row(w, act, 110, decode_q3_k)
}

/// Q4_K weights · Q8_K activations.
pub fn vec_dot_q4_k_q8_k(w: &[u8], act: &[u8]) -> f32 {
    dot_row(w, act, 144, decode_q4_k)
}

/// Q5_K weights · Q8_K activations.
pub fn vec_dot_q5_k_q8_k(w: &[u8], act: &[u8]) -> f32 {
    dot_row(w, act, 176, decode_q5_k)
}

/// Q6_K weights · Q8_K activations.
pub fn vec_dot_q6_k_q8_k(w: &[u8], act: &[u8]) -> f32 {
    dot_row(w, act, 210, decode_q6_k)
}

/// TQ1_0 weights · Q8_K activations.
pub fn vec_dot_tq1_0_q8_k(w: &[u8], act: &[u8]) -> f32 {
    dot_row(w, act, 54, decode_tq1_0)
}

/// TQ2_0 weights · Q8_K activations.
pub fn vec_dot_tq2_0_q8_k(w: &[u8], act: &[u8]) -> f32 {
    dot_row(w, act, 66, decode_tq2_0)
}
