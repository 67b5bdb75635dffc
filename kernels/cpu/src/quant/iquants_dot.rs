//! Dot products of the i-quants with their activation formats: IQ4_NL with Q8_0, the others with
//! Q8_K through [`IntBlock`].
//!
//! The i-quant scales are folded into integers: `d·(0.5 + s)·0.25 = (d/8)·(2s + 1)` for IQ2,
//! `(d/4)·(2s + 1)` for IQ3_XXS, and IQ1's `g ± 1/8` becomes `(8g ± 1)/8`, so every product inside
//! a sub-block is an integer one.

use super::bits::{read_f16, read_u16, read_u32};
use super::iq_tables::{
    IQ1S_GRID, IQ2S_GRID, IQ2XS_GRID, IQ2XXS_GRID, IQ3S_GRID, IQ3XXS_GRID, KSIGNS, KVALUES_IQ4NL,
};
use super::iquants::{grid_byte, iq1_m_scale, iq4_xs_scale};
use super::kquants_dot::{dot_row, IntBlock};

/// Writes 8 signed grid values (`row` magnitudes, `signs` bits) to `q`.
#[inline]
fn put_signed(q: &mut [i8], row: u64, signs: u8) {
    for (k, q) in q.iter_mut().enumerate() {
        let v = grid_byte(row, k) as i8;
        *q = if (signs >> k) & 1 == 0 { v } else { -v };
    }
}

/// Decodes an IQ2_XXS block (see [`super::iquants::dequantize_iq2_xxs`]).
pub fn decode_iq2_xxs(b: &[u8], o: &mut IntBlock) {
    for ib in 0..8 {
        let aux1 = read_u32(b, 6 + 8 * ib);
        let s = (2 * (aux1 >> 28) + 1) as i32;
        o.scale[2 * ib] = s;
        o.scale[2 * ib + 1] = s;
        for l in 0..4 {
            let row = IQ2XXS_GRID[usize::from(b[2 + 8 * ib + l])];
            let signs = KSIGNS[((aux1 >> (7 * l)) & 0x7f) as usize];
            put_signed(&mut o.q[32 * ib + 8 * l..][..8], row, signs);
        }
    }
    o.min = [0; 16];
    o.d = read_f16(b, 0) * 0.125;
    o.dmin = 0.0;
}

/// Decodes an IQ2_XS block.
pub fn decode_iq2_xs(b: &[u8], o: &mut IntBlock) {
    for s in 0..16 {
        o.scale[s] = 2 * i32::from((b[66 + s / 2] >> (4 * (s % 2))) & 0x0f) + 1;
    }
    for g in 0..32 {
        let q = read_u16(b, 2 + 2 * g);
        put_signed(
            &mut o.q[8 * g..][..8],
            IQ2XS_GRID[usize::from(q & 511)],
            KSIGNS[usize::from(q >> 9)],
        );
    }
    o.min = [0; 16];
    o.d = read_f16(b, 0) * 0.125;
    o.dmin = 0.0;
}

/// Decodes an IQ2_S block.
pub fn decode_iq2_s(b: &[u8], o: &mut IntBlock) {
    for s in 0..16 {
        o.scale[s] = 2 * i32::from((b[74 + s / 2] >> (4 * (s % 2))) & 0x0f) + 1;
    }
    for g in 0..32 {
        let hi = usize::from((b[66 + g / 4] >> (2 * (g % 4))) & 3);
        let row = IQ2S_GRID[usize::from(b[2 + g]) | (hi << 8)];
        put_signed(&mut o.q[8 * g..][..8], row, b[34 + g]);
    }
    o.min = [0; 16];
    o.d = read_f16(b, 0) * 0.125;
    o.dmin = 0.0;
}

/// Two 4-value IQ3 grid rows as one 8-value row.
#[inline]
fn join_rows(lo: u32, hi: u32) -> u64 {
    u64::from(lo) | (u64::from(hi) << 32)
}

/// Decodes an IQ3_XXS block.
pub fn decode_iq3_xxs(b: &[u8], o: &mut IntBlock) {
    for ib in 0..8 {
        let aux = read_u32(b, 66 + 4 * ib);
        let s = (2 * (aux >> 28) + 1) as i32;
        o.scale[2 * ib] = s;
        o.scale[2 * ib + 1] = s;
        for l in 0..4 {
            let i = 2 + 8 * ib + 2 * l;
            let row = join_rows(
                IQ3XXS_GRID[usize::from(b[i])],
                IQ3XXS_GRID[usize::from(b[i + 1])],
            );
            let signs = KSIGNS[((aux >> (7 * l)) & 0x7f) as usize];
            put_signed(&mut o.q[32 * ib + 8 * l..][..8], row, signs);
        }
    }
    o.min = [0; 16];
    o.d = read_f16(b, 0) * 0.25;
    o.dmin = 0.0;
}

/// Decodes an IQ3_S block.
pub fn decode_iq3_s(b: &[u8], o: &mut IntBlock) {
    for ib in 0..8 {
        let s = 1 + 2 * i32::from((b[106 + ib / 2] >> (4 * (ib % 2))) & 0x0f);
        o.scale[2 * ib] = s;
        o.scale[2 * ib + 1] = s;
    }
    let index =
        |g: usize| usize::from(b[2 + g]) | (usize::from((b[66 + g / 8] >> (g % 8)) & 1) << 8);
    for p in 0..32 {
        let row = join_rows(IQ3S_GRID[index(2 * p)], IQ3S_GRID[index(2 * p + 1)]);
        put_signed(&mut o.q[8 * p..][..8], row, b[74 + p]);
    }
    o.min = [0; 16];
    o.d = read_f16(b, 0);
    o.dmin = 0.0;
}

