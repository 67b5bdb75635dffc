//! Opens plugin files: checks the ABI version through a plain C symbol first, then lets abi_stable
//! check the root module's layout, and summarises its report in one line.

use std::path::{Path, PathBuf};

use abi_stable::library::{lib_header_from_path, LibraryError, RootModule};
use bloomery_plugin_api::kernel::{KernelPluginRef, ProbeReport};
use bloomery_plugin_api::model::ModelPluginRef;
use bloomery_plugin_api::op::OpSupport;
use bloomery_plugin_api::{
    ABI_VERSION, ABI_VERSION_SYMBOL, PLUGIN_KIND_KERNEL, PLUGIN_KIND_MODEL, PLUGIN_KIND_SYMBOL,
};

use super::error::LoadError;

/// A loaded model plugin.
pub struct ModelPluginFile {
    /// The file.
    pub path: PathBuf,
    /// The plugin's name.
    pub name: String,
    /// Architectures served, aliases included.
    pub architectures: Vec<String>,
    /// The root module.
    pub module: ModelPluginRef,
}

/// A loaded kernel plugin with its probe result.
pub struct KernelPluginFile {
    /// The file.
    pub path: PathBuf,
    /// The bundle's name.
    pub name: String,
    /// What probing this machine found.
    pub probe: ProbeReport,
    /// The `(op, dtype)` pairs implemented.
    pub capabilities: Vec<OpSupport>,
    /// The root module.
    pub module: KernelPluginRef,
}

/// A plugin file of either kind.
pub enum PluginFile {
    /// A model plugin.
    Model(ModelPluginFile),
    /// A kernel plugin.
    Kernel(KernelPluginFile),
}

type U32Fn = unsafe extern "C" fn() -> u32;

/// Reads a `extern "C" fn() -> u32` symbol, or `None` when the library lacks it.
fn read_u32_symbol(lib: &libloading::Library, symbol: &[u8]) -> Option<u32> {
    // SAFETY: the symbols read here are declared by `bloomery_plugin_api::export_*_plugin!` as
    // `extern "C" fn() -> u32`; a library that exports the name with another type is not a plugin
    // of ours, and calling a function that takes no argument and returns a word cannot corrupt the
    // host beyond what loading the library already allowed.
    unsafe {
        let f: libloading::Symbol<'_, U32Fn> = lib.get(symbol).ok()?;
        Some(f())
    }
}

/// Opens one plugin file.
pub fn open(path: &Path) -> Result<PluginFile, LoadError> {
    // SAFETY: loading a library runs its initialisers; the plugin folder is trusted configuration
    // chosen by the user, as in every plugin host.
    let lib = unsafe { libloading::Library::new(path) }.map_err(|e| LoadError::NotALibrary {
        path: path.to_owned(),
        reason: first_line(&e.to_string()),
    })?;
    let version =
        read_u32_symbol(&lib, ABI_VERSION_SYMBOL).ok_or_else(|| LoadError::NotAPlugin {
            path: path.to_owned(),
        })?;
    if version != ABI_VERSION {
        return Err(LoadError::AbiMismatch {
            path: path.to_owned(),
            found: version,
            expected: ABI_VERSION,
        });
    }
    let kind = read_u32_symbol(&lib, PLUGIN_KIND_SYMBOL).ok_or_else(|| LoadError::NotAPlugin {
        path: path.to_owned(),
    })?;
    // abi_stable keeps its own handle; ours only served the two symbols above. abi_stable never
    // unloads a library, so the code stays mapped for the life of the process.
    drop(lib);
    match kind {
        PLUGIN_KIND_MODEL => {
            let module: ModelPluginRef = init_root(path)?;
            Ok(PluginFile::Model(ModelPluginFile {
                path: path.to_owned(),
                name: module.name()().into(),
                architectures: module.architectures()()
                    .into_iter()
                    .map(String::from)
                    .collect(),
                module,
            }))
        }
        PLUGIN_KIND_KERNEL => {
            let module: KernelPluginRef = init_root(path)?;
            Ok(PluginFile::Kernel(KernelPluginFile {
                path: path.to_owned(),
                name: module.name()().into(),
                probe: module.probe()(),
                capabilities: module.capabilities()().into_iter().collect(),
                module,
            }))
        }
        other => Err(LoadError::UnknownKind {
            path: path.to_owned(),
            kind: other,
        }),
    }
}

fn init_root<M: RootModule>(path: &Path) -> Result<M, LoadError> {
    let layout = |e: LibraryError| LoadError::Layout {
        path: path.to_owned(),
        summary: summarize(&e),
        detail: e.to_string(),
    };
    lib_header_from_path(path)
        .map_err(layout)?
        .init_root_module::<M>()
        .map_err(layout)
}

/// One line for abi_stable's report, which for a layout mismatch runs to hundreds of lines.
fn summarize(e: &LibraryError) -> String {
    match e {
        LibraryError::IncompatibleVersionNumber {
            library_name,
            expected_version,
            actual_version,
        } => format!(
            "{library_name} built against plugin-api {actual_version}, this host has {expected_version}"
        ),
        LibraryError::AbiInstability(_) => {
            "its types differ from this host's plugin-api layout (run with --verbose for the report)".into()
        }
        LibraryError::InvalidAbiHeader(h) => format!("built with another abi_stable ({h:?})"),
        LibraryError::Many(list) => list.iter().map(summarize).collect::<Vec<_>>().join("; "),
        LibraryError::GetSymbolError { symbol, .. } => format!(
            "no abi_stable root module (symbol `{}` missing): not built with bloomery-plugin-api's export macros",
            String::from_utf8_lossy(symbol).trim_end_matches('\0')
        ),
        other => first_line(&other.to_string()),
    }
}

fn first_line(s: &str) -> String {
    let line = s
        .lines()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .unwrap_or("");
    let mut out: String = line.chars().take(200).collect();
    if out.len() < line.len() {
        out.push('…');
    }
    out
}
