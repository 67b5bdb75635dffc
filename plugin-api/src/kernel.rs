//! Kernel plugins: one device class each (a CPU instruction-set build, a GPU bundle).
//!
//! A kernel plugin probes the machine and scores itself (0 = cannot run here, with the reason);
//! the host keeps the best-scoring plugin of each device class. It lists the `(op, dtype)` pairs it
//! implements, opens devices, allocates and copies memory, and runs op calls. Device memory is
//! named by plain integer handles.

use abi_stable::library::RootModule;
use abi_stable::sabi_types::VersionStrings;
use abi_stable::std_types::{RBox, RResult, RSlice, RSliceMut, RString, RVec};
use abi_stable::{package_version_strings, sabi_trait, StableAbi};

use crate::op::OpSupport;
use crate::tensor::OpCall;
use crate::PluginError;

/// The class of device a plugin drives.
#[repr(u8)]
#[derive(StableAbi, Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DeviceClass {
    /// The host CPU.
    Cpu = 0,
    /// A discrete or integrated GPU.
    Gpu = 1,
}

/// One device as the plugin sees it.
#[repr(C)]
#[derive(StableAbi, Clone, Debug, PartialEq)]
pub struct DeviceInfo {
    /// Name (`NVIDIA H200`, `x86-64 AVX2, 16 threads`).
    pub name: RString,
    /// Total memory in bytes (0 when unknown).
    pub total_memory: u64,
    /// Free memory in bytes (0 when unknown).
    pub free_memory: u64,
}

/// A buffer in host memory that the device's calls read and write in place
/// ([`KernelDevice::alloc_shared`]).
#[repr(C)]
#[derive(StableAbi, Clone, Copy, Debug, PartialEq, Eq)]
pub struct SharedAlloc {
    /// The buffer's handle on the device.
    pub handle: u64,
    /// The host address of its bytes.
    pub host: usize,
}

/// The result of probing the machine.
#[repr(C)]
#[derive(StableAbi, Clone, Debug, PartialEq)]
pub struct ProbeReport {
    /// 0 when the plugin cannot run here; otherwise higher is more specialised.
    pub score: u32,
    /// One line: why it can or cannot run (`AVX2+FMA+F16C present`, `no CUDA driver`).
    pub reason: RString,
    /// Device class.
    pub class: DeviceClass,
    /// Devices found.
    pub devices: RVec<DeviceInfo>,
}

/// How to open a device.
#[repr(C)]
#[derive(StableAbi, Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceConfig {
    /// Device index (0 for the CPU).
    pub index: u32,
    /// Worker threads for CPU kernels (0 = one per core).
    pub threads: u32,
    /// Pin worker threads to cores.
    pub pin_threads: bool,
}

/// An open device. Every method returns a result; none panics across the boundary.
#[sabi_trait]
pub trait KernelDevice: Send + Sync {
    /// The device's name and memory.
    fn info(&self) -> DeviceInfo;

    /// Allocates `bytes` of device memory; returns its handle.
    fn alloc(&self, bytes: u64) -> RResult<u64, PluginError>;

    /// Frees a handle from [`KernelDevice::alloc`] or [`KernelDevice::map_host`].
    fn free(&self, buffer: u64) -> RResult<(), PluginError>;

    /// Makes `bytes` of host memory at address `ptr` usable as a buffer: zero-copy on the CPU, a
    /// registered or copied buffer on a GPU. The host keeps the memory alive and unchanged until
    /// the handle is freed.
    fn map_host(&self, ptr: usize, bytes: u64) -> RResult<u64, PluginError>;

