//! Property test: random metadata (every value type, nested arrays, odd keys) and random tensors
//! written by [`GgufWriter`] in version 2 or 3 at a random alignment read back identically.

use bloomery_gguf::{parse, Array, GgufWriter, Value};
use bloomery_plugin_api::DType;
use proptest::prelude::*;
use std::io::Write;

fn array(depth: u32) -> BoxedStrategy<Array> {
    let leaf = prop_oneof![
        prop::collection::vec(any::<u8>(), 0..8).prop_map(Array::U8),
        prop::collection::vec(any::<i8>(), 0..8).prop_map(Array::I8),
        prop::collection::vec(any::<u16>(), 0..8).prop_map(Array::U16),
        prop::collection::vec(any::<i16>(), 0..8).prop_map(Array::I16),
        prop::collection::vec(any::<u32>(), 0..8).prop_map(Array::U32),
        prop::collection::vec(any::<i32>(), 0..8).prop_map(Array::I32),
        prop::collection::vec(any::<u64>(), 0..8).prop_map(Array::U64),
        prop::collection::vec(any::<i64>(), 0..8).prop_map(Array::I64),
        prop::collection::vec(-1e30f32..1e30, 0..8).prop_map(Array::F32),
        prop::collection::vec(-1e300f64..1e300, 0..8).prop_map(Array::F64),
        prop::collection::vec(any::<bool>(), 0..8).prop_map(Array::Bool),
        prop::collection::vec(".{0,12}", 0..6).prop_map(Array::String),
    ];
    if depth == 0 {
        leaf.boxed()
    } else {
        prop_oneof![
            3 => leaf,
            1 => prop::collection::vec(array(depth - 1), 0..4).prop_map(Array::Array),
        ]
        .boxed()
    }
}

fn value() -> impl Strategy<Value = Value> {
    prop_oneof![
        any::<u8>().prop_map(Value::U8),
        any::<i8>().prop_map(Value::I8),
        any::<u16>().prop_map(Value::U16),
        any::<i16>().prop_map(Value::I16),
        any::<u32>().prop_map(Value::U32),
        any::<i32>().prop_map(Value::I32),
        any::<u64>().prop_map(Value::U64),
        any::<i64>().prop_map(Value::I64),
        (-1e30f32..1e30).prop_map(Value::F32),
        (-1e300f64..1e300).prop_map(Value::F64),
        any::<bool>().prop_map(Value::Bool),
        ".{0,24}".prop_map(Value::String),
        array(3).prop_map(Value::Array),
    ]
}

/// (type, shape) of a tensor: F32, F16, Q8_0 (block 32) or Q4_K (block 256).
fn tensor() -> impl Strategy<Value = (DType, Vec<u64>)> {
    let ty = prop_oneof![
        Just(DType::F32),
        Just(DType::F16),
        Just(DType::Q8_0),
        Just(DType::Q4_K)
    ];
    (ty, 1u64..4, prop::collection::vec(1u64..4, 0..4)).prop_map(|(t, blocks, rest)| {
        let block = u64::from(t.layout().map_or(1, |l| l.block));
        let mut shape = vec![blocks * block];
        shape.extend(rest);
        (t, shape)
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]
    #[test]
    fn random_files_round_trip(
        version in 2u32..=3,
        align_pow in prop::option::of(0u32..8),
        kvs in prop::collection::vec((".{0,16}", value()), 0..12),
        tensors in prop::collection::vec(tensor(), 0..6),
    ) {
        let mut w = GgufWriter::with_version(version).unwrap();
        if let Some(p) = align_pow {
            w.set_alignment(1 << p).unwrap();
        }
        let mut expected = w.metadata().entries().to_vec();
        for (k, v) in kvs {
            if w.set(&k, v.clone()).is_ok() {
                expected.push(bloomery_gguf::Entry { key: k, value: v, offset: 0 });
            }
        }
        for (i, (t, shape)) in tensors.iter().enumerate() {
            w.add_tensor(&format!("t{i}"), *t, shape).unwrap();
        }
        let mut bytes = Vec::new();
        let n = w.write_to(&mut bytes, "p.gguf", |t, s| s.write_all(&vec![t.name.len() as u8; t.size as usize])).unwrap();
        prop_assert_eq!(n, bytes.len() as u64);
        let h = parse(&bytes, "p.gguf").unwrap();
        prop_assert_eq!(h.version, version);
        let got: Vec<_> = h.metadata.entries().iter().map(|e| (&e.key, &e.value)).collect();
        let want: Vec<_> = expected.iter().map(|e| (&e.key, &e.value)).collect();
        prop_assert_eq!(got, want);
        prop_assert_eq!(h.tensors.len(), tensors.len());
        for (t, wt) in h.tensors.iter().zip(w.tensors()) {
            prop_assert_eq!((&t.name, &t.shape, t.dtype, t.start, t.size), (&wt.name, &wt.shape, wt.dtype, wt.start, wt.size));
        }
    }
}
