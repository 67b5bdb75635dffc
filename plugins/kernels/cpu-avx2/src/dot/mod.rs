//! Row dot products for x86-64-v3 (AVX2, FMA, F16C), hand-written with `std::arch` intrinsics for
//! the formats MoE models ship; every other type goes to the portable reference
//! (`bloomery_kernels_cpu::quant::vec_dot`).
//!
//! The quantized kernels follow the reference's arithmetic: integer products inside each block
//! (`maddubs`/`madd`), one float scaling per block or sub-block. They differ from it only in the
//! order of the float additions across blocks. Activation quants are assumed to lie in -127..=127,
//! which the Q8_0, Q8_1 and Q8_K quantizers guarantee; that keeps `maddubs` from saturating.

#[cfg(target_arch = "x86_64")]
mod float;
#[cfg(target_arch = "x86_64")]
mod iquants;
#[cfg(target_arch = "x86_64")]
mod kquants;
#[cfg(target_arch = "x86_64")]
mod legacy;
#[cfg(target_arch = "x86_64")]
mod simd;
#[cfg(all(test, target_arch = "x86_64"))]
mod tests;

use bloomery_kernels_cpu::quant::{self, QuantError};
use bloomery_plugin_api::DType;

/// The weight types with hand-written kernels; the others go to the portable reference.
pub const HAND_WRITTEN: &[DType] = &[
    DType::Q4_K,
    DType::Q8_0,
    DType::Q6_K,
    DType::Q5_K,
    DType::Q5_0,
    DType::Q4_0,
    DType::Q3_K,
    DType::Q2_K,
    DType::IQ4_XS,
    DType::IQ4_NL,
    DType::F16,
    DType::F32,
    DType::BF16,
    DType::Q4_1,
    DType::Q5_1,
    DType::MXFP4,
    DType::IQ2_XXS,
    DType::IQ2_XS,
    DType::IQ2_S,
    DType::IQ3_XXS,
    DType::IQ3_S,
    DType::IQ1_S,
    DType::IQ1_M,
    DType::NVFP4,
    DType::TQ2_0,
];

/// The row kernel of this plugin (see `bloomery_kernels_cpu::linear::RowDot`): the dot product of
/// `n` elements of weight type `t` (`w`, exactly their bytes) with `n` activations in
/// `quant::vec_dot_type(t)` (`act`, exactly their bytes).
///
/// Same contract and errors as `quant::vec_dot`, which it calls for types without a hand-written
/// kernel, for every length error, and on CPUs without AVX2, FMA and F16C (the plugin does not
/// open a device there, but this function stays sound if called anyway; the check reads a
/// cached flag). Hot path: does not allocate.
pub fn row_dot(t: DType, n: usize, w: &[u8], act: &[u8]) -> Result<f32, QuantError> {
    #[cfg(target_arch = "x86_64")]
    if has_v3() && lengths_match(t, n, w, act) {
        // SAFETY: `has_v3()` found AVX2, FMA and F16C on this CPU.
        if let Some(v) = unsafe { row_dot_v3(t, w, act) } {
            return Ok(v);
        }
    }
    quant::vec_dot(t, n, w, act)
}

/// Whether this CPU has AVX2, FMA and F16C (std caches the detection).
#[cfg(target_arch = "x86_64")]
#[inline]
pub(crate) fn has_v3() -> bool {
    is_x86_feature_detected!("avx2")
        && is_x86_feature_detected!("fma")
        && is_x86_feature_detected!("f16c")
}

/// True when `w` and `act` are exactly the bytes of `n` elements of `t` and of its activation
/// type (the checks `quant::vec_dot` makes; it reports the error when they fail).
#[cfg(target_arch = "x86_64")]
fn lengths_match(t: DType, n: usize, w: &[u8], act: &[u8]) -> bool {
    let bytes = |t: DType| t.row_bytes(n as u64).and_then(|b| usize::try_from(b).ok());
    let Some(at) = quant::vec_dot_type(t) else {
        return false;
    };
    bytes(t) == Some(w.len()) && bytes(at) == Some(act.len())
}

/// The hand-written kernel's result for `t`, or `None` when `t` has none. Lengths were checked.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
fn row_dot_v3(t: DType, w: &[u8], act: &[u8]) -> Option<f32> {
    Some(match t {
        DType::F32 => float::f32_f32(w, act),
        DType::F16 => float::f16_f32(w, act),
        DType::BF16 => float::bf16_f32(w, act),
        DType::Q4_0 => legacy::q4_0(w, act),
        DType::Q4_1 => legacy::q4_1(w, act),
        DType::Q5_0 => legacy::q5_0(w, act),
        DType::Q5_1 => legacy::q5_1(w, act),
        DType::Q8_0 => legacy::q8_0(w, act),
        DType::IQ4_NL => legacy::iq4_nl(w, act),
        DType::MXFP4 => legacy::mxfp4(w, act),
        DType::Q2_K => kquants::q2_k(w, act),
        DType::Q3_K => kquants::q3_k(w, act),
        DType::Q4_K => kquants::q4_k(w, act),
        DType::Q5_K => kquants::q5_k(w, act),
        DType::Q6_K => kquants::q6_k(w, act),
        DType::IQ4_XS => kquants::iq4_xs(w, act),
        DType::IQ2_XXS => iquants::iq2_xxs(w, act),
        DType::IQ2_XS => iquants::iq2_xs(w, act),
        DType::IQ2_S => iquants::iq2_s(w, act),
        DType::IQ3_XXS => iquants::iq3_xxs(w, act),
        DType::IQ3_S => iquants::iq3_s(w, act),
        DType::IQ1_S => iquants::iq1_s(w, act),
        DType::IQ1_M => iquants::iq1_m(w, act),
        DType::NVFP4 => legacy::nvfp4(w, act),
        DType::TQ2_0 => kquants::tq2_0(w, act),
        _ => return None,
    })
}
