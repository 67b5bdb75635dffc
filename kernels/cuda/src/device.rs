//! A CUDA device: memory and copies through the driver API, on the device's primary context.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use abi_stable::std_types::{RResult, RSlice, RSliceMut};
use bloomery_plugin_api::kernel::{DeviceConfig, DeviceInfo, KernelDevice, SharedAlloc};
use bloomery_plugin_api::tensor::OpCall;
use bloomery_plugin_api::PluginError;
use cudarc::driver::{result, sys, CudaContext, CudaEvent, CudaGraph, CudaStream, DriverError};

use crate::ops::{Buffers, Launcher};
use crate::probe::{read_driver, Bundle, DriverProblem};
use crate::profile::{label, Profile};

fn err(what: &str) -> impl FnOnce(DriverError) -> PluginError + '_ {
    move |e| PluginError::device(format!("{what}: {e:?}"))
}

/// An open CUDA device. Buffers are device allocations named by their device address. Field order
/// is drop order: graphs go before the launcher whose scratch they name.
pub struct CudaDevice {
    name: String,
    graphs: Mutex<HashMap<u64, Graph>>,
    next_graph: AtomicU64,
    profile: Option<Profile>,
    ctx: Arc<CudaContext>,
    sizes: Mutex<HashMap<u64, u64>>,
    /// Host ranges page-locked by `pin_host` (start, bytes), unregistered on drop.
    pinned: Mutex<Vec<(usize, usize)>>,
    /// Buffers in host memory, freed without `cuMemFree`: views of page-locked ranges
    /// (`map_pinned`, None) and page-locked allocations (`alloc_shared`, the host address that
    /// `cuMemFreeHost` takes).
    in_host: Mutex<HashMap<u64, Option<usize>>>,
    /// The queue of `upload`s, beside the kernel stream.
    copies: Arc<CudaStream>,
    /// Fences and upload completions not yet passed by a `sync`.
    marks: Mutex<Marks>,
    kernels: Launcher,
}

/// The events behind `fence` and `upload`, dropped at the next `sync`.
#[derive(Default)]
struct Marks {
    /// Fence id → the event recorded on the kernel stream.
    fences: HashMap<u64, CudaEvent>,
    /// The last fence id given out.
    last: u64,
    /// Each upload's completion, which the kernel stream waits for.
    uploads: Vec<CudaEvent>,
}

/// How long a profiled pass waits behind `bl_hold` while the host queues it.
const HOLD_NS: i64 = 40_000_000;

/// A captured, instantiated graph, and the scratch area its launches name.
struct Graph {
    exec: CudaGraph,
    scratch: u64,
}

// SAFETY: a graph is only touched under the device's `graphs` mutex, which serialises every
// access as the CUDA graph API requires; the driver objects themselves are not thread-bound.
unsafe impl Send for Graph {}

