//! The k-quants Q2_K, Q3_K, Q4_K, Q5_K, Q6_K (256-element super-blocks with 6- or 8-bit sub-block
//! scales) and the activation format Q8_K: dequantization, and Q8_K quantization.
//!
//! Dequantization repeats gguf's float operations in gguf's order (`(d · scale) · q - dmin · min`),
//! which makes it bit-identical. Layouts are given beside each function.

use super::bits::{nearest_int, read_f16, read_f32};

/// Elements per super-block.
pub const QK_K: usize = 256;

/// Unpacks the 12-byte, 6-bit scales and minimums of Q4_K and Q5_K (8 of each).
#[inline]
pub fn scale_min_k4(s: &[u8]) -> ([u8; 8], [u8; 8]) {
    let mut sc = [0u8; 8];
    let mut mn = [0u8; 8];
    for i in 0..4 {
        sc[i] = s[i] & 0x3f;
        mn[i] = s[4 + i] & 0x3f;
        sc[4 + i] = (s[8 + i] & 0x0f) | ((s[i] >> 2) & 0x30);
        mn[4 + i] = (s[8 + i] >> 4) | ((s[4 + i] >> 2) & 0x30);
    }
    (sc, mn)
}

/// Unpacks the 12-byte Q3_K scales into 16 signed 6-bit values (offset 32 removed).
#[inline]
pub fn scales_q3_k(s: &[u8]) -> [i8; 16] {
    let mut out = [0i8; 16];
    for (k, o) in out.iter_mut().enumerate() {
        let lo = (s[k % 8] >> (4 * (k / 8))) & 0x0f;
        let hi = (s[8 + k % 4] >> (2 * (k / 4))) & 0x03;
        *o = (lo | (hi << 4)) as i8 - 32;
    }
    out
}

/// Unpacks 256 two-bit values laid out as in Q2_K, Q3_K and TQ2_0: element `c·128 + p·32 + j` in
/// bits `2p` of byte `c·32 + j`.
#[inline]
pub fn unpack_2bit(qs: &[u8], out: &mut [i8; QK_K]) {
    for (c, out) in out.chunks_exact_mut(128).enumerate() {
        let qs = &qs[32 * c..][..32];
        for (p, out) in out.chunks_exact_mut(32).enumerate() {
            for (o, &q) in out.iter_mut().zip(qs) {
                *o = ((q >> (2 * p)) & 3) as i8;
            }
        }
    }
}

/// The signed 3-bit values (-4..4) of a Q3_K block.
#[inline]
pub fn unpack_q3_k(b: &[u8], out: &mut [i8; QK_K]) {
    unpack_2bit(&b[32..96], out);
    for (p, out) in out.chunks_exact_mut(32).enumerate() {
        for (o, &h) in out.iter_mut().zip(&b[..32]) {
            // A set hmask bit means no offset.
            *o -= ((((h >> p) & 1) ^ 1) << 2) as i8;
        }
    }
}

/// Q2_K to f32. Block (84 bytes): `scales[16]` (low nibble scale, high nibble min), `qs[64]`
/// (2-bit, see [`unpack_2bit`]), `d:f16`, `dmin:f16`.
pub fn dequantize_q2_k(src: &[u8], dst: &mut [f32]) {
    let mut q = [0i8; QK_K];
    for (b, y) in src.chunks_exact(84).zip(dst.chunks_exact_mut(QK_K)) {
        let (d, dmin) = (read_f16(b, 80), read_f16(b, 82));
        unpack_2bit(&b[16..80], &mut q);
        for (s, (y, q)) in y.chunks_exact_mut(16).zip(q.chunks_exact(16)).enumerate() {
            let dl = d * f32::from(b[s] & 0x0f);
            let ml = dmin * f32::from(b[s] >> 4);
            for (y, &q) in y.iter_mut().zip(q) {
                *y = dl * f32::from(q) - ml;
            }
        }
    }
}

/// Q3_K to f32. Block (110 bytes): `hmask[32]` (bit `p` of byte `j`: high bit of element
/// `p·32 + j`, set meaning no offset), `qs[64]` (2-bit, as Q2_K), `scales[12]`, `d:f16`.
pub fn dequantize_q3_k(src: &[u8], dst: &mut [f32]) {
    let mut q = [0i8; QK_K];
    for (b, y) in src.chunks_exact(110).zip(dst.chunks_exact_mut(QK_K)) {
        let d = read_f16(b, 108);
        let sc = scales_q3_k(&b[96..108]);
        unpack_q3_k(b, &mut q);
        for (s, (y, q)) in y.chunks_exact_mut(16).zip(q.chunks_exact(16)).enumerate() {
            let dl = d * f32::from(sc[s]);
            for (y, &q) in y.iter_mut().zip(q) {
                *y = dl * f32::from(q);
            }
        }
    }
}

