//! The stable ABI between the bloomery host and its plugins.
//!
//! Model plugins (one per architecture family) and kernel plugins (one per device bundle) are shared
//! objects built against this crate. Everything that crosses the boundary is `#[repr(C)]` or an
//! abi_stable type; device memory travels as plain integer handles.
//!
//! A plugin exports three things, written by [`export_model_plugin!`] or [`export_kernel_plugin!`]:
//! the plain C functions `bloomery_abi_version` and `bloomery_plugin_kind`, which the host reads
//! before anything else (so a plugin built against another ABI is refused with both version numbers,
//! without touching its types), and the abi_stable root module, whose layout abi_stable checks.
#![allow(non_local_definitions)]

pub mod builders;
pub mod dtype;
pub mod error;
pub mod graph;
pub mod kernel;
pub mod meta;
pub mod model;
pub mod op;
pub mod tensor;

pub use abi_stable;
pub use dtype::{BlockLayout, DType};
pub use error::PluginError;

/// The ABI version of this crate: a plugin is loaded only when its version equals the host's.
/// Any change to a type that crosses the boundary (the op set included) bumps it.
pub const ABI_VERSION: u32 = 1;

/// `bloomery_plugin_kind` of a model plugin.
pub const PLUGIN_KIND_MODEL: u32 = 1;
/// `bloomery_plugin_kind` of a kernel plugin.
pub const PLUGIN_KIND_KERNEL: u32 = 2;

/// The C symbol holding a plugin's ABI version (`extern "C" fn() -> u32`).
pub const ABI_VERSION_SYMBOL: &[u8] = b"bloomery_abi_version\0";
/// The C symbol holding a plugin's kind (`extern "C" fn() -> u32`).
pub const PLUGIN_KIND_SYMBOL: &[u8] = b"bloomery_plugin_kind\0";

/// Exports a model plugin: `export_model_plugin!(ModelPlugin { .. })`.
#[macro_export]
macro_rules! export_model_plugin {
    ($module:expr) => {
        /// The ABI version this plugin was built against.
        #[no_mangle]
        pub extern "C" fn bloomery_abi_version() -> u32 {
            $crate::ABI_VERSION
        }

        /// The kind of this plugin.
        #[no_mangle]
        pub extern "C" fn bloomery_plugin_kind() -> u32 {
            $crate::PLUGIN_KIND_MODEL
        }

        /// The root module.
        #[$crate::abi_stable::export_root_module]
        pub fn bloomery_root_module() -> $crate::model::ModelPluginRef {
            use $crate::abi_stable::prefix_type::PrefixTypeTrait;
            $module.leak_into_prefix()
        }
    };
}

/// Exports a kernel plugin: `export_kernel_plugin!(KernelPlugin { .. })`.
#[macro_export]
macro_rules! export_kernel_plugin {
    ($module:expr) => {
        /// The ABI version this plugin was built against.
        #[no_mangle]
        pub extern "C" fn bloomery_abi_version() -> u32 {
            $crate::ABI_VERSION
        }

        /// The kind of this plugin.
        #[no_mangle]
        pub extern "C" fn bloomery_plugin_kind() -> u32 {
            $crate::PLUGIN_KIND_KERNEL
        }

        /// The root module.
        #[$crate::abi_stable::export_root_module]
        pub fn bloomery_root_module() -> $crate::kernel::KernelPluginRef {
            use $crate::abi_stable::prefix_type::PrefixTypeTrait;
            $module.leak_into_prefix()
        }
    };
}
