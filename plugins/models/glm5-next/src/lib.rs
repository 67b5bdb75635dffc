//! Model plugin for GLM-5.3 (GGUF architecture `glm5-next`, and ik_llama.cpp's spelling
//! `glm5next`): Kimi Delta Attention layers and, every fourth layer, NoPE latent attention (MLA)
//! over the selection of a k-pool DSA indexer; manifold hyper-connections (4 residual streams)
//! around every mixer and FFN; dense SwiGLU lead layers, then 288 sigmoid-routed experts plus a
//! shared expert, clamped; a NextN layer after the trunk, declared and built apart as the
//! draft graph ([`nextn::build`]). The KDA layer is the shared builder `bloomery_plugin_api::kda`.

pub mod graph;
pub mod hparams;
pub mod layers;
pub mod mla;
pub mod nextn;
pub mod state;
pub mod synth;
pub mod weights;

use abi_stable::std_types::{RResult, RVec};
use bloomery_plugin_api::graph::{BatchShape, Graph, GraphKind};
use bloomery_plugin_api::meta::ModelFileView;
use bloomery_plugin_api::model::{ModelCaps, ModelInstance, ModelSpec, StateDecl};
use bloomery_plugin_api::weights::WeightTable;
use bloomery_plugin_api::PluginError;

use hparams::{HParams, ARCH, ARCH_IK};
use state::LayerState;
use weights::Weights;

/// A loaded GLM-5.3 model.
pub struct Glm5Next {
    hp: HParams,
    weights: Weights,
    state: Vec<StateDecl>,
    layer_state: Vec<LayerState>,
}

impl Glm5Next {
    /// Reads hyperparameters and weights from the file view.
    pub fn load(view: &ModelFileView) -> Result<Self, PluginError> {
        let arch = match view.architecture()? {
            ARCH => ARCH,
            ARCH_IK => ARCH_IK,
            other => {
                return Err(PluginError::unsupported(
                    format!("architecture `{other}`"),
                    &[ARCH, ARCH_IK],
                ))
            }
        };
        let hp = HParams::from_view(view, arch)?;
        let weights = weights::declare(&mut WeightTable::new(view), &hp)?;
        let (state, layer_state) = state::declare(&hp, weights.nextn.is_some());
        Ok(Glm5Next {
            hp,
            weights,
            state,
            layer_state,
        })
    }

    /// What a graph of `kind` needs.
    fn model(&self, kind: GraphKind) -> graph::Model<'_> {
        graph::Model {
            hp: &self.hp,
            w: &self.weights,
            state: &self.layer_state,
            verify: kind == GraphKind::Verify,
        }
    }
}

impl ModelInstance for Glm5Next {
    fn spec(&self) -> ModelSpec {
        ModelSpec {
            architecture: self.hp.arch.into(),
            hparams: self.hp.summary(),
            weights: self.weights.decls.clone().into(),
            state: RVec::from(self.state.clone()),
            caps: ModelCaps {
                recurrent: true,
                n_mtp_layers: u32::from(self.weights.nextn.is_some()),
                max_context: u64::from(self.hp.lm.n_ctx_train),
            },
            ngram: abi_stable::std_types::ROption::RNone,
        }
    }

    fn build_graph(&self, shape: BatchShape) -> RResult<Graph, PluginError> {
        match shape.kind {
            GraphKind::Main | GraphKind::Verify => graph::build(&self.model(shape.kind), shape),
            GraphKind::Mtp => nextn::build(&self.model(shape.kind), shape),
        }
        .into()
    }
}

bloomery_plugin_api::export_model_plugin! {
    name: ARCH,
    architectures: [ARCH, ARCH_IK],
    synth_presets: synth::presets,
    load: Glm5Next::load,
}

/// The test binary refuses any one allocation over 1 GiB, so that the hostile-file test fails
/// on a table sized by a hostile count.
#[cfg(test)]
#[global_allocator]
static ALLOC: bloomery_plugin_api::hostile::CappedAlloc =
    bloomery_plugin_api::hostile::CappedAlloc::new(1 << 30);

#[cfg(test)]
mod tests;
