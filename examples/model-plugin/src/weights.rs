//! Every weight of a `qwen3` model, by role and shape.

use bloomery_plugin_api::model::WeightClass;
use bloomery_plugin_api::weights::{GluFfnWeights, ModelWeights, PreNormLayer, WeightTable};
use bloomery_plugin_api::PluginError;

use crate::hparams::HParams;

/// All weights: each layer pre-norm attention with QK-norm, then a pre-norm SwiGLU FFN; the head
/// is the embedding when the file has no `output.weight` (the small models tie them).
pub type Weights = ModelWeights<PreNormLayer<GluFfnWeights>>;

/// Declares every weight into `t`.
pub fn declare(t: &mut WeightTable<'_>, hp: &HParams) -> Result<Weights, PluginError> {
    let (e, ff) = (u64::from(hp.lm.n_embd), u64::from(hp.n_ff));
    ModelWeights::declare(t, &hp.lm, |l| {
        l.pre_norm(e, &hp.lm.attn, |l| l.glu_ffn("", WeightClass::Ffn, e, ff))
    })
}
