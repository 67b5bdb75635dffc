//! Typed hyperparameters of a `gemma3` file, parsed once from its metadata.

use bloomery_plugin_api::hparams::{ArchKeys, LmHParams};
use bloomery_plugin_api::meta::ModelFileView;
use bloomery_plugin_api::model::HParams as Summary;
use bloomery_plugin_api::PluginError;

/// The architecture string.
pub const ARCH: &str = "gemma3";

/// Period of the sliding/global layer pattern when the file has no
/// `attention.sliding_window_pattern` key: in each period of this many layers all but the last
/// slide (llama.cpp's default for Gemma 3: five sliding layers, then one global layer).
pub const DEFAULT_SWA_PATTERN: u32 = 6;

/// Rope base of the sliding-window layers when the file has no `rope.freq_base_swa` key.
pub const DEFAULT_FREQ_BASE_SWA: f32 = 10_000.0;

/// Hyperparameters.
#[derive(Clone, Debug, PartialEq)]
pub struct HParams {
    /// Layers, widths, attention heads, vocabulary.
    pub lm: LmHParams,
    /// Dense FFN width.
    pub n_ff: u32,
    /// Sliding window in positions (0 = every layer global).
    pub sliding_window: u32,
    /// Per layer: does it use the sliding window (and the local rope base)?
    pub is_swa: Vec<bool>,
    /// Rope base of the sliding-window layers.
    pub freq_base_swa: f32,
    /// Attention logit scale applied to the queries.
    pub attn_scale: f32,
    /// Final logit soft cap (0 = none).
    pub final_softcap: f32,
}

impl HParams {
    /// Reads the keys; a missing or mistyped key is a named error.
    pub fn from_view(view: &ModelFileView) -> Result<Self, PluginError> {
        let keys = ArchKeys::new(view, ARCH);
        let lm = LmHParams::read(&keys)?;
        let sliding_window = keys.u32_or("attention.sliding_window", 0)?;
        // Which layers slide: an explicit per-layer array, or a period whose last layer is global.
        let is_swa = if sliding_window > 0 {
            keys.layer_flags(
                "attention.sliding_window_pattern",
                lm.n_layer,
                DEFAULT_SWA_PATTERN,
            )?
        } else {
            vec![false; lm.n_layer as usize]
        };
        // gemma_pytorch: the 27B model scales by 1/sqrt(n_embd / n_head) (query_pre_attn_scalar);
        // the others by 1/sqrt(head_dim). llama.cpp tells the 27B by its 62 layers.
        let attn_scale = if lm.n_layer == 62 {
            1.0 / ((lm.n_embd / lm.attn.n_head) as f32).sqrt()
        } else {
            1.0 / (lm.attn.head_dim as f32).sqrt()
        };
        Ok(HParams {
            n_ff: keys.width("feed_forward_length", "ffn_down.weight", 0)?,
            sliding_window,
            is_swa,
            freq_base_swa: keys.f32_or("rope.freq_base_swa", DEFAULT_FREQ_BASE_SWA)?,
            attn_scale,
            final_softcap: keys.f32_or("final_logit_softcapping", 0.0)?,
            lm,
        })
    }

    /// The summary the host shows and plans with.
    pub fn summary(&self) -> Summary {
        self.lm.dense_summary(self.n_ff)
    }
}
