//! A CUDA device: memory and copies through the driver API, on the device's primary context.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use abi_stable::std_types::{RResult, RSlice, RSliceMut};
use bloomery_plugin_api::kernel::{DeviceConfig, DeviceInfo, KernelDevice};
use bloomery_plugin_api::tensor::OpCall;
use bloomery_plugin_api::PluginError;
use cudarc::driver::{result, CudaContext, DriverError};

use crate::ops::{Buffers, Launcher};
use crate::probe::{read_driver, Bundle, DriverProblem};

fn err(what: &str) -> impl FnOnce(DriverError) -> PluginError + '_ {
    move |e| PluginError::device(format!("{what}: {e:?}"))
}

/// An open CUDA device. Buffers are device allocations named by their device address.
pub struct CudaDevice {
    name: String,
    ctx: Arc<CudaContext>,
    sizes: Mutex<HashMap<u64, u64>>,
    kernels: Launcher,
}

impl CudaDevice {
    /// Opens device `config.index` (refusing cleanly when there is no driver or no such device).
    pub fn open(bundle: &Bundle, config: &DeviceConfig) -> Result<CudaDevice, PluginError> {
        if bundle.ptx.is_empty() {
            return Err(PluginError::device(format!(
                "{} was built without kernels (no nvcc at build time)",
                bundle.name
            )));
        }
        let facts = read_driver().map_err(|p| match p {
            DriverProblem::NoDriver => PluginError::device("no CUDA driver (libcuda.so not found)"),
            DriverProblem::Failed(e) => PluginError::device(format!("CUDA driver failed: {e}")),
        })?;
        let (name, _, _) = facts.devices.get(config.index as usize).ok_or_else(|| {
            PluginError::invalid(format!(
                "no CUDA device {} ({} found)",
                config.index,
                facts.devices.len()
            ))
        })?;
        let ctx = std::panic::catch_unwind(|| CudaContext::new(config.index as usize))
            .map_err(|_| PluginError::device("the CUDA driver lacks an entry point cudarc needs"))?
            .map_err(err("creating the CUDA context"))?;
        let kernels = Launcher::new(Arc::clone(&ctx), bundle.ptx)?;
        Ok(CudaDevice {
            name: format!("{name} ({})", bundle.name),
            ctx,
            sizes: Mutex::new(HashMap::new()),
            kernels,
        })
    }

    fn bind(&self) -> Result<(), PluginError> {
        self.ctx
            .bind_to_thread()
            .map_err(err("binding the CUDA context"))
    }

    fn check(&self, buffer: u64, offset: u64, len: u64) -> Result<u64, PluginError> {
        let sizes = self
            .sizes
            .lock()
            .map_err(|_| PluginError::device("buffer table poisoned"))?;
        let size = sizes
            .get(&buffer)
            .ok_or_else(|| PluginError::invalid(format!("unknown device buffer {buffer:#x}")))?;
        if offset.checked_add(len).is_none_or(|end| end > *size) {
            return Err(PluginError::invalid(format!(
                "{len} bytes at offset {offset} are outside device buffer {buffer:#x} of {size} bytes"
            )));
        }
        Ok(buffer + offset)
    }

    fn alloc_bytes(&self, bytes: u64) -> Result<u64, PluginError> {
        self.bind()?;
        let n = usize::try_from(bytes.max(1))
            .map_err(|_| PluginError::invalid("allocation too large"))?;
        // SAFETY: the context is bound to this thread; the allocation is recorded and freed once.
        let ptr = unsafe { result::malloc_sync(n) }.map_err(|e| match result::mem_get_info() {
            Ok((free, _)) => PluginError::OutOfMemory {
                requested: bytes,
                available: free as u64,
            },
            Err(_) => PluginError::device(format!("cuMemAlloc of {bytes} bytes: {e:?}")),
        })?;
        self.sizes
            .lock()
            .map_err(|_| PluginError::device("buffer table poisoned"))?
            .insert(ptr, bytes);
        Ok(ptr)
    }

    fn free_bytes(&self, buffer: u64) -> Result<(), PluginError> {
        self.bind()?;
        let removed = self
            .sizes
            .lock()
            .map_err(|_| PluginError::device("buffer table poisoned"))?
            .remove(&buffer);
        if removed.is_none() {
            return Err(PluginError::invalid(format!(
                "free of unknown device buffer {buffer:#x}"
            )));
        }
        // SAFETY: `buffer` came from `malloc_sync` and was just removed from the table.
        unsafe { result::free_sync(buffer) }.map_err(err("cuMemFree"))
    }

    fn write_bytes(&self, buffer: u64, offset: u64, data: &[u8]) -> Result<(), PluginError> {
        let dst = self.check(buffer, offset, data.len() as u64)?;
        self.bind()?;
        // SAFETY: `check` proved the destination range lies inside a live allocation.
        unsafe { result::memcpy_htod_sync(dst, data) }.map_err(err("copy to the device"))
    }

    fn read_bytes(&self, buffer: u64, offset: u64, out: &mut [u8]) -> Result<(), PluginError> {
        let src = self.check(buffer, offset, out.len() as u64)?;
        self.bind()?;
        // SAFETY: `check` proved the source range lies inside a live allocation.
        unsafe { result::memcpy_dtoh_sync(out, src) }.map_err(err("copy from the device"))
    }
}

impl Buffers for CudaDevice {
    fn address(&self, buffer: u64, offset: u64, len: u64) -> Result<u64, PluginError> {
        self.check(buffer, offset, len)
    }
}

