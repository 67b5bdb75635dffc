//! Model plugin for Qwen3.8-Flash-Next (GGUF architecture `qwen4exp`, llama.cpp b11434
//! `src/models/qwen4exp.cpp`; reference `tests/oracle/hf_qwen4exp.py`, whose docstring lists
//! every key and tensor the b11434 converter writes): Gated DeltaNet layers and, every fourth
//! layer, gated GQA over the QSA indexer's block selection; gated hyper-connections (4 residual
//! streams, low-rank mixers, no Sinkhorn) in place of every norm; 512 softmax-routed experts
//! plus a sigmoid-gated shared expert in every layer; the PLE n-gram table added on one layer;
//! the MTP block, from the trunk file or from a separate MTP-only file.
//!
//! This crate reads and checks the hyperparameters ([`hparams`], [`layers`], [`ple`]), declares
//! every weight ([`weights`]) and the state ([`state`]), and offers `synth` presets ([`synth`]).
//! The graph is not built yet: [`ModelInstance::build_graph`] refuses by name.

pub mod hparams;
pub mod layers;
pub mod ple;
pub mod state;
pub mod synth;
pub mod weights;

use abi_stable::std_types::{RResult, RVec};
use bloomery_plugin_api::graph::{BatchShape, Graph};
use bloomery_plugin_api::meta::ModelFileView;
use bloomery_plugin_api::model::{ModelCaps, ModelInstance, ModelSpec, StateDecl};
use bloomery_plugin_api::weights::WeightTable;
use bloomery_plugin_api::PluginError;

use hparams::{HParams, ARCH};
use state::LayerState;
use weights::Weights;

/// A loaded Qwen3.8-Flash-Next file (trunk, MTP-only, or both).
pub struct Qwen4Exp {
    hp: HParams,
    weights: Weights,
    state: Vec<StateDecl>,
    layer_state: Vec<Option<LayerState>>,
}

impl Qwen4Exp {
    /// Reads hyperparameters and weights from the file view.
    pub fn load(view: &ModelFileView) -> Result<Self, PluginError> {
        view.expect_architecture(ARCH)?;
        let hp = HParams::from_view(view)?;
        let weights = weights::declare(&mut WeightTable::new(view), &hp)?;
        let (state, layer_state) = state::declare(&hp, weights.nextn.is_some());
        Ok(Qwen4Exp {
            hp,
            weights,
            state,
            layer_state,
        })
    }

    /// The hyperparameters.
    pub fn hparams(&self) -> &HParams {
        &self.hp
    }

    /// The weights.
    pub fn weights(&self) -> &Weights {
        &self.weights
    }

    /// Where layer `il`'s state is (`None` for a layer the file does not hold).
    pub fn layer_state(&self, il: u32) -> Option<LayerState> {
        self.layer_state.get(il as usize).copied().flatten()
    }
}

impl ModelInstance for Qwen4Exp {
    fn spec(&self) -> ModelSpec {
        ModelSpec {
            architecture: ARCH.into(),
            hparams: self.hp.summary(),
            weights: self.weights.decls.clone().into(),
            state: RVec::from(self.state.clone()),
            caps: ModelCaps {
                recurrent: true,
                n_mtp_layers: u32::from(self.weights.nextn.is_some()),
                max_context: u64::from(self.hp.lm.n_ctx_train),
            },
        }
    }

    fn build_graph(&self, shape: BatchShape) -> RResult<Graph, PluginError> {
        RResult::RErr(PluginError::unsupported(
            format!(
                "the qwen4exp {:?} graph: the ABI lacks the QSA block selection, the gated \
                 hyper-connection mixers, the n-gram end-id reset and the dilated convolution \
                 (crate docs)",
                shape.kind
            ),
            &[],
        ))
    }
}

bloomery_plugin_api::export_model_plugin! {
    name: ARCH,
    architectures: [ARCH],
    synth_presets: synth::presets,
    load: Qwen4Exp::load,
}

/// The test binary refuses any one allocation over 1 GiB, so that the hostile-file test fails
/// on a table sized by a hostile count.
#[cfg(test)]
#[global_allocator]
static ALLOC: bloomery_plugin_api::hostile::CappedAlloc =
    bloomery_plugin_api::hostile::CappedAlloc::new(1 << 30);

#[cfg(test)]
mod tests;
