//! The `cuda-sm86` kernel plugin, the Ampere bundle (its kernels will ship as compute_86 PTX, which the driver JIT-compiles for newer cards). It probes the driver (CUDA 13 / R580 or newer)
//! and the compute capability, and opens devices; its kernels are the PTX of `kernels/cuda/cu`.
#![allow(non_local_definitions)]

use bloomery_kernels_cuda::probe::Bundle;

/// What this bundle runs on.
pub const BUNDLE: Bundle = Bundle {
    name: "cuda-sm86",
    native: (8, 6),
    ptx_from: Some((8, 6)),
    ptx: bloomery_kernels_cuda::PTX_SM86,
};

bloomery_kernels_cuda::export_cuda_bundle!(BUNDLE);
