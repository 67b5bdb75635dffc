//! Random tensor payloads for synthetic models: realistic magnitudes (|w| ≲ 0.1), finite, and
//! deterministic for a seed and tensor name.
//!
//! Quantized types get random payload bytes with their scale fields fixed so that the dequantized
//! values stay in range (e.g. Q4_K: d = 1e-4, dmin = 7e-4, as in the reference file the llama.cpp
//! figures of `shared/REFERENCE.md` were measured on); float types get uniform values.

use std::io::{self, Write};

use bloomery_plugin_api::model::WeightClass;
use bloomery_plugin_api::DType;
use half::{bf16, f16};

/// A small, fast PRNG (wyrand).
pub struct Rng(u64);

impl Rng {
    /// Seeded from a seed and a tensor name, so every tensor is reproducible on its own.
    pub fn for_tensor(seed: u64, name: &str) -> Rng {
        let mut h = seed ^ 0x9e37_79b9_7f4a_7c15;
        for b in name.bytes() {
            h = (h ^ u64::from(b)).wrapping_mul(0x1000_0000_01b3);
        }
        Rng(h)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0xa076_1d64_78bd_642f);
        let t = u128::from(self.0) * u128::from(self.0 ^ 0xe703_7ed1_a0b4_28db);
        ((t >> 64) ^ t) as u64
    }

    /// Uniform in [-1, 1).
    pub fn unit(&mut self) -> f32 {
        ((self.next_u64() >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }

    /// Fills `buf` with random bytes.
    pub fn fill(&mut self, buf: &mut [u8]) {
        let mut chunks = buf.chunks_exact_mut(8);
        for c in &mut chunks {
            c.copy_from_slice(&self.next_u64().to_le_bytes());
        }
        let rest = chunks.into_remainder();
        let last = self.next_u64().to_le_bytes();
        rest.copy_from_slice(&last[..rest.len()]);
    }
}

/// Types `synth` can write, with how their scale fields are set (and I32 for id tables only,
/// [`write_ids`]).
pub const SYNTH_TYPES: [DType; 13] = [
    DType::F32,
    DType::F16,
    DType::BF16,
    DType::Q8_0,
    DType::Q4_0,
    DType::Q5_0,
    DType::Q2_K,
    DType::Q3_K,
    DType::Q4_K,
    DType::Q5_K,
    DType::Q6_K,
    DType::IQ4_NL,
    DType::IQ4_XS,
];

/// Scale fields of one block: (byte offset, f16 value).
fn scale_fields(t: DType) -> &'static [(usize, f32)] {
    match t {
        DType::Q8_0 => &[(0, 3e-4)],
        DType::Q4_0 => &[(0, 0.0125)],
        DType::Q5_0 => &[(0, 0.006)],
        DType::Q2_K => &[(80, 2e-3), (82, 2e-3)],
        DType::Q3_K => &[(108, 7e-4)],
        DType::Q4_K => &[(0, 1e-4), (2, 7e-4)],
        DType::Q5_K => &[(0, 5e-5), (2, 7e-4)],
        DType::Q6_K => &[(208, 2e-5)],
        DType::IQ4_NL => &[(0, 7e-4)],
        DType::IQ4_XS => &[(0, 2.5e-5)],
        _ => &[],
    }
}

/// The value range of float weights as (centre, half-width): the preset's `[lo, hi]` when it
/// gives one, else the class default.
pub fn float_range(class: WeightClass, range: [f32; 2]) -> (f32, f32) {
    if range[0] != range[1] {
        return ((range[0] + range[1]) / 2.0, (range[1] - range[0]) / 2.0);
    }
    match class {
        WeightClass::Norm => (1.0, 0.1),
        _ => (0.0, 0.05),
    }
}

