//! Every weight of a `qwen3moe` model, by role and shape.

use bloomery_plugin_api::weights::{ExpertWeights, ModelWeights, PreNormLayer, WeightTable};
use bloomery_plugin_api::PluginError;

use crate::hparams::HParams;

/// All weights: each layer pre-norm attention with QK-norm, then routed experts (separate or
/// fused gate/up stacks).
pub type Weights = ModelWeights<PreNormLayer<ExpertWeights>>;

/// Declares every weight into `t`.
pub fn declare(t: &mut WeightTable<'_>, hp: &HParams) -> Result<Weights, PluginError> {
    let e = u64::from(hp.lm.n_embd);
    let x = hp.experts;
    ModelWeights::declare(t, &hp.lm, |l| {
        l.pre_norm(e, &hp.lm.attn, |l| {
            l.experts(e, u64::from(x.n_ff_exp), x.n_expert)
        })
    })
}
