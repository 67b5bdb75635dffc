//! The model file as a model plugin sees it: the GGUF key/value metadata and the tensor table.
//!
//! The host builds a [`ModelFileView`] once per load and lends it to the plugin's `load`; the plugin
//! reads hyperparameters through the typed getters, whose errors name the key.

use crate::{DType, PluginError};
use abi_stable::std_types::{RString, RVec};
use abi_stable::StableAbi;

/// One metadata value, as stored in the file (arrays may nest).
#[repr(C, u8)]
#[derive(StableAbi, Clone, Debug, PartialEq)]
pub enum MetaValue {
    /// `u8`.
    U8(u8),
    /// `i8`.
    I8(i8),
    /// `u16`.
    U16(u16),
    /// `i16`.
    I16(i16),
    /// `u32`.
    U32(u32),
    /// `i32`.
    I32(i32),
    /// `u64`.
    U64(u64),
    /// `i64`.
    I64(i64),
    /// `f32`.
    F32(f32),
    /// `f64`.
    F64(f64),
    /// `bool`.
    Bool(bool),
    /// A UTF-8 string.
    String(RString),
    /// An array of values (of one type in a well-formed file).
    Array(RVec<MetaValue>),
}

impl MetaValue {
    /// The value as an unsigned integer, if it is a non-negative integer of any width.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            MetaValue::U8(v) => Some(v.into()),
            MetaValue::U16(v) => Some(v.into()),
            MetaValue::U32(v) => Some(v.into()),
            MetaValue::U64(v) => Some(v),
            MetaValue::I8(v) => u64::try_from(v).ok(),
            MetaValue::I16(v) => u64::try_from(v).ok(),
            MetaValue::I32(v) => u64::try_from(v).ok(),
            MetaValue::I64(v) => u64::try_from(v).ok(),
            MetaValue::Bool(v) => Some(v.into()),
            _ => None,
        }
    }

    /// The value as a float, if it is a number.
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            MetaValue::F32(v) => Some(v.into()),
            MetaValue::F64(v) => Some(v),
            MetaValue::I8(v) => Some(v.into()),
            MetaValue::I16(v) => Some(v.into()),
            MetaValue::I32(v) => Some(v.into()),
            MetaValue::I64(v) => Some(v as f64),
            _ => self.as_u64().map(|v| v as f64),
        }
    }

    /// The value as a string slice, if it is a string.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            MetaValue::String(s) => Some(s.as_str()),
            _ => None,
        }
    }

    /// The type name used in error messages (`"u32"`, `"array"`).
    pub fn type_name(&self) -> &'static str {
        match self {
            MetaValue::U8(_) => "u8",
            MetaValue::I8(_) => "i8",
            MetaValue::U16(_) => "u16",
            MetaValue::I16(_) => "i16",
            MetaValue::U32(_) => "u32",
            MetaValue::I32(_) => "i32",
            MetaValue::U64(_) => "u64",
            MetaValue::I64(_) => "i64",
            MetaValue::F32(_) => "f32",
            MetaValue::F64(_) => "f64",
            MetaValue::Bool(_) => "bool",
            MetaValue::String(_) => "string",
            MetaValue::Array(_) => "array",
        }
    }
}

/// One metadata entry.
#[repr(C)]
#[derive(StableAbi, Clone, Debug, PartialEq)]
pub struct MetaEntry {
    /// The key, e.g. `general.architecture`.
    pub key: RString,
    /// The value.
    pub value: MetaValue,
}

impl MetaEntry {
    /// An entry.
    pub fn new(key: &str, value: MetaValue) -> MetaEntry {
        MetaEntry {
            key: key.into(),
            value,
        }
    }
}

/// One tensor of the file, as declared in its header.
#[repr(C)]
#[derive(StableAbi, Clone, Debug, PartialEq)]
pub struct TensorInfo {
    /// The GGUF name, e.g. `blk.0.attn_q.weight`.
    pub name: RString,
    /// Element type.
    pub dtype: DType,
    /// Number of dimensions used (1..=4).
    pub n_dims: u32,
    /// Extent of each dimension, ne0 contiguous; unused dimensions are 1.
    pub ne: [u64; 4],
}

