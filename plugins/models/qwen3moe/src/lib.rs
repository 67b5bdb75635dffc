//! Model plugin for the Qwen3-MoE family (GGUF architecture `qwen3moe`): Qwen3-30B-A3B and
//! Qwen3-235B-A22B. GQA with QK-norm and NEOX rope; 128 routed experts, softmax router, top-8,
//! renormalised; separate or fused gate/up expert stacks.
#![allow(non_local_definitions)]

pub mod graph;
pub mod hparams;
pub mod synth;
pub mod weights;

use abi_stable::std_types::RResult;
use bloomery_plugin_api::builders::kv_cache_decls;
use bloomery_plugin_api::graph::{BatchShape, Graph};
use bloomery_plugin_api::hparams::{ArchKeys, RopeConfig};
use bloomery_plugin_api::meta::ModelFileView;
use bloomery_plugin_api::model::{ModelCaps, ModelInstance, ModelSpec};
use bloomery_plugin_api::op::{RopeMode, RopeParams};
use bloomery_plugin_api::weights::WeightTable;
use bloomery_plugin_api::PluginError;

use hparams::{HParams, ARCH};
use weights::Weights;

/// A loaded `qwen3moe` model.
pub struct Qwen3Moe {
    hp: HParams,
    weights: Weights,
    rope: RopeParams,
}

impl Qwen3Moe {
    /// Reads hyperparameters and weights from the file view.
    pub fn load(view: &ModelFileView) -> Result<Self, PluginError> {
        view.expect_architecture(ARCH)?;
        let hp = HParams::from_view(view)?;
        let weights = weights::declare(&mut WeightTable::new(view), &hp)?;
        let keys = ArchKeys::new(view, ARCH);
        let rope = RopeConfig::read(&keys, RopeMode::Neox, hp.lm.attn.head_dim)?.params;
        Ok(Qwen3Moe { hp, weights, rope })
    }
}

impl ModelInstance for Qwen3Moe {
    fn spec(&self) -> ModelSpec {
        ModelSpec {
            architecture: ARCH.into(),
            hparams: self.hp.summary(),
            weights: self.weights.decls.clone(),
            state: kv_cache_decls(self.hp.lm.n_layer, self.hp.lm.attn.kv_width(), |_| 0),
            caps: ModelCaps::kv_only(u64::from(self.hp.lm.n_ctx_train)),
        }
    }

    fn build_graph(&self, shape: BatchShape) -> RResult<Graph, PluginError> {
        graph::build(&self.hp, &self.weights, self.rope, shape).into()
    }
}

bloomery_plugin_api::export_model_plugin! {
    name: ARCH,
    architectures: [ARCH],
    synth_presets: synth::presets,
    load: Qwen3Moe::load,
}

#[cfg(test)]
mod tests {
    use super::*;
    use bloomery_plugin_api::DType;

    #[test]
    fn every_preset_loads_with_its_declared_weights() {
        for p in synth::presets() {
            let m = Qwen3Moe::load(&p.file_view(DType::F32)).unwrap();
            assert_eq!(m.spec().weights.len(), p.tensors.len(), "{}", p.name);
        }
    }
}
