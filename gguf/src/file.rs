//! One GGUF file on disk: memory-mapped, parsed and checked, with tensor bytes as slices of the
//! mapping.

use crate::{parse, GgufError, Header, Metadata, TensorInfo};
use memmap2::Mmap;
use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};

/// An open GGUF file. Tensor data is read from a read-only memory map and never copied.
///
/// The file must not be modified by anyone while it is open (as with every mmap-based loader).
#[derive(Debug)]
pub struct GgufFile {
    path: PathBuf,
    map: Option<Mmap>,
    header: Header,
    /// Tensor name to index in `header.tensors`.
    index: HashMap<String, usize>,
}

impl GgufFile {
    /// Opens, maps and parses the file at `path`, checking every tensor range.
    pub fn open(path: impl AsRef<Path>) -> Result<GgufFile, GgufError> {
        let path = path.as_ref();
        let name = path.display().to_string();
        let io = |source| GgufError::Io {
            file: name.clone(),
            source,
        };
        let file = File::open(path).map_err(io)?;
        let len = file.metadata().map_err(io)?.len();
        let map = if len == 0 {
            None
        } else {
            // SAFETY: the map is read-only and private to this value; the documented contract
            // of `GgufFile` is that the file is not changed while it is open. Every access goes
            // through ranges checked against the mapping's length.
            Some(unsafe { Mmap::map(&file) }.map_err(io)?)
        };
        let bytes: &[u8] = map.as_deref().unwrap_or(&[]);
        let header = parse(bytes, &name)?;
        let index = header
            .tensors
            .iter()
            .enumerate()
            .map(|(i, t)| (t.name.clone(), i))
            .collect();
        Ok(GgufFile {
            path: path.to_owned(),
            map,
            header,
            index,
        })
    }

    /// The path the file was opened from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The parsed header.
    pub fn header(&self) -> &Header {
        &self.header
    }

    /// The metadata pairs.
    pub fn metadata(&self) -> &Metadata {
        &self.header.metadata
    }

    /// The metadata pairs, to put overrides over them.
    pub fn metadata_mut(&mut self) -> &mut Metadata {
        &mut self.header.metadata
    }

    /// The tensor infos, in file order.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.header.tensors
    }

    /// The tensor named `name`, if any.
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.index
            .get(name)
            .and_then(|&i| self.header.tensors.get(i))
    }

    /// The whole mapped file.
    pub fn bytes(&self) -> &[u8] {
        self.map.as_deref().unwrap_or(&[])
    }

    /// The bytes of tensor `t`, a slice of the mapping. A `t` from another file whose range does
    /// not lie in this one is refused with [`GgufError::TensorOutOfBounds`].
    pub fn tensor_data(&self, t: &TensorInfo) -> Result<&[u8], GgufError> {
        let bytes = self.bytes();
        let end = t.start.checked_add(t.size);
        end.and_then(|e| bytes.get(usize::try_from(t.start).ok()?..usize::try_from(e).ok()?))
            .ok_or_else(|| GgufError::TensorOutOfBounds {
                file: self.header.source.clone(),
                offset: t.info_offset,
                tensor: t.name.clone(),
                start: t.start,
                end: end.unwrap_or(u64::MAX),
                file_len: bytes.len() as u64,
            })
    }

    /// The bytes of the tensor named `name`, or `None` when there is no such tensor.
    pub fn data(&self, name: &str) -> Option<&[u8]> {
        self.tensor(name).and_then(|t| self.tensor_data(t).ok())
    }
}
