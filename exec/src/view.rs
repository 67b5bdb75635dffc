//! The model file as plugins see it: GGUF metadata and tensors converted to the ABI's
//! [`ModelFileView`]. The tokenizer's large arrays stay with the host.

use abi_stable::std_types::RVec;
use bloomery_gguf::{Array, GgufModel, Metadata, Value};
use bloomery_plugin_api::meta::{MetaEntry, MetaValue, ModelFileView, TensorInfo};

/// Keys the host keeps to itself (vocabulary arrays of up to ~250k entries).
const HOST_ONLY: [&str; 5] = [
    "tokenizer.ggml.tokens",
    "tokenizer.ggml.scores",
    "tokenizer.ggml.token_type",
    "tokenizer.ggml.merges",
    "tokenizer.ggml.precompiled_charsmap",
];

fn array(a: &Array) -> MetaValue {
    fn conv<T: Copy>(v: &[T], f: impl Fn(T) -> MetaValue) -> MetaValue {
        MetaValue::Array(v.iter().map(|&x| f(x)).collect())
    }
    match a {
        Array::U8(v) => conv(v, MetaValue::U8),
        Array::I8(v) => conv(v, MetaValue::I8),
        Array::U16(v) => conv(v, MetaValue::U16),
        Array::I16(v) => conv(v, MetaValue::I16),
        Array::U32(v) => conv(v, MetaValue::U32),
        Array::I32(v) => conv(v, MetaValue::I32),
        Array::U64(v) => conv(v, MetaValue::U64),
        Array::I64(v) => conv(v, MetaValue::I64),
        Array::F32(v) => conv(v, MetaValue::F32),
        Array::F64(v) => conv(v, MetaValue::F64),
        Array::Bool(v) => conv(v, MetaValue::Bool),
        Array::String(v) => MetaValue::Array(
            v.iter()
                .map(|s| MetaValue::String(s.as_str().into()))
                .collect(),
        ),
        Array::Array(v) => MetaValue::Array(v.iter().map(array).collect()),
    }
}

/// Converts one metadata value.
pub fn meta_value(v: &Value) -> MetaValue {
    match v {
        Value::U8(x) => MetaValue::U8(*x),
        Value::I8(x) => MetaValue::I8(*x),
        Value::U16(x) => MetaValue::U16(*x),
        Value::I16(x) => MetaValue::I16(*x),
        Value::U32(x) => MetaValue::U32(*x),
        Value::I32(x) => MetaValue::I32(*x),
        Value::U64(x) => MetaValue::U64(*x),
        Value::I64(x) => MetaValue::I64(*x),
        Value::F32(x) => MetaValue::F32(*x),
        Value::F64(x) => MetaValue::F64(*x),
        Value::Bool(x) => MetaValue::Bool(*x),
        Value::String(s) => MetaValue::String(s.as_str().into()),
        Value::Array(a) => array(a),
    }
}

/// The view of a model for its plugin.
pub fn file_view(model: &GgufModel) -> ModelFileView {
    header_view(model.metadata(), model.tensors().iter().map(|t| &t.info))
}

/// The view of a model for its plugin from a parsed header's metadata and tensor infos (the
/// fuzz target `fuzz/fuzz_targets/model_load.rs` builds it from arbitrary bytes).
pub fn header_view<'a>(
    metadata: &Metadata,
    tensors: impl Iterator<Item = &'a bloomery_gguf::TensorInfo>,
) -> ModelFileView {
    let metadata: RVec<MetaEntry> = metadata
        .entries()
        .iter()
        .filter(|e| !HOST_ONLY.contains(&e.key.as_str()))
        .map(|e| MetaEntry {
            key: e.key.as_str().into(),
            value: meta_value(&e.value),
        })
        .collect();
    let tensors: RVec<TensorInfo> = tensors
        .map(|t| {
            let mut ne = [1u64; 4];
            for (d, &x) in t.shape.iter().take(4).enumerate() {
                ne[d] = x;
            }
            TensorInfo {
                name: t.name.as_str().into(),
                dtype: t.dtype,
                n_dims: t.shape.len() as u32,
                ne,
            }
        })
        .collect();
    ModelFileView { metadata, tensors }
}
