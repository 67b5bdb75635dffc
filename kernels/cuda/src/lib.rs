//! CUDA support shared by the CUDA kernel plugins (`cuda-sm86`, `cuda-sm90`, `cuda-sm121`):
//! probing the driver and devices ([`probe`]) and the device itself ([`device`]: memory, copies,
//! synchronisation). CUDA is loaded at run time through cudarc, so everything builds and runs on
//! machines without it, where the probe answers "no CUDA driver".
//!
//! The kernels (`cu/kernels.cu`) are compiled to PTX per architecture by `build.rs`; each bundle
//! embeds its architecture's PTX ([`PTX_SM86`], [`PTX_SM90`], [`PTX_SM121`]) and the device loads
//! it at open. [`ops`] launches them.

pub mod device;
pub mod memlog;
pub mod ops;
pub mod probe;
pub mod profile;

/// PTX for compute_86 (empty when built without nvcc).
pub const PTX_SM86: &str = include_str!(concat!(env!("OUT_DIR"), "/kernels_86.ptx"));
/// PTX for compute_90 (empty when built without nvcc).
pub const PTX_SM90: &str = include_str!(concat!(env!("OUT_DIR"), "/kernels_90.ptx"));
/// PTX for compute_121 (empty when built without nvcc).
pub const PTX_SM121: &str = include_str!(concat!(env!("OUT_DIR"), "/kernels_121.ptx"));

/// Exports a CUDA bundle as a kernel plugin: `export_cuda_bundle!(BUNDLE)` with a
/// [`probe::Bundle`] constant. Each bundle crate is this call plus its kernels.
#[macro_export]
macro_rules! export_cuda_bundle {
    ($bundle:expr) => {
        extern "C" fn __bloomery_abi_version() -> u32 {
            bloomery_plugin_api::ABI_VERSION
        }

        extern "C" fn __bloomery_name() -> abi_stable::std_types::RString {
            $bundle.name.into()
        }

        extern "C" fn __bloomery_probe() -> bloomery_plugin_api::kernel::ProbeReport {
            $crate::probe::probe(&$bundle)
        }

        extern "C" fn __bloomery_capabilities(
        ) -> abi_stable::std_types::RVec<bloomery_plugin_api::op::OpSupport> {
            $crate::ops::capabilities(&$bundle)
        }

        extern "C" fn __bloomery_open(
            config: &bloomery_plugin_api::kernel::DeviceConfig,
        ) -> abi_stable::std_types::RResult<
            bloomery_plugin_api::kernel::KernelDeviceBox,
            bloomery_plugin_api::PluginError,
        > {
            $crate::device::CudaDevice::open(&$bundle, config)
                .map(|d| {
                    bloomery_plugin_api::kernel::KernelDevice_TO::from_value(
                        d,
                        abi_stable::sabi_trait::TD_Opaque,
                    )
                })
                .into()
        }

        bloomery_plugin_api::export_kernel_plugin!(bloomery_plugin_api::kernel::KernelPlugin {
            abi_version: __bloomery_abi_version,
            name: __bloomery_name,
            probe: __bloomery_probe,
            capabilities: __bloomery_capabilities,
            open: __bloomery_open,
        });
    };
}
