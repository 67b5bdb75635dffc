//! Example model plugin for dense Qwen3 (GGUF architecture `qwen3`: Qwen3-0.6B, 1.7B, 4B, 8B, 14B,
//! 32B), built outside the bloomery workspace against `bloomery-plugin-api` alone. GQA with
//! QK-norm and NEOX rope; SwiGLU FFN; head tied to the embedding in the small models.
//! `docs/new-architecture.md` walks through it.
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

/// A loaded `qwen3` model.
pub struct Qwen3 {
    hp: HParams,
    weights: Weights,
    rope: RopeParams,
}

impl Qwen3 {
    /// Reads hyperparameters and weights from the file view.
    pub fn load(view: &ModelFileView) -> Result<Self, PluginError> {
        view.expect_architecture(ARCH)?;
        let hp = HParams::from_view(view)?;
        let weights = weights::declare(&mut WeightTable::new(view), &hp)?;
        let keys = ArchKeys::new(view, ARCH);
        let rope = RopeConfig::read(&keys, RopeMode::Neox, hp.lm.attn.head_dim)?.params;
        Ok(Qwen3 { hp, weights, rope })
    }
}

impl ModelInstance for Qwen3 {
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
    load: Qwen3::load,
}

#[cfg(test)]
mod tests {
    use super::*;
    use bloomery_plugin_api::graph::GraphKind;
    use bloomery_plugin_api::op::{GluKind, Op};
    use bloomery_plugin_api::DType;

    #[test]
    fn every_preset_loads_with_its_declared_weights() {
        for p in synth::presets() {
            let m = Qwen3::load(&p.file_view(DType::F32)).unwrap();
            assert_eq!(m.spec().weights.len(), p.tensors.len(), "{}", p.name);
        }
    }

    #[test]
    fn the_tiny_graph_has_a_swiglu_ffn_per_layer_and_a_tied_head() {
        let presets = synth::presets();
        let tiny = presets.iter().find(|p| p.name.as_str() == "tiny").unwrap();
        let m = Qwen3::load(&tiny.file_view(DType::F32)).unwrap();
        let shape = BatchShape {
            n_rows: 3,
            n_outputs: 1,
            kind: GraphKind::Main,
        };
        let g = graph::build(&m.hp, &m.weights, m.rope, shape).unwrap();
        let count = |f: fn(&Op) -> bool| g.nodes.iter().filter(|n| f(&n.op)).count();
        assert_eq!(
            count(|op| matches!(
                op,
                Op::Glu {
                    kind: GluKind::SwiGlu,
                    ..
                }
            )),
            4
        );
        assert_eq!(count(|op| matches!(op, Op::Attention(_))), 4);
        assert_eq!(m.weights.globals.output, m.weights.globals.tok_embd);
        let logits = g
            .outputs
            .iter()
            .find(|o| o.name.as_str() == "logits")
            .unwrap();
        assert_eq!(g.tensors[logits.tensor.0 as usize].ne, [512, 1, 1, 1]);
    }
}
