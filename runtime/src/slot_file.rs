//! The file `/slots/:id?action=save` writes and `restore` reads: a header naming the model it came
//! from, the tokens the slot held, the slot's state buffers and a SHA-256 of all of it. Every
//! field is checked on read, the digest first (a flipped bit anywhere is refused, never restored);
//! a file of another model or a damaged one is refused with a named error. Files are opened
//! without following a symbolic link in their last component, for reading or for writing: a link
//! placed in the slot folder cannot send a save or a restore elsewhere.
//!
//! Layout (little-endian): `BLOOMSLT`, version u32 (2), identity length u32 + UTF-8 identity,
//! token count u32 + token ids u32, part count u32, then per part its length u64 + bytes, then the
//! SHA-256 of every byte before it.

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use sha2::{Digest, Sha256};
use thiserror::Error;

const MAGIC: &[u8; 8] = b"BLOOMSLT";
const VERSION: u32 = 2;
const DIGEST: usize = 32;

/// Why a slot file was refused.
#[derive(Debug, Error)]
pub enum SlotFileError {
    /// Reading or writing failed.
    #[error("slot file {path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// The cause.
        source: std::io::Error,
    },
    /// The name is a symbolic link, which slot files never follow.
    #[error("slot file {path} is a symbolic link; slot files are read and written only in place")]
    Link {
        /// The file.
        path: String,
    },
    /// Not a slot file, truncated or damaged.
    #[error("slot file {path} is not a valid bloomery slot file: {why}")]
    Corrupt {
        /// The file.
        path: String,
        /// What is wrong.
        why: String,
    },
    /// Saved from another model (or another cache type or layout).
    #[error("slot file {path} was saved from another model ({saved}); this server runs {running}")]
    OtherModel {
        /// The file.
        path: String,
        /// The identity in the file.
        saved: String,
        /// This model's identity.
        running: String,
    },
}

/// A slot's saved contents.
#[derive(Debug, Clone, PartialEq)]
pub struct SlotFile {
    /// The model identity it was saved from.
    pub identity: String,
    /// Tokens the slot held.
    pub tokens: Vec<u32>,
    /// The state buffers' bytes.
    pub parts: Vec<Vec<u8>>,
}

/// The error of opening `path`: a symbolic link is named as one.
fn open_error(path: &Path, source: std::io::Error) -> SlotFileError {
    let shown = path.display().to_string();
    if source.raw_os_error() == Some(libc::ELOOP) {
        SlotFileError::Link { path: shown }
    } else {
        SlotFileError::Io {
            path: shown,
            source,
        }
    }
}

/// Writes bytes to a file and to the digest.
struct Hashed {
    file: File,
    digest: Sha256,
    n: u64,
}

impl Hashed {
    fn put(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        self.digest.update(bytes);
        self.n += bytes.len() as u64;
        self.file.write_all(bytes)
    }
}

impl SlotFile {
    /// Writes the file; returns the bytes written.
    pub fn write(&self, path: &Path) -> Result<u64, SlotFileError> {
        let io = |source| SlotFileError::Io {
            path: path.display().to_string(),
            source,
        };
        let file = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .custom_flags(libc::O_NOFOLLOW)
            .open(path)
            .map_err(|e| open_error(path, e))?;
        let mut head = Vec::new();
        head.extend_from_slice(MAGIC);
        head.extend_from_slice(&VERSION.to_le_bytes());
        head.extend_from_slice(&(self.identity.len() as u32).to_le_bytes());
        head.extend_from_slice(self.identity.as_bytes());
        head.extend_from_slice(&(self.tokens.len() as u32).to_le_bytes());
        for t in &self.tokens {
            head.extend_from_slice(&t.to_le_bytes());
        }
        head.extend_from_slice(&(self.parts.len() as u32).to_le_bytes());
        let mut out = Hashed {
            file,
            digest: Sha256::new(),
            n: 0,
        };
        out.put(&head).map_err(io)?;
        for p in &self.parts {
            out.put(&(p.len() as u64).to_le_bytes()).map_err(io)?;
            out.put(p).map_err(io)?;
        }
        let digest = out.digest.finalize();
        out.file.write_all(&digest).map_err(io)?;
        out.file.flush().map_err(io)?;
        Ok(out.n + DIGEST as u64)
    }

