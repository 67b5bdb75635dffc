//! The `qwen3` forward graph: per layer pre-norm GQA with QK-norm and NEOX rope, then a pre-norm
//! SwiGLU FFN; final norm and head. Node names follow llama.cpp's.

use bloomery_plugin_api::builders::{causal_lm, LayerSettings};
use bloomery_plugin_api::graph::{BatchShape, Graph};
use bloomery_plugin_api::op::{GluKind, RopeParams};
use bloomery_plugin_api::PluginError;

use crate::hparams::HParams;
use crate::weights::Weights;

/// Builds the graph for `shape`.
pub fn build(
    hp: &HParams,
    w: &Weights,
    rope: RopeParams,
    shape: BatchShape,
) -> Result<Graph, PluginError> {
    let s = LayerSettings {
        attn: hp.lm.attn.gqa(),
        rope: Some(rope),
        eps: hp.lm.eps,
    };
    causal_lm(shape, &w.globals, hp.lm.eps, &w.layers, |g, at, l, x| {
        g.pre_norm_layer(l, at, s, x, |g, ffn, x| {
            g.glu_ffn("ffn_", ffn, GluKind::SwiGlu, x)
        })
    })
}