impl KernelDevice for CudaDevice {
    fn info(&self) -> DeviceInfo {
        let (free, total) = self
            .bind()
            .ok()
            .and_then(|_| result::mem_get_info().ok())
            .unwrap_or((0, 0));
        DeviceInfo {
            name: self.name.as_str().into(),
            total_memory: total as u64,
            free_memory: free as u64,
        }
    }

    fn alloc(&self, bytes: u64) -> RResult<u64, PluginError> {
        self.alloc_bytes(bytes).into()
    }

    fn free(&self, buffer: u64) -> RResult<(), PluginError> {
        self.free_bytes(buffer).into()
    }

    fn map_host(&self, ptr: usize, bytes: u64) -> RResult<u64, PluginError> {
        let n = match usize::try_from(bytes) {
            Ok(n) if ptr != 0 => n,
            _ => {
                return RResult::RErr(PluginError::invalid(
                    "map_host of a null or oversized range",
                ))
            }
        };
        // SAFETY: the host guarantees `ptr..ptr+bytes` is valid readable memory for this call
        // (KernelDevice::map_host's contract); it is copied into a new device allocation.
        let host = unsafe { std::slice::from_raw_parts(ptr as *const u8, n) };
        let copied = self
            .alloc_bytes(bytes)
            .and_then(|b| self.write_bytes(b, 0, host).map(|_| b));
        copied.into()
    }

    fn write(&self, buffer: u64, offset: u64, data: RSlice<'_, u8>) -> RResult<(), PluginError> {
        self.write_bytes(buffer, offset, data.as_slice()).into()
    }

    fn read(
        &self,
        buffer: u64,
        offset: u64,
        mut out: RSliceMut<'_, u8>,
    ) -> RResult<(), PluginError> {
        self.read_bytes(buffer, offset, out.as_mut_slice()).into()
    }

    fn copy(
        &self,
        src: u64,
        src_offset: u64,
        dst: u64,
        dst_offset: u64,
        bytes: u64,
    ) -> RResult<(), PluginError> {
        let run = || -> Result<(), PluginError> {
            let s = self.check(src, src_offset, bytes)?;
            let d = self.check(dst, dst_offset, bytes)?;
            self.bind()?;
            let n = usize::try_from(bytes).map_err(|_| PluginError::invalid("copy too large"))?;
            // SAFETY: both ranges were checked against live allocations.
            unsafe { result::memcpy_dtod_sync(d, s, n) }.map_err(err("device-to-device copy"))
        };
        run().into()
    }

    fn run(&self, calls: RSlice<'_, OpCall>) -> RResult<(), PluginError> {
        let run = || -> Result<(), PluginError> {
            self.bind()?;
            for c in calls.iter() {
                self.kernels.run(self, c)?;
            }
            Ok(())
        };
        run().into()
    }

    fn sync(&self) -> RResult<(), PluginError> {
        let sync = || -> Result<(), PluginError> {
            self.ctx
                .synchronize()
                .map_err(err("a kernel failed (synchronising the device)"))?;
            match self.kernels.take_error()? {
                0 => Ok(()),
                1 => Err(PluginError::invalid(
                    "GetRows: an id was outside its table (on the card)",
                )),
                code => Err(PluginError::device(format!(
                    "a kernel reported error {code}"
                ))),
            }
        };
        sync().into()
    }

    fn capture(&self, _calls: RSlice<'_, OpCall>) -> RResult<u64, PluginError> {
        RResult::RErr(PluginError::unsupported(
            "graph capture on the CUDA bundles (not implemented yet)",
            &[],
        ))
    }

    fn replay(&self, _graph: u64) -> RResult<(), PluginError> {
        RResult::RErr(PluginError::unsupported(
            "graph replay on the CUDA bundles (not implemented yet)",
            &[],
        ))
    }

    fn release_graph(&self, _graph: u64) -> RResult<(), PluginError> {
        RResult::RErr(PluginError::unsupported(
            "graph release on the CUDA bundles (not implemented yet)",
            &[],
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bloomery_plugin_api::kernel::KernelDevice;

    /// Memory round trip on a real GPU; says plainly when there is none.
    #[test]
    fn memory_round_trip_on_a_real_device() {
        let config = DeviceConfig {
            index: 0,
            threads: 0,
            pin_threads: false,
        };
        let bundle = Bundle {
            name: "test",
            native: (9, 0),
            ptx_from: None,
            ptx: crate::PTX_SM90,
        };
        let dev = match CudaDevice::open(&bundle, &config) {
            Ok(d) => d,
            Err(e) => {
                eprintln!("skipped: {e}");
                let e = e.to_string();
                assert!(e.contains("CUDA") || e.contains("without kernels"), "{e}");
                return;
            }
        };
        let data: Vec<u8> = (0..=255u8).cycle().take(1 << 20).collect();
        let a = dev
            .map_host(data.as_ptr() as usize, data.len() as u64)
            .unwrap();
        let b = dev.alloc(data.len() as u64).unwrap();
        dev.copy(a, 16, b, 0, 1000).unwrap();
        dev.sync().unwrap();
        let mut out = vec![0u8; 1000];
        dev.read(b, 0, out.as_mut_slice().into()).unwrap();
        assert_eq!(&out[..], &data[16..1016]);
        assert!(dev
            .read(b, (1 << 20) - 10, out.as_mut_slice().into())
            .is_err());
        assert!(dev.info().total_memory > 0);
        dev.free(a).unwrap();
        dev.free(b).unwrap();
        assert!(dev.free(b).is_err());
        eprintln!("device round trip ok on {}", dev.info().name);
    }
}
