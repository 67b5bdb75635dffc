//! Errors of plugin loading and selection.

use std::path::PathBuf;

/// Why a plugin file or folder could not be used. Each message is one line naming the file.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// The plugin folder does not exist or cannot be read.
    #[error("plugin folder {path}: {reason}")]
    Folder {
        /// The folder.
        path: PathBuf,
        /// The OS error.
        reason: String,
    },
    /// The file is not a loadable shared library.
    #[error("{path}: not a loadable shared library ({reason})")]
    NotALibrary {
        /// The file.
        path: PathBuf,
        /// The loader's message.
        reason: String,
    },
    /// A shared library without the bloomery plugin symbols.
    #[error("{path}: not a bloomery plugin (no `bloomery_abi_version` symbol)")]
    NotAPlugin {
        /// The file.
        path: PathBuf,
    },
    /// Built against another ABI version.
    #[error("{path}: plugin ABI {found}, but this host speaks ABI {expected}")]
    AbiMismatch {
        /// The file.
        path: PathBuf,
        /// The plugin's version.
        found: u32,
        /// The host's version.
        expected: u32,
    },
    /// A kind other than model or kernel.
    #[error("{path}: unknown plugin kind {kind}")]
    UnknownKind {
        /// The file.
        path: PathBuf,
        /// The kind found.
        kind: u32,
    },
    /// abi_stable refused the root module (layout or library version mismatch).
    #[error("{path}: {summary}")]
    Layout {
        /// The file.
        path: PathBuf,
        /// A one-line summary.
        summary: String,
        /// abi_stable's full report (shown with --verbose).
        detail: String,
    },
    /// Two plugins claim one architecture; the second one's claim is refused.
    #[error("architecture `{arch}` is claimed by both {first} and {second}; keeping {first}")]
    DuplicateArchitecture {
        /// The architecture.
        arch: String,
        /// The plugin kept.
        first: PathBuf,
        /// The plugin refused.
        second: PathBuf,
    },
    /// Two kernel plugins have one name; the second is refused.
    #[error("kernel plugin `{name}` is found twice: {first} and {second}; keeping {first}")]
    DuplicateKernel {
        /// The name.
        name: String,
        /// The plugin kept.
        first: PathBuf,
        /// The plugin refused.
        second: PathBuf,
    },
}

/// Why no plugin could serve a request.
#[derive(Debug, thiserror::Error)]
pub enum SelectError {
    /// No model plugin serves the file's architecture.
    #[error("no model plugin serves architecture `{arch}`; loaded plugins serve {served:?}")]
    NoArchitecture {
        /// The file's `general.architecture`.
        arch: String,
        /// What the loaded plugins serve, aliases included.
        served: Vec<String>,
    },
    /// No kernel plugin can run on this machine.
    #[error("no kernel plugin can run on this machine: {reasons}")]
    NoKernel {
        /// Each candidate with its reason.
        reasons: String,
    },
}
