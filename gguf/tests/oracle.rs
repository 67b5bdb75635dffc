//! The independent oracle: files written by the `gguf` Python package (0.19.0) must read back
//! exactly as its own GGUFReader read them (tests/fixtures/expected.json), and a file written by
//! our writer must stay byte-identical to the one gguf's reader checked (fixtures/PROVENANCE.md).

mod common;

use bloomery_gguf::{Array, GgufFile, Value};
use serde_json::{json, Value as J};
use std::path::{Path, PathBuf};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

/// gguf-py's type names for a value: `["UINT32"]`, `["ARRAY", "STRING"]`, `["ARRAY", "ARRAY", "INT32"]`.
fn py_types(v: &Value) -> Vec<String> {
    fn name(t: bloomery_gguf::ValueType) -> String {
        use bloomery_gguf::ValueType::*;
        match t {
            U8 => "UINT8",
            I8 => "INT8",
            U16 => "UINT16",
            I16 => "INT16",
            U32 => "UINT32",
            I32 => "INT32",
            U64 => "UINT64",
            I64 => "INT64",
            F32 => "FLOAT32",
            F64 => "FLOAT64",
            Bool => "BOOL",
            String => "STRING",
            Array => "ARRAY",
        }
        .to_owned()
    }
    let mut out = vec![name(v.value_type())];
    let mut cur = match v {
        Value::Array(a) => Some(a),
        _ => None,
    };
    while let Some(a) = cur {
        out.push(name(a.elem_type()));
        cur = match a {
            Array::Array(inner) => inner.first(),
            _ => None,
        };
    }
    out
}

fn array_json(a: &Array) -> Vec<J> {
    match a {
        Array::U8(v) => v.iter().map(|&x| json!(x)).collect(),
        Array::I8(v) => v.iter().map(|&x| json!(x)).collect(),
        Array::U16(v) => v.iter().map(|&x| json!(x)).collect(),
        Array::I16(v) => v.iter().map(|&x| json!(x)).collect(),
        Array::U32(v) => v.iter().map(|&x| json!(x)).collect(),
        Array::I32(v) => v.iter().map(|&x| json!(x)).collect(),
        Array::U64(v) => v.iter().map(|&x| json!(x)).collect(),
        Array::I64(v) => v.iter().map(|&x| json!(x)).collect(),
        Array::F32(v) => v.iter().map(|&x| json!(f64::from(x))).collect(),
        Array::F64(v) => v.iter().map(|&x| json!(x)).collect(),
        Array::Bool(v) => v.iter().map(|&x| json!(x)).collect(),
        Array::String(v) => v.iter().map(|x| json!(x)).collect(),
        Array::Array(v) => v.iter().map(|x| J::Array(array_json(x))).collect(),
    }
}

fn leaves(a: &Array) -> Vec<J> {
    match a {
        Array::Array(v) => v.iter().flat_map(leaves).collect(),
        a => array_json(a),
    }
}

fn value_json(v: &Value) -> J {
    match v {
        Value::U8(x) => json!(x),
        Value::I8(x) => json!(x),
        Value::U16(x) => json!(x),
        Value::I16(x) => json!(x),
        Value::U32(x) => json!(x),
        Value::I32(x) => json!(x),
        Value::U64(x) => json!(x),
        Value::I64(x) => json!(x),
        Value::F32(x) => json!(f64::from(*x)),
        Value::F64(x) => json!(x),
        Value::Bool(x) => json!(x),
        Value::String(x) => json!(x),
        Value::Array(a @ Array::Array(_)) => json!({ "nested_leaves": leaves(a) }),
        Value::Array(a) => J::Array(array_json(a)),
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

#[test]
fn files_written_by_gguf_py_read_as_gguf_py_reads_them() {
    let text = std::fs::read_to_string(fixtures().join("expected.json")).unwrap();
    let expected: J = serde_json::from_str(&text).unwrap();
    let files = expected.as_object().unwrap();
    assert_eq!(files.len(), 2);
    for (name, want) in files {
        let f = GgufFile::open(fixtures().join(name)).unwrap();
        let h = f.header();
        assert_eq!(json!(h.alignment), want["alignment"], "{name}");
        assert_eq!(json!(h.data_offset), want["data_offset"], "{name}");
        let kv = want["kv"].as_array().unwrap();
        assert_eq!(h.metadata.len(), kv.len(), "{name}");
        for (e, w) in h.metadata.entries().iter().zip(kv) {
            assert_eq!(json!(e.key), w["key"]);
            assert_eq!(json!(e.offset), w["offset"], "{}", e.key);
            assert_eq!(json!(py_types(&e.value)), w["types"], "{}", e.key);
            assert_eq!(value_json(&e.value), w["value"], "{}", e.key);
        }
        let ts = want["tensors"].as_array().unwrap();
        assert_eq!(h.tensors.len(), ts.len());
        for (t, w) in h.tensors.iter().zip(ts) {
            assert_eq!(json!(t.name), w["name"]);
            assert_eq!(json!(t.dtype.0), w["type"], "{}", t.name);
            assert_eq!(json!(t.shape), w["shape"], "{}", t.name);
            assert_eq!(json!(t.n_elements()), w["n_elements"], "{}", t.name);
            assert_eq!(json!(t.size), w["n_bytes"], "{}", t.name);
            assert_eq!(json!(t.start), w["data_offset"], "{}", t.name);
            assert_eq!(
                json!(hex(f.tensor_data(t).unwrap())),
                w["data_hex"],
                "{}",
                t.name
            );
        }
    }
}

/// The file whose reading by gguf-py is recorded in fixtures/ours_checked_by_gguf_py.txt.
fn ours() -> Vec<u8> {
    common::sample_bytes(&common::sample_writer(3, Some(64)))
}

#[test]
fn our_writer_still_produces_the_file_gguf_py_checked() {
    let committed = std::fs::read(fixtures().join("ours_v3_align64.gguf")).unwrap();
    assert!(
        committed == ours(),
        "writer output changed: run `cargo run -p bloomery-gguf --example regenerate_writer_fixture`, then fixtures/check_ours.py"
    );
}
