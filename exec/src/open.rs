//! A model file opened by the plugin that serves its `general.architecture`.

use std::path::Path;

use bloomery_devices::{ModelPluginFile, Registry};
use bloomery_gguf::GgufModel;
use bloomery_plugin_api::abi_stable::std_types::ROption;
use bloomery_plugin_api::model::{ModelInstanceBox, ModelSpec};
use bloomery_plugin_api::PluginError;

use crate::error::ModelError;
use crate::file_check::check_hyperparameters;
use crate::overrides::MetaOverride;
use crate::view;

/// A file opened by its model plugin.
pub(crate) struct Opened<'r> {
    pub(crate) file: GgufModel,
    pub(crate) shown: String,
    pub(crate) plugin: &'r ModelPluginFile,
    pub(crate) instance: ModelInstanceBox,
    pub(crate) spec: ModelSpec,
}

/// `file` (of architecture `arch`, shown as `shown` in errors) loaded by its model `plugin`,
/// once the host's checks of its hyperparameters pass (`file_check.rs`).
pub fn instantiate(
    plugin: &ModelPluginFile,
    file: &GgufModel,
    arch: &str,
    shown: &str,
) -> Result<ModelInstanceBox, ModelError> {
    check_hyperparameters(file, arch, shown)?;
    let refused = |error| ModelError::Plugin {
        path: shown.to_owned(),
        plugin: plugin.name.clone(),
        error,
    };
    let instance = plugin.module.load()(&view::file_view(file))
        .into_result()
        .map_err(refused)?;
    // The host hashes with the declared n-gram constants: checked before any pass reads them.
    let spec = instance.spec();
    if let ROption::RSome(n) = &spec.ngram {
        n.check().map_err(refused)?;
        let n_vocab = spec.hparams.n_vocab as usize;
        if !n.token_map.is_empty() && n.token_map.len() != n_vocab {
            return Err(refused(PluginError::invalid(format!(
                "n-gram spec: a token map of {} ids for a vocabulary of {n_vocab}",
                n.token_map.len()
            ))));
        }
    }
    Ok(instance)
}

pub(crate) fn open_model<'r>(
    reg: &'r Registry,
    path: &Path,
    overrides: &[MetaOverride],
) -> Result<Opened<'r>, ModelError> {
    let mut file = GgufModel::open(path)?;
    let shown = path.display().to_string();
    crate::overrides::apply(file.metadata_mut(), overrides).map_err(|why| {
        ModelError::Override {
            path: shown.clone(),
            why,
        }
    })?;
    let arch = file
        .metadata()
        .get_str("general.architecture")
        .map_err(|_| ModelError::NoArchitecture {
            path: shown.clone(),
        })?
        .to_owned();
    let plugin = reg.model_for(&arch)?;
    let instance = instantiate(plugin, &file, &arch, &shown)?;
    let spec = instance.spec();
    Ok(Opened {
        file,
        shown,
        plugin,
        instance,
        spec,
    })
}
