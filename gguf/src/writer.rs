//! The GGUF writer: metadata and tensor infos are collected first, then the header is written and
//! each tensor's bytes are streamed from a callback, so a file of any size never sits in memory.

use crate::parse::{align_up, MAGIC};
use crate::validate::tensor_size;
use crate::value::{Array, Entry, Metadata, Value};
use crate::{GgufError, TensorInfo, DEFAULT_ALIGNMENT, KEY_ALIGNMENT, MAX_ARRAY_DEPTH, MAX_DIMS};
use bloomery_plugin_api::DType;
use std::collections::HashSet;
use std::fs::File;
use std::io::{self, BufWriter, Read, Write};
use std::path::Path;

/// Name used for the writer in errors raised before a file is named.
const WRITER: &str = "(gguf writer)";

/// Builds a GGUF file: [`GgufWriter::set`] metadata, [`GgufWriter::add_tensor`] tensor infos, then
/// [`GgufWriter::write_to`] or [`GgufWriter::write_file`] with a callback that supplies each
/// tensor's bytes.
#[derive(Clone, Debug)]
pub struct GgufWriter {
    version: u32,
    alignment: u64,
    metadata: Metadata,
    tensors: Vec<TensorInfo>,
    names: HashSet<String>,
    /// Length of the unpadded header, kept up to date as pairs and tensors are added.
    header_len: u64,
}

impl Default for GgufWriter {
    fn default() -> Self {
        GgufWriter::new()
    }
}

/// The writer a data callback writes one tensor's bytes into; it counts them and refuses bytes
/// past the tensor's size.
pub struct TensorSink<'a> {
    inner: &'a mut dyn Write,
    remaining: u64,
    written: u64,
    overflow: bool,
}

impl Write for TensorSink<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if buf.len() as u64 > self.remaining {
            self.overflow = true;
            return Err(io::Error::other("more bytes than the tensor holds"));
        }
        let n = self.inner.write(buf)?;
        self.remaining -= n as u64;
        self.written += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

impl GgufWriter {
    /// An empty GGUF version 3 writer with the default alignment (32).
    pub fn new() -> GgufWriter {
        GgufWriter {
            version: 3,
            alignment: DEFAULT_ALIGNMENT,
            metadata: Metadata::new(WRITER),
            tensors: Vec::new(),
            names: HashSet::new(),
            header_len: 24,
        }
    }

    /// An empty writer for GGUF `version` 2 or 3.
    pub fn with_version(version: u32) -> Result<GgufWriter, GgufError> {
        if !(2..=3).contains(&version) {
            return Err(GgufError::Invalid {
                file: WRITER.to_owned(),
                why: format!("cannot write GGUF version {version}, only 2 or 3"),
            });
        }
        Ok(GgufWriter {
            version,
            ..GgufWriter::new()
        })
    }

    /// The GGUF version that will be written.
    pub fn version(&self) -> u32 {
        self.version
    }

    /// The data alignment.
    pub fn alignment(&self) -> u64 {
        self.alignment
    }

    /// Adds a metadata pair. Keys must be unique; `general.alignment` must be a u32 power of two
    /// and sets the alignment of the tensor data.
    pub fn set(&mut self, key: &str, value: impl Into<Value>) -> Result<(), GgufError> {
        let value = value.into();
        if let Value::Array(a) = &value {
            if array_depth(a) > MAX_ARRAY_DEPTH {
                return Err(GgufError::ArrayTooDeep {
                    file: WRITER.to_owned(),
                    offset: 0,
                    key: key.to_owned(),
                    max: MAX_ARRAY_DEPTH,
                });
            }
        }
        if key == KEY_ALIGNMENT {
            match value {
                Value::U32(a) if a.is_power_of_two() => self.alignment = a.into(),
                ref v => {
                    return Err(GgufError::BadAlignment {
                        file: WRITER.to_owned(),
                        offset: 0,
                        found: format!("{v:?}"),
                    })
                }
            }
        }
        let len = 12 + key.len() as u64 + value_len(&value);
        self.metadata.push(Entry {
            key: key.to_owned(),
            value,
            offset: 0,
        })?;
        self.header_len += len;
        self.layout();
        Ok(())
    }

    /// Sets `general.alignment` (a nonzero power of two).
    pub fn set_alignment(&mut self, alignment: u32) -> Result<(), GgufError> {
        self.set(KEY_ALIGNMENT, Value::U32(alignment))
    }

