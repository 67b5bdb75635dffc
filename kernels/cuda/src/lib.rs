//! CUDA support shared by the CUDA kernel plugins (`cuda-sm86`, `cuda-sm90`, `cuda-sm121`):
//! probing the driver and devices ([`probe`]) and the device itself ([`device`]: memory, copies,
//! synchronisation). CUDA is loaded at run time through cudarc, so everything builds and runs on
//! machines without it, where the probe answers "no CUDA driver".
//!
//! The bundles implement no ops yet (their capability lists are empty, so the host never sends
//! them a graph); the kernels arrive with the GPU forward pass.

pub mod device;
pub mod probe;
