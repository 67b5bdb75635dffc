//! Every weight of a `gemma3` model, by role and shape.

use bloomery_plugin_api::model::WeightClass;
use bloomery_plugin_api::weights::{
    AttentionWeights, GluFfnWeights, ModelWeights, WeightRef, WeightTable,
};
use bloomery_plugin_api::PluginError;

use crate::hparams::HParams;

/// The weights of one layer. Norm weights are used as stored: the GGUF converter already folded
/// Gemma's `1 + w` into them.
pub struct Layer {
    /// Pre-attention RMS norm.
    pub attn_norm: WeightRef,
    /// Attention with QK-norm.
    pub attn: AttentionWeights,
    /// RMS norm of the attention output, before the residual add.
    pub attn_post_norm: WeightRef,
    /// Pre-FFN RMS norm.
    pub ffn_norm: WeightRef,
    /// GeGLU FFN.
    pub ffn: GluFfnWeights,
    /// RMS norm of the FFN output, before the residual add.
    pub ffn_post_norm: WeightRef,
}

/// All weights.
pub type Weights = ModelWeights<Layer>;

/// Declares every weight into `t`.
pub fn declare(t: &mut WeightTable<'_>, hp: &HParams) -> Result<Weights, PluginError> {
    let (e, ff) = (u64::from(hp.lm.n_embd), u64::from(hp.n_ff));
    ModelWeights::declare(t, &hp.lm, |l| {
        Ok(Layer {
            attn_norm: l.norm("attn_norm", e)?,
            attn: l.attention(e, &hp.lm.attn)?,
            attn_post_norm: l.norm("post_attention_norm", e)?,
            ffn_norm: l.norm("ffn_norm", e)?,
            ffn: l.glu_ffn("", WeightClass::Ffn, e, ff)?,
            ffn_post_norm: l.norm("post_ffw_norm", e)?,
        })
    })
}
