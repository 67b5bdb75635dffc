//! GGUF reader and writer: versions 2 and 3 (little-endian), every metadata value type, checked
//! tensor ranges, memory-mapped data, split files (`name-00001-of-00003.gguf`), and a streaming
//! writer for multi-gigabyte files.
//!
//! [`parse`] is a pure function over bytes (fuzzed in `fuzz/`); [`GgufFile`] maps one file;
//! [`GgufModel`] opens all parts of a split model; [`GgufWriter`] and [`write_split`] write files.
//!
//! ```
//! use bloomery_gguf::{GgufFile, GgufWriter};
//! use bloomery_plugin_api::DType;
//! use std::io::Write;
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let dir = tempfile::tempdir()?;
//! let path = dir.path().join("tiny.gguf");
//! let mut w = GgufWriter::new();
//! w.set("general.architecture", "demo")?;
//! w.set("demo.block_count", 2u32)?;
//! w.add_tensor("token_embd.weight", DType::F32, &[4, 2])?;
//! // Tensor bytes are streamed: the callback writes exactly `t.size` bytes for each tensor.
//! w.write_file(&path, |t, sink| sink.write_all(&vec![0u8; t.size as usize]))?;
//!
//! let f = GgufFile::open(&path)?;
//! assert_eq!(f.metadata().get_u32("demo.block_count")?, 2);
//! assert_eq!(f.data("token_embd.weight").map(<[u8]>::len), Some(32));
//! # Ok(())
//! # }
//! ```

#![deny(missing_docs)]

mod cursor;
mod data_check;
mod error;
mod file;
mod parse;
mod split;
mod split_writer;
mod tensor;
mod validate;
mod value;
mod writer;

pub use data_check::{check_tensor_data, DataFault};
pub use error::GgufError;
pub use file::GgufFile;
pub use parse::{parse, parse_prefix, Header, MAGIC};
pub use split::{split_name, split_path, GgufModel, ModelTensor, SplitName};
pub use split_writer::{write_split, SplitLimits};
pub use tensor::TensorInfo;
pub use value::{Array, Entry, Metadata, Value, ValueType};
pub use writer::{GgufWriter, TensorSink};

/// Data alignment used when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// Most dimensions a tensor may have (`GGML_MAX_DIMS`).
pub const MAX_DIMS: usize = 4;
/// Deepest nesting of arrays of arrays that the reader accepts (guards the stack).
pub const MAX_ARRAY_DEPTH: usize = 16;
/// The alignment key.
pub const KEY_ALIGNMENT: &str = "general.alignment";
/// Split key: 0-based number of this part (u16).
pub const KEY_SPLIT_NO: &str = "split.no";
/// Split key: number of parts (u16).
pub const KEY_SPLIT_COUNT: &str = "split.count";
/// Split key: number of tensors in all parts together (i32).
pub const KEY_SPLIT_TENSORS_COUNT: &str = "split.tensors.count";