/// Q4_K to f32. Block (144 bytes): `d:f16`, `dmin:f16`, `scales[12]` (8 six-bit scales and mins),
/// `qs[128]` (element `c·64 + h·32 + j` in nibble `h` of byte `c·32 + j`).
pub fn dequantize_q4_k(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(144).zip(dst.chunks_exact_mut(QK_K)) {
        let (d, dmin) = (read_f16(b, 0), read_f16(b, 2));
        let (sc, mn) = scale_min_k4(&b[4..16]);
        for (s, y) in y.chunks_exact_mut(32).enumerate() {
            let ds = d * f32::from(sc[s]);
            let dm = dmin * f32::from(mn[s]);
            let qs = &b[16 + (s / 2) * 32..][..32];
            for (j, y) in y.iter_mut().enumerate() {
                let q = (qs[j] >> (4 * (s % 2))) & 0x0f;
                *y = ds * f32::from(q) - dm;
            }
        }
    }
}

/// Q5_K to f32. Block (176 bytes): `d:f16`, `dmin:f16`, `scales[12]`, `qh[32]` (bit `p` of byte
/// `j`: fifth bit of element `p·32 + j`), `qs[128]` (as Q4_K).
pub fn dequantize_q5_k(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(176).zip(dst.chunks_exact_mut(QK_K)) {
        let (d, dmin) = (read_f16(b, 0), read_f16(b, 2));
        let (sc, mn) = scale_min_k4(&b[4..16]);
        for (s, y) in y.chunks_exact_mut(32).enumerate() {
            let ds = d * f32::from(sc[s]);
            let dm = dmin * f32::from(mn[s]);
            let qs = &b[48 + (s / 2) * 32..][..32];
            for (j, y) in y.iter_mut().enumerate() {
                let q = ((qs[j] >> (4 * (s % 2))) & 0x0f) | (((b[16 + j] >> s) & 1) << 4);
                *y = ds * f32::from(q) - dm;
            }
        }
    }
}

/// The signed 6-bit values (-32..32) of a Q6_K block: element `c·128 + h·64 + j` has its low
/// nibble in nibble `h` of `ql[c·64 + j]`, and element `c·128 + p·32 + j` its top 2 bits in bits
/// `2p` of `qh[c·32 + j]`.
#[inline]
pub fn unpack_q6_k(b: &[u8], out: &mut [i8; QK_K]) {
    for (c, out) in out.chunks_exact_mut(128).enumerate() {
        let ql = &b[64 * c..][..64];
        let qh = &b[128 + 32 * c..][..32];
        for j in 0..32 {
            let (l0, l1, h) = (ql[j], ql[32 + j], qh[j]);
            out[j] = ((l0 & 0x0f) | ((h & 3) << 4)) as i8 - 32;
            out[32 + j] = ((l1 & 0x0f) | (((h >> 2) & 3) << 4)) as i8 - 32;
            out[64 + j] = ((l0 >> 4) | (((h >> 4) & 3) << 4)) as i8 - 32;
            out[96 + j] = ((l1 >> 4) | (((h >> 6) & 3) << 4)) as i8 - 32;
        }
    }
}

/// Q6_K to f32. Block (210 bytes): `ql[128]`, `qh[64]` (see [`unpack_q6_k`]), `scales:i8[16]`,
/// `d:f16`.
pub fn dequantize_q6_k(src: &[u8], dst: &mut [f32]) {
    let mut q = [0i8; QK_K];
    for (b, y) in src.chunks_exact(210).zip(dst.chunks_exact_mut(QK_K)) {
        let d = read_f16(b, 208);
        unpack_q6_k(b, &mut q);
        for (s, (y, q)) in y.chunks_exact_mut(16).zip(q.chunks_exact(16)).enumerate() {
            let ds = d * f32::from(b[192 + s] as i8);
            for (y, &q) in y.iter_mut().zip(q) {
                *y = ds * f32::from(q);
            }
        }
    }
}

/// Q8_K to f32 (`d · q`). Block (292 bytes): `d:f32`, `qs:i8[256]`, `bsums:i16[16]`.
pub fn dequantize_q8_k(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(292).zip(dst.chunks_exact_mut(QK_K)) {
        let d = read_f32(b, 0);
        for (y, &q) in y.iter_mut().zip(&b[4..260]) {
            *y = d * f32::from(q as i8);
        }
    }
}

/// f32 to Q8_K as ggml's `quantize_row_q8_K_ref`: `iscale = -127 / max` (max = the element of
/// largest magnitude), `q = min(127, nearest_int(iscale · x))`, `d = 1 / iscale`, and the sums of
/// each 16 quants.
pub fn quantize_q8_k(src: &[f32], dst: &mut [u8]) {
    for (x, b) in src.chunks_exact(QK_K).zip(dst.chunks_exact_mut(292)) {
        let (mut max, mut amax) = (0f32, 0f32);
        for &v in x {
            if v.abs() > amax {
                amax = v.abs();
                max = v;
            }
        }
        if amax == 0.0 {
            b.fill(0);
            continue;
        }
        let iscale = -127.0 / max;
        for (q, &v) in b[4..260].iter_mut().zip(x) {
            *q = nearest_int(iscale * v).min(127) as i8 as u8;
        }
        for g in 0..16 {
            let s: i32 = b[4 + 16 * g..][..16]
                .iter()
                .map(|&q| i32::from(q as i8))
                .sum();
            b[260 + 2 * g..][..2].copy_from_slice(&(s as i16).to_le_bytes());
        }
        b[0..4].copy_from_slice(&(1.0 / iscale).to_le_bytes());
    }
}