    /// Adds a tensor info; its bytes come later from the data callback. The shape is checked as
    /// the reader checks it (1 to 4 nonzero dimensions, whole blocks, no overflow, unique name).
    pub fn add_tensor(
        &mut self,
        name: &str,
        dtype: DType,
        shape: &[u64],
    ) -> Result<&TensorInfo, GgufError> {
        if shape.is_empty() || shape.len() > MAX_DIMS {
            return Err(GgufError::BadDimCount {
                file: WRITER.to_owned(),
                offset: 0,
                tensor: name.to_owned(),
                n_dims: shape.len().try_into().unwrap_or(u32::MAX),
            });
        }
        let size = tensor_size(WRITER, 0, name, dtype, shape)?;
        if !self.names.insert(name.to_owned()) {
            return Err(GgufError::DuplicateTensor {
                file: WRITER.to_owned(),
                offset: 0,
                tensor: name.to_owned(),
            });
        }
        self.tensors.push(TensorInfo {
            name: name.to_owned(),
            shape: shape.to_vec(),
            dtype,
            offset: 0,
            start: 0,
            size,
            info_offset: 0,
        });
        self.header_len += 24 + name.len() as u64 + 8 * shape.len() as u64;
        self.layout();
        let last = self.tensors.len() - 1;
        Ok(&self.tensors[last])
    }

    /// The metadata pairs added so far, in order.
    pub fn metadata(&self) -> &Metadata {
        &self.metadata
    }

    /// The tensor infos added so far, with the offsets and absolute starts they will be written at.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    /// Length of the header with its padding: where the tensor data will start.
    pub fn data_offset(&self) -> u64 {
        align_up(self.header_len, self.alignment).unwrap_or(u64::MAX)
    }

    /// Length of the whole file that will be written.
    pub fn file_len(&self) -> u64 {
        let data: u64 = self.tensors.iter().map(|t| self.padded(t.size)).sum();
        self.data_offset() + data
    }

    fn padded(&self, size: u64) -> u64 {
        align_up(size, self.alignment).unwrap_or(u64::MAX)
    }

    /// Recomputes every tensor's offset (after a tensor or the alignment changed).
    fn layout(&mut self) {
        let mut offset = 0u64;
        for i in 0..self.tensors.len() {
            self.tensors[i].offset = offset;
            offset = offset.saturating_add(self.padded(self.tensors[i].size));
        }
        let data_offset = self.data_offset();
        for t in &mut self.tensors {
            t.start = data_offset.saturating_add(t.offset);
        }
    }

    /// The header: magic, version, counts, metadata and tensor infos, without padding.
    fn header_bytes(&self) -> Vec<u8> {
        let mut b = Vec::new();
        b.extend_from_slice(&MAGIC);
        b.extend_from_slice(&self.version.to_le_bytes());
        b.extend_from_slice(&(self.tensors.len() as u64).to_le_bytes());
        b.extend_from_slice(&(self.metadata.len() as u64).to_le_bytes());
        for e in self.metadata.entries() {
            put_str(&mut b, &e.key);
            b.extend_from_slice(&(e.value.value_type() as u32).to_le_bytes());
            put_value(&mut b, &e.value);
        }
        for t in &self.tensors {
            put_str(&mut b, &t.name);
            b.extend_from_slice(&(t.shape.len() as u32).to_le_bytes());
            for d in &t.shape {
                b.extend_from_slice(&d.to_le_bytes());
            }
            b.extend_from_slice(&t.dtype.0.to_le_bytes());
            b.extend_from_slice(&t.offset.to_le_bytes());
        }
        b
    }

    /// Writes the file to `out`; `fill(t, sink)` must write exactly `t.size` bytes of tensor `t`
    /// into `sink`. `file` names the output in errors. Returns the number of bytes written.
    pub fn write_to<W, F>(&self, mut out: W, file: &str, mut fill: F) -> Result<u64, GgufError>
    where
        W: Write,
        F: FnMut(&TensorInfo, &mut TensorSink) -> io::Result<()>,
    {
        let io = |source| GgufError::Io {
            file: file.to_owned(),
            source,
        };
        let header = self.header_bytes();
        debug_assert_eq!(header.len() as u64, self.header_len);
        let data_offset = self.data_offset();
        out.write_all(&header).map_err(io)?;
        zeros(&mut out, data_offset - header.len() as u64).map_err(io)?;
        let mut pos = data_offset;
        for t in &self.tensors {
            let mut sink = TensorSink {
                inner: &mut out,
                remaining: t.size,
                written: 0,
                overflow: false,
            };
            let result = fill(t, &mut sink);
            let (written, overflow) = (sink.written, sink.overflow);
            if overflow || (result.is_ok() && written != t.size) {
                return Err(GgufError::TensorDataSize {
                    file: file.to_owned(),
                    offset: pos,
                    tensor: t.name.clone(),
                    expected: t.size,
                    written: if overflow { t.size + 1 } else { written },
                });
            }
            result.map_err(io)?;
            let pad = self.padded(t.size) - t.size;
            zeros(&mut out, pad).map_err(io)?;
            pos += t.size + pad;
        }
        out.flush().map_err(io)?;
        Ok(pos)
    }

