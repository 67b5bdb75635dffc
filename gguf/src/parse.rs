//! The pure GGUF header parser: magic, version, metadata and tensor infos from a byte slice,
//! followed by the checks of [`crate::validate`]. It never panics and never allocates more than a
//! small multiple of the bytes it has actually read.

use crate::cursor::Cursor;
use crate::value::{Array, Entry, Metadata, Value, ValueType};
use crate::{validate, GgufError, TensorInfo, DEFAULT_ALIGNMENT, MAX_ARRAY_DEPTH, MAX_DIMS};
use bloomery_plugin_api::DType;

/// The four magic bytes every GGUF file starts with.
pub const MAGIC: [u8; 4] = *b"GGUF";

/// Smallest possible key/value pair: empty key (8), type (4), one-byte value.
const MIN_KV_SIZE: u64 = 13;
/// Smallest possible tensor info: empty name (8), n_dims (4), one dim (8), type (4), offset (8).
const MIN_TENSOR_INFO_SIZE: u64 = 32;
/// Upper bound on capacity reserved ahead of reading; vectors grow past it only as items are read.
const RESERVE_CAP: u64 = 4096;

/// A parsed and checked GGUF header.
#[derive(Clone, Debug)]
pub struct Header {
    /// The file name given to the parser (used in error messages).
    pub source: String,
    /// GGUF version: 2 or 3.
    pub version: u32,
    /// The metadata pairs, in file order.
    pub metadata: Metadata,
    /// The tensor infos, in file order, each with a checked byte range.
    pub tensors: Vec<TensorInfo>,
    /// The data alignment (`general.alignment`, default 32).
    pub alignment: u64,
    /// Absolute offset of the tensor data section (the end of the header, aligned).
    pub data_offset: u64,
    /// Length of the whole file in bytes.
    pub file_len: u64,
}

impl Header {
    /// The tensor named `name`, if any.
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensors.iter().find(|t| t.name == name)
    }
}

/// Parses and checks a whole GGUF file held in `bytes`; `source` names it in errors.
pub fn parse(bytes: &[u8], source: &str) -> Result<Header, GgufError> {
    parse_prefix(bytes, bytes.len() as u64, source)
}

/// Parses the header from `prefix`, the first bytes of a file that is `file_len` bytes long, and
/// checks every tensor range against `file_len` (tensor data need not be in `prefix`).
pub fn parse_prefix(prefix: &[u8], file_len: u64, source: &str) -> Result<Header, GgufError> {
    // A prefix longer than the file claims bytes the file does not have.
    let prefix = match usize::try_from(file_len) {
        Ok(n) if n < prefix.len() => &prefix[..n],
        _ => prefix,
    };
    let mut c = Cursor::new(source, prefix);
    let magic = c.array::<4>("magic")?;
    if magic != MAGIC {
        return Err(GgufError::BadMagic {
            file: source.to_owned(),
            offset: 0,
            found: magic,
        });
    }
    let version = read_version(&mut c)?;
    let n_tensors = c.count(MIN_TENSOR_INFO_SIZE, "tensor count")?;
    let n_kv = c.count(MIN_KV_SIZE, "metadata key/value count")?;

    let mut metadata = Metadata::new(source);
    for _ in 0..n_kv {
        metadata.push(read_entry(&mut c)?)?;
    }
    let alignment = read_alignment(&metadata, source)?;

    let mut tensors = Vec::with_capacity(n_tensors.min(RESERVE_CAP) as usize);
    for _ in 0..n_tensors {
        tensors.push(read_tensor_info(&mut c)?);
    }
    let data_offset = align_up(c.pos(), alignment).ok_or_else(|| GgufError::Invalid {
        file: source.to_owned(),
        why: "data offset overflows".to_owned(),
    })?;
    validate::tensors(&mut tensors, source, data_offset, alignment, file_len)?;
    Ok(Header {
        source: source.to_owned(),
        version,
        metadata,
        tensors,
        alignment,
        data_offset,
        file_len,
    })
}

/// Rounds `x` up to a multiple of `align` (a power of two), or `None` on overflow.
pub(crate) fn align_up(x: u64, align: u64) -> Option<u64> {
    Some(x.checked_add(align - 1)? & !(align - 1))
}

fn read_version(c: &mut Cursor) -> Result<u32, GgufError> {
    let offset = c.pos();
    let version = c.u32("version")?;
    let file = c.file.to_owned();
    match version {
        2 | 3 => Ok(version),
        1 => Err(GgufError::Version1 { file, offset }),
        v if v & 0xFFFF == 0 && v != 0 => Err(GgufError::BigEndian {
            file,
            offset,
            version: v.swap_bytes(),
        }),
        v => Err(GgufError::UnsupportedVersion {
            file,
            offset,
            version: v,
        }),
    }
}

fn read_alignment(metadata: &Metadata, source: &str) -> Result<u64, GgufError> {
    let Ok(e) = metadata.entry(crate::KEY_ALIGNMENT) else {
        return Ok(DEFAULT_ALIGNMENT);
    };
    match e.value {
        Value::U32(a) if a.is_power_of_two() => Ok(a.into()),
        ref v => Err(GgufError::BadAlignment {
            file: source.to_owned(),
            offset: e.offset,
            found: format!("{v:?}"),
        }),
    }
}

fn read_type(c: &mut Cursor, key: &str) -> Result<ValueType, GgufError> {
    let offset = c.pos();
    let id = c.u32("value type")?;
    ValueType::from_id(id).ok_or_else(|| GgufError::UnknownValueType {
        file: c.file.to_owned(),
        offset,
        key: key.to_owned(),
        type_id: id,
    })
}

