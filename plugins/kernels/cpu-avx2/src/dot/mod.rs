//! Row dot products for x86-64-v3 (AVX2, FMA, F16C), hand-written with `std::arch` intrinsics for
//! the formats MoE models ship; every other type goes to the portable reference
//! (`bloomery_kernels_cpu::quant::vec_dot`). Where the CPU also has AVX-512 F/BW/VL and VNNI
//! (checked once, cached), Q6_K uses the 512-bit kernel of `avx512` instead.
//!
//! The quantized kernels follow the reference's arithmetic: integer products inside each block
//! (`maddubs`/`madd`), one float scaling per block or sub-block. They differ from it only in the
//! order of the float additions across blocks. Activation quants are assumed to lie in -127..=127,
//! which the Q8_0, Q8_1 and Q8_K quantizers guarantee; that keeps `maddubs` from saturating.

#[cfg(target_arch = "x86_64")]
mod avx512;
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

use bloomery_kernels_cpu::linear;
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

/// The weight types whose AVX-512 VNNI kernels [`rows_dot`] uses on CPUs with AVX-512 F, BW,
/// VL and VNNI (a subset of [`HAND_WRITTEN`]).
pub const AVX512: &[DType] = &[DType::Q6_K];

/// The rows kernel of this plugin (see `bloomery_kernels_cpu::linear::RowsDot`): the dot products
/// of `out.len()` weight rows of `n` elements of `t` (`stride` bytes apart in `w`) with `n`
/// activations in `quant::vec_dot_type(t)` (`act`, exactly their bytes).
///
/// Same contract and errors as `linear::reference_rows_dot`, which it calls for types without a
/// hand-written kernel, for every length error, and on CPUs without AVX2, FMA and F16C (the
/// plugin does not open a device there, but this function stays sound if called anyway; the
/// check reads a cached flag). The types in [`AVX512`] take their AVX-512 kernels where the CPU
/// has AVX-512 F, BW, VL and VNNI (another cached check). The type is matched once per call.
/// Hot path: does not allocate.
pub fn rows_dot(
    t: DType,
    n: usize,
    w: &[u8],
    stride: usize,
    act: &[u8],
    out: &mut [f32],
) -> Result<(), QuantError> {
    rows_dot_on(t, n, w, stride, act, out, true)
}

/// [`rows_dot`] without the AVX-512 kernels, whatever the CPU (AVX2 or the reference): for
/// timing the two against each other and for testing the AVX2 kernels on AVX-512 CPUs.
pub fn rows_dot_avx2(
    t: DType,
    n: usize,
    w: &[u8],
    stride: usize,
    act: &[u8],
    out: &mut [f32],
) -> Result<(), QuantError> {
    rows_dot_on(t, n, w, stride, act, out, false)
}

