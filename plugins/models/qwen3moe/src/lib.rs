//! Model plugin for the Qwen3-MoE family (GGUF architecture `qwen3moe`): Qwen3-30B-A3B and
//! Qwen3-235B-A22B. GQA with QK-norm and NEOX rope; 128 routed experts, softmax router, top-8,
//! renormalised; separate or fused gate/up expert stacks.
#![allow(non_local_definitions)]

pub mod graph;
pub mod hparams;
pub mod synth;
pub mod weights;

use bloomery_plugin_api::graph::{BatchShape, Graph};
use bloomery_plugin_api::kv_model::{KvArchitecture, KvModel};
use bloomery_plugin_api::op::RopeMode;
use bloomery_plugin_api::weights::{ExpertWeights, PreNormLayer, WeightTable};
use bloomery_plugin_api::PluginError;

use hparams::{HParams, ARCH};
use weights::Weights;

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
        graph::build(m, shape)
    }
}

bloomery_plugin_api::export_model_plugin! {
    name: ARCH,
    architectures: [ARCH],
    synth_presets: synth::presets,
    load: KvModel::<Qwen3Moe>::load,
}

#[cfg(test)]
mod tests {
    use super::*;
    use bloomery_plugin_api::synth::check_presets;

    #[test]
    fn every_preset_loads_with_its_declared_weights() {
        check_presets(&synth::presets(), KvModel::<Qwen3Moe>::load).unwrap();
    }
}