    /// Creates the file at `path` and writes it through a 1 MiB buffer (see [`Self::write_to`]).
    pub fn write_file<F>(&self, path: impl AsRef<Path>, fill: F) -> Result<u64, GgufError>
    where
        F: FnMut(&TensorInfo, &mut TensorSink) -> io::Result<()>,
    {
        let path = path.as_ref();
        let name = path.display().to_string();
        let f = File::create(path).map_err(|source| GgufError::Io {
            file: name.clone(),
            source,
        })?;
        self.write_to(BufWriter::with_capacity(1 << 20, f), &name, fill)
    }
}

/// Levels of array nesting: 1 for an array of scalars, as the reader counts them.
fn array_depth(a: &Array) -> usize {
    match a {
        Array::Array(v) => 1 + v.iter().map(array_depth).max().unwrap_or(0),
        _ => 1,
    }
}

/// Writes `n` zero bytes (padding; at most one alignment, which may be up to 2^31).
fn zeros(out: &mut impl Write, n: u64) -> io::Result<()> {
    io::copy(&mut io::repeat(0).take(n), out).map(|_| ())
}

/// Encoded length of a value (without its type field).
fn value_len(v: &Value) -> u64 {
    match v {
        Value::String(s) => 8 + s.len() as u64,
        Value::Array(a) => array_len(a),
        v => v.value_type().min_size(),
    }
}

/// Encoded length of an array with its element type and count fields.
fn array_len(a: &Array) -> u64 {
    let body = match a {
        Array::String(v) => v.iter().map(|s| 8 + s.len() as u64).sum(),
        Array::Array(v) => v.iter().map(array_len).sum(),
        a => a.elem_type().min_size() * a.len() as u64,
    };
    12 + body
}

fn put_str(b: &mut Vec<u8>, s: &str) {
    b.extend_from_slice(&(s.len() as u64).to_le_bytes());
    b.extend_from_slice(s.as_bytes());
}

fn put_value(b: &mut Vec<u8>, v: &Value) {
    match v {
        Value::U8(x) => b.push(*x),
        Value::I8(x) => b.extend_from_slice(&x.to_le_bytes()),
        Value::U16(x) => b.extend_from_slice(&x.to_le_bytes()),
        Value::I16(x) => b.extend_from_slice(&x.to_le_bytes()),
        Value::U32(x) => b.extend_from_slice(&x.to_le_bytes()),
        Value::I32(x) => b.extend_from_slice(&x.to_le_bytes()),
        Value::U64(x) => b.extend_from_slice(&x.to_le_bytes()),
        Value::I64(x) => b.extend_from_slice(&x.to_le_bytes()),
        Value::F32(x) => b.extend_from_slice(&x.to_le_bytes()),
        Value::F64(x) => b.extend_from_slice(&x.to_le_bytes()),
        Value::Bool(x) => b.push(u8::from(*x)),
        Value::String(s) => put_str(b, s),
        Value::Array(a) => put_array(b, a),
    }
}

macro_rules! put_all {
    ($b:expr, $v:expr) => {
        for x in $v {
            $b.extend_from_slice(&x.to_le_bytes());
        }
    };
}

fn put_array(b: &mut Vec<u8>, a: &Array) {
    b.extend_from_slice(&(a.elem_type() as u32).to_le_bytes());
    b.extend_from_slice(&(a.len() as u64).to_le_bytes());
    match a {
        Array::U8(v) => b.extend_from_slice(v),
        Array::I8(v) => put_all!(b, v),
        Array::U16(v) => put_all!(b, v),
        Array::I16(v) => put_all!(b, v),
        Array::U32(v) => put_all!(b, v),
        Array::I32(v) => put_all!(b, v),
        Array::U64(v) => put_all!(b, v),
        Array::I64(v) => put_all!(b, v),
        Array::F32(v) => put_all!(b, v),
        Array::F64(v) => put_all!(b, v),
        Array::Bool(v) => b.extend(v.iter().map(|&x| u8::from(x))),
        Array::String(v) => v.iter().for_each(|s| put_str(b, s)),
        Array::Array(v) => v.iter().for_each(|x| put_array(b, x)),
    }
}
