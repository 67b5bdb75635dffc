//! The `cuda-sm90` kernel plugin, the Hopper (sm_90) bundle. It probes the driver (CUDA 13 / R580 or newer)
//! and the compute capability, and opens devices; its kernels are the PTX of `kernels/cuda/cu`.
#![allow(non_local_definitions)]

use bloomery_kernels_cuda::probe::Bundle;

/// What this bundle runs on.
pub const BUNDLE: Bundle = Bundle {
    name: "cuda-sm90",
    native: (9, 0),
    ptx_from: None,
    ptx: bloomery_kernels_cuda::PTX_SM90,
};

bloomery_kernels_cuda::export_cuda_bundle!(BUNDLE);
