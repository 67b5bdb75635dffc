//! Model plugin for the Kimi Delta Attention (KDA) hybrids: GGUF architectures `solar-open2`
//! (Solar-Open2-250B: KDA layers and, every fourth layer from layer 0, gated NoPE GQA; every
//! layer MoE with sigmoid routing and a shared expert) and `kimi-linear` (Kimi-Linear files whose
//! layers are all KDA; its MLA attention layers are refused by name). The KDA layer itself is
//! the shared builder `bloomery_plugin_api::kda`.

pub mod graph;
pub mod hparams;
pub mod state;
pub mod synth;
pub mod weights;

use abi_stable::std_types::{RResult, RVec};
use bloomery_plugin_api::graph::{BatchShape, Graph};
use bloomery_plugin_api::meta::ModelFileView;
use bloomery_plugin_api::model::{ModelCaps, ModelInstance, ModelSpec, StateDecl};
use bloomery_plugin_api::weights::WeightTable;
use bloomery_plugin_api::PluginError;

use hparams::{HParams, ARCH_KIMI, ARCH_SOLAR};
use state::LayerState;
use weights::Weights;

/// A loaded KDA hybrid.
pub struct KdaHybrid {
    hp: HParams,
    weights: Weights,
    state: RVec<StateDecl>,
    layer_state: Vec<LayerState>,
}

impl KdaHybrid {
    /// Reads hyperparameters and weights from the file view.
    pub fn load(view: &ModelFileView) -> Result<Self, PluginError> {
        let arch = match view.architecture()? {
            ARCH_SOLAR => ARCH_SOLAR,
            ARCH_KIMI => ARCH_KIMI,
            other => {
                return Err(PluginError::unsupported(
                    format!("architecture `{other}`"),
                    &[ARCH_SOLAR, ARCH_KIMI],
                ))
            }
        };
        let hp = HParams::from_view(view, arch)?;
        let weights = weights::declare(&mut WeightTable::new(view), &hp)?;
        let (state, layer_state) = state::declare(&hp);
        Ok(KdaHybrid {
            hp,
            weights,
            state,
            layer_state,
        })
    }
}

impl ModelInstance for KdaHybrid {
    fn spec(&self) -> ModelSpec {
        ModelSpec {
            architecture: self.hp.arch.into(),
            hparams: self.hp.summary(),
            weights: self.weights.decls.clone(),
            state: self.state.clone(),
            caps: ModelCaps {
                recurrent: true,
                n_mtp_layers: 0,
                max_context: u64::from(self.hp.lm.n_ctx_train),
            },
            ngram: abi_stable::std_types::ROption::RNone,
        }
    }

    fn build_graph(&self, shape: BatchShape) -> RResult<Graph, PluginError> {
        let m = graph::Model {
            hp: &self.hp,
            w: &self.weights,
            state: &self.layer_state,
        };
        graph::build(&m, shape).into()
    }
}

bloomery_plugin_api::export_model_plugin! {
    name: "solar-open2",
    architectures: [ARCH_SOLAR, ARCH_KIMI],
    synth_presets: synth::presets,
    load: KdaHybrid::load,
}

/// The test binary refuses any one allocation over 1 GiB, so that the hostile-file test fails
/// on a table sized by a hostile count.
#[cfg(test)]
#[global_allocator]
static ALLOC: bloomery_plugin_api::hostile::CappedAlloc =
    bloomery_plugin_api::hostile::CappedAlloc::new(1 << 30);

#[cfg(test)]
mod tests;
