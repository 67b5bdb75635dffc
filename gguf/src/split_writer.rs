//! Writing a model as split parts `<prefix>-0000N-of-0000M.gguf`, each a complete GGUF file with
//! the `split.no`, `split.count` and `split.tensors.count` keys (u16, u16, i32, as llama.cpp).

use crate::split::split_path;
use crate::{
    GgufError, GgufWriter, TensorInfo, TensorSink, Value, KEY_ALIGNMENT, KEY_SPLIT_COUNT,
    KEY_SPLIT_NO, KEY_SPLIT_TENSORS_COUNT,
};
use std::io;
use std::path::{Path, PathBuf};

/// When to start a new part. A part always holds at least one tensor, so a single tensor larger
/// than `max_bytes` gets a part of its own.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct SplitLimits {
    /// Most tensors in one part (`None`: no limit).
    pub max_tensors: Option<usize>,
    /// Most bytes of (padded) tensor data in one part (`None`: no limit).
    pub max_bytes: Option<u64>,
}

/// Writes the tensors and metadata of `model` as split parts next to `prefix`; the first part
/// holds all metadata, later parts only the split keys (and `general.alignment` when set).
/// `fill` supplies each tensor's bytes as for [`GgufWriter::write_to`] (its info is the one in the
/// part being written). Returns the paths written, in order.
pub fn write_split<F>(
    model: &GgufWriter,
    prefix: &Path,
    limits: SplitLimits,
    mut fill: F,
) -> Result<Vec<PathBuf>, GgufError>
where
    F: FnMut(&TensorInfo, &mut TensorSink) -> io::Result<()>,
{
    let invalid = |why: String| GgufError::Invalid {
        file: prefix.display().to_string(),
        why,
    };
    let groups = plan(model, limits);
    let count = u16::try_from(groups.len()).ok().ok_or_else(|| {
        invalid(format!(
            "{} parts is more than a split name holds",
            groups.len()
        ))
    })?;
    let total = i32::try_from(model.tensors().len())
        .map_err(|_| invalid("too many tensors for split.tensors.count".to_owned()))?;
    let mut paths = Vec::with_capacity(groups.len());
    for (no, group) in groups.iter().enumerate() {
        let mut part = GgufWriter::with_version(model.version())?;
        for e in model.metadata().entries() {
            if no == 0 || e.key == KEY_ALIGNMENT {
                part.set(&e.key, e.value.clone())?;
            }
        }
        // `no < count <= u16::MAX`, so it fits in u16.
        part.set(KEY_SPLIT_NO, Value::U16(no as u16))?;
        part.set(KEY_SPLIT_COUNT, Value::U16(count))?;
        part.set(KEY_SPLIT_TENSORS_COUNT, Value::I32(total))?;
        for t in group {
            part.add_tensor(&t.name, t.dtype, &t.shape)?;
        }
        let path = split_path(prefix, no as u32 + 1, count.into());
        part.write_file(&path, &mut fill)?;
        paths.push(path);
    }
    Ok(paths)
}

/// Groups the tensors into parts in order, starting a new part when adding a tensor would pass a
/// limit. A model without tensors still gets one part.
fn plan(model: &GgufWriter, limits: SplitLimits) -> Vec<Vec<&TensorInfo>> {
    let align = model.alignment();
    let mut groups: Vec<Vec<&TensorInfo>> = vec![Vec::new()];
    let mut bytes = 0u64;
    for t in model.tensors() {
        let size = t.size.div_ceil(align).saturating_mul(align);
        // `groups` is never empty: it starts with one group and only grows.
        let cur = groups.len() - 1;
        let full_count = limits
            .max_tensors
            .is_some_and(|m| groups[cur].len() >= m.max(1));
        let full_bytes = limits
            .max_bytes
            .is_some_and(|m| bytes.saturating_add(size) > m);
        if !groups[cur].is_empty() && (full_count || full_bytes) {
            groups.push(Vec::new());
            bytes = 0;
        }
        let cur = groups.len() - 1;
        groups[cur].push(t);
        bytes = bytes.saturating_add(size);
    }
    groups
}
