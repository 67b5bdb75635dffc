//! The `cpu-avx2` kernel plugin for x86-64-v3 CPUs (AVX2, FMA, F16C): the shared CPU device with
//! dot-product kernels compiled for those instructions, and AVX-512 VNNI kernels for Q6_K and Q8_0
//! chosen at run time where the CPU has AVX-512 F/BW/VL/VNNI. It scores 0 on CPUs without AVX2,
//! FMA and F16C.
#![allow(non_local_definitions)]

pub mod dot;

use abi_stable::sabi_trait::TD_Opaque;
use abi_stable::std_types::{RResult, RString, RVec};
use bloomery_kernels_cpu::device::CpuDevice;
use bloomery_kernels_cpu::dispatch;
use bloomery_plugin_api::kernel::{
    DeviceClass, DeviceConfig, DeviceInfo, KernelDeviceBox, KernelDevice_TO, KernelPlugin,
    ProbeReport,
};
use bloomery_plugin_api::op::OpSupport;
use bloomery_plugin_api::{PluginError, ABI_VERSION};

/// The plugin's name.
pub const NAME: &str = "cpu-avx2";

/// The CPU features this build needs, and which of them the running CPU lacks.
pub fn missing_features() -> Vec<&'static str> {
    #[cfg(target_arch = "x86_64")]
    {
        let mut missing = Vec::new();
        if !std::arch::is_x86_feature_detected!("avx2") {
            missing.push("AVX2");
        }
        if !std::arch::is_x86_feature_detected!("fma") {
            missing.push("FMA");
        }
        if !std::arch::is_x86_feature_detected!("f16c") {
            missing.push("F16C");
        }
        missing
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        vec!["an x86-64 CPU"]
    }
}

extern "C" fn abi_version() -> u32 {
    ABI_VERSION
}

extern "C" fn name() -> RString {
    NAME.into()
}

extern "C" fn probe() -> ProbeReport {
    let missing = missing_features();
    let threads = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    let (score, reason) = if missing.is_empty() {
        (100, "AVX2, FMA and F16C present".to_owned())
    } else {
        (0, format!("this CPU lacks {}", missing.join(", ")))
    };
    ProbeReport {
        score,
        reason: reason.into(),
        class: DeviceClass::Cpu,
        devices: vec![DeviceInfo {
            name: format!("x86-64 CPU, {threads} threads").into(),
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
    let missing = missing_features();
    if !missing.is_empty() {
        return RResult::RErr(PluginError::device(format!(
            "cpu-avx2 cannot run here: this CPU lacks {}",
            missing.join(", ")
        )));
    }
    CpuDevice::new(NAME, config, dot::rows_dot)
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
