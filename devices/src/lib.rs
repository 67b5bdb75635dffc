//! The bottom of the host's layers: the plugin registry (every plugin of a folder, the model
//! plugin per architecture, the best kernel plugin per device class), a kernel plugin's open
//! device with its buffers, and the host-memory helpers every layer above shares (page rounding,
//! byte views of typed slices).

pub mod bytes;
pub mod device;
pub mod pages;
pub mod registry;

pub use device::{Buffer, Device, Staging};
pub use registry::{
    KernelPluginFile, LoadError, ModelPluginFile, PluginFile, Registry, SelectError,
};
