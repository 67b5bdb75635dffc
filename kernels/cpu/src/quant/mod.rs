//! Every GGUF quant format: block layouts, dequantization, quantization, dot products.
//!
//! Dequantization is bit-identical to the `gguf` Python package 0.19.0 (`gguf.quants.dequantize`),
//! and quantization is bit-identical to it where it quantizes (F32, F16, BF16, Q4_0, Q4_1, Q5_0,
//! Q5_1, Q8_0, MXFP4, TQ1_0, TQ2_0); the activation formats Q8_1 and Q8_K follow ggml's reference
//! quantizers. Dot products pair a weight row with an activation row in [`vec_dot_type`] and work
//! on integers inside each block, as ggml does, scaling once per (sub-)block.
//!
//! The top-level functions check lengths and dispatch with a `match`; the per-type functions in the
//! submodules are public for callers that have already checked lengths. Nothing here allocates.

pub mod bits;
pub mod float;
pub mod fp4;
#[rustfmt::skip]
pub mod iq_tables;
pub mod iquants;
pub mod iquants_dot;
pub mod kquants;
pub mod kquants_dot;
pub mod legacy;
pub mod ternary;

use bloomery_plugin_api::DType;

/// Why a quant operation was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QuantError {
    /// The type has no implementation of this operation (or the type id is unknown).
    #[error("{op} is not supported for element type {dtype}")]
    Unsupported {
        /// The element type.
        dtype: DType,
        /// The operation: "dequantize", "quantize" or "vec_dot".
        op: &'static str,
    },
    /// A buffer has the wrong length.
    #[error("{dtype}: {what} has length {found}, expected {expected}")]
    LengthMismatch {
        /// The element type the buffer holds.
        dtype: DType,
        /// Which buffer (e.g. "source bytes").
        what: &'static str,
        /// The length the element count asks for.
        expected: usize,
        /// The length given.
        found: usize,
    },
    /// An element count is not a whole number of blocks.
    #[error("{dtype}: {n} elements is not a whole number of {block}-element blocks")]
    NotWholeBlocks {
        /// The element type.
        dtype: DType,
        /// The element count given.
        n: usize,
        /// Elements per block of the type.
        block: usize,
    },
}

/// Bytes taken by `n` elements of `t`, checking that `n` fills whole blocks.
pub(crate) fn row_bytes(t: DType, n: usize, op: &'static str) -> Result<usize, QuantError> {
    let l = t.layout().ok_or(QuantError::Unsupported { dtype: t, op })?;
    let block = l.block as usize;
    if !n.is_multiple_of(block) {
        return Err(QuantError::NotWholeBlocks { dtype: t, n, block });
    }
    Ok(n / block * l.bytes as usize)
}

fn check_len(
    dtype: DType,
    what: &'static str,
    expected: usize,
    found: usize,
) -> Result<(), QuantError> {
    if expected == found {
        Ok(())
    } else {
        Err(QuantError::LengthMismatch {
            dtype,
            what,
            expected,
            found,
        })
    }
}

/// Dequantizes one row: `dst.len()` elements of `t` from `src`, which must be exactly their bytes.
///
/// Bit-identical to `gguf.quants.dequantize` (gguf 0.19.0) for every type it dequantizes; Q8_1 and
/// Q8_K (activation formats gguf does not dequantize) give `d · q`. Does not allocate.
pub fn dequantize_row(t: DType, src: &[u8], dst: &mut [f32]) -> Result<(), QuantError> {
    const OP: &str = "dequantize";
    let unsupported = QuantError::Unsupported { dtype: t, op: OP };
    let f: fn(&[u8], &mut [f32]) = match t {
        DType::F32 => float::dequantize_f32,
        DType::F16 => float::dequantize_f16,
        DType::BF16 => float::dequantize_bf16,
        DType::Q4_0 => legacy::dequantize_q4_0,
        DType::Q4_1 => legacy::dequantize_q4_1,
        DType::Q5_0 => legacy::dequantize_q5_0,
        DType::Q5_1 => legacy::dequantize_q5_1,
        DType::Q8_0 => legacy::dequantize_q8_0,
        DType::Q8_1 => legacy::dequantize_q8_1,
        DType::Q2_K => kquants::dequantize_q2_k,
        DType::Q3_K => kquants::dequantize_q3_k,
        DType::Q4_K => kquants::dequantize_q4_k,
        DType::Q5_K => kquants::dequantize_q5_k,
        DType::Q6_K => kquants::dequantize_q6_k,
        DType::Q8_K => kquants::dequantize_q8_k,
        DType::IQ1_S => iquants::dequantize_iq1_s,
        DType::IQ1_M => iquants::dequantize_iq1_m,
        DType::IQ2_XXS => iquants::dequantize_iq2_xxs,
        DType::IQ2_XS => iquants::dequantize_iq2_xs,
        DType::IQ2_S => iquants::dequantize_iq2_s,
        DType::IQ3_XXS => iquants::dequantize_iq3_xxs,
        DType::IQ3_S => iquants::dequantize_iq3_s,
        DType::IQ4_NL => iquants::dequantize_iq4_nl,
        DType::IQ4_XS => iquants::dequantize_iq4_xs,
        DType::TQ1_0 => ternary::dequantize_tq1_0,
        DType::TQ2_0 => ternary::dequantize_tq2_0,
        DType::MXFP4 => fp4::dequantize_mxfp4,
        DType::NVFP4 => fp4::dequantize_nvfp4,
        _ => return Err(unsupported),
    };
    let bytes = row_bytes(t, dst.len(), OP)?;
    check_len(t, "source bytes", bytes, src.len())?;
    f(src, dst);
    Ok(())
}