/// The scratch areas the graphs name.
fn scratch_named(graphs: &HashMap<u64, Graph>) -> Vec<u64> {
    graphs.values().map(|g| g.scratch).collect()
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
        // PTX for compute capability 9.0 and up opens every kernel with griddepcontrol.wait.
        let kernels = Launcher::new(Arc::clone(&ctx), bundle.ptx, bundle.native.0 >= 9)?;
        let copies = ctx.new_stream().map_err(err("creating the copy stream"))?;
        Ok(CudaDevice {
            name: format!("{name} ({})", bundle.name),
            graphs: Mutex::new(HashMap::new()),
            next_graph: AtomicU64::new(1),
            profile: Profile::from_env(),
            ctx,
            sizes: Mutex::new(HashMap::new()),
            pinned: Mutex::new(Vec::new()),
            in_host: Mutex::new(HashMap::new()),
            copies,
            marks: Mutex::new(Marks::default()),
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
        crate::memlog::note("alloc", bytes as i64);
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
        let in_host = self
            .in_host
            .lock()
            .map_err(|_| PluginError::device("buffer table poisoned"))?
            .remove(&buffer);
        match in_host {
            Some(None) => Ok(()),
            // SAFETY: `p` came from cuMemHostAlloc in alloc_shared and its buffer was just
            // removed from both tables, so it is freed once.
            Some(Some(p)) => unsafe { sys::cuMemFreeHost(p as *mut _) }
                .result()
                .map_err(err("cuMemFreeHost")),
            None => {
                crate::memlog::note("free", -(removed.unwrap_or(0) as i64));
                // SAFETY: `buffer` came from `malloc_sync` and was just removed from the table.
                unsafe { result::free_sync(buffer) }.map_err(err("cuMemFree"))
            }
        }
    }

    /// Waits for the kernel stream (every kernel and copy is ordered on it).
    fn settle(&self) -> Result<(), PluginError> {
        self.bind()?;
        self.kernels
            .stream
            .synchronize()
            .map_err(err("a kernel failed (waiting for the kernel stream)"))
    }

    fn write_bytes(&self, buffer: u64, offset: u64, data: &[u8]) -> Result<(), PluginError> {
        let dst = self.check(buffer, offset, data.len() as u64)?;
        self.bind()?;
        let stream = &self.kernels.stream;
        // SAFETY: `check` proved the destination range lies inside a live allocation; the copy is
        // ordered on the kernel stream and finished before `data` is released (synchronised).
        unsafe { result::memcpy_htod_async(dst, data, stream.cu_stream()) }
            .map_err(err("copy to the device"))?;
        self.settle()
    }

    /// Records a buffer of `bytes` in host memory under `handle` (its device address): a view
    /// (`owned` None) or a page-locked allocation to free with `cuMemFreeHost`.
    fn record_in_host(
        &self,
        handle: u64,
        bytes: u64,
        owned: Option<usize>,
    ) -> Result<(), PluginError> {
        let mut sizes = self
            .sizes
            .lock()
            .map_err(|_| PluginError::device("buffer table poisoned"))?;
        if sizes.contains_key(&handle) {
            return Err(PluginError::invalid(format!(
                "host memory at device address {handle:#x} is already a buffer"
            )));
        }
        self.in_host
            .lock()
            .map_err(|_| PluginError::device("buffer table poisoned"))?
            .insert(handle, owned);
        sizes.insert(handle, bytes);
        Ok(())
    }

    fn read_bytes(&self, buffer: u64, offset: u64, out: &mut [u8]) -> Result<(), PluginError> {
        let src = self.check(buffer, offset, out.len() as u64)?;
        self.bind()?;
        let stream = &self.kernels.stream;
        // SAFETY: `check` proved the source range lies inside a live allocation; the copy is
        // ordered after every kernel on the stream and finished before `out` is returned.
        unsafe { result::memcpy_dtoh_async(out, src, stream.cu_stream()) }
            .map_err(err("copy from the device"))?;
        self.settle()
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
            // SAFETY: both ranges were checked against live allocations; the copy is ordered on
            // the kernel stream.
            unsafe { result::memcpy_dtod_async(d, s, n, self.kernels.stream.cu_stream()) }
                .map_err(err("device-to-device copy"))
        };
        run().into()
    }

    fn run(&self, calls: RSlice<'_, OpCall>) -> RResult<(), PluginError> {
        let run = || -> Result<(), PluginError> {
            self.bind()?;
            self.kernels.forget_quantized();
            if self.profile.is_some() {
                self.kernels.hold(HOLD_NS)?;
            }
            match &self.profile {
                // Op by op, so that each op is timed on its own.
                Some(p) => {
                    for c in calls.iter() {
                        p.time(&self.ctx, &self.kernels.stream, label(c), || {
                            self.kernels.run(self, c)
                        })?;
                    }
                    Ok(())
                }
                None => self.kernels.run_all(self, &calls),
            }
        };
        run().into()
    }

    fn sync(&self) -> RResult<(), PluginError> {
        let sync = || -> Result<(), PluginError> {
            self.ctx
                .synchronize()
                .map_err(err("a kernel failed (synchronising the device)"))?;
            if let Ok(mut m) = self.marks.lock() {
                m.fences.clear();
                m.uploads.clear();
            }
            if let Some(p) = &self.profile {
                p.collect();
            }
            match self.kernels.take_error()? {
                0 => Ok(()),
                1 => Err(PluginError::invalid(
                    "GetRows: an id was outside its table (on the card)",
                )),
                5 => Err(PluginError::invalid(
                    "ConvCausal/DeltaRule: a slot outside the state, a negative position or \
                     two sequences in one slot (on the card)",
                )),
                6 => Err(PluginError::device(
                    "MoeExperts: hidden rows laid out in pairs for down rows that do not suit \
                     that layout (on the card)",
                )),
                7 => Err(PluginError::invalid(
                    "SpanMean: a span empty or outside its rows (on the card)",
                )),
                8 => Err(PluginError::invalid(
                    "KPoolSelect: a slot or position outside the cache (on the card)",
                )),
                11 => Err(PluginError::invalid(
                    "Compress/CompSelect: a slot, position or compressed row outside its cache \
                     (on the card)",
                )),
                12 => Err(PluginError::invalid(
                    "Attention: a row sees more compressed rows than the compressed cache holds \
                     (on the card)",
                )),
                code => Err(PluginError::device(format!(
                    "a kernel reported error {code}"
                ))),
            }
        };
        sync().into()
    }

    fn capture(&self, calls: RSlice<'_, OpCall>) -> RResult<u64, PluginError> {
        let capture = || -> Result<u64, PluginError> {
            self.settle()?;
            let mut graphs = self
                .graphs
                .lock()
                .map_err(|_| PluginError::device("graph table poisoned"))?;
            // The eager passes before a capture size the scratch; what they outgrew goes now.
            self.kernels.free_retired(&scratch_named(&graphs))?;
            let stream = &self.kernels.stream;
            stream
                .begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED)
                .map_err(err("beginning a graph capture"))?;
            self.kernels.forget_quantized();
            self.kernels.capturing.store(true, Ordering::Release);
            let recorded = self.kernels.run_all(self, &calls);
            self.kernels.capturing.store(false, Ordering::Release);
            // The capture is always ended, also after a failed call, so the stream stays usable.
            let graph = stream.end_capture(sys::CUgraphInstantiate_flags(0));
            recorded?;
            let graph = graph
                .map_err(err("instantiating a captured graph"))?
                .ok_or_else(|| PluginError::device("graph capture recorded nothing"))?;
            let id = self.next_graph.fetch_add(1, Ordering::Relaxed);
            graphs.insert(
                id,
                Graph {
                    exec: graph,
                    scratch: self.kernels.scratch_base(),
                },
            );
            crate::memlog::event("graph captured");
            Ok(id)
        };
        capture().into()
    }

    fn replay(&self, graph: u64) -> RResult<(), PluginError> {
        let replay = || -> Result<(), PluginError> {
            let graphs = self
                .graphs
                .lock()
                .map_err(|_| PluginError::device("graph table poisoned"))?;
            let g = graphs
                .get(&graph)
                .ok_or_else(|| PluginError::invalid(format!("no captured graph {graph}")))?;
            g.exec.launch().map_err(err("launching a captured graph"))
        };
        replay().into()
    }

    fn pin_host(&self, ptr: usize, bytes: u64) -> RResult<(), PluginError> {
        let pin = || -> Result<(), PluginError> {
            self.bind()?;
            let flags = sys::CU_MEMHOSTREGISTER_READ_ONLY
                | sys::CU_MEMHOSTREGISTER_PORTABLE
                | sys::CU_MEMHOSTREGISTER_DEVICEMAP;
            // SAFETY: the host guarantees `ptr..ptr+bytes` stays mapped and unchanged while the
            // device is open (KernelDevice::pin_host's contract); the driver only page-locks it
            // and reads it during copies and in-place reads. It is unregistered in Drop.
            unsafe { sys::cuMemHostRegister_v2(ptr as *mut _, bytes as usize, flags) }
                .result()
                .map_err(err("page-locking host memory"))?;
            self.pinned
                .lock()
                .map_err(|_| PluginError::device("pinned table poisoned"))?
                .push((ptr, bytes as usize));
            Ok(())
        };
        pin().into()
    }

    fn map_pinned(&self, ptr: usize, bytes: u64) -> RResult<u64, PluginError> {
        let map = || -> Result<u64, PluginError> {
            let end = ptr.checked_add(bytes as usize);
            let base = self
                .pinned
                .lock()
                .map_err(|_| PluginError::device("pinned table poisoned"))?
                .iter()
                .find(|&&(lo, n)| lo <= ptr && end.is_some_and(|e| e <= lo + n))
                .map(|&(lo, _)| lo)
                .ok_or_else(|| {
                    PluginError::invalid(format!(
                        "map_pinned: {bytes} bytes at {ptr:#x} are not inside a page-locked range"
                    ))
                })?;
            self.bind()?;
            let mut dev: sys::CUdeviceptr = 0;
            // SAFETY: `base` starts a range registered by pin_host with DEVICEMAP on this
            // context, still mapped while the device is open (pin_host's contract).
            unsafe { sys::cuMemHostGetDevicePointer_v2(&mut dev, base as *mut _, 0) }
                .result()
                .map_err(err("mapping page-locked memory for the device"))?;
            let handle = dev + (ptr - base) as u64;
            self.record_in_host(handle, bytes, None)?;
            Ok(handle)
        };
        map().into()
    }

    fn wait_word(&self, buffer: u64, offset: u64, value: u32) -> RResult<(), PluginError> {
        let wait = || -> Result<(), PluginError> {
            let word = self.check(buffer, offset, 4)?;
            self.bind()?;
            // SAFETY: `check` proved the word lies inside a live allocation (page-locked host
            // memory mapped for the card, from alloc_shared, which the host writes); the wait
            // only reads it, and the host writes it before it waits for the stream
            // (KernelDevice::wait_word's contract).
            unsafe {
                sys::cuStreamWaitValue32_v2(
                    self.kernels.stream.cu_stream(),
                    word,
                    value,
                    sys::CUstreamWaitValue_flags::CU_STREAM_WAIT_VALUE_EQ as u32,
                )
            }
            .result()
            .map_err(err("holding the stream for a host word"))
        };
        wait().into()
    }

    fn alloc_shared(&self, bytes: u64) -> RResult<SharedAlloc, PluginError> {
        let alloc = || -> Result<SharedAlloc, PluginError> {
            let n = usize::try_from(bytes.max(1))
                .map_err(|_| PluginError::invalid("allocation too large"))?;
            self.bind()?;
            let mut host: *mut std::ffi::c_void = std::ptr::null_mut();
            let flags = sys::CU_MEMHOSTALLOC_DEVICEMAP | sys::CU_MEMHOSTALLOC_PORTABLE;
            // SAFETY: the context is bound; the allocation is recorded and freed once (free).
            unsafe { sys::cuMemHostAlloc(&mut host, n, flags) }
                .result()
                .map_err(|_| PluginError::OutOfMemory {
                    requested: bytes,
                    available: 0,
                })?;
            // SAFETY: `host` points to `n` bytes just allocated and owned here.
            unsafe { std::ptr::write_bytes(host.cast::<u8>(), 0, n) };
            let mut dev: sys::CUdeviceptr = 0;
            // SAFETY: `host` is a live DEVICEMAP allocation of this context.
            let recorded = unsafe { sys::cuMemHostGetDevicePointer_v2(&mut dev, host, 0) }
                .result()
                .map_err(err("mapping page-locked memory for the device"))
                .and_then(|()| self.record_in_host(dev, bytes, Some(host as usize)));
            if let Err(e) = recorded {
                // SAFETY: `host` came from cuMemHostAlloc above and is in no table.
                let _ = unsafe { sys::cuMemFreeHost(host) };
                return Err(e);
            }
            Ok(SharedAlloc {
                handle: dev,
                host: host as usize,
            })
        };
        alloc().into()
    }

    fn fence(&self) -> RResult<u64, PluginError> {
        let fence = || -> Result<u64, PluginError> {
            self.bind()?;
            let event = self
                .kernels
                .stream
                .record_event(None)
                .map_err(err("recording a fence"))?;
            let mut m = self
                .marks
                .lock()
                .map_err(|_| PluginError::device("fence table poisoned"))?;
            m.last += 1;
            let id = m.last;
            m.fences.insert(id, event);
            Ok(id)
        };
        fence().into()
    }

    fn upload(
        &self,
        buffer: u64,
        offset: u64,
        data: RSlice<'_, u8>,
        after: u64,
    ) -> RResult<(), PluginError> {
        let upload = || -> Result<(), PluginError> {
            let dst = self.check(buffer, offset, data.len() as u64)?;
            self.bind()?;
            let mut m = self
                .marks
                .lock()
                .map_err(|_| PluginError::device("fence table poisoned"))?;
            if after != 0 {
                let fence = m.fences.get(&after).ok_or_else(|| {
                    PluginError::invalid(format!("no fence {after} since the last sync"))
                })?;
                self.copies
                    .wait(fence)
                    .map_err(err("ordering an upload after a fence"))?;
            }
            // SAFETY: `check` proved the destination lies inside a live allocation; the host keeps
            // `data` mapped and unchanged until the next sync (KernelDevice::upload's contract),
            // which waits for this copy.
            unsafe { result::memcpy_htod_async(dst, data.as_slice(), self.copies.cu_stream()) }
                .map_err(err("uploading to the device"))?;
            let done = self
                .copies
                .record_event(None)
                .map_err(err("recording an upload"))?;
            self.kernels
                .stream
                .wait(&done)
                .map_err(err("ordering calls after an upload"))?;
            m.uploads.push(done);
            Ok(())
        };
        upload().into()
    }

    fn release_graph(&self, graph: u64) -> RResult<(), PluginError> {
        let release = || -> Result<(), PluginError> {
            self.settle()?;
            let mut graphs = self
                .graphs
                .lock()
                .map_err(|_| PluginError::device("graph table poisoned"))?;
            graphs
                .remove(&graph)
                .ok_or_else(|| PluginError::invalid(format!("no captured graph {graph}")))?;
            self.kernels.free_retired(&scratch_named(&graphs))
        };
        release().into()
    }
}

impl Drop for CudaDevice {
    fn drop(&mut self) {
        let _ = self.settle();
        if let Some(p) = &self.profile {
            eprintln!("CUDA per-op profile ({}):\n{}", self.name, p.report());
        }
        if let Ok(mut g) = self.graphs.lock() {
            g.clear();
        }
        if let Ok(pinned) = self.pinned.lock() {
            for &(p, _) in pinned.iter() {
                // SAFETY: `p` was registered by pin_host on this context and is still mapped.
                let _ = unsafe { sys::cuMemHostUnregister(p as *mut _) };
            }
        }
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
