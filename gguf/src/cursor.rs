//! A bounds-checked little-endian reader over a byte slice that knows its file name and the
//! absolute offset of every field, so each failure becomes a named error with a position.

use crate::GgufError;

/// Reads fields from `bytes`, starting at offset 0 of the file named `file`.
pub(crate) struct Cursor<'a> {
    pub(crate) file: &'a str,
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    pub(crate) fn new(file: &'a str, bytes: &'a [u8]) -> Self {
        Cursor {
            file,
            bytes,
            pos: 0,
        }
    }

    /// The absolute offset of the next field.
    pub(crate) fn pos(&self) -> u64 {
        self.pos as u64
    }

    /// Bytes left after the next field's start.
    pub(crate) fn remaining(&self) -> u64 {
        (self.bytes.len() - self.pos) as u64
    }

    /// Takes `n` bytes, or fails with [`GgufError::Truncated`] naming `what`.
    pub(crate) fn take(&mut self, n: u64, what: &'static str) -> Result<&'a [u8], GgufError> {
        let available = self.remaining();
        if n > available {
            return Err(GgufError::Truncated {
                file: self.file.to_owned(),
                offset: self.pos(),
                what,
                needed: n,
                available,
            });
        }
        // `n <= remaining <= usize::MAX`, so the cast is lossless and the range is in bounds.
        let n = n as usize;
        let out = &self.bytes[self.pos..self.pos + n];
        self.pos += n;
        Ok(out)
    }

    /// Takes exactly `N` bytes as an array.
    pub(crate) fn array<const N: usize>(
        &mut self,
        what: &'static str,
    ) -> Result<[u8; N], GgufError> {
        let s = self.take(N as u64, what)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }

    pub(crate) fn u32(&mut self, what: &'static str) -> Result<u32, GgufError> {
        self.array(what).map(u32::from_le_bytes)
    }

    pub(crate) fn u64(&mut self, what: &'static str) -> Result<u64, GgufError> {
        self.array(what).map(u64::from_le_bytes)
    }

    /// Reads a count of items that each take at least `min_size` bytes, and refuses a count that
    /// cannot fit in the bytes after it, before anything is allocated for it.
    pub(crate) fn count(&mut self, min_size: u64, what: &'static str) -> Result<u64, GgufError> {
        let offset = self.pos();
        let count = self.u64(what)?;
        let available = self.remaining();
        match count.checked_mul(min_size) {
            Some(need) if need <= available => Ok(count),
            _ => Err(GgufError::CountTooLarge {
                file: self.file.to_owned(),
                offset,
                what,
                count,
                available,
            }),
        }
    }

    /// Reads a GGUF string: u64 length, then that many UTF-8 bytes.
    pub(crate) fn string(&mut self, what: &'static str) -> Result<String, GgufError> {
        let len = self.count(1, what)?;
        let at = self.pos();
        let bytes = self.take(len, what)?;
        match std::str::from_utf8(bytes) {
            Ok(s) => Ok(s.to_owned()),
            Err(_) => Err(GgufError::InvalidUtf8 {
                file: self.file.to_owned(),
                offset: at,
                what,
            }),
        }
    }
}
