//! Host-memory buffers of a CPU device: owned allocations and zero-copy views of host memory (the
//! mapped model file), named by their address, with every access checked against its region.

use std::alloc::Layout;
use std::collections::BTreeMap;
use std::sync::RwLock;

use bloomery_plugin_api::tensor::TensorRef;
use bloomery_plugin_api::PluginError;

/// Alignment of owned buffers (a cache line, enough for any SIMD load).
pub const ALIGN: usize = 64;

#[derive(Debug)]
struct Region {
    bytes: u64,
    /// `Some` for owned allocations (freed with this layout), `None` for mapped host memory.
    owned: Option<Layout>,
    /// Times the same address was mapped; the region goes when the count reaches zero.
    maps: u32,
}

/// The buffers of one device.
#[derive(Debug, Default)]
pub struct Buffers {
    regions: RwLock<BTreeMap<u64, Region>>,
}

fn poisoned() -> PluginError {
    PluginError::device("buffer table lock poisoned by an earlier panic")
}

impl Buffers {
    /// Allocates `bytes` (zeroed, 64-byte aligned); the handle is the address.
    pub fn alloc(&self, bytes: u64) -> Result<u64, PluginError> {
        let size = usize::try_from(bytes.max(1)).map_err(|_| PluginError::OutOfMemory {
            requested: bytes,
            available: 0,
        })?;
        let layout = Layout::from_size_align(size, ALIGN)
            .map_err(|_| PluginError::invalid(format!("cannot allocate {bytes} bytes")))?;
        // SAFETY: the layout has a nonzero size (at least 1).
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        if ptr.is_null() {
            return Err(PluginError::OutOfMemory {
                requested: bytes,
                available: 0,
            });
        }
        let handle = ptr as u64;
        let mut regions = self.regions.write().map_err(|_| poisoned())?;
        regions.insert(
            handle,
            Region {
                bytes,
                owned: Some(layout),
                maps: 1,
            },
        );
        Ok(handle)
    }

    /// Registers host memory at `ptr` as a buffer without copying.
    pub fn map_host(&self, ptr: usize, bytes: u64) -> Result<u64, PluginError> {
        if ptr == 0 {
            return Err(PluginError::invalid("map_host of a null pointer"));
        }
        let handle = ptr as u64;
        let mut regions = self.regions.write().map_err(|_| poisoned())?;
        match regions.get_mut(&handle) {
            Some(r) if r.owned.is_none() => {
                r.bytes = r.bytes.max(bytes);
                r.maps += 1;
            }
            Some(_) => {
                return Err(PluginError::invalid(format!(
                    "map_host({handle:#x}): address is an owned buffer"
                )))
            }
            None => {
                regions.insert(
                    handle,
                    Region {
                        bytes,
                        owned: None,
                        maps: 1,
                    },
                );
            }
        }
        Ok(handle)
    }

    /// Frees an owned buffer or drops one mapping of host memory.
    pub fn free(&self, handle: u64) -> Result<(), PluginError> {
        let mut regions = self.regions.write().map_err(|_| poisoned())?;
        let Some(region) = regions.get_mut(&handle) else {
            return Err(PluginError::invalid(format!(
                "free of unknown buffer {handle:#x}"
            )));
        };
        region.maps -= 1;
        if region.maps > 0 {
            return Ok(());
        }
        let owned = region.owned;
        regions.remove(&handle);
        if let Some(layout) = owned {
            // SAFETY: `handle` was returned by `alloc_zeroed` with this layout and is removed from
            // the table, so it is freed exactly once.
            unsafe { std::alloc::dealloc(handle as *mut u8, layout) };
        }
        Ok(())
    }

    /// Checks that `len` bytes at `offset` lie inside buffer `handle`; returns the address.
    pub fn check(&self, handle: u64, offset: u64, len: u64) -> Result<*mut u8, PluginError> {
        let regions = self.regions.read().map_err(|_| poisoned())?;
        let region = regions
            .get(&handle)
            .ok_or_else(|| PluginError::invalid(format!("unknown buffer {handle:#x}")))?;
        let end = offset.checked_add(len);
        if end.is_none_or(|e| e > region.bytes) {
            return Err(PluginError::invalid(format!(
                "access of {len} bytes at offset {offset} is outside buffer {handle:#x} of {} bytes",
                region.bytes
            )));
        }
        Ok((handle + offset) as *mut u8)
    }

    /// Checks a tensor against its buffer; returns the address of its first element.
    pub fn check_tensor(&self, t: &TensorRef) -> Result<*mut u8, PluginError> {
        let span = t.span_bytes().ok_or_else(|| {
            PluginError::invalid(format!(
                "tensor of {} {:?} has no valid layout",
                t.dtype, t.ne
            ))
        })?;
        self.check(t.buffer, t.offset, span)
    }

    /// Copies host bytes into a buffer.
    pub fn write(&self, handle: u64, offset: u64, data: &[u8]) -> Result<(), PluginError> {
        let dst = self.check(handle, offset, data.len() as u64)?;
        // SAFETY: `check` proved dst..dst+len lies inside a live region; `data` is a separate
        // host slice borrowed for the call.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), dst, data.len()) };
        Ok(())
    }

    /// Copies buffer bytes out.
    pub fn read(&self, handle: u64, offset: u64, out: &mut [u8]) -> Result<(), PluginError> {
        let src = self.check(handle, offset, out.len() as u64)?;
        // SAFETY: `check` proved src..src+len lies inside a live region.
        unsafe { std::ptr::copy_nonoverlapping(src, out.as_mut_ptr(), out.len()) };
        Ok(())
    }

    /// Copies between two buffers (regions may overlap).
    pub fn copy(
        &self,
        src: u64,
        src_offset: u64,
        dst: u64,
        dst_offset: u64,
        bytes: u64,
    ) -> Result<(), PluginError> {
        let s = self.check(src, src_offset, bytes)?;
        let d = self.check(dst, dst_offset, bytes)?;
        let n = usize::try_from(bytes).map_err(|_| PluginError::invalid("copy too large"))?;
        // SAFETY: both ranges were checked to lie inside live regions; `copy` allows overlap.
        unsafe { std::ptr::copy(s, d, n) };
        Ok(())
    }
}

impl Drop for Buffers {
    fn drop(&mut self) {
        let Ok(regions) = self.regions.get_mut() else {
            return;
        };
        for (&handle, r) in regions.iter() {
            if let Some(layout) = r.owned {
                // SAFETY: owned regions were allocated with this layout and are freed once, here,
                // as the table is dropped.
                unsafe { std::alloc::dealloc(handle as *mut u8, layout) };
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounds_are_checked_and_buffers_freed_once() {
        let b = Buffers::default();
        let h = b.alloc(16).unwrap();
        b.write(h, 8, &[1, 2, 3, 4]).unwrap();
        let mut out = [0u8; 4];
        b.read(h, 8, &mut out).unwrap();
        assert_eq!(out, [1, 2, 3, 4]);
        assert!(b.write(h, 14, &[0; 4]).is_err());
        assert!(b.read(h, u64::MAX, &mut out).is_err());
        b.free(h).unwrap();
        assert!(b.free(h).is_err());
        assert!(b.read(h, 0, &mut out).is_err());
    }

    #[test]
    fn mapped_memory_is_shared_not_copied() {
        let data = [7u8; 32];
        let b = Buffers::default();
        let h = b.map_host(data.as_ptr() as usize, 32).unwrap();
        let mut out = [0u8; 2];
        b.read(h, 30, &mut out).unwrap();
        assert_eq!(out, [7, 7]);
        b.free(h).unwrap();
    }
}
