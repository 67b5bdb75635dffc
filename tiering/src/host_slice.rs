//! Bytes of the mapped model file the tier reads (streamed stacks, tables), kept as addresses
//! so the tier can move between threads.

use bloomery_devices::pages::page_size;

/// Bytes of the mapped file: an address kept as an integer so the tier can move between
/// threads. Valid while the model's mapping lives (the tier is dropped before it).
#[derive(Clone, Copy, Debug)]
pub struct HostSlice {
    /// The first byte's address.
    pub addr: usize,
    /// Bytes.
    pub len: usize,
}

impl HostSlice {
    /// The slice of the mapped file holding `bytes`.
    pub fn of(bytes: &[u8]) -> HostSlice {
        HostSlice {
            addr: bytes.as_ptr() as usize,
            len: bytes.len(),
        }
    }

    /// `len` bytes of the slice from byte `from` (clamped to its end).
    pub fn part(&self, from: usize, len: usize) -> HostSlice {
        let from = from.min(self.len);
        HostSlice {
            addr: self.addr + from,
            len: len.min(self.len - from),
        }
    }

    /// The bytes.
    pub fn bytes(&self) -> &[u8] {
        // SAFETY: `addr..addr+len` lies in the model's read-only file mapping, which outlives
        // every tier and executor that holds a HostSlice (LoadedModel's field order).
        unsafe { std::slice::from_raw_parts(self.addr as *const u8, self.len) }
    }

    /// Drops the slice's whole pages from the process's resident memory (the disk tier streams
    /// prompts' layers from the mapping and must not keep them resident). The bytes do not
    /// change: a later read faults the pages in again from the file.
    pub fn release(&self) {
        let page = page_size();
        let lo = self.addr.div_ceil(page) * page;
        let hi = (self.addr + self.len) / page * page;
        if hi > lo {
            // SAFETY: [lo, hi) is whole pages inside the model's read-only shared file mapping,
            // alive while the tier is (see `bytes`). MADV_DONTNEED on such a mapping only unmaps
            // the pages; later reads fault them in from the file with the same bytes, so a copy
            // still reading them is unaffected.
            let _ = unsafe { libc::madvise(lo as *mut libc::c_void, hi - lo, libc::MADV_DONTNEED) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::HostSlice;
    use std::io::Write;

    /// Resident pages of this process (`/proc/self/statm`, second field).
    fn resident_pages() -> usize {
        let statm = std::fs::read_to_string("/proc/self/statm").unwrap();
        statm.split_whitespace().nth(1).unwrap().parse().unwrap()
    }

    #[test]
    fn a_released_slice_leaves_resident_memory_with_its_bytes_unchanged() {
        let mut f = tempfile::NamedTempFile::new().unwrap();
        let bytes: Vec<u8> = (0..64u32 << 20).map(|i| (i % 251) as u8).collect();
        f.write_all(&bytes).unwrap();
        f.flush().unwrap();
        // SAFETY: the temporary file is not modified while mapped.
        let map = unsafe { memmap2::Mmap::map(f.as_file()) }.unwrap();
        let slice = HostSlice {
            addr: map.as_ptr() as usize,
            len: map.len(),
        };
        let sum = |s: &HostSlice| s.bytes().iter().map(|&b| u64::from(b)).sum::<u64>();
        let want = sum(&slice);
        let touched = resident_pages();
        slice.release();
        let released = resident_pages();
        // 64 MiB are 16,384 pages of 4 KiB: at least half of them must have left.
        assert!(
            touched >= released + 8192,
            "resident pages {touched} before the release, {released} after"
        );
        assert_eq!(sum(&slice), want, "the bytes changed");
    }
}
