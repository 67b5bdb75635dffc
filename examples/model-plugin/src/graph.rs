//! The `qwen3` architecture and its forward graph: per layer pre-norm GQA with QK-norm and NEOX rope, then a pre-norm
//! SwiGLU FFN; final norm and head. Node names follow llama.cpp's.

use bloomery_plugin_api::builders::{causal_lm, LayerSettings};
use bloomery_plugin_api::graph::{BatchShape, Graph};
use bloomery_plugin_api::kv_model::{KvArchitecture, KvModel};
use bloomery_plugin_api::op::GluKind;
use bloomery_plugin_api::op::RopeMode;
use bloomery_plugin_api::weights::{GluFfnWeights, PreNormLayer, WeightTable};
use bloomery_plugin_api::PluginError;

use crate::hparams::{HParams, ARCH};
use crate::weights::{self, Weights};

/// The `qwen3` architecture: its state is a K/V cache per layer, so [`KvModel`] loads and serves
/// it from what this crate declares.
pub struct Qwen3;

impl KvArchitecture for Qwen3 {
    const ARCH: &'static str = ARCH;
    const ROPE: RopeMode = RopeMode::Neox;
    type HParams = HParams;
    type Layer = PreNormLayer<GluFfnWeights>;

    fn weights(t: &mut WeightTable<'_>, hp: &HParams) -> Result<Weights, PluginError> {
        weights::declare(t, hp)
    }

    fn graph(m: &KvModel<Self>, shape: BatchShape) -> Result<Graph, PluginError> {
        build(m, shape)
    }
}

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
