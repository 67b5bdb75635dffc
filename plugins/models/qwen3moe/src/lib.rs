//! Model plugin for the Qwen3-MoE family (GGUF architecture `qwen3moe`): Qwen3-30B-A3B and
//! Qwen3-235B-A22B. GQA with QK-norm and NEOX rope; 128 routed experts, softmax router, top-8,
//! renormalised; separate or fused gate/up expert stacks.
#![allow(non_local_definitions)]

pub mod graph;
pub mod hparams;
pub mod synth;
pub mod weights;

use bloomery_plugin_api::kv_model::KvModel;

use graph::Qwen3Moe;
use hparams::ARCH;

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
