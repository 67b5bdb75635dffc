//! The `qwen3` forward graph: per layer pre-norm GQA with QK-norm and NEOX rope, then a pre-norm
//! SwiGLU FFN; final norm and head. Node names follow llama.cpp's.

use bloomery_plugin_api::builders::{causal_lm, LayerSettings};
use bloomery_plugin_api::graph::{BatchShape, Graph};
use bloomery_plugin_api::kv_model::KvModel;
use bloomery_plugin_api::op::GluKind;
use bloomery_plugin_api::PluginError;

use crate::Qwen3;

/// Builds the graph for `shape`.
pub fn build(m: &KvModel<Qwen3>, shape: BatchShape) -> Result<Graph, PluginError> {
    let lm = &m.hp.lm;
    let s = LayerSettings::new(lm, m.rope);
    let w = &m.weights;
    causal_lm(shape, &w.globals, lm.eps, &w.layers, |g, at, l, x| {
        g.pre_norm_layer(l, at, s, x, |g, ffn, x| {
            g.glu_ffn("ffn_", ffn, GluKind::SwiGlu, x)
        })
    })
}
