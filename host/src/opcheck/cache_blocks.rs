//! Block-by-block comparison of a quantized K/V cache (the cache store's check): every block of
//! the device's cache must equal the reference's bytes, except where llama.cpp's two stores round
//! differently. The reference (cpu-scalar) quantizes as llama.cpp's CPU store and a CUDA bundle as
//! llama.cpp's CUDA store: Q8_0 ties to even through 127 / max on the CPU and half away from zero
//! through 1 / d on the card, and the card fuses `x · id + offset` of the 4- and 5-bit types into
//! one rounding, so a value near a rounding boundary may land one step apart; IQ4_NL's refined
//! scale sums its terms in another order, so it may differ in its last f16 bit. A block passes
//! when its scale (and minimum) fields are equal (IQ4_NL's scale within one f16 unit, or zero on
//! both sides, when its indices do not matter) and at most one of its 32 values is one step
//! apart. Anything else, a low byte of a scale included, fails.

use bloomery_plugin_api::DType;

/// The outcome of comparing two caches of one type.
#[derive(Debug, PartialEq)]
pub struct BlockDiff {
    /// Blocks compared.
    pub blocks: usize,
    /// Blocks outside the allowance.
    pub bad: usize,
    /// Index of the first element of the first bad block.
    pub first_bad: Option<usize>,
}

/// A block's fields: its f16 scale and minimum bits (0 where the type has none) and its 32
/// values' integers (codes, or IQ4_NL table indices).
struct Fields {
    scales: [u16; 2],
    q: [i32; 32],
}

fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

/// Value `j`'s low four bits in a block whose nibbles start at `qs` (values 0..15 in the low
/// nibbles, 16..31 in the high ones).
fn nibble(b: &[u8], qs: usize, j: usize) -> i32 {
    i32::from((b[qs + j % 16] >> (4 * (j / 16))) & 0xf)
}

/// The fields of one block of `t` (one of the quantized cache types; `b` its bytes).
fn fields(t: DType, b: &[u8]) -> Fields {
    let mut q = [0i32; 32];
    let scales = match t {
        DType::Q8_0 => {
            for (j, v) in q.iter_mut().enumerate() {
                *v = i32::from(b[2 + j] as i8);
            }
            [u16_at(b, 0), 0]
        }
        DType::Q4_1 | DType::Q5_1 => {
            let five = t == DType::Q5_1;
            let qh = if five {
                u32::from_le_bytes([b[4], b[5], b[6], b[7]])
            } else {
                0
            };
            for (j, v) in q.iter_mut().enumerate() {
                *v = nibble(b, if five { 8 } else { 4 }, j) | (((qh >> j) & 1) as i32) << 4;
            }
            [u16_at(b, 0), u16_at(b, 2)]
        }
        DType::Q5_0 => {
            let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
            for (j, v) in q.iter_mut().enumerate() {
                *v = nibble(b, 6, j) | (((qh >> j) & 1) as i32) << 4;
            }
            [u16_at(b, 0), 0]
        }
        // Q4_0 and IQ4_NL: a scale and 16 bytes of nibbles.
        _ => {
            for (j, v) in q.iter_mut().enumerate() {
                *v = nibble(b, 2, j);
            }
            [u16_at(b, 0), 0]
        }
    };
    Fields { scales, q }
}

/// Whether the device's block `a` is within the allowance of the reference's block `r`.
fn block_ok(t: DType, a: &[u8], r: &[u8]) -> bool {
    if a == r {
        return true;
    }
    let (fa, fr) = (fields(t, a), fields(t, r));
    if t == DType::IQ4_NL {
        let zero = |s: u16| s & 0x7fff == 0;
        if zero(fa.scales[0]) && zero(fr.scales[0]) {
            return true;
        }
        if (i32::from(fa.scales[0]) - i32::from(fr.scales[0])).abs() > 1 {
            return false;
        }
    } else if fa.scales != fr.scales {
        return false;
    }
    let apart: Vec<i32> =
        fa.q.iter()
            .zip(&fr.q)
            .map(|(x, y)| (x - y).abs())
            .filter(|&d| d != 0)
            .collect();
    apart.len() <= 1 && apart.iter().all(|&d| d == 1)
}

/// Compares the device's cache bytes `out` with the reference's `reference`, both of type `t`.
pub fn compare(t: DType, out: &[u8], reference: &[u8]) -> Result<BlockDiff, String> {
    let bytes = match t.layout() {
        Some(l) if l.block == 32 && out.len() == reference.len() => l.bytes as usize,
        _ => {
            return Err(format!(
                "{t}: {} and {} bytes are not two caches of 32-value blocks",
                out.len(),
                reference.len()
            ))
        }
    };
    let mut diff = BlockDiff {
        blocks: out.len() / bytes,
        bad: 0,
        first_bad: None,
    };
    for (i, (a, r)) in out
        .chunks_exact(bytes)
        .zip(reference.chunks_exact(bytes))
        .enumerate()
    {
        if !block_ok(t, a, r) {
            diff.bad += 1;
            diff.first_bad.get_or_insert(i * 32);
        }
    }
    Ok(diff)
}

#[cfg(test)]
mod tests {
    use super::*;
    use bloomery_kernels_cpu::quant::quantize_kv_row;

    /// A row of 64 values quantized by the CPU store.
    fn row(t: DType) -> Vec<u8> {
        let x: Vec<f32> = (0..64)
            .map(|i| ((i * 37 % 64) as f32 - 31.5) / 40.0)
            .collect();
        let mut b = vec![0u8; t.row_bytes(64).unwrap() as usize];
        quantize_kv_row(t, &x, &mut b).unwrap();
        b
    }

    #[test]
    fn equal_caches_pass_and_a_scale_low_byte_fails() {
        for t in [
            DType::Q8_0,
            DType::Q4_0,
            DType::Q4_1,
            DType::Q5_0,
            DType::Q5_1,
            DType::IQ4_NL,
        ] {
            let r = row(t);
            let ok = compare(t, &r, &r).unwrap();
            assert_eq!((ok.blocks, ok.bad), (2, 0), "{t}");
            // The card's defect: the scale's low byte stored as 0.
            let mut a = r.clone();
            let bytes = t.layout().unwrap().bytes as usize;
            a[bytes] = 0;
            let bad = compare(t, &a, &r).unwrap();
            assert_eq!((bad.bad, bad.first_bad), (1, Some(32)), "{t}");
        }
    }

    #[test]
    fn one_value_one_step_apart_passes_and_two_fail() {
        let r = row(DType::Q8_0);
        let mut a = r.clone();
        a[2] = a[2].wrapping_add(1);
        assert_eq!(compare(DType::Q8_0, &a, &r).unwrap().bad, 0);
        a[3] = a[3].wrapping_add(1);
        assert_eq!(compare(DType::Q8_0, &a, &r).unwrap().bad, 1);
        let mut b = r.clone();
        b[2] = b[2].wrapping_add(2);
        assert_eq!(compare(DType::Q8_0, &b, &r).unwrap().bad, 1);
    }

    #[test]
    fn an_iq4_nl_scale_one_unit_apart_passes() {
        let r = row(DType::IQ4_NL);
        let mut a = r.clone();
        let s = u16_at(&r, 0) + 1;
        a[..2].copy_from_slice(&s.to_le_bytes());
        assert_eq!(compare(DType::IQ4_NL, &a, &r).unwrap().bad, 0);
        let s = u16_at(&r, 0) + 2;
        a[..2].copy_from_slice(&s.to_le_bytes());
        assert_eq!(compare(DType::IQ4_NL, &a, &r).unwrap().bad, 1);
    }
}
