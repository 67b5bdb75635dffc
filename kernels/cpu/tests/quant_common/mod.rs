//! Shared helpers of the quant integration tests: reading the gguf fixtures.

#![allow(dead_code)]

use std::path::PathBuf;

use bloomery_plugin_api::DType;

/// The fixture folder.
pub fn fixture_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/quant")
}

fn read(name: &str) -> Vec<u8> {
    let path = fixture_dir().join(name);
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn f32s(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// A dequantization fixture: the row bytes and gguf's f32 output.
pub fn dequant_fixture(t: DType) -> (Vec<u8>, Vec<f32>) {
    let b = read(&format!("dequant_{t}.bin"));
    let n = u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize;
    let bytes = t.row_bytes(n as u64).unwrap() as usize;
    assert_eq!(b.len(), 4 + bytes + 4 * n, "{t}: fixture size");
    (b[4..4 + bytes].to_vec(), f32s(&b[4 + bytes..]))
}

/// A quantization fixture: the f32 input and gguf's quantized bytes.
pub fn quantize_fixture(t: DType) -> (Vec<f32>, Vec<u8>) {
    let b = read(&format!("quantize_{t}.bin"));
    let n = u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize;
    let bytes = t.row_bytes(n as u64).unwrap() as usize;
    assert_eq!(b.len(), 4 + 4 * n + bytes, "{t}: fixture size");
    (f32s(&b[4..4 + 4 * n]), b[4 + 4 * n..].to_vec())
}

/// Every type gguf 0.19.0 dequantizes, with a fixture.
pub const DEQUANT_TYPES: &[DType] = &[
    DType::F32,
    DType::F16,
    DType::BF16,
    DType::Q4_0,
    DType::Q4_1,
    DType::Q5_0,
    DType::Q5_1,
    DType::Q8_0,
    DType::Q2_K,
    DType::Q3_K,
    DType::Q4_K,
    DType::Q5_K,
    DType::Q6_K,
    DType::TQ1_0,
    DType::TQ2_0,
    DType::IQ2_XXS,
    DType::IQ2_XS,
    DType::IQ2_S,
    DType::IQ3_XXS,
    DType::IQ3_S,
    DType::IQ1_S,
    DType::IQ1_M,
    DType::IQ4_NL,
    DType::IQ4_XS,
    DType::MXFP4,
    DType::NVFP4,
];
