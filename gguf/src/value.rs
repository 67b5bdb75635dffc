//! Metadata values: the thirteen GGUF value types, typed arrays, and the ordered key/value table
//! with typed getters that fail with named errors.

use crate::GgufError;
use std::collections::HashMap;

/// A GGUF metadata value type id (`gguf_type`).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum ValueType {
    /// u8
    U8 = 0,
    /// i8
    I8 = 1,
    /// u16
    U16 = 2,
    /// i16
    I16 = 3,
    /// u32
    U32 = 4,
    /// i32
    I32 = 5,
    /// f32
    F32 = 6,
    /// bool (one byte, 0 or 1)
    Bool = 7,
    /// UTF-8 string with a u64 length
    String = 8,
    /// array: element type u32, count u64, elements
    Array = 9,
    /// u64
    U64 = 10,
    /// i64
    I64 = 11,
    /// f64
    F64 = 12,
}

impl ValueType {
    /// The type for an id, or `None` for an id outside 0..=12.
    pub fn from_id(id: u32) -> Option<ValueType> {
        use ValueType::*;
        Some(match id {
            0 => U8,
            1 => I8,
            2 => U16,
            3 => I16,
            4 => U32,
            5 => I32,
            6 => F32,
            7 => Bool,
            8 => String,
            9 => Array,
            10 => U64,
            11 => I64,
            12 => F64,
            _ => return None,
        })
    }

    /// The fewest bytes one value of this type takes in a file (a string's length field, an
    /// array's type and count fields).
    pub fn min_size(self) -> u64 {
        use ValueType::*;
        match self {
            U8 | I8 | Bool => 1,
            U16 | I16 => 2,
            U32 | I32 | F32 => 4,
            U64 | I64 | F64 | String => 8,
            Array => 12,
        }
    }

    /// The lower-case name used in messages (`"u32"`, `"string"`).
    pub fn name(self) -> &'static str {
        use ValueType::*;
        match self {
            U8 => "u8",
            I8 => "i8",
            U16 => "u16",
            I16 => "i16",
            U32 => "u32",
            I32 => "i32",
            F32 => "f32",
            Bool => "bool",
            String => "string",
            Array => "array",
            U64 => "u64",
            I64 => "i64",
            F64 => "f64",
        }
    }
}

/// One metadata value.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    /// u8
    U8(u8),
    /// i8
    I8(i8),
    /// u16
    U16(u16),
    /// i16
    I16(i16),
    /// u32
    U32(u32),
    /// i32
    I32(i32),
    /// u64
    U64(u64),
    /// i64
    I64(i64),
    /// f32
    F32(f32),
    /// f64
    F64(f64),
    /// bool
    Bool(bool),
    /// string
    String(String),
    /// array
    Array(Array),
}

/// A metadata array: all elements share one type, kept in a typed vector so that a large array
/// costs no more memory than its bytes in the file (strings and nested arrays at most ~3x).
#[derive(Clone, Debug, PartialEq)]
pub enum Array {
    /// u8 elements
    U8(Vec<u8>),
    /// i8 elements
    I8(Vec<i8>),
    /// u16 elements
    U16(Vec<u16>),
    /// i16 elements
    I16(Vec<i16>),
    /// u32 elements
    U32(Vec<u32>),
    /// i32 elements
    I32(Vec<i32>),
    /// u64 elements
    U64(Vec<u64>),
    /// i64 elements
    I64(Vec<i64>),
    /// f32 elements
    F32(Vec<f32>),
    /// f64 elements
    F64(Vec<f64>),
    /// bool elements
    Bool(Vec<bool>),
    /// string elements
    String(Vec<String>),
    /// nested arrays, each with its own element type
    Array(Vec<Array>),
}

impl Value {
    /// The value's type.
    pub fn value_type(&self) -> ValueType {
        match self {
            Value::U8(_) => ValueType::U8,
            Value::I8(_) => ValueType::I8,
            Value::U16(_) => ValueType::U16,
            Value::I16(_) => ValueType::I16,
            Value::U32(_) => ValueType::U32,
            Value::I32(_) => ValueType::I32,
            Value::U64(_) => ValueType::U64,
            Value::I64(_) => ValueType::I64,
            Value::F32(_) => ValueType::F32,
            Value::F64(_) => ValueType::F64,
            Value::Bool(_) => ValueType::Bool,
            Value::String(_) => ValueType::String,
            Value::Array(_) => ValueType::Array,
        }
    }

