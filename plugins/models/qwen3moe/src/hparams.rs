//! Typed hyperparameters of a `qwen3moe` file, parsed once from its metadata.

use bloomery_plugin_api::hparams::{ArchKeys, Experts, LmHParams};
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

impl HParams {
    /// Reads the keys; a missing or mistyped key is a named error.
    pub fn from_view(view: &ModelFileView) -> Result<Self, PluginError> {
        let keys = ArchKeys::new(view, ARCH);
        Ok(HParams {
            lm: LmHParams::read(&keys)?,
            experts: Experts::read(&keys)?,
        })
    }

    /// The summary the host shows and plans with.
    pub fn summary(&self) -> Summary {
        self.lm.moe_summary(&self.experts)
    }
}
