//! The `cuda-sm86` kernel plugin: PTX for compute_86, which the driver JIT-compiles for newer cards. It probes the driver (CUDA 13 / R580 or newer) and the
//! compute capability, and opens devices; its kernels arrive with the GPU forward pass, so its
//! capability list is empty for now and the host never sends it a graph.
#![allow(non_local_definitions)]

use abi_stable::sabi_trait::TD_Opaque;
use abi_stable::std_types::{RResult, RString, RVec};
use bloomery_kernels_cuda::device::CudaDevice;
use bloomery_kernels_cuda::probe::{probe as probe_bundle, Bundle};
use bloomery_plugin_api::kernel::{
    DeviceConfig, KernelDeviceBox, KernelDevice_TO, KernelPlugin, ProbeReport,
};
use bloomery_plugin_api::op::OpSupport;
use bloomery_plugin_api::{PluginError, ABI_VERSION};

/// What this bundle runs on.
pub const BUNDLE: Bundle = Bundle {
    name: "cuda-sm86",
    native: (8, 6),
    ptx_from: Some((8, 6)),
};

extern "C" fn abi_version() -> u32 {
    ABI_VERSION
}

extern "C" fn name() -> RString {
    BUNDLE.name.into()
}

extern "C" fn probe() -> ProbeReport {
    probe_bundle(&BUNDLE)
}

extern "C" fn capabilities() -> RVec<OpSupport> {
    RVec::new()
}

extern "C" fn open(config: &DeviceConfig) -> RResult<KernelDeviceBox, PluginError> {
    CudaDevice::open(BUNDLE.name, config)
        .map(|d| KernelDevice_TO::from_value(d, TD_Opaque))
        .into()
}

bloomery_plugin_api::export_kernel_plugin!(KernelPlugin {
    abi_version,
    name,
    probe,
    capabilities,
    open,
});
