//! Checks on tensor infos: sizes from shapes with checked arithmetic, alignment, bounds,
//! overlaps and unique names. Each failure is a named [`GgufError`] with the info's offset.

use crate::{GgufError, TensorInfo};
use bloomery_plugin_api::DType;
use std::collections::HashSet;

/// The byte size of a tensor of `dtype` and `shape`, refusing zero dimensions, element counts
/// past `i64::MAX`, a first dimension that is not a whole number of blocks, and overflow.
pub(crate) fn tensor_size(
    file: &str,
    offset: u64,
    tensor: &str,
    dtype: DType,
    shape: &[u64],
) -> Result<u64, GgufError> {
    let bad = |why| GgufError::BadShape {
        file: file.to_owned(),
        offset,
        tensor: tensor.to_owned(),
        shape: shape.to_vec(),
        why,
    };
    if shape.is_empty() {
        return Err(bad("no dimensions"));
    }
    if shape.contains(&0) {
        return Err(bad("a dimension is zero"));
    }
    shape
        .iter()
        .try_fold(1u64, |acc, &d| acc.checked_mul(d))
        .filter(|&n| n <= i64::MAX as u64)
        .ok_or_else(|| bad("element count overflows"))?;
    let Some(layout) = dtype.layout() else {
        return Err(GgufError::UnknownTensorType {
            file: file.to_owned(),
            offset,
            tensor: tensor.to_owned(),
            dtype,
        });
    };
    let ne0 = shape[0];
    if !ne0.is_multiple_of(u64::from(layout.block)) {
        return Err(GgufError::PartialBlock {
            file: file.to_owned(),
            offset,
            tensor: tensor.to_owned(),
            dtype,
            ne0,
            block: layout.block,
        });
    }
    let row = dtype
        .row_bytes(ne0)
        .ok_or_else(|| bad("row size overflows"))?;
    shape[1..]
        .iter()
        .try_fold(row, |acc, &d| acc.checked_mul(d))
        .ok_or_else(|| bad("byte size overflows"))
}

/// Places every tensor at `data_offset + offset` and checks alignment, bounds, names and overlaps.
pub(crate) fn tensors(
    tensors: &mut [TensorInfo],
    file: &str,
    data_offset: u64,
    alignment: u64,
    file_len: u64,
) -> Result<(), GgufError> {
    let mut names = HashSet::with_capacity(tensors.len());
    for t in tensors.iter_mut() {
        if !names.insert(t.name.as_str()) {
            return Err(GgufError::DuplicateTensor {
                file: file.to_owned(),
                offset: t.info_offset,
                tensor: t.name.clone(),
            });
        }
        if !t.offset.is_multiple_of(alignment) {
            return Err(GgufError::MisalignedTensor {
                file: file.to_owned(),
                offset: t.info_offset,
                tensor: t.name.clone(),
                data_offset: t.offset,
                alignment,
            });
        }
        let start = data_offset.checked_add(t.offset);
        let end = start.and_then(|s| s.checked_add(t.size));
        match (start, end) {
            (Some(s), Some(e)) if e <= file_len => t.start = s,
            _ => {
                return Err(GgufError::TensorOutOfBounds {
                    file: file.to_owned(),
                    offset: t.info_offset,
                    tensor: t.name.clone(),
                    start: start.unwrap_or(u64::MAX),
                    end: end.unwrap_or(u64::MAX),
                    file_len,
                })
            }
        }
    }
    let mut order: Vec<usize> = (0..tensors.len()).collect();
    order.sort_by_key(|&i| tensors[i].start);
    for w in order.windows(2) {
        let (a, b) = (&tensors[w[0]], &tensors[w[1]]);
        // Both ranges were checked above, so `a.start + a.size` cannot overflow.
        let a_end = a.start + a.size;
        if b.start < a_end {
            return Err(GgufError::OverlappingTensors {
                file: file.to_owned(),
                offset: b.info_offset,
                tensor: b.name.clone(),
                start: b.start,
                other: a.name.clone(),
                other_end: a_end,
            });
        }
    }
    Ok(())
}