/// Quantizes one row: `src.len()` f32 values into `dst`, which must be exactly their bytes in `t`.
///
/// Supported: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, MXFP4, TQ1_0, TQ2_0 (bit-identical to
/// `gguf.quants.quantize` 0.19.0) and the activation formats Q8_1 and Q8_K (ggml's reference
/// quantizers). Does not allocate.
pub fn quantize_row(t: DType, src: &[f32], dst: &mut [u8]) -> Result<(), QuantError> {
    const OP: &str = "quantize";
    let f: fn(&[f32], &mut [u8]) = match t {
        DType::F32 => float::quantize_f32,
        DType::F16 => float::quantize_f16,
        DType::BF16 => float::quantize_bf16,
        DType::Q4_0 => legacy::quantize_q4_0,
        DType::Q4_1 => legacy::quantize_q4_1,
        DType::Q5_0 => legacy::quantize_q5_0,
        DType::Q5_1 => legacy::quantize_q5_1,
        DType::Q8_0 => legacy::quantize_q8_0,
        DType::Q8_1 => legacy::quantize_q8_1,
        DType::Q8_K => kquants::quantize_q8_k,
        DType::MXFP4 => fp4::quantize_mxfp4,
        DType::TQ1_0 => ternary::quantize_tq1_0,
        DType::TQ2_0 => ternary::quantize_tq2_0,
        _ => return Err(QuantError::Unsupported { dtype: t, op: OP }),
    };
    let bytes = row_bytes(t, src.len(), OP)?;
    check_len(t, "destination bytes", bytes, dst.len())?;
    f(src, dst);
    Ok(())
}

/// Quantizes one row of activations to `t` for [`vec_dot`]: Q8_0 and Q8_1 round as ggml's x86
/// path does (so products agree with llama.cpp's on the same inputs), every other format as
/// [`quantize_row`].
pub fn quantize_act_row(t: DType, src: &[f32], dst: &mut [u8]) -> Result<(), QuantError> {
    let f: fn(&[f32], &mut [u8]) = match t {
        DType::Q8_0 => legacy::quantize_q8_0_act,
        DType::Q8_1 => legacy::quantize_q8_1_act,
        _ => return quantize_row(t, src, dst),
    };
    const OP: &str = "quantize activations";
    let bytes = row_bytes(t, src.len(), OP)?;
    check_len(t, "destination bytes", bytes, dst.len())?;
    f(src, dst);
    Ok(())
}

/// The element types a K/V cache may hold (llama.cpp's `-ctk`/`-ctv` set).
pub const KV_CACHE_TYPES: [DType; 8] = [
    DType::F32,
    DType::F16,
    DType::Q8_0,
    DType::Q4_0,
    DType::Q4_1,
    DType::Q5_0,
    DType::Q5_1,
    DType::IQ4_NL,
];

/// Quantizes one K/V row into a cache of type `t` as llama.cpp's CPU cache store does (its
/// `from_float` of the type): Q8_0 with the rounding of ggml's x86 path (as activations), Q4_0,
/// Q4_1, Q5_0, Q5_1 and IQ4_NL with ggml's reference quantizers. Does not allocate.
pub fn quantize_kv_row(t: DType, src: &[f32], dst: &mut [u8]) -> Result<(), QuantError> {
    let f: fn(&[f32], &mut [u8]) = match t {
        DType::Q8_0 => legacy::quantize_q8_0_act,
        DType::IQ4_NL => iquants::quantize_iq4_nl,
        t if KV_CACHE_TYPES.contains(&t) => return quantize_row(t, src, dst),
        _ => {
            return Err(QuantError::Unsupported {
                dtype: t,
                op: "K/V cache store",
            })
        }
    };
    const OP: &str = "K/V cache store";
    let bytes = row_bytes(t, src.len(), OP)?;
    check_len(t, "destination bytes", bytes, dst.len())?;
    f(src, dst);
    Ok(())
}