    /// Any integer value that is not negative, widened to u64.
    pub fn as_uint(&self) -> Option<u64> {
        match *self {
            Value::U8(v) => Some(v.into()),
            Value::U16(v) => Some(v.into()),
            Value::U32(v) => Some(v.into()),
            Value::U64(v) => Some(v),
            Value::I8(v) => u64::try_from(v).ok(),
            Value::I16(v) => u64::try_from(v).ok(),
            Value::I32(v) => u64::try_from(v).ok(),
            Value::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }
}

impl Array {
    /// The element type.
    pub fn elem_type(&self) -> ValueType {
        match self {
            Array::U8(_) => ValueType::U8,
            Array::I8(_) => ValueType::I8,
            Array::U16(_) => ValueType::U16,
            Array::I16(_) => ValueType::I16,
            Array::U32(_) => ValueType::U32,
            Array::I32(_) => ValueType::I32,
            Array::U64(_) => ValueType::U64,
            Array::I64(_) => ValueType::I64,
            Array::F32(_) => ValueType::F32,
            Array::F64(_) => ValueType::F64,
            Array::Bool(_) => ValueType::Bool,
            Array::String(_) => ValueType::String,
            Array::Array(_) => ValueType::Array,
        }
    }

    /// The number of elements.
    pub fn len(&self) -> usize {
        match self {
            Array::U8(v) => v.len(),
            Array::I8(v) => v.len(),
            Array::U16(v) => v.len(),
            Array::I16(v) => v.len(),
            Array::U32(v) => v.len(),
            Array::I32(v) => v.len(),
            Array::U64(v) => v.len(),
            Array::I64(v) => v.len(),
            Array::F32(v) => v.len(),
            Array::F64(v) => v.len(),
            Array::Bool(v) => v.len(),
            Array::String(v) => v.len(),
            Array::Array(v) => v.len(),
        }
    }