fn read_entry(c: &mut Cursor) -> Result<Entry, GgufError> {
    let offset = c.pos();
    let key = c.string("metadata key")?;
    let ty = read_type(c, &key)?;
    let value = read_value(c, ty, &key)?;
    Ok(Entry { key, value, offset })
}

fn read_value(c: &mut Cursor, ty: ValueType, key: &str) -> Result<Value, GgufError> {
    const W: &str = "metadata value";
    Ok(match ty {
        ValueType::U8 => Value::U8(u8::from_le_bytes(c.array(W)?)),
        ValueType::I8 => Value::I8(i8::from_le_bytes(c.array(W)?)),
        ValueType::U16 => Value::U16(u16::from_le_bytes(c.array(W)?)),
        ValueType::I16 => Value::I16(i16::from_le_bytes(c.array(W)?)),
        ValueType::U32 => Value::U32(u32::from_le_bytes(c.array(W)?)),
        ValueType::I32 => Value::I32(i32::from_le_bytes(c.array(W)?)),
        ValueType::U64 => Value::U64(u64::from_le_bytes(c.array(W)?)),
        ValueType::I64 => Value::I64(i64::from_le_bytes(c.array(W)?)),
        ValueType::F32 => Value::F32(f32::from_le_bytes(c.array(W)?)),
        ValueType::F64 => Value::F64(f64::from_le_bytes(c.array(W)?)),
        ValueType::Bool => Value::Bool(c.array::<1>(W)?[0] != 0),
        ValueType::String => Value::String(c.string("string value")?),
        ValueType::Array => Value::Array(read_array(c, key, 1)?),
    })
}

/// Decodes `n` fixed-size little-endian elements.
macro_rules! fixed {
    ($c:expr, $n:expr, $t:ty, $v:ident) => {{
        let bytes = $c.take($n * std::mem::size_of::<$t>() as u64, "array elements")?;
        Array::$v(
            bytes
                .chunks_exact(std::mem::size_of::<$t>())
                .map(|ch| {
                    let mut a = [0u8; std::mem::size_of::<$t>()];
                    a.copy_from_slice(ch);
                    <$t>::from_le_bytes(a)
                })
                .collect(),
        )
    }};
}

fn read_array(c: &mut Cursor, key: &str, depth: usize) -> Result<Array, GgufError> {
    let offset = c.pos();
    if depth > MAX_ARRAY_DEPTH {
        return Err(GgufError::ArrayTooDeep {
            file: c.file.to_owned(),
            offset,
            key: key.to_owned(),
            max: MAX_ARRAY_DEPTH,
        });
    }
    let ty = read_type(c, key)?;
    // The count is checked against the bytes left before any vector is sized by it.
    let n = c.count(ty.min_size(), "array count")?;
    Ok(match ty {
        ValueType::U8 => Array::U8(c.take(n, "array elements")?.to_vec()),
        ValueType::I8 => fixed!(c, n, i8, I8),
        ValueType::U16 => fixed!(c, n, u16, U16),
        ValueType::I16 => fixed!(c, n, i16, I16),
        ValueType::U32 => fixed!(c, n, u32, U32),
        ValueType::I32 => fixed!(c, n, i32, I32),
        ValueType::U64 => fixed!(c, n, u64, U64),
        ValueType::I64 => fixed!(c, n, i64, I64),
        ValueType::F32 => fixed!(c, n, f32, F32),
        ValueType::F64 => fixed!(c, n, f64, F64),
        ValueType::Bool => Array::Bool(
            c.take(n, "array elements")?
                .iter()
                .map(|&b| b != 0)
                .collect(),
        ),
        ValueType::String => {
            let mut v = Vec::with_capacity(n as usize);
            for _ in 0..n {
                v.push(c.string("string array element")?);
            }
            Array::String(v)
        }
        ValueType::Array => {
            let mut v = Vec::with_capacity(n.min(RESERVE_CAP) as usize);
            for _ in 0..n {
                v.push(read_array(c, key, depth + 1)?);
            }
            Array::Array(v)
        }
    })
}

fn read_tensor_info(c: &mut Cursor) -> Result<TensorInfo, GgufError> {
    let info_offset = c.pos();
    let name = c.string("tensor name")?;
    let dims_at = c.pos();
    let n_dims = c.u32("tensor n_dims")?;
    if n_dims == 0 || n_dims as usize > MAX_DIMS {
        return Err(GgufError::BadDimCount {
            file: c.file.to_owned(),
            offset: dims_at,
            tensor: name,
            n_dims,
        });
    }
    let mut shape = Vec::with_capacity(n_dims as usize);
    for _ in 0..n_dims {
        shape.push(c.u64("tensor dimension")?);
    }
    let type_at = c.pos();
    let dtype = DType(c.u32("tensor type")?);
    if dtype.layout().is_none() {
        return Err(GgufError::UnknownTensorType {
            file: c.file.to_owned(),
            offset: type_at,
            tensor: name,
            dtype,
        });
    }
    let offset = c.u64("tensor offset")?;
    let size = validate::tensor_size(c.file, info_offset, &name, dtype, &shape)?;
    Ok(TensorInfo {
        name,
        shape,
        dtype,
        offset,
        start: 0,
        size,
        info_offset,
    })
}

#[cfg(test)]
#[path = "parse_tests.rs"]
mod tests;