/// Writes `8·g ± 1` for the 8 IQ1 grid values of `row` (`-1` when `negative`).
#[inline]
fn put_iq1(q: &mut [i8], row: u64, negative: bool) {
    let delta = if negative { -1 } else { 1 };
    for (k, q) in q.iter_mut().enumerate() {
        *q = 8 * (grid_byte(row, k) as i8) + delta;
    }
}

/// Decodes an IQ1_S block.
pub fn decode_iq1_s(b: &[u8], o: &mut IntBlock) {
    for ib in 0..8 {
        let qh = read_u16(b, 34 + 2 * ib);
        let s = i32::from(2 * ((qh >> 12) & 7) + 1);
        o.scale[2 * ib] = s;
        o.scale[2 * ib + 1] = s;
        for l in 0..4 {
            let idx = usize::from(b[2 + 4 * ib + l]) | (usize::from((qh >> (3 * l)) & 7) << 8);
            put_iq1(
                &mut o.q[32 * ib + 8 * l..][..8],
                IQ1S_GRID[idx],
                qh & 0x8000 != 0,
            );
        }
    }
    o.min = [0; 16];
    o.d = read_f16(b, 0) * 0.125;
    o.dmin = 0.0;
}

/// Decodes an IQ1_M block.
pub fn decode_iq1_m(b: &[u8], o: &mut IntBlock) {
    for s in 0..16 {
        o.scale[s] = i32::from(2 * ((read_u16(b, 48 + 2 * (s / 4)) >> (3 * (s % 4))) & 7) + 1);
    }
    for g in 0..32 {
        let qh = b[32 + g / 2] >> (4 * (g % 2));
        let row = IQ1S_GRID[usize::from(b[g]) | (usize::from(qh & 7) << 8)];
        put_iq1(&mut o.q[8 * g..][..8], row, qh & 0x08 != 0);
    }
    o.min = [0; 16];
    o.d = iq1_m_scale(b) * 0.125;
    o.dmin = 0.0;
}

/// Decodes an IQ4_XS block.
pub fn decode_iq4_xs(b: &[u8], o: &mut IntBlock) {
    for ib in 0..8 {
        let s = i32::from(iq4_xs_scale(b, ib));
        o.scale[2 * ib] = s;
        o.scale[2 * ib + 1] = s;
        let qs = &b[8 + 16 * ib..][..16];
        for j in 0..16 {
            o.q[32 * ib + j] = KVALUES_IQ4NL[usize::from(qs[j] & 0x0f)];
            o.q[32 * ib + j + 16] = KVALUES_IQ4NL[usize::from(qs[j] >> 4)];
        }
    }
    o.min = [0; 16];
    o.d = read_f16(b, 0);
    o.dmin = 0.0;
}

/// IQ1_S weights · Q8_K activations. Lengths checked by the caller.
pub fn vec_dot_iq1_s_q8_k(w: &[u8], act: &[u8]) -> f32 {
    dot_row(w, act, 50, decode_iq1_s)
}

/// IQ1_M weights · Q8_K activations.
pub fn vec_dot_iq1_m_q8_k(w: &[u8], act: &[u8]) -> f32 {
    dot_row(w, act, 56, decode_iq1_m)
}

/// IQ2_XXS weights · Q8_K activations.
pub fn vec_dot_iq2_xxs_q8_k(w: &[u8], act: &[u8]) -> f32 {
    dot_row(w, act, 66, decode_iq2_xxs)
}

/// IQ2_XS weights · Q8_K activations.
pub fn vec_dot_iq2_xs_q8_k(w: &[u8], act: &[u8]) -> f32 {
    dot_row(w, act, 74, decode_iq2_xs)
}

/// IQ2_S weights · Q8_K activations.
pub fn vec_dot_iq2_s_q8_k(w: &[u8], act: &[u8]) -> f32 {
    dot_row(w, act, 82, decode_iq2_s)
}

/// IQ3_XXS weights · Q8_K activations.
pub fn vec_dot_iq3_xxs_q8_k(w: &[u8], act: &[u8]) -> f32 {
    dot_row(w, act, 98, decode_iq3_xxs)
}

/// IQ3_S weights · Q8_K activations.
pub fn vec_dot_iq3_s_q8_k(w: &[u8], act: &[u8]) -> f32 {
    dot_row(w, act, 110, decode_iq3_s)
}

/// IQ4_XS weights · Q8_K activations.
pub fn vec_dot_iq4_xs_q8_k(w: &[u8], act: &[u8]) -> f32 {
    dot_row(w, act, 136, decode_iq4_xs)
}

/// IQ4_NL weights · Q8_0 activations.
pub fn vec_dot_iq4_nl_q8_0(w: &[u8], act: &[u8]) -> f32 {
    let mut sum = 0f32;
    for (b, a) in w.chunks_exact(18).zip(act.chunks_exact(34)) {
        let mut s = 0i32;
        for j in 0..16 {
            s += i32::from(KVALUES_IQ4NL[usize::from(b[2 + j] & 0x0f)]) * i32::from(a[2 + j] as i8);
            s += i32::from(KVALUES_IQ4NL[usize::from(b[2 + j] >> 4)]) * i32::from(a[18 + j] as i8);
        }
        sum += s as f32 * (read_f16(b, 0) * read_f16(a, 0));
    }
    sum
}
