//! The `cuda-sm121` kernel plugin, the GB10 (compute_121) bundle. It probes the driver (CUDA 13 / R580 or newer)
//! and the compute capability, and opens devices; its kernels are the PTX of `kernels/cuda/cu`.
#![allow(non_local_definitions)]

use bloomery_kernels_cuda::probe::Bundle;

/// What this bundle runs on.
pub const BUNDLE: Bundle = Bundle {
    name: "cuda-sm121",
    native: (12, 1),
    ptx_from: Some((12, 1)),
    ptx: bloomery_kernels_cuda::PTX_SM121,
};

bloomery_kernels_cuda::export_cuda_bundle!(BUNDLE);