    /// True when the array has no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

macro_rules! from_impls {
    ($($t:ty => $v:ident, $a:ident;)*) => {
        $(
            impl From<$t> for Value {
                fn from(x: $t) -> Value { Value::$v(x) }
            }
            impl From<Vec<$t>> for Value {
                fn from(x: Vec<$t>) -> Value { Value::Array(Array::$a(x)) }
            }
        )*
    };
}

from_impls! {
    u8 => U8, U8; i8 => I8, I8; u16 => U16, U16; i16 => I16, I16; u32 => U32, U32;
    i32 => I32, I32; u64 => U64, U64; i64 => I64, I64; f32 => F32, F32; f64 => F64, F64;
    bool => Bool, Bool; String => String, String;
}

impl From<&str> for Value {
    fn from(x: &str) -> Value {
        Value::String(x.to_owned())
    }
}

impl From<Array> for Value {
    fn from(x: Array) -> Value {
        Value::Array(x)
    }
}

/// One key/value pair as read from (or to be written to) a file.
#[derive(Clone, Debug, PartialEq)]
pub struct Entry {
    /// The key.
    pub key: String,
    /// The value.
    pub value: Value,
    /// Byte offset of the pair in its file (0 for pairs not read from a file).
    pub offset: u64,
}

/// The metadata table: pairs in file order, with lookup by key.
#[derive(Clone, Debug, Default)]
pub struct Metadata {
    file: String,
    entries: Vec<Entry>,
    index: HashMap<String, usize>,
}

macro_rules! getters {
    ($($(#[$doc:meta])* $fn:ident -> $t:ty, $v:ident, $name:literal;)*) => {
        $(
            $(#[$doc])*
            pub fn $fn(&self, key: &str) -> Result<$t, GgufError> {
                let e = self.entry(key)?;
                match &e.value {
                    Value::$v(x) => Ok(x.clone()),
                    other => Err(self.wrong(e, $name, other)),
                }
            }
        )*
    };
}

impl Metadata {
    /// An empty table for the file named `file` (used in error messages).
    pub fn new(file: &str) -> Metadata {
        Metadata {
            file: file.to_owned(),
            ..Metadata::default()
        }
    }

    /// Appends a pair; a key already present is refused with [`GgufError::DuplicateKey`].
    pub fn push(&mut self, entry: Entry) -> Result<(), GgufError> {
        if self.index.contains_key(&entry.key) {
            return Err(GgufError::DuplicateKey {
                file: self.file.clone(),
                offset: entry.offset,
                key: entry.key,
            });
        }
        self.index.insert(entry.key.clone(), self.entries.len());
        self.entries.push(entry);
        Ok(())
    }

    /// Puts `value` at `key`: over the present pair's value (its place kept), or as a new pair
    /// at the end (offset 0: not read from the file).
    pub fn set(&mut self, key: &str, value: Value) {
        match self.index.get(key) {
            Some(&i) => self.entries[i].value = value,
            None => {
                self.index.insert(key.to_owned(), self.entries.len());
                self.entries.push(Entry {
                    key: key.to_owned(),
                    value,
                    offset: 0,
                });
            }
        }
    }

    /// The pairs in file order.
    pub fn entries(&self) -> &[Entry] {
        &self.entries
    }

    /// The number of pairs.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// True when there are no pairs.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The value of `key`, if present.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.index
            .get(key)
            .and_then(|&i| self.entries.get(i))
            .map(|e| &e.value)
    }

    /// The pair for `key`, or [`GgufError::MissingKey`].
    pub fn entry(&self, key: &str) -> Result<&Entry, GgufError> {
        self.index
            .get(key)
            .and_then(|&i| self.entries.get(i))
            .ok_or_else(|| GgufError::MissingKey {
                file: self.file.clone(),
                key: key.to_owned(),
            })
    }

    fn wrong(&self, e: &Entry, expected: &'static str, found: &Value) -> GgufError {
        GgufError::WrongType {
            file: self.file.clone(),
            offset: e.offset,
            key: e.key.clone(),
            expected,
            found: found.value_type().name(),
        }
    }

    getters! {
        /// The u8 value of `key`.
        get_u8 -> u8, U8, "u8";
        /// The i8 value of `key`.
        get_i8 -> i8, I8, "i8";
        /// The u16 value of `key`.
        get_u16 -> u16, U16, "u16";
        /// The i16 value of `key`.
        get_i16 -> i16, I16, "i16";
        /// The u32 value of `key`.
        get_u32 -> u32, U32, "u32";
        /// The i32 value of `key`.
        get_i32 -> i32, I32, "i32";
        /// The u64 value of `key`.
        get_u64 -> u64, U64, "u64";
        /// The i64 value of `key`.
        get_i64 -> i64, I64, "i64";
        /// The f32 value of `key`.
        get_f32 -> f32, F32, "f32";
        /// The f64 value of `key`.
        get_f64 -> f64, F64, "f64";
        /// The bool value of `key`.
        get_bool -> bool, Bool, "bool";
    }

    /// The string value of `key`.
    pub fn get_str(&self, key: &str) -> Result<&str, GgufError> {
        let e = self.entry(key)?;
        match &e.value {
            Value::String(s) => Ok(s),
            other => Err(self.wrong(e, "string", other)),
        }
    }

    /// The array value of `key`.
    pub fn get_array(&self, key: &str) -> Result<&Array, GgufError> {
        let e = self.entry(key)?;
        match &e.value {
            Value::Array(a) => Ok(a),
            other => Err(self.wrong(e, "array", other)),
        }
    }

    /// The value of `key` as u64, accepting any integer type holding a value that is not negative
    /// (split keys are written as u16 and i32 by different tools).
    pub fn get_uint(&self, key: &str) -> Result<u64, GgufError> {
        let e = self.entry(key)?;
        e.value
            .as_uint()
            .ok_or_else(|| self.wrong(e, "non-negative integer", &e.value))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn getters_name_missing_keys_and_wrong_types() {
        let mut m = Metadata::new("f.gguf");
        m.push(Entry {
            key: "a".into(),
            value: Value::from("x"),
            offset: 24,
        })
        .unwrap();
        m.push(Entry {
            key: "n".into(),
            value: Value::I32(7),
            offset: 40,
        })
        .unwrap();
        assert_eq!(m.get_str("a").unwrap(), "x");
        assert_eq!(m.get_uint("n").unwrap(), 7);
        let e = m.get_u32("a").unwrap_err();
        assert!(matches!(
            e,
            GgufError::WrongType {
                offset: 24,
                expected: "u32",
                found: "string",
                ..
            }
        ));
        assert_eq!(
            e.to_string(),
            "f.gguf @24: key `a`: wrong type: expected u32, found string"
        );
        assert!(matches!(m.get_u32("b"), Err(GgufError::MissingKey { .. })));
        let dup = m.push(Entry {
            key: "a".into(),
            value: Value::U8(1),
            offset: 60,
        });
        assert!(matches!(
            dup,
            Err(GgufError::DuplicateKey { offset: 60, .. })
        ));
    }
}
