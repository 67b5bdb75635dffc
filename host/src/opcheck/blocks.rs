//! Random blocks of the quantized weight types for the op checks: every quant and scale bit
//! random, except the float scales, which are set so that the block's values stay within about
//! ±`a` and are finite (a random f16 can be NaN or huge).

use bloomery_plugin_api::DType;
use half::f16;
use rand::rngs::StdRng;
use rand::Rng;

/// A float field of a block: its byte offset and the range its value is drawn from, as
/// multiples of the fill's magnitude `a`.
#[derive(Clone, Copy)]
enum Field {
    /// An f16 at this offset, uniform in `[lo·a, hi·a)`.
    F16(usize, f32, f32),
    /// An E8M0 exponent at this offset (MXFP4), the block's values within about ±`a`.
    E8m0(usize),
}

/// Block bytes and float fields of the types filled here, from the layouts in
/// kernels/cpu/src/quant/ (largest |q · scale| in the comment).
fn layout(t: DType) -> Option<(usize, &'static [Field])> {
    use Field::{E8m0, F16};
    // 1/X for the magnitudes below: d·X bounds |value|.
    const Q6K: f32 = 1.0 / (128.0 * 32.0); // i8 scale · (q - 32)
    const Q5K: f32 = 1.0 / (63.0 * 31.0); // 6-bit scale · 5-bit q
    const Q3K: f32 = 1.0 / (32.0 * 4.0); // signed 6-bit scale · (q - 4)
    const IQ4XS: f32 = 1.0 / (32.0 * 127.0); // signed 6-bit scale · table (≤ 127)
    const IQ3XXS: f32 = 1.0 / (15.5 * 0.5 * 62.0); // (0.5 + 4-bit scale) / 2 · grid (≤ 62)
    Some(match t {
        DType::Q6_K => (210, &[F16(208, Q6K / 2.0, Q6K)]),
        DType::Q5_K => (176, &[F16(0, Q5K / 2.0, Q5K), F16(2, 0.0, 0.5 / 63.0)]),
        DType::Q3_K => (110, &[F16(108, Q3K / 2.0, Q3K)]),
        DType::Q5_0 => (22, &[F16(0, -1.0 / 16.0, 1.0 / 16.0)]),
        DType::Q4_0 => (18, &[F16(0, -1.0 / 8.0, 1.0 / 8.0)]),
        DType::Q5_1 => (24, &[F16(0, 0.5 / 31.0, 1.0 / 31.0), F16(2, -1.0, 0.0)]),
        DType::Q4_1 => (20, &[F16(0, 0.5 / 15.0, 1.0 / 15.0), F16(2, -1.0, 0.0)]),
        DType::IQ4_XS => (136, &[F16(0, IQ4XS / 2.0, IQ4XS)]),
        DType::IQ3_XXS => (98, &[F16(0, IQ3XXS / 2.0, IQ3XXS)]),
        DType::IQ4_NL => (18, &[F16(0, -1.0 / 127.0, 1.0 / 127.0)]),
        DType::MXFP4 => (17, &[E8m0(0)]),
        _ => return None,
    })
}

/// Whether [`fill`] knows `t`.
pub fn covers(t: DType) -> bool {
    layout(t).is_some()
}

/// Fills `out` with random blocks of `t` whose values stay within about ±`a` (nothing when `t`
/// is not [`covered`](covers)).
pub fn fill(t: DType, a: f32, rng: &mut StdRng, out: &mut [u8]) {
    let Some((bytes, fields)) = layout(t) else {
        return;
    };
    for b in out.chunks_exact_mut(bytes) {
        rng.fill(&mut b[..]);
        for f in fields {
            match *f {
                Field::F16(at, lo, hi) => {
                    let v = f16::from_f32(a * rng.gen_range(lo..hi));
                    b[at..at + 2].copy_from_slice(&v.to_le_bytes());
                }
                Field::E8m0(at) => {
                    // The scale is 2^(e - 128) and the largest E2M1 value 12 (doubled 6).
                    let top = (128.0 + (a / 12.0).log2()).floor() as i32;
                    b[at] = rng.gen_range(top - 3..=top).clamp(2, 254) as u8;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn filled_blocks_dequantize_to_finite_values_within_the_magnitude() {
        let mut rng = StdRng::seed_from_u64(3);
        for t in [
            DType::Q6_K,
            DType::Q5_K,
            DType::Q3_K,
            DType::Q5_0,
            DType::Q4_0,
            DType::Q5_1,
            DType::IQ4_XS,
            DType::IQ4_NL,
            DType::MXFP4,
            DType::IQ3_XXS,
        ] {
            let n = 1024;
            let mut b = vec![0u8; t.row_bytes(n).unwrap() as usize];
            assert!(covers(t), "{t}");
            fill(t, 0.1, &mut rng, &mut b);
            let mut y = vec![0f32; n as usize];
            bloomery_kernels_cpu::quant::dequantize_row(t, &b, &mut y).unwrap();
            let max = y.iter().fold(0f32, |m, v| m.max(v.abs()));
            assert!(y.iter().all(|v| v.is_finite()), "{t}");
            assert!(max <= 0.1 * 1.01 && max > 0.01, "{t}: max |w| {max}");
        }
    }
}
