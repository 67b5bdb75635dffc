//! Model plugin for the Qwen3-MoE family (GGUF architecture `qwen3moe`): Qwen3-30B-A3B and
//! Qwen3-235B-A22B. GQA with QK-norm and NEOX rope; 128 routed experts, softmax router, top-8,
//! renormalised; separate or fused gate/up expert stacks.
#![allow(non_local_definitions)]

pub mod graph;
pub mod hparams;
pub mod synth;
pub mod weights;

use abi_stable::std_types::RResult;
use bloomery_plugin_api::builders::{kv_cache_decls, RopeConfig};
use bloomery_plugin_api::graph::{BatchShape, Graph};
use bloomery_plugin_api::meta::ModelFileView;
use bloomery_plugin_api::model::{ModelCaps, ModelInstance, ModelSpec};
use bloomery_plugin_api::op::{RopeMode, RopeParams};
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
        let weights = Weights::from_view(view, &hp)?;
        let rope = RopeConfig::from_view(view, ARCH, RopeMode::Neox, hp.head_dim)?.params;
        Ok(Qwen3Moe { hp, weights, rope })
    }
}

impl ModelInstance for Qwen3Moe {
    fn spec(&self) -> ModelSpec {
        ModelSpec {
            architecture: ARCH.into(),
            hparams: self.hp.summary(),
            weights: self.weights.decls.clone(),
            state: kv_cache_decls(
                self.hp.n_layer,
                u64::from(self.hp.head_dim * self.hp.n_head_kv),
                |_| 0,
            ),
            caps: ModelCaps::kv_only(u64::from(self.hp.n_ctx_train)),
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