    /// Reads and checks a file against the running model's `identity`; returns it and the
    /// bytes read.
    pub fn read(path: &Path, identity: &str) -> Result<(SlotFile, u64), SlotFileError> {
        let shown = path.display().to_string();
        let mut bytes = Vec::new();
        OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW)
            .open(path)
            .map_err(|e| open_error(path, e))?
            .read_to_end(&mut bytes)
            .map_err(|source| SlotFileError::Io {
                path: shown.clone(),
                source,
            })?;
        let corrupt = |why: &str| SlotFileError::Corrupt {
            path: shown.clone(),
            why: why.to_owned(),
        };
        let mut r = Reader { b: &bytes, at: 0 };
        if r.take(8)
            .ok_or_else(|| corrupt("too short for the magic"))?
            != MAGIC
        {
            return Err(corrupt("wrong magic"));
        }
        let version = r.u32().ok_or_else(|| corrupt("truncated header"))?;
        if version != VERSION {
            return Err(corrupt(&format!("version {version}, expected {VERSION}")));
        }
        let body = bytes
            .len()
            .checked_sub(DIGEST)
            .filter(|&n| n >= r.at)
            .ok_or_else(|| corrupt("too short for its digest"))?;
        if Sha256::digest(&bytes[..body])[..] != bytes[body..] {
            return Err(corrupt(
                "its SHA-256 does not match its contents (damaged or cut short)",
            ));
        }
        let mut r = Reader {
            b: &bytes[..body],
            at: r.at,
        };
        let n = r.u32().ok_or_else(|| corrupt("truncated header"))? as usize;
        let saved = r
            .take(n)
            .and_then(|s| std::str::from_utf8(s).ok())
            .ok_or_else(|| corrupt("truncated or non-UTF-8 identity"))?
            .to_owned();
        if saved != identity {
            return Err(SlotFileError::OtherModel {
                path: shown,
                saved,
                running: identity.to_owned(),
            });
        }
        let n_tokens = r.u32().ok_or_else(|| corrupt("truncated token count"))? as usize;
        if n_tokens > (body - r.at) / 4 {
            return Err(corrupt("token count larger than the file"));
        }
        let tokens = (0..n_tokens)
            .map(|_| r.u32())
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| corrupt("truncated tokens"))?;
        let n_parts = r.u32().ok_or_else(|| corrupt("truncated part count"))? as usize;
        let mut parts = Vec::new();
        for i in 0..n_parts {
            let len = r
                .u64()
                .ok_or_else(|| corrupt(&format!("truncated length of part {i}")))?;
            let p = usize::try_from(len)
                .ok()
                .and_then(|l| r.take(l))
                .ok_or_else(|| corrupt(&format!("part {i} is cut short")))?;
            parts.push(p.to_vec());
        }
        if r.at != body {
            return Err(corrupt("trailing bytes after the last part"));
        }
        let n = bytes.len() as u64;
        Ok((
            SlotFile {
                identity: saved,
                tokens,
                parts,
            },
            n,
        ))
    }
}

struct Reader<'a> {
    b: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let end = self.at.checked_add(n)?;
        let s = self.b.get(self.at..end)?;
        self.at = end;
        Some(s)
    }
    fn u32(&mut self) -> Option<u32> {
        self.take(4)
            .map(|s| u32::from_le_bytes([s[0], s[1], s[2], s[3]]))
    }
    fn u64(&mut self) -> Option<u64> {
        self.take(8)
            .map(|s| u64::from_le_bytes([s[0], s[1], s[2], s[3], s[4], s[5], s[6], s[7]]))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> SlotFile {
        SlotFile {
            identity: "qwen3moe 42 tensors 0123".into(),
            tokens: vec![1, 2, 3],
            parts: vec![vec![9; 24], vec![], vec![7; 5]],
        }
    }

    #[test]
    fn round_trip_and_every_truncation_is_refused_by_name() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.bin");
        let n = sample().write(&path).unwrap();
        let (back, read) = SlotFile::read(&path, &sample().identity).unwrap();
        assert_eq!((back, read), (sample(), n));
        let bytes = std::fs::read(&path).unwrap();
        for cut in 0..bytes.len() {
            std::fs::write(&path, &bytes[..cut]).unwrap();
            let e = SlotFile::read(&path, &sample().identity).unwrap_err();
            assert!(matches!(e, SlotFileError::Corrupt { .. }), "cut {cut}: {e}");
        }
        let mut extra = bytes.clone();
        extra.push(0);
        std::fs::write(&path, &extra).unwrap();
        assert!(matches!(
            SlotFile::read(&path, &sample().identity),
            Err(SlotFileError::Corrupt { .. })
        ));
    }

    #[test]
    fn a_file_of_another_model_is_refused_naming_both() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.bin");
        sample().write(&path).unwrap();
        let e = SlotFile::read(&path, "gemma3 7 tensors ffff").unwrap_err();
        assert!(matches!(e, SlotFileError::OtherModel { .. }));
        assert!(e.to_string().contains("gemma3") && e.to_string().contains("qwen3moe"));
    }

    #[test]
    fn a_flipped_bit_anywhere_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.bin");
        sample().write(&path).unwrap();
        let bytes = std::fs::read(&path).unwrap();
        for at in 0..bytes.len() {
            let mut flipped = bytes.clone();
            flipped[at] ^= 0x10;
            std::fs::write(&path, &flipped).unwrap();
            let e = SlotFile::read(&path, &sample().identity).unwrap_err();
            assert!(matches!(e, SlotFileError::Corrupt { .. }), "byte {at}: {e}");
        }
    }

    #[test]
    fn symbolic_links_are_not_followed() {
        let dir = tempfile::tempdir().unwrap();
        let real = dir.path().join("real.bin");
        sample().write(&real).unwrap();
        let before = std::fs::read(&real).unwrap();
        let link = dir.path().join("link.bin");
        std::os::unix::fs::symlink(&real, &link).unwrap();
        let e = SlotFile::read(&link, &sample().identity).unwrap_err();
        assert!(matches!(e, SlotFileError::Link { .. }), "{e}");
        let e = sample().write(&link).unwrap_err();
        assert!(matches!(e, SlotFileError::Link { .. }), "{e}");
        assert_eq!(std::fs::read(&real).unwrap(), before);
    }
}
