//! The `cpu-scalar` kernel plugin: the portable reference kernels of `bloomery-kernels-cpu`, with
//! nothing specific to an instruction set. It runs on any CPU (and builds for aarch64) and is what
//! every faster plugin is tested against.
#![allow(non_local_definitions)]

use abi_stable::sabi_trait::TD_Opaque;
use abi_stable::std_types::{RResult, RString, RVec};
use bloomery_kernels_cpu::device::CpuDevice;
use bloomery_kernels_cpu::{dispatch, linear};
use bloomery_plugin_api::kernel::{
    DeviceClass, DeviceConfig, DeviceInfo, KernelDeviceBox, KernelDevice_TO, KernelPlugin,
    ProbeReport,
};
use bloomery_plugin_api::op::OpSupport;
use bloomery_plugin_api::{PluginError, ABI_VERSION};

/// The plugin's name.
pub const NAME: &str = "cpu-scalar";

extern "C" fn abi_version() -> u32 {
    ABI_VERSION
}

extern "C" fn name() -> RString {
    NAME.into()
}

extern "C" fn probe() -> ProbeReport {
    let threads = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    ProbeReport {
        score: 1,
        reason: "portable reference kernels run on any CPU".into(),
        class: DeviceClass::Cpu,
        devices: vec![DeviceInfo {
            name: format!("{} CPU, {threads} threads", std::env::consts::ARCH).into(),
            total_memory: 0,
            free_memory: 0,
        }]
        .into(),
    }
}

extern "C" fn capabilities() -> RVec<OpSupport> {
    dispatch::capabilities()
}

extern "C" fn open(config: &DeviceConfig) -> RResult<KernelDeviceBox, PluginError> {
    CpuDevice::new(NAME, config, linear::reference_rows_dot)
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