/// The model file as the plugin sees it. Owned by the host; lent to the plugin during `load`.
#[repr(C)]
#[derive(StableAbi, Clone, Debug, Default)]
pub struct ModelFileView {
    /// Metadata in file order. Large tokenizer arrays (`tokenizer.ggml.*`) are left out: the host
    /// owns the tokenizer.
    pub metadata: RVec<MetaEntry>,
    /// Every tensor of the model (all split parts together).
    pub tensors: RVec<TensorInfo>,
}

impl ModelFileView {
    /// This view with the entry `key` set to `value`, or removed when `value` is `None` (tests
    /// that sweep a file's keys).
    pub fn with_entry(mut self, key: &str, value: Option<MetaValue>) -> Self {
        let mut meta: Vec<MetaEntry> = self
            .metadata
            .into_iter()
            .filter(|e| e.key.as_str() != key)
            .collect();
        if let Some(v) = value {
            meta.push(MetaEntry::new(key, v));
        }
        self.metadata = meta.into();
        self
    }

    /// The value of `key`, if present.
    pub fn get(&self, key: &str) -> Option<&MetaValue> {
        self.metadata
            .iter()
            .find(|e| e.key.as_str() == key)
            .map(|e| &e.value)
    }

    /// `general.architecture`, or a named error.
    pub fn architecture(&self) -> Result<&str, PluginError> {
        self.string("general.architecture")
    }

    /// Checks that `general.architecture` is `arch` (a plugin's loader refuses other files by name).
    pub fn expect_architecture(&self, arch: &str) -> Result<(), PluginError> {
        let found = self.architecture()?;
        if found != arch {
            return Err(PluginError::unsupported(
                format!("architecture `{found}`"),
                &[arch],
            ));
        }
        Ok(())
    }

    /// A required string value.
    pub fn string(&self, key: &str) -> Result<&str, PluginError> {
        let v = self.require(key)?;
        v.as_str().ok_or_else(|| bad_type(key, "string", v))
    }

    /// A required non-negative integer that fits in `u32`.
    pub fn u32(&self, key: &str) -> Result<u32, PluginError> {
        let v = self.require(key)?;
        v.as_u64()
            .and_then(|x| u32::try_from(x).ok())
            .ok_or_else(|| bad_type(key, "an integer in u32 range", v))
    }

    /// An optional `u32`: `default` when absent, an error when present with the wrong type.
    pub fn u32_or(&self, key: &str, default: u32) -> Result<u32, PluginError> {
        match self.get(key) {
            None => Ok(default),
            Some(_) => self.u32(key),
        }
    }

    /// A required number, as `f32`.
    pub fn f32(&self, key: &str) -> Result<f32, PluginError> {
        let v = self.require(key)?;
        v.as_f64()
            .map(|x| x as f32)
            .ok_or_else(|| bad_type(key, "a number", v))
    }

    /// An optional number: `default` when absent.
    pub fn f32_or(&self, key: &str, default: f32) -> Result<f32, PluginError> {
        match self.get(key) {
            None => Ok(default),
            Some(_) => self.f32(key),
        }
    }

    /// An optional bool: `default` when absent.
    pub fn bool_or(&self, key: &str, default: bool) -> Result<bool, PluginError> {
        match self.get(key) {
            None => Ok(default),
            Some(MetaValue::Bool(b)) => Ok(*b),
            Some(v) => Err(bad_type(key, "bool", v)),
        }
    }

    /// A per-layer `u32`: the key may hold one value for every layer or an array of `n_layer`
    /// values (as GGUF files do for e.g. `attention.head_count_kv` of hybrid models).
    pub fn per_layer_u32(&self, key: &str, n_layer: u32) -> Result<Vec<u32>, PluginError> {
        let v = self.require(key)?;
        match v {
            MetaValue::Array(items) => {
                if items.len() != n_layer as usize {
                    return Err(PluginError::BadKey {
                        key: key.into(),
                        message: format!("expected {n_layer} values, found {}", items.len()).into(),
                    });
                }
                items
                    .iter()
                    .map(|x| {
                        x.as_u64()
                            .and_then(|x| u32::try_from(x).ok())
                            .ok_or_else(|| bad_type(key, "array of u32", x))
                    })
                    .collect()
            }
            _ => Ok(vec![self.u32(key)?; n_layer as usize]),
        }
    }

