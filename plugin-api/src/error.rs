//! The error that crosses the plugin boundary.

use abi_stable::std_types::{RString, RVec};
use abi_stable::StableAbi;
use std::fmt;

/// An error returned by a plugin entry point. No panic crosses the boundary: every fallible call
/// returns `RResult<_, PluginError>`, and a model plugin's boundary turns a panic into
/// [`PluginError::Panicked`].
#[repr(C, u8)]
#[derive(StableAbi, Clone, Debug, PartialEq)]
pub enum PluginError {
    /// The plugin does not implement what was asked: `what` names it (an op, a dtype, a feature) and
    /// `supported` lists what the plugin does offer in its place.
    Unsupported {
        /// What was asked for.
        what: RString,
        /// What the plugin supports instead.
        supported: RVec<RString>,
    },
    /// A metadata key the model needs is absent from the file.
    MissingKey {
        /// The full key, e.g. `qwen3moe.block_count`.
        key: RString,
    },
    /// A metadata key has a value of the wrong type or out of range.
    BadKey {
        /// The full key.
        key: RString,
        /// What was expected and what was found.
        message: RString,
    },
    /// A tensor the model needs is absent from the file.
    MissingTensor {
        /// The tensor's GGUF name, e.g. `blk.3.ffn_down_exps.weight`.
        name: RString,
    },
    /// A tensor has a shape or type the model cannot use.
    BadTensor {
        /// The tensor's GGUF name.
        name: RString,
        /// What was expected and what was found.
        message: RString,
    },
    /// An argument is inconsistent (shapes, lengths, handles).
    InvalidArgument {
        /// What was wrong, with the values found.
        message: RString,
    },
    /// A device allocation failed.
    OutOfMemory {
        /// Bytes requested.
        requested: u64,
        /// Bytes the device reported free, or 0 when unknown.
        available: u64,
    },
    /// The device or its driver failed (a kernel fault, a lost context).
    Device {
        /// The driver's message.
        message: RString,
    },
    /// The plugin panicked; its export boundary caught the panic ([`crate::guard`]) so that it
    /// did not unwind into the host.
    Panicked {
        /// The plugin's name.
        plugin: RString,
        /// The entry point that panicked and the panic's message: ``in `load`: …``.
        message: RString,
    },
}

impl PluginError {
    /// An [`PluginError::InvalidArgument`] with the given message.
    pub fn invalid(message: impl Into<String>) -> Self {
        PluginError::InvalidArgument {
            message: RString::from(message.into()),
        }
    }

    /// An [`PluginError::Unsupported`] naming what was asked and what is offered.
    pub fn unsupported(what: impl Into<String>, supported: &[&str]) -> Self {
        PluginError::Unsupported {
            what: RString::from(what.into()),
            supported: supported.iter().map(|s| RString::from(*s)).collect(),
        }
    }

    /// A [`PluginError::Device`] with the given message.
    pub fn device(message: impl Into<String>) -> Self {
        PluginError::Device {
            message: RString::from(message.into()),
        }
    }
}

impl fmt::Display for PluginError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PluginError::Unsupported { what, supported } => {
                write!(f, "unsupported: {what}")?;
                if !supported.is_empty() {
                    let list: Vec<&str> = supported.iter().map(|s| s.as_str()).collect();
                    write!(f, " (supported: {})", list.join(", "))?;
                }
                Ok(())
            }
            PluginError::MissingKey { key } => write!(f, "missing metadata key `{key}`"),
            PluginError::BadKey { key, message } => write!(f, "metadata key `{key}`: {message}"),
            PluginError::MissingTensor { name } => write!(f, "missing tensor `{name}`"),
            PluginError::BadTensor { name, message } => write!(f, "tensor `{name}`: {message}"),
            PluginError::InvalidArgument { message } => write!(f, "invalid argument: {message}"),
            PluginError::OutOfMemory {
                requested,
                available,
            } => write!(
                f,
                "out of device memory: asked for {requested} bytes, {available} free"
            ),
            PluginError::Device { message } => write!(f, "device error: {message}"),
            PluginError::Panicked { plugin, message } => {
                write!(f, "plugin `{plugin}` panicked {message}")
            }
        }
    }
}

impl std::error::Error for PluginError {}
