//! The one error type of this crate: every refusal names the file and, where it comes from the
//! file's bytes, the byte offset at which the problem was found.

use bloomery_plugin_api::DType;

/// Everything that can go wrong reading, checking or writing a GGUF file.
///
/// `file` is the path (or the `source` name given to [`crate::parse`]); `offset` is the byte offset
/// in that file where the offending field starts.
#[derive(Debug, thiserror::Error)]
pub enum GgufError {
    /// The file could not be opened, mapped, read or written.
    #[error("{file}: {source}")]
    Io {
        /// The file.
        file: String,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// The first four bytes are not `GGUF`.
    #[error("{file} @{offset}: bad magic {found:02x?}, expected \"GGUF\"")]
    BadMagic {
        /// The file.
        file: String,
        /// Always 0.
        offset: u64,
        /// The bytes found.
        found: [u8; 4],
    },
    /// A big-endian GGUF file; only little-endian files are read.
    #[error("{file} @{offset}: big-endian GGUF (version {version}) is not supported")]
    BigEndian {
        /// The file.
        file: String,
        /// Offset of the version field.
        offset: u64,
        /// The version read with the byte order swapped.
        version: u32,
    },
    /// A GGUF version 1 file (32-bit counts), which is not supported.
    #[error("{file} @{offset}: GGUF version 1 is not supported, expected version 2 or 3")]
    Version1 {
        /// The file.
        file: String,
        /// Offset of the version field.
        offset: u64,
    },
    /// A version other than 1, 2 or 3.
    #[error("{file} @{offset}: unsupported GGUF version {version}, expected 2 or 3")]
    UnsupportedVersion {
        /// The file.
        file: String,
        /// Offset of the version field.
        offset: u64,
        /// The version found.
        version: u32,
    },
    /// The file ends inside a field.
    #[error("{file} @{offset}: truncated reading {what}: needs {needed} bytes, {available} left")]
    Truncated {
        /// The file.
        file: String,
        /// Offset of the field that does not fit.
        offset: u64,
        /// What was being read.
        what: &'static str,
        /// Bytes the field needs.
        needed: u64,
        /// Bytes left in the file from `offset`.
        available: u64,
    },
    /// A count or length that cannot fit in the bytes that remain (checked before allocating).
    #[error("{file} @{offset}: {what} {count} cannot fit in the {available} bytes left")]
    CountTooLarge {
        /// The file.
        file: String,
        /// Offset of the count field.
        offset: u64,
        /// What is counted.
        what: &'static str,
        /// The count found.
        count: u64,
        /// Bytes left in the file after the count.
        available: u64,
    },
    /// A key, tensor name or string value that is not UTF-8.
    #[error("{file} @{offset}: {what} is not valid UTF-8")]
    InvalidUtf8 {
        /// The file.
        file: String,
        /// Offset of the string's bytes.
        offset: u64,
        /// What the string is.
        what: &'static str,
    },
    /// A metadata value type id outside 0..=12.
    #[error("{file} @{offset}: unknown metadata value type {type_id} for key `{key}`")]
    UnknownValueType {
        /// The file.
        file: String,
        /// Offset of the type field.
        offset: u64,
        /// The key being read.
        key: String,
        /// The type id found.
        type_id: u32,
    },
    /// Arrays nested deeper than [`crate::MAX_ARRAY_DEPTH`].
    #[error("{file} @{offset}: arrays nested deeper than {max} in key `{key}`")]
    ArrayTooDeep {
        /// The file.
        file: String,
        /// Offset of the too-deep array.
        offset: u64,
        /// The key being read.
        key: String,
        /// The nesting limit.
        max: usize,
    },
    /// A metadata key that appears twice.
    #[error("{file} @{offset}: duplicate metadata key `{key}`")]
    DuplicateKey {
        /// The file.
        file: String,
        /// Offset of the second occurrence.
        offset: u64,
        /// The key.
        key: String,
    },
    /// A key that a caller asked for is absent.
    #[error("{file}: missing key `{key}`")]
    MissingKey {
        /// The file.
        file: String,
        /// The key.
        key: String,
    },
    /// A key holds a value of another type than asked for.
    #[error("{file} @{offset}: key `{key}`: wrong type: expected {expected}, found {found}")]
    WrongType {
        /// The file.
        file: String,
        /// Offset of the key/value pair.
        offset: u64,
        /// The key.
        key: String,
        /// The type asked for.
        expected: &'static str,
        /// The type found.
        found: &'static str,
    },
    /// `general.alignment` is not a nonzero power of two stored as u32.
    #[error("{file} @{offset}: general.alignment {found} must be a nonzero power of two (u32)")]
    BadAlignment {
        /// The file.
        file: String,
        /// Offset of the key/value pair.
        offset: u64,
        /// What was found, as text.
        found: String,
    },
    /// A tensor with an unknown GGML type id.
    #[error("{file} @{offset}: tensor `{tensor}` has unknown type {dtype}")]
    UnknownTensorType {
        /// The file.
        file: String,
        /// Offset of the type field.
        offset: u64,
        /// The tensor.
        tensor: String,
        /// The type found.
        dtype: DType,
    },
    /// A tensor with zero or more than four dimensions.
    #[error("{file} @{offset}: tensor `{tensor}` has {n_dims} dimensions, expected 1..=4")]
    BadDimCount {
        /// The file.
        file: String,
        /// Offset of the n_dims field.
        offset: u64,
        /// The tensor.
        tensor: String,
        /// The count found.
        n_dims: u32,
    },
    /// A dimension that is zero, or dimensions whose product overflows.
    #[error("{file} @{offset}: tensor `{tensor}` has bad shape {shape:?}: {why}")]
    BadShape {
        /// The file.
        file: String,
        /// Offset of the tensor info.
        offset: u64,
        /// The tensor.
        tensor: String,
        /// The shape found (ne0 first).
        shape: Vec<u64>,
        /// What is wrong.
        why: &'static str,
    },
    /// ne0 is not a whole number of the type's blocks.
    #[error("{file} @{offset}: tensor `{tensor}` ne0 {ne0} is not a multiple of the {dtype} block {block}")]
    PartialBlock {
        /// The file.
        file: String,
        /// Offset of the tensor info.
        offset: u64,
        /// The tensor.
        tensor: String,
        /// The type.
        dtype: DType,
        /// The first dimension.
        ne0: u64,
        /// Elements per block.
        block: u32,
    },
    /// A tensor offset that is not a multiple of the alignment.
    #[error("{file} @{offset}: tensor `{tensor}` data offset {data_offset} is not a multiple of alignment {alignment}")]
    MisalignedTensor {
        /// The file.
        file: String,
        /// Offset of the tensor's offset field.
        offset: u64,
        /// The tensor.
        tensor: String,
        /// The tensor's offset relative to the data section.
        data_offset: u64,
        /// The alignment.
        alignment: u64,
    },
    /// A tensor whose bytes do not lie inside the file.
    #[error("{file} @{offset}: tensor `{tensor}` bytes {start}..{end} lie outside the file of {file_len} bytes")]
    TensorOutOfBounds {
        /// The file.
        file: String,
        /// Offset of the tensor's offset field.
        offset: u64,
        /// The tensor.
        tensor: String,
        /// Absolute start (saturated on overflow).
        start: u64,
        /// Absolute end (saturated on overflow).
        end: u64,
        /// The file length.
        file_len: u64,
    },
    /// Two tensors whose byte ranges overlap.
    #[error("{file} @{offset}: tensor `{tensor}` (from {start}) overlaps tensor `{other}` (ends at {other_end})")]
    OverlappingTensors {
        /// The file.
        file: String,
        /// Offset of the later tensor's offset field.
        offset: u64,
        /// The later tensor.
        tensor: String,
        /// Its absolute start.
        start: u64,
        /// The earlier tensor.
        other: String,
        /// The earlier tensor's absolute end.
        other_end: u64,
    },
    /// A tensor name that appears twice (in one file or across split parts).
    #[error("{file} @{offset}: duplicate tensor name `{tensor}`")]
    DuplicateTensor {
        /// The file.
        file: String,
        /// Offset of the second occurrence's info (0 in the writer).
        offset: u64,
        /// The tensor.
        tensor: String,
    },
    /// A split part that is not on disk.
    #[error("{file}: missing split part {part} of {count} (needed by {needed_by})")]
    MissingSplitPart {
        /// The missing file.
        file: String,
        /// 1-based part number.
        part: u32,
        /// Number of parts.
        count: u32,
        /// The file that was opened.
        needed_by: String,
    },
    /// A split part whose split keys disagree with its name or with the other parts.
    #[error("{file} @{offset}: split key `{key}` is {found}, expected {expected}")]
    SplitMismatch {
        /// The part.
        file: String,
        /// Offset of the key/value pair (0 when the key is absent).
        offset: u64,
        /// The key.
        key: &'static str,
        /// The value expected.
        expected: u64,
        /// The value found.
        found: u64,
    },
    /// The writer's callback wrote a different number of bytes than the tensor needs.
    #[error("{file} @{offset}: tensor `{tensor}` needs {expected} bytes, the data source gave {written}")]
    TensorDataSize {
        /// The file being written.
        file: String,
        /// Offset of the tensor's data in the output.
        offset: u64,
        /// The tensor.
        tensor: String,
        /// Bytes the tensor needs.
        expected: u64,
        /// Bytes given (a count past `expected` stops at `expected + 1`).
        written: u64,
    },
    /// A value the writer cannot encode (e.g. an empty `file` name for a split prefix).
    #[error("{file}: {why}")]
    Invalid {
        /// The file.
        file: String,
        /// What is wrong.
        why: String,
    },
}

impl GgufError {
    /// The byte offset the error points at, when it comes from a file's bytes.
    pub fn offset(&self) -> Option<u64> {
        use GgufError::*;
        match self {
            Io { .. } | MissingKey { .. } | MissingSplitPart { .. } | Invalid { .. } => None,
            BadMagic { offset, .. }
            | BigEndian { offset, .. }
            | Version1 { offset, .. }
            | UnsupportedVersion { offset, .. }
            | Truncated { offset, .. }
            | CountTooLarge { offset, .. }
            | InvalidUtf8 { offset, .. }
            | UnknownValueType { offset, .. }
            | ArrayTooDeep { offset, .. }
            | DuplicateKey { offset, .. }
            | WrongType { offset, .. }
            | BadAlignment { offset, .. }
            | UnknownTensorType { offset, .. }
            | BadDimCount { offset, .. }
            | BadShape { offset, .. }
            | PartialBlock { offset, .. }
            | MisalignedTensor { offset, .. }
            | TensorOutOfBounds { offset, .. }
            | OverlappingTensors { offset, .. }
            | DuplicateTensor { offset, .. }
            | SplitMismatch { offset, .. }
            | TensorDataSize { offset, .. } => Some(*offset),
        }
    }

    /// The file the error is about.
    pub fn file(&self) -> &str {
        use GgufError::*;
        match self {
            Io { file, .. }
            | BadMagic { file, .. }
            | BigEndian { file, .. }
            | Version1 { file, .. }
            | UnsupportedVersion { file, .. }
            | Truncated { file, .. }
            | CountTooLarge { file, .. }
            | InvalidUtf8 { file, .. }
            | UnknownValueType { file, .. }
            | ArrayTooDeep { file, .. }
            | DuplicateKey { file, .. }
            | MissingKey { file, .. }
            | WrongType { file, .. }
            | BadAlignment { file, .. }
            | UnknownTensorType { file, .. }
            | BadDimCount { file, .. }
            | BadShape { file, .. }
            | PartialBlock { file, .. }
            | MisalignedTensor { file, .. }
            | TensorOutOfBounds { file, .. }
            | OverlappingTensors { file, .. }
            | DuplicateTensor { file, .. }
            | MissingSplitPart { file, .. }
            | SplitMismatch { file, .. }
            | TensorDataSize { file, .. }
            | Invalid { file, .. } => file,
        }
    }
}