/// The activation format paired with weight type `t` in [`vec_dot`] (ggml's `vec_dot_type`), or
/// `None` when `t` has no dot product here.
pub fn vec_dot_type(t: DType) -> Option<DType> {
    Some(match t {
        DType::F32 | DType::F16 | DType::BF16 => DType::F32,
        DType::Q4_0 | DType::Q5_0 | DType::Q8_0 | DType::IQ4_NL | DType::MXFP4 | DType::NVFP4 => {
            DType::Q8_0
        }
        DType::Q4_1 | DType::Q5_1 => DType::Q8_1,
        DType::Q2_K
        | DType::Q3_K
        | DType::Q4_K
        | DType::Q5_K
        | DType::Q6_K
        | DType::IQ1_S
        | DType::IQ1_M
        | DType::IQ2_XXS
        | DType::IQ2_XS
        | DType::IQ2_S
        | DType::IQ3_XXS
        | DType::IQ3_S
        | DType::IQ4_XS
        | DType::TQ1_0
        | DType::TQ2_0 => DType::Q8_K,
        _ => return None,
    })
}

/// The dot product of one weight row (`n` elements of `t`, exactly their bytes) with one
/// activation row (`n` elements of [`vec_dot_type`]`(t)`, exactly their bytes).
///
/// Products are summed as integers inside each block (sub-block for k- and i-quants) and scaled
/// once per block, as ggml does; F32/F16/BF16 weights take f32 activations and sum in f64. Hot
/// path: does not allocate.
pub fn vec_dot(t: DType, n: usize, w: &[u8], act: &[u8]) -> Result<f32, QuantError> {
    const OP: &str = "vec_dot";
    let at = vec_dot_type(t).ok_or(QuantError::Unsupported { dtype: t, op: OP })?;
    check_len(t, "weight bytes", row_bytes(t, n, OP)?, w.len())?;
    check_len(at, "activation bytes", row_bytes(at, n, OP)?, act.len())?;
    let f: fn(&[u8], &[u8]) -> f32 = match t {
        DType::F32 => float::vec_dot_f32,
        DType::F16 => float::vec_dot_f16,
        DType::BF16 => float::vec_dot_bf16,
        DType::Q4_0 => legacy::vec_dot_q4_0_q8_0,
        DType::Q5_0 => legacy::vec_dot_q5_0_q8_0,
        DType::Q8_0 => legacy::vec_dot_q8_0_q8_0,
        DType::Q4_1 => legacy::vec_dot_q4_1_q8_1,
        DType::Q5_1 => legacy::vec_dot_q5_1_q8_1,
        DType::IQ4_NL => iquants_dot::vec_dot_iq4_nl_q8_0,
        DType::MXFP4 => fp4::vec_dot_mxfp4_q8_0,
        DType::NVFP4 => fp4::vec_dot_nvfp4_q8_0,
        DType::Q2_K => kquants_dot::vec_dot_q2_k_q8_k,
        DType::Q3_K => kquants_dot::vec_dot_q3_k_q8_k,
        DType::Q4_K => kquants_dot::vec_dot_q4_k_q8_k,
        DType::Q5_K => kquants_dot::vec_dot_q5_k_q8_k,
        DType::Q6_K => kquants_dot::vec_dot_q6_k_q8_k,
        DType::TQ1_0 => kquants_dot::vec_dot_tq1_0_q8_k,
        DType::TQ2_0 => kquants_dot::vec_dot_tq2_0_q8_k,
        DType::IQ1_S => iquants_dot::vec_dot_iq1_s_q8_k,
        DType::IQ1_M => iquants_dot::vec_dot_iq1_m_q8_k,
        DType::IQ2_XXS => iquants_dot::vec_dot_iq2_xxs_q8_k,
        DType::IQ2_XS => iquants_dot::vec_dot_iq2_xs_q8_k,
        DType::IQ2_S => iquants_dot::vec_dot_iq2_s_q8_k,
        DType::IQ3_XXS => iquants_dot::vec_dot_iq3_xxs_q8_k,
        DType::IQ3_S => iquants_dot::vec_dot_iq3_s_q8_k,
        DType::IQ4_XS => iquants_dot::vec_dot_iq4_xs_q8_k,
        _ => return Err(QuantError::Unsupported { dtype: t, op: OP }),
    };
    Ok(f(w, act))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn activation_quantizer_rounds_ties_to_even_where_the_reference_rounds_away() {
        // max |x| = 127 makes the scale exactly 1, so 2.5 and -4.5 are exact ties.
        let mut x = vec![0f32; 32];
        x[0] = 127.0;
        x[1] = 2.5;
        x[2] = -4.5;
        x[3] = 3.5;
        for (t, at) in [(DType::Q8_0, 2), (DType::Q8_1, 4)] {
            let n = t.row_bytes(32).unwrap() as usize;
            let (mut act, mut reference) = (vec![0u8; n], vec![0u8; n]);
            quantize_act_row(t, &x, &mut act).unwrap();
            quantize_row(t, &x, &mut reference).unwrap();
            let q = |b: &[u8]| [b[at + 1] as i8, b[at + 2] as i8, b[at + 3] as i8];
            assert_eq!(q(&act), [2, -4, 4], "{t}");
            assert_eq!(q(&reference), [3, -5, 4], "{t}");
            assert_eq!(act[..at], reference[..at], "{t}: same scale");
        }
        let mut k = vec![0u8; DType::Q8_K.row_bytes(256).unwrap() as usize];
        let mut kr = k.clone();
        quantize_act_row(DType::Q8_K, &[0.5; 256], &mut k).unwrap();
        quantize_row(DType::Q8_K, &[0.5; 256], &mut kr).unwrap();
        assert_eq!(k, kr, "Q8_K activations use the reference quantizer");
    }

    /// The types gguf 0.19.0 dequantizes, plus the activation formats Q8_1 and Q8_K.
    const DEQUANTIZED: &[DType] = &[
        DType::F32,
        DType::F16,
        DType::BF16,
        DType::Q4_0,
        DType::Q4_1,
        DType::Q5_0,
        DType::Q5_1,
        DType::Q8_0,
        DType::Q8_1,
        DType::Q2_K,
        DType::Q3_K,
        DType::Q4_K,
        DType::Q5_K,
        DType::Q6_K,
        DType::Q8_K,
        DType::IQ1_S,
        DType::IQ1_M,
        DType::IQ2_XXS,
        DType::IQ2_XS,
        DType::IQ2_S,
        DType::IQ3_XXS,
        DType::IQ3_S,
        DType::IQ4_NL,
        DType::IQ4_XS,
        DType::TQ1_0,
        DType::TQ2_0,
        DType::MXFP4,
        DType::NVFP4,
    ];

    #[test]
    fn every_known_type_is_served_or_refused_by_name() {
        for &t in DType::ALL {
            let l = t.layout().unwrap();
            let (n, bytes) = (l.block as usize, l.bytes as usize);
            let mut y = vec![1f32; n];
            let r = dequantize_row(t, &vec![0u8; bytes], &mut y);
            if DEQUANTIZED.contains(&t) {
                assert_eq!(r, Ok(()), "{t}");
                assert!(y.iter().all(|v| *v == 0.0), "{t}: zero bytes are zeros");
            } else {
                assert_eq!(
                    r,
                    Err(QuantError::Unsupported {
                        dtype: t,
                        op: "dequantize"
                    }),
                    "{t}"
                );
            }
            match vec_dot_type(t) {
                Some(at) => {
                    let act = vec![0u8; at.row_bytes(n as u64).unwrap() as usize];
                    assert_eq!(vec_dot(t, n, &vec![0u8; bytes], &act), Ok(0.0), "{t}");
                    // The partner format is one quantize_row serves.
                    let mut q = vec![0u8; act.len()];
                    assert_eq!(
                        quantize_row(at, &vec![0f32; n], &mut q),
                        Ok(()),
                        "{t} -> {at}"
                    );
                }
                None => assert!(vec_dot(t, n, &vec![0u8; bytes], &[]).is_err(), "{t}"),
            }
        }
    }

    #[test]
    fn quantize_then_dequantize_is_close_for_every_quantizer() {
        let x: Vec<f32> = (0..512)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) / 7.0)
            .collect();
        let types = [
            DType::F32,
            DType::F16,
            DType::BF16,
            DType::Q4_0,
            DType::Q4_1,
            DType::Q5_0,
            DType::Q5_1,
            DType::Q8_0,
            DType::Q8_1,
            DType::Q8_K,
            DType::MXFP4,
            DType::TQ1_0,
            DType::TQ2_0,
        ];
        for t in types {
            let mut q = vec![0u8; t.row_bytes(512).unwrap() as usize];
            quantize_row(t, &x, &mut q).unwrap();
            let mut y = vec![0f32; 512];
            dequantize_row(t, &q, &mut y).unwrap();
            // Ternary types keep one level per sign; MXFP4's power-of-two scale clips the block
            // maximum to as little as 6/8 of it, and its levels are 1/4 of the range apart; the
            // others resolve at least 1/8 of the range.
            let tol = match t {
                DType::TQ1_0 | DType::TQ2_0 => 7.2,
                DType::MXFP4 => 7.2 / 4.0,
                _ => 7.2 / 8.0,
            };
            for (a, b) in x.iter().zip(&y) {
                assert!((a - b).abs() <= tol, "{t}: {a} -> {b}");
            }
        }
    }
}
