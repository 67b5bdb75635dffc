//! A kernel plugin's open device, with results instead of `RResult` and buffers freed on drop.

use std::sync::Arc;

use bloomery_plugin_api::kernel::{DeviceConfig, DeviceInfo, KernelDeviceBox};
use bloomery_plugin_api::op::OpSupport;
use bloomery_plugin_api::tensor::{OpCall, TensorRef};
use bloomery_plugin_api::PluginError;

use crate::registry::KernelPluginFile;

/// An open device of a kernel plugin.
pub struct Device {
    inner: KernelDeviceBox,
    /// The plugin's name.
    pub plugin: String,
    /// What the plugin implements.
    pub capabilities: Vec<OpSupport>,
}

/// Device memory, freed when dropped.
pub struct Buffer {
    device: Arc<Device>,
    /// The device's handle.
    pub handle: u64,
    /// Size in bytes.
    pub bytes: u64,
}

impl Buffer {
    /// A tensor shaped and typed as `like`, at the start of this buffer.
    pub fn tensor(&self, like: TensorRef) -> TensorRef {
        TensorRef {
            buffer: self.handle,
            offset: 0,
            ..like
        }
    }
}

impl Drop for Buffer {
    fn drop(&mut self) {
        if let Err(e) = self.device.inner.free(self.handle).into_result() {
            tracing::warn!("freeing device buffer: {e}");
        }
    }
}

/// Page-locked host memory the device copies into on its queue, read here once the device is
/// synchronized ([`Device::alloc_staging`], [`Device::read_through`]).
pub struct Staging {
    buffer: Buffer,
    /// Host address of the buffer's bytes.
    host: usize,
}

impl Device {
    /// Opens device `index` of a kernel plugin.
    pub fn open(
        plugin: &KernelPluginFile,
        config: DeviceConfig,
    ) -> Result<Arc<Device>, PluginError> {
        let inner = plugin.module.open()(&config).into_result()?;
        Ok(Arc::new(Device {
            inner,
            plugin: plugin.name.clone(),
            capabilities: plugin.capabilities.clone(),
        }))
    }

    /// Owns the device's buffer `handle` of `bytes` (freed when the Buffer drops).
    fn own(self: &Arc<Self>, handle: u64, bytes: u64) -> Buffer {
        Buffer {
            device: Arc::clone(self),
            handle,
            bytes,
        }
    }

    /// Allocates `bytes`.
    pub fn alloc(self: &Arc<Self>, bytes: u64) -> Result<Buffer, PluginError> {
        let handle = self.inner.alloc(bytes).into_result()?;
        Ok(self.own(handle, bytes))
    }

    /// Makes host memory usable as a buffer (zero-copy on the CPU).
    ///
    /// # Safety
    /// `ptr..ptr+bytes` must stay valid and unchanged while the buffer lives.
    pub unsafe fn map_host(
        self: &Arc<Self>,
        ptr: *const u8,
        bytes: u64,
    ) -> Result<Buffer, PluginError> {
        let handle = self.inner.map_host(ptr as usize, bytes).into_result()?;
        Ok(self.own(handle, bytes))
    }

    /// Makes page-locked host memory (inside a [`Device::pin_host`] range) a buffer the device's
    /// calls read in place, without a copy (zero-copy on the CPU).
    ///
    /// # Safety
    /// `ptr..ptr+bytes` must stay valid and unchanged while the buffer lives.
    pub unsafe fn map_pinned(
        self: &Arc<Self>,
        ptr: *const u8,
        bytes: u64,
    ) -> Result<Buffer, PluginError> {
        let handle = self.inner.map_pinned(ptr as usize, bytes).into_result()?;
        Ok(self.own(handle, bytes))
    }

    /// Allocates zeroed page-locked host memory the device's calls use in place; returns the
    /// buffer and the host address of its bytes, valid while the buffer lives.
    pub fn alloc_shared(self: &Arc<Self>, bytes: u64) -> Result<(Buffer, usize), PluginError> {
        let s = self.inner.alloc_shared(bytes).into_result()?;
        Ok((self.own(s.handle, bytes), s.host))
    }

    /// Copies bytes into a buffer.
    pub fn write(&self, buffer: &Buffer, offset: u64, data: &[u8]) -> Result<(), PluginError> {
        self.inner
            .write(buffer.handle, offset, data.into())
            .into_result()
    }

    /// Copies bytes into the buffer with handle `handle` (a buffer some other owner keeps alive).
    pub fn write_handle(&self, handle: u64, offset: u64, data: &[u8]) -> Result<(), PluginError> {
        self.inner.write(handle, offset, data.into()).into_result()
    }

    /// Copies `bytes` between two buffers of this device, ordered after the calls submitted so
    /// far.
    pub fn copy(
        &self,
        (src, src_offset): (u64, u64),
        (dst, dst_offset): (u64, u64),
        bytes: u64,
    ) -> Result<(), PluginError> {
        self.inner
            .copy(src, src_offset, dst, dst_offset, bytes)
            .into_result()
    }

