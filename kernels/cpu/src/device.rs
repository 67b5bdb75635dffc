//! The CPU device shared by the CPU kernel plugins: host-memory buffers, a pinned worker pool and
//! the op dispatch, parameterised by the plugin's row dot-product kernel.

use abi_stable::std_types::{RResult, RSlice, RSliceMut};
use bloomery_plugin_api::kernel::{DeviceConfig, DeviceInfo, KernelDevice, SharedAlloc};
use bloomery_plugin_api::tensor::OpCall;
use bloomery_plugin_api::PluginError;

use crate::dispatch::{self, Backend};
use crate::linear::RowsDot;
use crate::memory::Buffers;
use crate::pool::{Pinning, Pool, PoolOptions};

/// An open CPU device.
pub struct CpuDevice {
    name: String,
    buffers: Buffers,
    pool: Pool,
    dot: RowsDot,
}

/// How long idle workers spin before parking. Longer than the card's share of a layer when the
/// CPU computes host experts (≈ 0.1 ms), so workers are awake when the next layer's experts come:
/// on the H200's host, `moe_bench` with 120 µs of other work before each layer read experts at
/// 72.7 GB/s with a 480 µs spin against 67.2 GB/s with 50 µs.
const WORKER_SPIN: std::time::Duration = std::time::Duration::from_micros(500);

impl CpuDevice {
    /// Starts the worker pool (`threads` 0 = one per available core).
    pub fn new(name: &str, config: &DeviceConfig, dot: RowsDot) -> Result<CpuDevice, PluginError> {
        let threads = match config.threads {
            0 => std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(1),
            n => n as usize,
        };
        let mut options = PoolOptions::new(threads);
        options.spin = WORKER_SPIN;
        if config.pin_threads {
            options.pinning = Pinning::Auto;
        }
        let pool = Pool::new(options)
            .map_err(|e| PluginError::device(format!("starting {threads} CPU workers: {e}")))?;
        Ok(CpuDevice {
            name: format!("{name}, {threads} threads"),
            buffers: Buffers::default(),
            pool,
            dot,
        })
    }

    /// Runs calls in order.
    pub fn run_calls(&self, calls: &[OpCall]) -> Result<(), PluginError> {
        let backend = Backend {
            buffers: &self.buffers,
            par: &self.pool,
            dot: self.dot,
        };
        for c in calls {
            dispatch::run(&backend, c)?;
        }
        Ok(())
    }
}

fn total_memory() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("MemTotal:"))
                .and_then(|l| {
                    l.split_whitespace()
                        .nth(1)
                        .and_then(|v| v.parse::<u64>().ok())
                })
        })
        .map_or(0, |kb| kb * 1024)
}

impl KernelDevice for CpuDevice {
    fn info(&self) -> DeviceInfo {
        DeviceInfo {
            name: self.name.as_str().into(),
            total_memory: total_memory(),
            free_memory: 0,
        }
    }

    fn alloc(&self, bytes: u64) -> RResult<u64, PluginError> {
        self.buffers.alloc(bytes).into()
    }

    fn free(&self, buffer: u64) -> RResult<(), PluginError> {
        self.buffers.free(buffer).into()
    }

    fn map_host(&self, ptr: usize, bytes: u64) -> RResult<u64, PluginError> {
        self.buffers.map_host(ptr, bytes).into()
    }

    fn write(&self, buffer: u64, offset: u64, data: RSlice<'_, u8>) -> RResult<(), PluginError> {
        self.buffers.write(buffer, offset, data.as_slice()).into()
    }

    fn read(
        &self,
        buffer: u64,
        offset: u64,
        mut out: RSliceMut<'_, u8>,
    ) -> RResult<(), PluginError> {
        self.buffers.read(buffer, offset, out.as_mut_slice()).into()
    }

    fn copy(
        &self,
        src: u64,
        src_offset: u64,
        dst: u64,
        dst_offset: u64,
        bytes: u64,
    ) -> RResult<(), PluginError> {
        self.buffers
            .copy(src, src_offset, dst, dst_offset, bytes)
            .into()
    }

    fn run(&self, calls: RSlice<'_, OpCall>) -> RResult<(), PluginError> {
        self.run_calls(calls.as_slice()).into()
    }

    fn sync(&self) -> RResult<(), PluginError> {
        RResult::ROk(())
    }

    fn capture(&self, _calls: RSlice<'_, OpCall>) -> RResult<u64, PluginError> {
        RResult::RErr(PluginError::unsupported("graph capture on the CPU", &[]))
    }

    fn replay(&self, _graph: u64) -> RResult<(), PluginError> {
        RResult::RErr(PluginError::unsupported("graph replay on the CPU", &[]))
    }

    fn pin_host(&self, _ptr: usize, _bytes: u64) -> RResult<(), PluginError> {
        RResult::ROk(())
    }

    fn release_graph(&self, _graph: u64) -> RResult<(), PluginError> {
        RResult::RErr(PluginError::unsupported("graph release on the CPU", &[]))
    }

    fn fence(&self) -> RResult<u64, PluginError> {
        RResult::ROk(0)
    }

    fn map_pinned(&self, ptr: usize, bytes: u64) -> RResult<u64, PluginError> {
        self.buffers.map_host(ptr, bytes).into()
    }

    fn wait_word(&self, _buffer: u64, _offset: u64, _value: u32) -> RResult<(), PluginError> {
        // Calls run before `run` returns: a wait could only hang the caller.
        RResult::RErr(PluginError::unsupported("queue waits on the CPU", &[]))
    }

    fn alloc_shared(&self, bytes: u64) -> RResult<SharedAlloc, PluginError> {
        // The handle is the address (Buffers::alloc).
        self.buffers
            .alloc(bytes)
            .map(|handle| SharedAlloc {
                handle,
                host: handle as usize,
            })
            .into()
    }

    fn upload(
        &self,
        buffer: u64,
        offset: u64,
        data: RSlice<'_, u8>,
        _after: u64,
    ) -> RResult<(), PluginError> {
        // Calls run at once here, so everything before the fence is done: a plain write.
        self.buffers.write(buffer, offset, data.as_slice()).into()
    }
}