/// [`rows_dot`], with the AVX-512 kernels allowed or not.
fn rows_dot_on(
    t: DType,
    n: usize,
    w: &[u8],
    stride: usize,
    act: &[u8],
    out: &mut [f32],
    allow_avx512: bool,
) -> Result<(), QuantError> {
    #[cfg(target_arch = "x86_64")]
    if has_v3() {
        if let (Ok(w_row), true) = (
            linear::weight_rows_fit(t, n, w, stride, out.len()),
            act_matches(t, n, act),
        ) {
            if allow_avx512 && has_avx512() {
                // SAFETY: `has_avx512()` found AVX-512 F, BW, VL and VNNI (and `has_v3()`
                // AVX2, FMA and F16C) on this CPU.
                if unsafe { rows_dot_avx512(t, w, stride, w_row, act, out) } {
                    return Ok(());
                }
            }
            // SAFETY: `has_v3()` found AVX2, FMA and F16C on this CPU.
            if unsafe { rows_dot_v3(t, w, stride, w_row, act, out) } {
                return Ok(());
            }
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = allow_avx512;
    linear::reference_rows_dot(t, n, w, stride, act, out)
}

/// One row: [`rows_dot`] on a single row (the tests' and benchmark's entry).
pub fn row_dot(t: DType, n: usize, w: &[u8], act: &[u8]) -> Result<f32, QuantError> {
    let expected = t.row_bytes(n as u64).unwrap_or(u64::MAX);
    if w.len() as u64 != expected {
        return quant::vec_dot(t, n, w, act);
    }
    let mut out = [0f32];
    rows_dot(t, n, w, w.len(), act, &mut out)?;
    Ok(out[0])
}

/// Whether this CPU has AVX2, FMA and F16C (std caches the detection).
#[cfg(target_arch = "x86_64")]
#[inline]
pub(crate) fn has_v3() -> bool {
    is_x86_feature_detected!("avx2")
        && is_x86_feature_detected!("fma")
        && is_x86_feature_detected!("f16c")
}

/// Whether this CPU has AVX-512 F, BW, VL and VNNI (std caches the detection); the AVX-512
/// kernels also use AVX2, FMA and F16C, which [`has_v3`] checks.
#[cfg(target_arch = "x86_64")]
#[inline]
pub(crate) fn has_avx512() -> bool {
    is_x86_feature_detected!("avx512f")
        && is_x86_feature_detected!("avx512bw")
        && is_x86_feature_detected!("avx512vl")
        && is_x86_feature_detected!("avx512vnni")
}

/// Runs the AVX-512 kernel for `t` on every row (see `linear::for_each_row`); false, with
/// nothing written, when `t` is not in [`AVX512`]. Lengths were checked.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
fn rows_dot_avx512(
    t: DType,
    w: &[u8],
    stride: usize,
    w_row: usize,
    act: &[u8],
    out: &mut [f32],
) -> bool {
    if t != DType::Q6_K {
        return false;
    }
    linear::for_each_row(w, stride, w_row, out, |r| avx512::q6_k(r, act));
    true
}

/// True when `act` is exactly the bytes of `n` activations of `t`'s activation type (the check
/// `quant::vec_dot` makes; it reports the error when this fails).
#[cfg(target_arch = "x86_64")]
fn act_matches(t: DType, n: usize, act: &[u8]) -> bool {
    let bytes = |t: DType| t.row_bytes(n as u64).and_then(|b| usize::try_from(b).ok());
    quant::vec_dot_type(t).is_some_and(|at| bytes(at) == Some(act.len()))
}

/// Runs the hand-written kernel for `t` on every row (see `linear::for_each_row`); false, with
/// nothing written, when `t` has none. Lengths were checked.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
fn rows_dot_v3(
    t: DType,
    w: &[u8],
    stride: usize,
    w_row: usize,
    act: &[u8],
    out: &mut [f32],
) -> bool {
    macro_rules! each_row {
        ($kernel:path) => {
            linear::for_each_row(w, stride, w_row, out, |r| $kernel(r, act))
        };
    }
    match t {
        DType::F32 => each_row!(float::f32_f32),
        DType::F16 => each_row!(float::f16_f32),
        DType::BF16 => each_row!(float::bf16_f32),
        DType::Q4_0 => each_row!(legacy::q4_0),
        DType::Q4_1 => each_row!(legacy::q4_1),
        DType::Q5_0 => each_row!(legacy::q5_0),
        DType::Q5_1 => each_row!(legacy::q5_1),
        DType::Q8_0 => each_row!(legacy::q8_0),
        DType::IQ4_NL => each_row!(legacy::iq4_nl),
        DType::MXFP4 => each_row!(legacy::mxfp4),
        DType::Q2_K => each_row!(kquants::q2_k),
        DType::Q3_K => each_row!(kquants::q3_k),
        DType::Q4_K => each_row!(kquants::q4_k),
        DType::Q5_K => each_row!(kquants::q5_k),
        DType::Q6_K => each_row!(kquants::q6_k),
        DType::IQ4_XS => each_row!(kquants::iq4_xs),
        DType::IQ2_XXS => each_row!(iquants::iq2_xxs),
        DType::IQ2_XS => each_row!(iquants::iq2_xs),
        DType::IQ2_S => each_row!(iquants::iq2_s),
        DType::IQ3_XXS => each_row!(iquants::iq3_xxs),
        DType::IQ3_S => each_row!(iquants::iq3_s),
        DType::IQ1_S => each_row!(iquants::iq1_s),
        DType::IQ1_M => each_row!(iquants::iq1_m),
        DType::NVFP4 => each_row!(legacy::nvfp4),
        DType::TQ2_0 => each_row!(kquants::tq2_0),
        _ => return false,
    }
    true
}
