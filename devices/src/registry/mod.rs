//! The plugin registry: every plugin of one or more folders, the errors of those that could not be
//! used, and the choice of a model plugin per architecture and of the best kernel plugin per
//! device class.

mod error;
mod loader;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use bloomery_plugin_api::kernel::DeviceClass;

pub use error::{LoadError, SelectError};
pub use loader::{KernelPluginFile, ModelPluginFile, PluginFile};

/// Every plugin found in the plugin folders.
#[derive(Default)]
pub struct Registry {
    /// The folders scanned, in order.
    pub dirs: Vec<PathBuf>,
    /// Model plugins, folder by folder in file-name order.
    pub models: Vec<ModelPluginFile>,
    /// Kernel plugins, folder by folder in file-name order.
    pub kernels: Vec<KernelPluginFile>,
    /// Files that could not be used, and refused claims.
    pub errors: Vec<LoadError>,
    /// Architecture → index into `models` (first claim wins, earlier folders first).
    arch_index: BTreeMap<String, usize>,
}

impl Registry {
    /// Loads every `*.so` file of `dir` (not recursing). A missing folder is an error; a bad file is
    /// recorded in `errors` and skipped.
    pub fn load(dir: &Path) -> Result<Registry, LoadError> {
        Registry::load_all(&[dir.to_owned()])
    }

    /// Loads every `*.so` file of each of `dirs` in turn, as [`Registry::load`] does one: where
    /// two folders serve an architecture or hold a kernel plugin of one name, the earlier wins.
    pub fn load_all(dirs: &[PathBuf]) -> Result<Registry, LoadError> {
        let mut reg = Registry {
            dirs: dirs.to_vec(),
            ..Registry::default()
        };
        for dir in dirs {
            reg.add_folder(dir)?;
        }
        for k in &reg.kernels {
            tracing::info!(
                plugin = %k.name,
                score = k.probe.score,
                "probe: {}",
                k.probe.reason
            );
        }
        Ok(reg)
    }

    /// The folders scanned, for messages: `a, b`.
    pub fn folders(&self) -> String {
        let names: Vec<String> = self.dirs.iter().map(|d| d.display().to_string()).collect();
        names.join(", ")
    }

    fn add_folder(&mut self, dir: &Path) -> Result<(), LoadError> {
        let folder_err = |e: std::io::Error| LoadError::Folder {
            path: dir.to_owned(),
            reason: e.to_string(),
        };
        let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
            .map_err(folder_err)?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "so") && p.is_file())
            .collect();
        files.sort();
        for path in files {
            match loader::open(&path) {
                Ok(PluginFile::Model(m)) => self.add_model(m),
                Ok(PluginFile::Kernel(k)) => self.add_kernel(k),
                Err(e) => {
                    tracing::warn!("{e}");
                    self.errors.push(e);
                }
            }
        }
        Ok(())
    }

    fn add_model(&mut self, m: ModelPluginFile) {
        let index = self.models.len();
        for arch in &m.architectures {
            if let Some(&first) = self.arch_index.get(arch) {
                let e = LoadError::DuplicateArchitecture {
                    arch: arch.clone(),
                    first: self.models[first].path.clone(),
                    second: m.path.clone(),
                };
                tracing::warn!("{e}");
                self.errors.push(e);
            } else {
                self.arch_index.insert(arch.clone(), index);
            }
        }
        self.models.push(m);
    }

    fn add_kernel(&mut self, k: KernelPluginFile) {
        if let Some(first) = self.kernels.iter().find(|x| x.name == k.name) {
            let e = LoadError::DuplicateKernel {
                name: k.name.clone(),
                first: first.path.clone(),
                second: k.path.clone(),
            };
            tracing::warn!("{e}");
            self.errors.push(e);
            return;
        }
        self.kernels.push(k);
    }

    /// Architectures served by the loaded model plugins, sorted.
    pub fn served_architectures(&self) -> Vec<String> {
        self.arch_index.keys().cloned().collect()
    }

    /// The model plugin serving `arch`.
    pub fn model_for(&self, arch: &str) -> Result<&ModelPluginFile, SelectError> {
        self.arch_index
            .get(arch)
            .map(|&i| &self.models[i])
            .ok_or_else(|| SelectError::NoArchitecture {
                arch: arch.to_owned(),
                served: self.served_architectures(),
            })
    }

    /// Whether a model plugin's claim on `arch` is the one in force.
    pub fn serves(&self, plugin: &ModelPluginFile, arch: &str) -> bool {
        self.arch_index
            .get(arch)
            .is_some_and(|&i| self.models[i].path == plugin.path)
    }

    /// The best-scoring kernel plugin of `class` that can run here (score > 0); ties go to the
    /// first in file-name order.
    pub fn best_kernel(&self, class: DeviceClass) -> Result<&KernelPluginFile, SelectError> {
        let mut best: Option<&KernelPluginFile> = None;
        for k in self
            .kernels
            .iter()
            .filter(|k| k.probe.class == class && k.probe.score > 0)
        {
            if best.is_none_or(|b| k.probe.score > b.probe.score) {
                best = Some(k);
            }
        }
        let candidates = self
            .kernels
            .iter()
            .filter(|k| k.probe.class == class)
            .count();
        if candidates == 0 {
            return Err(SelectError::NoKernel {
                reasons: format!("no {class:?} kernel plugin in {}", self.folders()),
            });
        }
        best.ok_or_else(|| SelectError::NoKernel {
            reasons: self
                .kernels
                .iter()
                .filter(|k| k.probe.class == class)
                .map(|k| format!("{}: {}", k.name, k.probe.reason))
                .collect::<Vec<_>>()
                .join("; "),
        })
    }
}
