//! Split models (`name-00001-of-00003.gguf`): finding the sibling parts of any one part, checking
//! their `split.*` keys, and presenting the tensors of all parts as one model.

use crate::{
    GgufError, GgufFile, Metadata, TensorInfo, KEY_SPLIT_COUNT, KEY_SPLIT_NO,
    KEY_SPLIT_TENSORS_COUNT,
};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// The parts of a split file name `<prefix>-<no>-of-<count>.gguf`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SplitName {
    /// Everything before `-<no>-of-<count>.gguf`, directory included.
    pub prefix: PathBuf,
    /// 1-based part number.
    pub no: u32,
    /// Number of parts.
    pub count: u32,
}

/// Recognises a split file name (five-digit part numbers, as llama.cpp writes them).
pub fn split_name(path: &Path) -> Option<SplitName> {
    let file = path.file_name()?.to_str()?;
    let stem = file.strip_suffix(".gguf")?;
    // `stem` ends in "-NNNNN-of-MMMMM" (15 ASCII bytes).
    let cut = stem.len().checked_sub(15)?;
    let (prefix, tail) = (stem.get(..cut)?, stem.get(cut..)?);
    let b = tail.as_bytes();
    let digits = |r: std::ops::Range<usize>| -> Option<u32> {
        let s = tail.get(r)?;
        s.bytes()
            .all(|c| c.is_ascii_digit())
            .then(|| s.parse().ok())?
    };
    if b.first() != Some(&b'-') || tail.get(6..10) != Some("-of-") || prefix.is_empty() {
        return None;
    }
    let (no, count) = (digits(1..6)?, digits(10..15)?);
    if no == 0 || count == 0 || no > count {
        return None;
    }
    Some(SplitName {
        prefix: path.with_file_name(prefix),
        no,
        count,
    })
}

/// The path of part `no` (1-based) of `count`: `<prefix>-0000<no>-of-0000<count>.gguf`.
pub fn split_path(prefix: &Path, no: u32, count: u32) -> PathBuf {
    let mut s = prefix.as_os_str().to_owned();
    s.push(format!("-{no:05}-of-{count:05}.gguf"));
    PathBuf::from(s)
}

/// One tensor of a model, with the part that holds its bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModelTensor {
    /// Index of the part in [`GgufModel::parts`] (0-based).
    pub part: usize,
    /// The tensor's info in that part.
    pub info: TensorInfo,
}

/// A model stored in one GGUF file or split over several, presented as one set of tensors.
#[derive(Debug)]
pub struct GgufModel {
    parts: Vec<GgufFile>,
    tensors: Vec<ModelTensor>,
    index: HashMap<String, usize>,
}

impl GgufModel {
    /// Opens `path`; when its name is a split name, opens and checks all its sibling parts.
    pub fn open(path: impl AsRef<Path>) -> Result<GgufModel, GgufError> {
        let path = path.as_ref();
        let Some(name) = split_name(path) else {
            let file = GgufFile::open(path)?;
            let n = file.tensors().len();
            check_split_keys(file.metadata(), &file, 0, 1, Some(n))?;
            return GgufModel::from_parts(vec![file]);
        };
        let mut parts = Vec::with_capacity(name.count as usize);
        for no in 1..=name.count {
            let p = split_path(&name.prefix, no, name.count);
            if !p.exists() {
                return Err(GgufError::MissingSplitPart {
                    file: p.display().to_string(),
                    part: no,
                    count: name.count,
                    needed_by: path.display().to_string(),
                });
            }
            parts.push(GgufFile::open(&p)?);
        }
        // Place and count first, so a misplaced part is named before any count disagrees.
        let count = u64::from(name.count);
        for (i, part) in parts.iter().enumerate() {
            check_split_keys(part.metadata(), part, i as u64, count, None)?;
        }
        let total: usize = parts.iter().map(|p| p.tensors().len()).sum();
        for (i, part) in parts.iter().enumerate() {
            check_split_keys(part.metadata(), part, i as u64, count, Some(total))?;
        }
        GgufModel::from_parts(parts)
    }

