//! The check of tensor data that llama.cpp runs under `--check-tensors` (ggml's
//! `ggml_validate_row_data`): float tensors hold no NaN or infinity; a quantized block's f16
//! scales (and minimums) are neither; an MXFP4 block's E8M0 exponent is not 0xFF (f64 values are
//! checked as f32, as ggml does, so one beyond f32's range fails). Types whose
//! blocks carry no float scale (the integers, NVFP4's E4M3 scales) pass as they are.

use bloomery_plugin_api::DType;

/// The first value that fails the check: where and what.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DataFault {
    /// The element (float types) or block (quantized types) it is in.
    pub index: usize,
    /// What it is: `"NaN"`, `"infinity"` or `"an invalid E8M0 exponent"`.
    pub what: &'static str,
}

fn f16_fault(bits: u16) -> Option<&'static str> {
    match (bits & 0x7c00 == 0x7c00, bits & 0x03ff) {
        (true, 0) => Some("infinity"),
        (true, _) => Some("NaN"),
        _ => None,
    }
}

fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

/// Byte offsets of a block's f16 scales, for the types whose scales are plain f16 values.
fn f16_scales(dtype: DType) -> Option<&'static [usize]> {
    Some(match dtype {
        DType::Q1_0
        | DType::Q4_0
        | DType::Q5_0
        | DType::Q8_0
        | DType::IQ2_XXS
        | DType::IQ2_XS
        | DType::IQ2_S
        | DType::IQ3_XXS
        | DType::IQ3_S
        | DType::IQ1_S
        | DType::IQ4_NL
        | DType::IQ4_XS => &[0],
        DType::Q4_1 | DType::Q5_1 | DType::Q4_K | DType::Q5_K => &[0, 2],
        DType::Q2_K => &[80, 82],
        DType::Q3_K => &[108],
        DType::Q6_K => &[208],
        DType::TQ1_0 => &[52],
        DType::TQ2_0 => &[64],
        _ => return None,
    })
}

/// Checks `data`, whole blocks of `dtype`; the first fault, if any.
pub fn check_tensor_data(dtype: DType, data: &[u8]) -> Result<(), DataFault> {
    let size = dtype.layout().map_or(1, |l| l.bytes as usize);
    let fault = |index, what| Err(DataFault { index, what });
    if let Some(offsets) = f16_scales(dtype) {
        for (i, block) in data.chunks_exact(size).enumerate() {
            for &at in offsets {
                if let Some(what) = f16_fault(u16_at(block, at)) {
                    return fault(i, what);
                }
            }
        }
        return Ok(());
    }
    match dtype {
        DType::F32 => {
            for (i, v) in data.chunks_exact(4).enumerate() {
                let x = f32::from_le_bytes([v[0], v[1], v[2], v[3]]);
                if !x.is_finite() {
                    return fault(i, if x.is_nan() { "NaN" } else { "infinity" });
                }
            }
        }
        DType::F64 => {
            // ggml checks each value as an f32, so one past f32's range is infinite.
            for (i, v) in data.chunks_exact(8).enumerate() {
                let x = f64::from_le_bytes(v.try_into().unwrap_or([0; 8])) as f32;
                if !x.is_finite() {
                    return fault(i, if x.is_nan() { "NaN" } else { "infinity" });
                }
            }
        }
        DType::F16 => {
            for (i, v) in data.chunks_exact(2).enumerate() {
                if let Some(what) = f16_fault(u16_at(v, 0)) {
                    return fault(i, what);
                }
            }
        }
        DType::BF16 => {
            for (i, v) in data.chunks_exact(2).enumerate() {
                let m = u16_at(v, 0) & 0x7fff;
                if m >= 0x7f80 {
                    return fault(i, if m > 0x7f80 { "NaN" } else { "infinity" });
                }
            }
        }
        DType::Q8_K => {
            for (i, b) in data.chunks_exact(size).enumerate() {
                let d = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
                if !d.is_finite() {
                    return fault(i, if d.is_nan() { "NaN" } else { "infinity" });
                }
            }
        }
        DType::IQ1_M => {
            // The f16 scale is spread over the top nibbles of the four u16 scale words.
            for (i, b) in data.chunks_exact(size).enumerate() {
                let sc = |k: usize| u16_at(b, 48 + 2 * k);
                let bits = (sc(0) >> 12)
                    | ((sc(1) >> 8) & 0x00f0)
                    | ((sc(2) >> 4) & 0x0f00)
                    | (sc(3) & 0xf000);
                if let Some(what) = f16_fault(bits) {
                    return fault(i, what);
                }
            }
        }
        DType::MXFP4 => {
            for (i, b) in data.chunks_exact(size).enumerate() {
                if b[0] == 0xff {
                    return fault(i, "an invalid E8M0 exponent");
                }
            }
        }
        _ => {}
    }
    Ok(())
}
