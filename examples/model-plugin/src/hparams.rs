//! Typed hyperparameters of a `qwen3` file, parsed once from its metadata: what every causal LM
//! has, and the width of the dense FFN.

use bloomery_plugin_api::hparams::{ArchKeys, LmHParams};
use bloomery_plugin_api::kv_model::ArchHParams;
use bloomery_plugin_api::meta::ModelFileView;
use bloomery_plugin_api::model::HParams as Summary;
use bloomery_plugin_api::PluginError;

/// The architecture string.
pub const ARCH: &str = "qwen3";

/// Hyperparameters.
#[derive(Clone, Debug, PartialEq)]
pub struct HParams {
    /// Layers, widths, attention heads, vocabulary.
    pub lm: LmHParams,
    /// Dense FFN width.
    pub n_ff: u32,
}

impl ArchHParams for HParams {
    fn read(view: &ModelFileView) -> Result<Self, PluginError> {
        let keys = ArchKeys::new(view, ARCH);
        Ok(HParams {
            lm: LmHParams::read(&keys)?,
            n_ff: keys.width("feed_forward_length", "ffn_down.weight", 0)?,
        })
    }

    fn lm(&self) -> &LmHParams {
        &self.lm
    }

    fn summary(&self) -> Summary {
        self.lm.dense_summary(self.n_ff)
    }
}
