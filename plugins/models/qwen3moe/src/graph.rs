//! The `qwen3moe` forward graph: pre-norm GQA with QK-norm and NEOX rope, then routed experts
//! (softmax router, top-k, renormalised), for a batch of rows from any number of sequences.

use bloomery_plugin_api::builders::{causal_lm, LayerSettings};
use bloomery_plugin_api::graph::{BatchShape, Graph};
use bloomery_plugin_api::kv_model::KvModel;
use bloomery_plugin_api::op::{GluKind, RouterParams};
use bloomery_plugin_api::PluginError;

use crate::Qwen3Moe;

/// Builds the graph for `shape`.
pub fn build(m: &KvModel<Qwen3Moe>, shape: BatchShape) -> Result<Graph, PluginError> {
    let lm = &m.hp.lm;
    let x = m.hp.experts;
    let route = RouterParams::softmax_renorm(x.n_expert, x.n_expert_used, x.weights_scale);
    let s = LayerSettings::new(lm, m.rope);
    let w = &m.weights;
    causal_lm(shape, &w.globals, lm.eps, &w.layers, |g, at, l, x| {
        g.pre_norm_layer(l, at, s, x, |g, experts, x| {
            g.moe_block(&experts.block(route, GluKind::SwiGlu), x)
        })
    })
}
