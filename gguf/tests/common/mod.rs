//! Shared helpers for the integration tests: a writer holding every value type and a few tensors,
//! with deterministic tensor bytes.
#![allow(dead_code)]

use bloomery_gguf::{Array, GgufWriter, TensorInfo, Value};
use bloomery_plugin_api::DType;
use std::io::Write;

/// Deterministic bytes for a tensor, derived from its name.
pub fn tensor_bytes(t: &TensorInfo) -> Vec<u8> {
    let mut x: u64 = t.name.bytes().fold(0xcbf29ce484222325, |h, b| {
        (h ^ b as u64).wrapping_mul(0x100000001b3)
    });
    (0..t.size)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// Fill callback writing [`tensor_bytes`].
pub fn fill(t: &TensorInfo, sink: &mut bloomery_gguf::TensorSink) -> std::io::Result<()> {
    sink.write_all(&tensor_bytes(t))
}

/// Every metadata value type, including arrays of strings and arrays of arrays.
pub fn all_values() -> Vec<(&'static str, Value)> {
    vec![
        ("general.architecture", Value::from("test")),
        ("t.u8", Value::U8(200)),
        ("t.i8", Value::I8(-100)),
        ("t.u16", Value::U16(60000)),
        ("t.i16", Value::I16(-30000)),
        ("t.u32", Value::U32(4_000_000_000)),
        ("t.i32", Value::I32(-2_000_000_000)),
        ("t.u64", Value::U64(u64::MAX)),
        ("t.i64", Value::I64(i64::MIN)),
        ("t.f32", Value::F32(1.5)),
        ("t.f64", Value::F64(-3.25e100)),
        ("t.bool", Value::Bool(true)),
        ("t.str", Value::from("héllo ✓")),
        ("t.empty_str", Value::from("")),
        ("t.arr_u8", Value::from(vec![1u8, 2, 255])),
        ("t.arr_i8", Value::from(vec![-1i8, 2])),
        ("t.arr_u16", Value::from(vec![1u16, 65535])),
        ("t.arr_i16", Value::from(vec![-1i16, 2])),
        ("t.arr_u32", Value::from(vec![7u32])),
        ("t.arr_i32", Value::from(vec![1i32, -2, 3])),
        ("t.arr_u64", Value::from(vec![u64::MAX, 0])),
        ("t.arr_i64", Value::from(vec![i64::MIN])),
        ("t.arr_f32", Value::from(vec![0.5f32, -0.25])),
        ("t.arr_f64", Value::from(vec![0.1f64])),
        ("t.arr_bool", Value::from(vec![true, false])),
        (
            "t.arr_str",
            Value::from(vec!["a".to_owned(), String::new(), "ü".to_owned()]),
        ),
        ("t.arr_empty", Value::Array(Array::U32(vec![]))),
        (
            "t.nested",
            Value::Array(Array::Array(vec![
                Array::I32(vec![1, 2]),
                Array::String(vec!["x".into()]),
                Array::Array(vec![Array::Bool(vec![true])]),
                Array::F64(vec![]),
            ])),
        ),
    ]
}

/// A writer with [`all_values`] and five tensors of several types (F32, F16, Q4_K, Q8_0, I32).
pub fn sample_writer(version: u32, alignment: Option<u32>) -> GgufWriter {
    let mut w = GgufWriter::with_version(version).unwrap();
    if let Some(a) = alignment {
        w.set_alignment(a).unwrap();
    }
    for (k, v) in all_values() {
        w.set(k, v).unwrap();
    }
    w.add_tensor("f32.weight", DType::F32, &[4, 3]).unwrap();
    w.add_tensor("f16.weight", DType::F16, &[8, 2]).unwrap();
    w.add_tensor("q4k.weight", DType::Q4_K, &[256, 2]).unwrap();
    w.add_tensor("q8.weight", DType::Q8_0, &[64, 1, 1]).unwrap();
    w.add_tensor("i32.ids", DType::I32, &[5, 1, 1, 1]).unwrap();
    w
}

/// The bytes of `w` written in memory.
pub fn sample_bytes(w: &GgufWriter) -> Vec<u8> {
    let mut out = Vec::new();
    w.write_to(&mut out, "mem.gguf", fill).unwrap();
    out
}
