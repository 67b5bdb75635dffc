//! GGUF reader and writer: versions 2 and 3 (little-endian), every metadata value type, checked
//! tensor ranges, memory-mapped data, split files (`name-00001-of-00003.gguf`), and a streaming
//! writer for multi-gigabyte files.
//!
//! [`parse`] is a pure function over bytes (fuzzed in `fuzz/`); [`GgufFile`] maps one file;
//! [`GgufModel`] opens all parts of a split model; [`GgufWriter`] and [`write_split`] write files.

mod cursor;
mod error;
mod file;
mod parse;
mod split;
mod split_writer;
mod tensor;
mod validate;
mod value;
mod writer;

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
