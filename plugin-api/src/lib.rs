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
//!
//! Model plugins are made of compile-time helpers that never cross the boundary: [`hparams`]
//! (keys and their checks), [`weights`] (the weight table), [`builders`] (graph blocks),
//! [`synth`] (presets), [`decision`] (decision heads), [`kv_model`] (the loaded model of a K/V-cache architecture) and
//! [`hostile`] (the crafted files a loader's tests must survive);
//! `docs/new-architecture.md` shows how they fit.
#![allow(non_local_definitions)]

pub mod builders;
pub mod decision;
pub mod dtype;
pub mod error;
pub mod graph;
pub mod guard;
pub mod hostile;
pub mod hparams;
pub mod kda;
pub mod kernel;
pub mod kv_model;
pub mod meta;
pub mod mhc;
pub mod mhc_graph;
pub mod model;
pub mod nextn;
pub mod ngram;
pub mod op;
pub mod qwen_blocks;
pub mod synth;
pub mod tensor;
pub mod weights;

pub use abi_stable;
pub use dtype::{BlockLayout, DType};
pub use error::PluginError;

/// The ABI version of this crate: a plugin is loaded only when its version equals the host's.
/// Any change to a type that crosses the boundary (the op set included) bumps it.
pub const ABI_VERSION: u32 = 18;

/// `bloomery_plugin_kind` of a model plugin.
pub const PLUGIN_KIND_MODEL: u32 = 1;
/// `bloomery_plugin_kind` of a kernel plugin.
pub const PLUGIN_KIND_KERNEL: u32 = 2;

/// The C symbol holding a plugin's ABI version (`extern "C" fn() -> u32`).
pub const ABI_VERSION_SYMBOL: &[u8] = b"bloomery_abi_version\0";
/// The C symbol holding a plugin's kind (`extern "C" fn() -> u32`).
pub const PLUGIN_KIND_SYMBOL: &[u8] = b"bloomery_plugin_kind\0";

/// Exports a model plugin: the ABI symbols and the root module, from the plugin's name, the
/// architectures it serves, its synth presets and its loader. The loader and the loaded model's
/// entry points run under [`guard`]: a panic comes back as [`PluginError::Panicked`].
///
/// ```text
/// bloomery_plugin_api::export_model_plugin! {
///     name: "qwen3moe",
///     architectures: ["qwen3moe"],
///     synth_presets: synth::presets,   // fn() -> RVec<SynthPreset>
///     load: Qwen3Moe::load,            // fn(&ModelFileView) -> Result<impl ModelInstance, PluginError>
/// }
/// ```
#[macro_export]
macro_rules! export_model_plugin {
    (
        name: $name:expr,
        architectures: [$($arch:expr),+ $(,)?],
        synth_presets: $presets:path,
        load: $load:path $(,)?
    ) => {
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

        extern "C" fn __bloomery_abi_version() -> u32 {
            $crate::ABI_VERSION
        }

        extern "C" fn __bloomery_name() -> $crate::abi_stable::std_types::RString {
            $name.into()
        }

        extern "C" fn __bloomery_architectures(
        ) -> $crate::abi_stable::std_types::RVec<$crate::abi_stable::std_types::RString> {
            vec![$($crate::abi_stable::std_types::RString::from($arch)),+].into()
        }

        extern "C" fn __bloomery_synth_presets(
        ) -> $crate::abi_stable::std_types::RVec<$crate::model::SynthPreset> {
            $presets()
        }

        extern "C" fn __bloomery_load(
            view: &$crate::meta::ModelFileView,
        ) -> $crate::abi_stable::std_types::RResult<$crate::model::ModelInstanceBox, $crate::PluginError> {
            $crate::guard::catch($name, "load", || {
                let model = $crate::guard::Guarded::new($name, $load(view)?)?;
                Ok($crate::model::ModelInstance_TO::from_value(
                    model,
                    $crate::abi_stable::sabi_trait::TD_Opaque,
                ))
            })
            .into()
        }

        /// The root module.
        #[$crate::abi_stable::export_root_module]
        pub fn bloomery_root_module() -> $crate::model::ModelPluginRef {
            use $crate::abi_stable::prefix_type::PrefixTypeTrait;
            $crate::model::ModelPlugin {
                abi_version: __bloomery_abi_version,
                name: __bloomery_name,
                architectures: __bloomery_architectures,
                synth_presets: __bloomery_synth_presets,
                load: __bloomery_load,
            }
            .leak_into_prefix()
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
