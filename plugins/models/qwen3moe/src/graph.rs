//! The `qwen3moe` architecture and its forward graph: pre-norm GQA with QK-norm and NEOX rope, then routed experts
//! (softmax router, top-k, renormalised), for a batch of rows from any number of sequences.

use bloomery_plugin_api::builders::{causal_lm, LayerSettings};
use bloomery_plugin_api::graph::{BatchShape, Graph};
use bloomery_plugin_api::kv_model::{KvArchitecture, KvModel};
use bloomery_plugin_api::op::RopeMode;
use bloomery_plugin_api::op::{GluKind, RouterParams};
use bloomery_plugin_api::weights::{ExpertWeights, PreNormLayer, WeightTable};
use bloomery_plugin_api::PluginError;

use crate::hparams::{HParams, ARCH};
use crate::weights::{self, Weights};

/// The `qwen3moe` architecture: its state is a K/V cache per layer.
pub struct Qwen3Moe;

impl KvArchitecture for Qwen3Moe {
    const ARCH: &'static str = ARCH;
    const ROPE: RopeMode = RopeMode::Neox;
    type HParams = HParams;
    type Layer = PreNormLayer<ExpertWeights>;

    fn weights(t: &mut WeightTable<'_>, hp: &HParams) -> Result<Weights, PluginError> {
        weights::declare(t, hp)
    }

    fn graph(m: &KvModel<Self>, shape: BatchShape) -> Result<Graph, PluginError> {
        build(m, shape)
    }
}

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