    /// Copies host bytes into a buffer at `offset`.
    fn write(&self, buffer: u64, offset: u64, data: RSlice<'_, u8>) -> RResult<(), PluginError>;

    /// Copies buffer bytes at `offset` into `out`.
    fn read(&self, buffer: u64, offset: u64, out: RSliceMut<'_, u8>) -> RResult<(), PluginError>;

    /// Copies `bytes` between two buffers of this device.
    fn copy(
        &self,
        src: u64,
        src_offset: u64,
        dst: u64,
        dst_offset: u64,
        bytes: u64,
    ) -> RResult<(), PluginError>;

    /// Runs op calls in order (asynchronously on devices with streams).
    fn run(&self, calls: RSlice<'_, OpCall>) -> RResult<(), PluginError>;

    /// Waits until all submitted work is done.
    fn sync(&self) -> RResult<(), PluginError>;

    /// Records `calls` into a replayable device graph; returns its handle. Devices without graphs
    /// answer [`PluginError::Unsupported`].
    fn capture(&self, calls: RSlice<'_, OpCall>) -> RResult<u64, PluginError>;

    /// Replays a captured graph.
    fn replay(&self, graph: u64) -> RResult<(), PluginError>;

    /// Releases a captured graph.
    #[sabi(last_prefix_field)]
    fn release_graph(&self, graph: u64) -> RResult<(), PluginError>;

    /// Page-locks `bytes` of host memory at `ptr` so copies from it to the device run at full
    /// bus speed, until the device closes. The host keeps the memory mapped and unchanged that
    /// long. A no-op where copies gain nothing (the CPU).
    fn pin_host(&self, ptr: usize, bytes: u64) -> RResult<(), PluginError>;

    /// Marks the calls submitted so far, for [`KernelDevice::upload`]; returns the mark. Devices
    /// that run calls at once answer 0 (nothing to wait for). Marks live until the next `sync`.
    fn fence(&self) -> RResult<u64, PluginError>;

    /// Copies host bytes into a buffer at `offset` without waiting for the copy, on a copy queue
    /// of its own where the device has one, so that it overlaps the calls already submitted.
    /// The copy starts after the calls marked by fence `after` (0: at once); calls submitted
    /// after this upload wait for it. The host keeps `data` mapped and unchanged until the next
    /// `sync`, and copies run at full bus speed only from page-locked memory
    /// ([`KernelDevice::pin_host`]). Devices without queues copy before returning.
    fn upload(
        &self,
        buffer: u64,
        offset: u64,
        data: RSlice<'_, u8>,
        after: u64,
    ) -> RResult<(), PluginError>;

    /// Makes `bytes` of host memory at `ptr`, inside a range page-locked by
    /// [`KernelDevice::pin_host`], a buffer the device's calls read in place, without a copy
    /// (on a GPU each read crosses the bus). Returns its handle, freed with
    /// [`KernelDevice::free`]. The CPU maps it as [`KernelDevice::map_host`] does; a device that
    /// cannot read host memory answers [`PluginError::Unsupported`].
    fn map_pinned(&self, ptr: usize, bytes: u64) -> RResult<u64, PluginError>;

    /// Allocates `bytes` of zeroed, page-locked host memory that the device's calls use in
    /// place (on a GPU every access crosses the bus) and the host reads and writes through
    /// [`SharedAlloc::host`] between calls; freed with [`KernelDevice::free`]. On the CPU, an
    /// ordinary buffer.
    fn alloc_shared(&self, bytes: u64) -> RResult<SharedAlloc, PluginError>;

    /// Holds the calls and copies submitted after this one until the 4-byte word at `offset` of
    /// `buffer` (memory from [`KernelDevice::alloc_shared`], which the host writes later) equals
    /// `value`, and returns at once. The host must write the word, also after a failure, before
    /// it waits for the device. Devices that run calls before returning answer
    /// [`PluginError::Unsupported`] (the host could never write the word while they wait).
    fn wait_word(&self, buffer: u64, offset: u64, value: u32) -> RResult<(), PluginError>;
}

/// A boxed [`KernelDevice`] trait object.
pub type KernelDeviceBox = KernelDevice_TO<'static, RBox<()>>;

/// The root module of a kernel plugin.
#[repr(C)]
#[derive(StableAbi)]
#[sabi(kind(Prefix(prefix_ref = KernelPluginRef)))]
#[sabi(missing_field(option))]
pub struct KernelPlugin {
    /// [`crate::ABI_VERSION`] as the plugin was built.
    pub abi_version: extern "C" fn() -> u32,
    /// The bundle's name (`cpu-avx2`, `cuda-sm90`).
    pub name: extern "C" fn() -> RString,
    /// Probes this machine.
    pub probe: extern "C" fn() -> ProbeReport,
    /// The `(op, dtype)` pairs implemented.
    pub capabilities: extern "C" fn() -> RVec<OpSupport>,
    /// Opens a device.
    #[sabi(last_prefix_field)]
    pub open: extern "C" fn(&DeviceConfig) -> RResult<KernelDeviceBox, PluginError>,
}

impl RootModule for KernelPluginRef {
    abi_stable::declare_root_module_statics! {KernelPluginRef}
    const BASE_NAME: &'static str = "bloomery_kernel";
    const NAME: &'static str = "bloomery kernel plugin";
    const VERSION_STRINGS: VersionStrings = package_version_strings!();
}