    /// An optional array of integers (e.g. `rope.dimension_sections`); empty when absent.
    pub fn u32_array_or_empty(&self, key: &str) -> Result<Vec<u32>, PluginError> {
        match self.get(key) {
            None => Ok(Vec::new()),
            Some(MetaValue::Array(items)) => items
                .iter()
                .map(|x| {
                    x.as_u64()
                        .and_then(|x| u32::try_from(x).ok())
                        .ok_or_else(|| bad_type(key, "array of u32", x))
                })
                .collect(),
            Some(v) => Err(bad_type(key, "array", v)),
        }
    }

    /// The tensor named `name`, if the file has it.
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensors.iter().find(|t| t.name.as_str() == name)
    }

    /// The `blk.N.{suffix}` tensor of the lowest layer `N` that has one (the first tensor that
    /// carries a per-layer hyperparameter).
    pub fn first_layer_tensor(&self, suffix: &str) -> Option<&TensorInfo> {
        self.tensors
            .iter()
            .filter_map(|t| {
                let (n, rest) = t.name.as_str().strip_prefix("blk.")?.split_once('.')?;
                (rest == suffix).then_some((n.parse::<u64>().ok()?, t))
            })
            .min_by_key(|(n, _)| *n)
            .map(|(_, t)| t)
    }

    /// Layers the tensors name: the `N` such that layers 0 to `N − 1` each have a `blk.{i}.…`
    /// tensor (the GGUF naming every architecture follows). It never exceeds the tensor count, so
    /// a table sized by it is as large as the file's header at most.
    pub fn layers_named(&self) -> u64 {
        let named: std::collections::HashSet<u64> = self
            .tensors
            .iter()
            .filter_map(|t| {
                let (n, _) = t.name.as_str().strip_prefix("blk.")?.split_once('.')?;
                n.parse::<u64>().ok()
            })
            .collect();
        (0..).take_while(|i| named.contains(i)).count() as u64
    }

    fn require(&self, key: &str) -> Result<&MetaValue, PluginError> {
        self.get(key)
            .ok_or_else(|| PluginError::MissingKey { key: key.into() })
    }
}

fn bad_type(key: &str, expected: &str, found: &MetaValue) -> PluginError {
    PluginError::BadKey {
        key: key.into(),
        message: format!("expected {expected}, found {} {found:?}", found.type_name()).into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view() -> ModelFileView {
        ModelFileView {
            metadata: vec![
                MetaEntry {
                    key: "a.n".into(),
                    value: MetaValue::U32(4),
                },
                MetaEntry {
                    key: "a.kv".into(),
                    value: MetaValue::Array(vec![MetaValue::I32(0), MetaValue::I32(2)].into()),
                },
                MetaEntry {
                    key: "a.s".into(),
                    value: MetaValue::String("x".into()),
                },
            ]
            .into(),
            tensors: RVec::new(),
        }
    }

    #[test]
    fn getters_name_the_key_on_error() {
        let v = view();
        assert_eq!(v.u32("a.n"), Ok(4));
        assert_eq!(
            v.u32("a.missing"),
            Err(PluginError::MissingKey {
                key: "a.missing".into()
            })
        );
        let e = v.u32("a.s").unwrap_err().to_string();
        assert!(e.contains("a.s") && e.contains("string"), "{e}");
        assert_eq!(v.u32_or("a.none", 7), Ok(7));
    }

    #[test]
    fn per_layer_values_broadcast_or_check_length() {
        let v = view();
        assert_eq!(v.per_layer_u32("a.n", 3), Ok(vec![4, 4, 4]));
        assert_eq!(v.per_layer_u32("a.kv", 2), Ok(vec![0, 2]));
        assert!(v.per_layer_u32("a.kv", 3).is_err());
    }
}
