//! Typed hyperparameters of a `qwen3moe` file, parsed once from its metadata.

use bloomery_plugin_api::hparams::{ArchKeys, Experts, LmHParams};
use bloomery_plugin_api::kv_model::ArchHParams;
use bloomery_plugin_api::meta::ModelFileView;
use bloomery_plugin_api::model::HParams as Summary;
use bloomery_plugin_api::PluginError;

/// The architecture string.
pub const ARCH: &str = "qwen3moe";

/// Hyperparameters.
#[derive(Clone, Debug, PartialEq)]
pub struct HParams {
    /// Layers, widths, attention heads, vocabulary.
    pub lm: LmHParams,
    /// The routed experts.
    pub experts: Experts,
}

impl ArchHParams for HParams {
    fn read(view: &ModelFileView) -> Result<Self, PluginError> {
        let keys = ArchKeys::new(view, ARCH);
        Ok(HParams {
            lm: LmHParams::read(&keys)?,
            experts: Experts::read(&keys)?,
        })
    }

    fn lm(&self) -> &LmHParams {
        &self.lm
    }

    fn summary(&self) -> Summary {
        self.lm.moe_summary(&self.experts)
    }
}