/// Writes `bytes` bytes of a tensor of `dtype` into `out`; float values lie in `range`
/// ([`float_range`]).
pub fn write_tensor(
    out: &mut dyn Write,
    rng: &mut Rng,
    dtype: DType,
    range: (f32, f32),
    bytes: u64,
) -> io::Result<()> {
    const CHUNK: usize = 1 << 20;
    let layout = dtype
        .layout()
        .ok_or_else(|| io::Error::other(format!("synth cannot write {dtype}")))?;
    let block = layout.bytes as usize;
    let per_chunk = (CHUNK / block).max(1) * block;
    let mut buf = vec![0u8; per_chunk];
    let mut left = bytes as usize;
    let (centre, width) = range;
    while left > 0 {
        let n = left.min(per_chunk);
        let b = &mut buf[..n];
        match dtype {
            DType::F32 => b
                .chunks_exact_mut(4)
                .for_each(|c| c.copy_from_slice(&(centre + width * rng.unit()).to_le_bytes())),
            DType::F16 => b.chunks_exact_mut(2).for_each(|c| {
                c.copy_from_slice(&f16::from_f32(centre + width * rng.unit()).to_le_bytes())
            }),
            DType::BF16 => b.chunks_exact_mut(2).for_each(|c| {
                c.copy_from_slice(&bf16::from_f32(centre + width * rng.unit()).to_le_bytes())
            }),
            t if scale_fields(t).is_empty() => {
                return Err(io::Error::other(format!("synth cannot write {t}")));
            }
            t => {
                rng.fill(b);
                let fields = scale_fields(t);
                for blk in b.chunks_exact_mut(block) {
                    for &(off, v) in fields {
                        blk[off..off + 2].copy_from_slice(&f16::from_f32(v).to_le_bytes());
                    }
                }
            }
        }
        out.write_all(b)?;
        left -= n;
    }
    Ok(())
}

/// Writes `bytes` bytes of an I32 id table of rows of `row` values into `out`: each row holds
/// distinct ids drawn uniformly from `[lo, hi)`, where `range` is `(centre, half-width)` of
/// `[lo, hi]` ([`float_range`]); a row longer than the ids available is an error.
pub fn write_ids(
    out: &mut dyn Write,
    rng: &mut Rng,
    row: u64,
    range: (f32, f32),
    bytes: u64,
) -> io::Result<()> {
    let (lo, hi) = ((range.0 - range.1) as i64, (range.0 + range.1) as i64);
    let pool: Vec<i32> = (lo..hi).filter_map(|x| i32::try_from(x).ok()).collect();
    if row == 0 || row > pool.len() as u64 || !bytes.is_multiple_of(4 * row) {
        return Err(io::Error::other(format!(
            "an id table of rows of {row} distinct ids from [{lo}, {hi}) in {bytes} bytes"
        )));
    }
    let mut ids = pool;
    for _ in 0..bytes / (4 * row) {
        // A partial Fisher-Yates shuffle: the first `row` entries are a uniform draw without
        // repetition.
        for i in 0..row as usize {
            let j = i + (rng.next_u64() % (ids.len() - i) as u64) as usize;
            ids.swap(i, j);
            out.write_all(&ids[i].to_le_bytes())?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use bloomery_kernels_cpu::quant::dequantize_row;

    #[test]
    fn id_tables_hold_distinct_ids_in_range_per_row() {
        let mut data = Vec::new();
        let mut rng = Rng::for_tensor(1, "ids");
        let range = float_range(WeightClass::Index, [0.0, 16.0]);
        write_ids(&mut data, &mut rng, 6, range, 4 * 6 * 50).unwrap();
        let ids: Vec<i32> = data
            .chunks_exact(4)
            .map(|c| i32::from_le_bytes(c.try_into().unwrap()))
            .collect();
        let mut seen = [false; 16];
        for row in ids.chunks_exact(6) {
            let mut r = row.to_vec();
            r.sort_unstable();
            r.dedup();
            assert_eq!(r.len(), 6, "{row:?}");
            assert!(row.iter().all(|&x| (0..16).contains(&x)), "{row:?}");
            row.iter().for_each(|&x| seen[x as usize] = true);
        }
        assert!(
            seen.iter().all(|&s| s),
            "every id drawn somewhere: {seen:?}"
        );
        let mut rng = Rng::for_tensor(1, "ids");
        assert!(write_ids(&mut Vec::new(), &mut rng, 17, range, 4 * 17).is_err());
    }

    #[test]
    fn quantized_payloads_dequantize_to_small_finite_values() {
        for t in SYNTH_TYPES {
            let l = t.layout().unwrap();
            let n = l.block as usize * 64;
            let bytes = t.row_bytes(n as u64).unwrap();
            let mut data = Vec::new();
            let mut rng = Rng::for_tensor(1, "w");
            write_tensor(
                &mut data,
                &mut rng,
                t,
                float_range(WeightClass::Experts, [0.0; 2]),
                bytes,
            )
            .unwrap();
            let mut f = vec![0f32; n];
            dequantize_row(t, &data, &mut f).unwrap();
            let max = f.iter().fold(0f32, |m, v| m.max(v.abs()));
            assert!(f.iter().all(|v| v.is_finite()), "{t}");
            assert!(max <= 0.11 && max > 0.01, "{t}: max |w| = {max}");
        }
    }
}
