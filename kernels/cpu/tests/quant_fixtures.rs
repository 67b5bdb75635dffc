//! Dequantization and quantization against the gguf 0.19.0 fixtures, compared bit for bit.

mod quant_common;

use bloomery_kernels_cpu::quant::{dequantize_row, quantize_row};
use bloomery_plugin_api::DType;
use quant_common::{dequant_fixture, quantize_fixture, DEQUANT_TYPES};

/// Indices where two f32 rows differ in their bits (NaN equal to NaN only with the same bits).
fn bit_mismatches(got: &[f32], want: &[f32]) -> Vec<usize> {
    got.iter()
        .zip(want)
        .enumerate()
        .filter(|(_, (g, w))| g.to_bits() != w.to_bits())
        .map(|(i, _)| i)
        .collect()
}

#[test]
fn dequantize_is_bit_identical_to_gguf() {
    let mut failures = Vec::new();
    for &t in DEQUANT_TYPES {
        let (bytes, want) = dequant_fixture(t);
        let mut got = vec![0f32; want.len()];
        dequantize_row(t, &bytes, &mut got).unwrap();
        let bad = bit_mismatches(&got, &want);
        if let Some(&i) = bad.first() {
            failures.push(format!(
                "{t}: {} of {} differ, first at {i}: got {} ({:#010x}), gguf {} ({:#010x})",
                bad.len(),
                want.len(),
                got[i],
                got[i].to_bits(),
                want[i],
                want[i].to_bits()
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn quantize_is_bit_identical_to_gguf() {
    let types = [
        DType::F32,
        DType::F16,
        DType::BF16,
        DType::Q4_0,
        DType::Q4_1,
        DType::Q5_0,
        DType::Q5_1,
        DType::Q8_0,
        DType::MXFP4,
        DType::TQ1_0,
        DType::TQ2_0,
    ];
    let mut failures = Vec::new();
    for t in types {
        let (x, want) = quantize_fixture(t);
        let mut got = vec![0u8; want.len()];
        quantize_row(t, &x, &mut got).unwrap();
        if let Some(i) = got.iter().zip(&want).position(|(g, w)| g != w) {
            let n = got.iter().zip(&want).filter(|(g, w)| g != w).count();
            failures.push(format!(
                "{t}: {n} bytes differ, first at {i}: got {:#04x}, gguf {:#04x}",
                got[i], want[i]
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn dequant_f16_covers_every_bit_pattern_including_nan_payloads() {
    let (bytes, want) = dequant_fixture(DType::F16);
    assert_eq!(want.len(), 65536);
    let mut got = vec![0f32; want.len()];
    dequantize_row(DType::F16, &bytes, &mut got).unwrap();
    assert!(bit_mismatches(&got, &want).is_empty());
    assert_eq!(
        got[0x7c01].to_bits(),
        0x7f80_2000,
        "signalling NaN payload kept, as numpy"
    );
}
