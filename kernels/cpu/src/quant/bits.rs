//! Scalar conversions shared by the formats: f16 (as numpy does it), little-endian reads, E8M0.

/// Converts IEEE half bits to f32 exactly as numpy does: exact for every finite value, and NaN
/// payloads are kept (shifted into place), not quieted.
#[inline]
pub fn f16_to_f32(h: u16) -> f32 {
    let sign = u32::from(h & 0x8000) << 16;
    let exp = h & 0x7c00;
    let man = u32::from(h & 0x03ff);
    let bits = match exp {
        0 => {
            // Zero or subnormal: man · 2^-24 is exact in f32.
            let v = man as f32 * f32::from_bits(0x3380_0000);
            return if sign != 0 { -v } else { v };
        }
        0x7c00 => sign | 0x7f80_0000 | (man << 13),
        _ => sign | ((u32::from(h & 0x7fff) + 0x1_c000) << 13),
    };
    f32::from_bits(bits)
}

/// Converts f32 to IEEE half bits, rounding to nearest even (as numpy's `astype(float16)`);
/// overflow gives infinity, NaN keeps its top payload bits (at least one set).
#[inline]
pub fn f32_to_f16(x: f32) -> u16 {
    let b = x.to_bits();
    let sign = ((b >> 16) & 0x8000) as u16;
    let exp = (b >> 23) & 0xff;
    let man = b & 0x007f_ffff;
    if exp == 0xff {
        if man == 0 {
            return sign | 0x7c00;
        }
        let m = (man >> 13) as u16;
        return sign | 0x7c00 | if m == 0 { 1 } else { m };
    }
    let e = exp as i32 - 127 + 15;
    if e >= 31 {
        return sign | 0x7c00;
    }
    if e <= 0 {
        if e < -10 {
            return sign;
        }
        // Subnormal half: keep the top bits of the 24-bit significand, round to nearest even.
        let m = man | 0x0080_0000;
        let shift = (14 - e) as u32;
        let half = 1u32 << (shift - 1);
        let rem = m & ((1u32 << shift) - 1);
        let mut h = m >> shift;
        if rem > half || (rem == half && h & 1 == 1) {
            h += 1;
        }
        return sign | h as u16;
    }
    let mut h = ((e as u32) << 10) | (man >> 13);
    let rem = man & 0x1fff;
    if rem > 0x1000 || (rem == 0x1000 && h & 1 == 1) {
        h += 1; // a carry into the exponent is the right result, up to infinity
    }
    sign | h as u16
}

/// Reads the little-endian f16 at `b[i..i + 2]` as f32.
#[inline]
pub fn read_f16(b: &[u8], i: usize) -> f32 {
    f16_to_f32(read_u16(b, i))
}

/// Reads the little-endian u16 at `b[i..i + 2]`.
#[inline]
pub fn read_u16(b: &[u8], i: usize) -> u16 {
    u16::from_le_bytes([b[i], b[i + 1]])
}

/// Reads the little-endian u32 at `b[i..i + 4]`.
#[inline]
pub fn read_u32(b: &[u8], i: usize) -> u32 {
    u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]])
}

/// Reads the little-endian f32 at `b[i..i + 4]`.
#[inline]
pub fn read_f32(b: &[u8], i: usize) -> f32 {
    f32::from_bits(read_u32(b, i))
}

/// Writes `h` little-endian at `b[i..i + 2]`.
#[inline]
pub fn write_u16(b: &mut [u8], i: usize, h: u16) {
    b[i..i + 2].copy_from_slice(&h.to_le_bytes());
}

/// Half of the E8M0 scale `2^(x - 127)` (ggml's `ggml_e8m0_to_fp32_half`): the FP4 formats store
/// doubled E2M1 values, so this half-scale turns them back into values.
#[inline]
pub fn e8m0_to_f32_half(x: u8) -> f32 {
    let bits = if x < 2 {
        0x0020_0000u32 << x
    } else {
        u32::from(x - 1) << 23
    };
    f32::from_bits(bits)
}

/// Rounds half away from zero (C `roundf`; gguf's `np_roundf`).
#[inline]
pub fn round_away(x: f32) -> f32 {
    x.round()
}

/// ggml's `nearest_int`: rounds to nearest, ties to even, through the 1.5·2^23 trick (valid for
/// `|x| <= 2^22`).
#[inline]
pub fn nearest_int(x: f32) -> i32 {
    let v = x + 12_582_912.0;
    (v.to_bits() & 0x007f_ffff) as i32 - 0x0040_0000
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn f16_round_trips_every_finite_half() {
        for h in 0..=u16::MAX {
            let f = f16_to_f32(h);
            if f.is_nan() {
                assert_eq!(f32_to_f16(f), h, "NaN {h:#06x}");
            } else {
                assert_eq!(f32_to_f16(f), h, "{h:#06x} -> {f}");
            }
        }
    }

    #[test]
    fn f16_rounds_to_nearest_even() {
        assert_eq!(f32_to_f16(65520.0), 0x7c00); // halfway to 65536 rounds up to infinity
        assert_eq!(f32_to_f16(65519.0), 0x7bff);
        assert_eq!(f32_to_f16(f32::from_bits(0x3300_0000)), 0); // 2^-25: tie rounds to even 0
        assert_eq!(f32_to_f16(f32::from_bits(0x3300_0001)), 1);
        assert_eq!(f32_to_f16(1.0 + 1.0 / 2048.0), 0x3c00); // tie, even stays
        assert_eq!(f32_to_f16(1.0 + 3.0 / 2048.0), 0x3c02); // tie, odd rounds up
    }

    #[test]
    fn nearest_int_ties_to_even() {
        assert_eq!(nearest_int(2.5), 2);
        assert_eq!(nearest_int(3.5), 4);
        assert_eq!(nearest_int(-2.5), -2);
        assert_eq!(nearest_int(-127.4), -127);
    }
}