    fn from_parts(parts: Vec<GgufFile>) -> Result<GgufModel, GgufError> {
        let mut tensors = Vec::new();
        let mut index = HashMap::new();
        for (part, file) in parts.iter().enumerate() {
            for info in file.tensors() {
                if index.insert(info.name.clone(), tensors.len()).is_some() {
                    return Err(GgufError::DuplicateTensor {
                        file: file.path().display().to_string(),
                        offset: info.info_offset,
                        tensor: info.name.clone(),
                    });
                }
                tensors.push(ModelTensor {
                    part,
                    info: info.clone(),
                });
            }
        }
        Ok(GgufModel {
            parts,
            tensors,
            index,
        })
    }

    /// The parts, in order (one for an unsplit file).
    pub fn parts(&self) -> &[GgufFile] {
        &self.parts
    }

    /// The model metadata: that of the first part.
    pub fn metadata(&self) -> &Metadata {
        // `open` always yields at least one part.
        self.parts[0].metadata()
    }

    /// The model metadata, to put overrides over it (`--override-kv`).
    pub fn metadata_mut(&mut self) -> &mut Metadata {
        self.parts[0].metadata_mut()
    }

    /// All tensors of all parts, part by part in file order.
    pub fn tensors(&self) -> &[ModelTensor] {
        &self.tensors
    }

    /// The tensor named `name`, if any.
    pub fn tensor(&self, name: &str) -> Option<&ModelTensor> {
        self.index.get(name).and_then(|&i| self.tensors.get(i))
    }

    /// The bytes of tensor `t`, a slice of its part's mapping.
    pub fn tensor_data(&self, t: &ModelTensor) -> Result<&[u8], GgufError> {
        match self.parts.get(t.part) {
            Some(p) => p.tensor_data(&t.info),
            None => Err(GgufError::Invalid {
                file: self.parts[0].path().display().to_string(),
                why: format!(
                    "tensor `{}` names part {} of {}",
                    t.info.name,
                    t.part,
                    self.parts.len()
                ),
            }),
        }
    }

    /// The bytes of the tensor named `name`, or `None` when there is no such tensor.
    pub fn data(&self, name: &str) -> Option<&[u8]> {
        self.tensor(name).and_then(|t| self.tensor_data(t).ok())
    }
}

/// Checks one part's split keys against its place (`no`, 0-based) and the part count; `total` is
/// the tensor count of all parts together (`None`: skip that check). A file with one part may
/// omit the keys.
fn check_split_keys(
    m: &Metadata,
    file: &GgufFile,
    no: u64,
    count: u64,
    total: Option<usize>,
) -> Result<(), GgufError> {
    if count == 1 && m.get(KEY_SPLIT_COUNT).is_none() {
        return Ok(());
    }
    let name = file.path().display().to_string();
    let check = |key: &'static str, expected: u64| -> Result<(), GgufError> {
        let found = m.get_uint(key)?;
        if found != expected {
            return Err(GgufError::SplitMismatch {
                file: name.clone(),
                offset: m.entry(key)?.offset,
                key,
                expected,
                found,
            });
        }
        Ok(())
    };
    check(KEY_SPLIT_COUNT, count)?;
    check(KEY_SPLIT_NO, no)?;
    match total {
        Some(total) => check(KEY_SPLIT_TENSORS_COUNT, total as u64),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_names_parse_and_print() {
        let n = split_name(Path::new("/m/a-b-00002-of-00003.gguf")).unwrap();
        assert_eq!(n.prefix, Path::new("/m/a-b"));
        assert_eq!((n.no, n.count), (2, 3));
        assert_eq!(
            split_path(&n.prefix, 1, 3),
            Path::new("/m/a-b-00001-of-00003.gguf")
        );
        for bad in [
            "a-0000\u{e9}-of-00002.gguf",
            "a-0000\u{e9}of-00002.gguf",
            "\u{e9}\u{e9}\u{e9}\u{e9}\u{e9}\u{e9}\u{e9}\u{e9}.gguf",
            "a.gguf",
            "-00001-of-00002.gguf",
            "a-00003-of-00002.gguf",
            "a-0000x-of-00002.gguf",
            "a-00001-of-00002.bin",
        ] {
            assert!(split_name(Path::new(bad)).is_none(), "{bad}");
        }
    }
}