    /// Marks the calls submitted so far for [`Device::upload`] (0 where calls run at once).
    pub fn fence(&self) -> Result<u64, PluginError> {
        self.inner.fence().into_result()
    }

    /// Starts copying bytes into the buffer with handle `handle` without waiting, after the calls
    /// marked by fence `after` (0: at once); calls submitted later wait for the copy.
    ///
    /// # Safety
    /// `data` must stay mapped and unchanged until the next [`Device::sync`] returns.
    pub unsafe fn upload(
        &self,
        handle: u64,
        offset: u64,
        data: &[u8],
        after: u64,
    ) -> Result<(), PluginError> {
        self.inner
            .upload(handle, offset, data.into(), after)
            .into_result()
    }

    /// Page-locks host memory for fast copies to the device, until the device closes (a no-op
    /// on the CPU).
    ///
    /// # Safety
    /// `ptr..ptr+bytes` must stay mapped and unchanged while the device is open.
    pub unsafe fn pin_host(&self, ptr: *const u8, bytes: u64) -> Result<(), PluginError> {
        self.inner.pin_host(ptr as usize, bytes).into_result()
    }

    /// The device's name and memory.
    pub fn info(&self) -> DeviceInfo {
        self.inner.info()
    }

    /// Copies bytes out of a buffer.
    pub fn read(&self, handle: u64, offset: u64, out: &mut [u8]) -> Result<(), PluginError> {
        self.inner.read(handle, offset, out.into()).into_result()
    }

    /// Runs op calls.
    pub fn run(&self, calls: &[OpCall]) -> Result<(), PluginError> {
        self.inner.run(calls.into()).into_result()
    }

    /// Holds the calls submitted after this until the 4-byte word at `offset` of the shared
    /// buffer `handle` equals `value` (an `Unsupported` error on devices that run calls at
    /// once); the caller must write the word before it waits for the device.
    pub fn wait_word(&self, handle: u64, offset: u64, value: u32) -> Result<(), PluginError> {
        self.inner.wait_word(handle, offset, value).into_result()
    }

    /// Waits for submitted work.
    pub fn sync(&self) -> Result<(), PluginError> {
        self.inner.sync().into_result()
    }

    /// Records calls into a replayable device graph (an `Unsupported` error where the device has
    /// none).
    pub fn capture(&self, calls: &[OpCall]) -> Result<u64, PluginError> {
        self.inner.capture(calls.into()).into_result()
    }

    /// Replays a captured graph.
    pub fn replay(&self, graph: u64) -> Result<(), PluginError> {
        self.inner.replay(graph).into_result()
    }

    /// Releases a captured graph.
    pub fn release_graph(&self, graph: u64) -> Result<(), PluginError> {
        self.inner.release_graph(graph).into_result()
    }

    /// Allocates `bytes` of staging for [`Device::read_through`].
    pub fn alloc_staging(self: &Arc<Self>, bytes: u64) -> Result<Staging, PluginError> {
        let (buffer, host) = self.alloc_shared(bytes)?;
        Ok(Staging { buffer, host })
    }

    /// Reads the byte ranges `ranges` (buffer handle, offset, length), after the calls submitted
    /// so far, through `staging`: as many as it holds are copied into it on the device's queue,
    /// then one wait and the copies out, in turns. One byte string per range. Many ranges cost
    /// about one synchronous read, where [`Device::read`] waits for each.
    pub fn read_through(
        &self,
        ranges: &[(u64, u64, usize)],
        staging: &Staging,
    ) -> Result<Vec<Vec<u8>>, PluginError> {
        let cap = staging.buffer.bytes as usize;
        let mut out: Vec<Vec<u8>> = ranges
            .iter()
            .map(|&(_, _, len)| Vec::with_capacity(len))
            .collect();
        // (range, staging offset, bytes) copied since the last wait.
        let mut pending: Vec<(usize, usize, usize)> = Vec::new();
        let drain = |pending: &mut Vec<(usize, usize, usize)>, out: &mut [Vec<u8>]| {
            self.sync()?;
            for (i, at, n) in pending.drain(..) {
                // SAFETY: `at..at + n` lies inside the staging buffer (at + n <= cap), alive for
                // this borrow of `staging`; the device finished writing it at the sync above.
                let bytes =
                    unsafe { std::slice::from_raw_parts((staging.host + at) as *const u8, n) };
                out[i].extend_from_slice(bytes);
            }
            Ok::<(), PluginError>(())
        };
        let mut used = 0;
        for (i, &(handle, offset, len)) in ranges.iter().enumerate() {
            let mut done = 0;
            while done < len {
                if used == cap {
                    drain(&mut pending, &mut out)?;
                    used = 0;
                }
                let n = (len - done).min(cap - used);
                self.copy(
                    (handle, offset + done as u64),
                    (staging.buffer.handle, used as u64),
                    n as u64,
                )?;
                pending.push((i, used, n));
                used += n;
                done += n;
            }
        }
        drain(&mut pending, &mut out)?;
        Ok(out)
    }
}
