//! The Walsh-Hadamard rotation llama.cpp b11434 applies around a quantized K/V cache
//! (`llama-kv-cache.cpp`, `attn_rot_k`/`attn_rot_v`): before a quantized K cache, Q and K are
//! rotated in chunks of `kv_rotation_k` values (plugin-api's `op` module); before a quantized V
//! cache, V is rotated in chunks of `kv_rotation_v` values, and so is the attention output after
//! it (the transform is its own inverse), so attention is unchanged in exact arithmetic while the
//! cache quantizes values of evener magnitude. [`walsh_hadamard`] computes it as ggml's CPU fast
//! transform does.

use super::OpError;

/// Rotates each `n`-value chunk of `x` in place by the orthonormal Walsh-Hadamard transform
/// (Sylvester order, so rotating twice gives `x` back), as ggml's CPU op computes it: every
/// value times `1/√n` first, then butterflies `(u + v, u − v)` of widths 1, 2, 4 … n/2, in f32.
/// `n` is a power of two that divides `x.len()`. No allocation.
pub fn walsh_hadamard(x: &mut [f32], n: usize) -> Result<(), OpError> {
    if !n.is_power_of_two() || !x.len().is_multiple_of(n) {
        return Err(OpError::Parameter {
            op: "walsh_hadamard",
            what: format!(
                "chunks of {n} values over {} values (a power of two dividing them)",
                x.len()
            ),
        });
    }
    let scale = 1.0 / (n as f32).sqrt();
    for chunk in x.chunks_exact_mut(n) {
        chunk.iter_mut().for_each(|v| *v *= scale);
        let mut len = 1;
        while len < n {
            for pair in chunk.chunks_exact_mut(2 * len) {
                let (lo, hi) = pair.split_at_mut(len);
                for (u, v) in lo.iter_mut().zip(hi.iter_mut()) {
                    (*u, *v) = (*u + *v, *u - *v);
                }
            }
            len *= 2;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunk_sizes_follow_llama_cpp() {
        use bloomery_plugin_api::op::{kv_rotation_k, kv_rotation_v};
        assert_eq!(
            [32, 64, 96, 128, 192, 256, 512].map(kv_rotation_k),
            [0, 64, 0, 128, 64, 256, 512]
        );
        assert_eq!([32, 64, 128, 256].map(kv_rotation_v), [0, 64, 64, 64]);
    }

    #[test]
    fn the_rotation_is_orthonormal_and_its_own_inverse() {
        let x: Vec<f32> = (0..256)
            .map(|i| ((i * 73 % 101) as f32 - 50.0) / 17.0)
            .collect();
        for n in [64, 128, 256] {
            let mut y = x.clone();
            walsh_hadamard(&mut y, n).unwrap();
            let norm = |v: &[f32]| v.iter().map(|a| f64::from(*a).powi(2)).sum::<f64>();
            assert!((norm(&y) / norm(&x) - 1.0).abs() < 1e-6, "{n}");
            walsh_hadamard(&mut y, n).unwrap();
            for (a, b) in x.iter().zip(&y) {
                assert!((a - b).abs() < 1e-5, "{n}: {a} {b}");
            }
        }
        // The first row of H is all 1/√n: the first value is the chunk's sum over √n.
        let mut ones = vec![1.0f32; 64];
        walsh_hadamard(&mut ones, 64).unwrap();
        assert_eq!(ones[0], 8.0);
        assert!(ones[1..].iter().all(|&v| v == 0.0));
        assert!(walsh_hadamard(&mut ones, 48).is_err());
        assert!(walsh_hadamard(&mut ones[..32], 64).is_err());
    }
}
