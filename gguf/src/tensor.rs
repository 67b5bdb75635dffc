//! Tensor infos: name, shape, element type and where the tensor's bytes lie.

use bloomery_plugin_api::DType;

/// One tensor as described by a file's header.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorInfo {
    /// The tensor name, unique within the file.
    pub name: String,
    /// The dimensions, `ne0` (the contiguous one) first; 1 to 4 of them, none zero.
    pub shape: Vec<u64>,
    /// The element type (a type this build knows).
    pub dtype: DType,
    /// Offset of the bytes from the start of the data section, as stored in the file.
    pub offset: u64,
    /// Absolute offset of the bytes in the file (`data_offset + offset`).
    pub start: u64,
    /// Size of the bytes: `dtype.row_bytes(ne0)` times the other dimensions.
    pub size: u64,
    /// Absolute offset of this tensor's info in the header (0 for tensors not read from a file).
    pub info_offset: u64,
}

impl TensorInfo {
    /// The number of elements (fits in `i64`, checked when the info was read).
    pub fn n_elements(&self) -> u64 {
        self.shape.iter().product()
    }

    /// The absolute byte range `start..start + size` in the file.
    pub fn range(&self) -> std::ops::Range<u64> {
        self.start..self.start + self.size
    }
}
