//! The stable ABI between the bloomery host and its plugins.
//!
//! Model plugins (one per architecture family) and kernel plugins (one per device bundle) are shared
//! objects built against this crate. Everything that crosses the boundary is `#[repr(C)]` or an
//! abi_stable type; device memory travels as plain integer handles. [`ABI_VERSION`] is compared for
//! equality when a plugin is loaded.
#![allow(non_local_definitions)]

pub mod dtype;

pub use dtype::{BlockLayout, DType};

/// The ABI version of this crate: a plugin is loaded only when its version equals the host's.
pub const ABI_VERSION: u32 = 1;
