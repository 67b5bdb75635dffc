//! Portable CPU kernels shared by the CPU kernel plugins: every GGUF quant format ([`quant`]), the
//! reference ops ([`ops`]), matrix products ([`linear`]), the pinned worker pool ([`pool`]) and the
//! CPU device with its op dispatch ([`device`], [`dispatch`]). Nothing here is specific to an
//! instruction set: this crate is the reference every faster kernel is tested against, and it builds
//! for aarch64 as well as x86-64.

pub mod device;
pub mod dispatch;
pub mod linear;
pub mod linear_heads;
#[cfg(test)]
mod linear_tests;
pub mod memory;
pub mod ops;
pub mod pool;
pub mod quant;
pub mod tensors;
