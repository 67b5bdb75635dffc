//! Model plugin for DeepSeek-V4-Flash (GGUF architecture `deepseek4`, llama.cpp b11434
//! `src/models/deepseek4.cpp`; references `tests/oracle/hf_deepseek4.py` (transformers 5.24) and
//! `tests/oracle/llamacpp_dump_deepseek4.cpp`, tiny file `tests/oracle/make_deepseek4_tiny.py`):
//! latent attention (one 512-wide row serving as key and value) over a 128-position window ring
//! and compressed rows (ratio-4 layers with their own indexer, ratio-128 layers), rope on a tail
//! of each head and the inverse rope on the output, sinks, a grouped output projection;
//! manifold hyper-connections (4 streams, Sinkhorn) collapsed by a trained head; √softplus-routed
//! experts with a selection-only bias, the first `hash_layer_count` layers routed by a token
//! table, clamped SwiGLU, a shared expert.
//!
//! This crate reads and checks the hyperparameters ([`hparams`], [`layers`]), declares every
//! weight ([`weights`]) and the state ([`state`]), builds the forward graph ([`graph`],
//! docs/deepseek4-plan.md) and offers `synth` presets ([`synth`]). The graph uses ABI 13's ops
//! (the rope dimension offset and inverse rope, two-source attention, `Op::Compress`,
//! `Op::CompSelect`, i32 `GetRows`), which the CPU kernels and the CUDA bundles implement (the
//! tiny file's greedy text equal on an H100, session 61). `host/tests/deepseek4_golden.rs`
//! checks it against transformers 5.24.
//! Still missing: the host honouring a state's `window` (the ring is declared with its window
//! but the host gives it the whole context; [`state`]). Every state buffer is kept per
//! position, so drafts refused and prefixes restored rewind to any position
//! (`host/tests/deepseek4_rollback.rs`).
//!
//! MTP blocks (`nextn_predict_layers` with their tensors) are refused by name by the loader.
//!
//! DeepSeek-V4.1-Flash (`deepseek41`, `docs/deepseek41-plan.md`): its keys, the compressor and
//! index sources ([`v41`]), the Engram sites and hash constants ([`engram`], declared to the
//! host as the n-gram spec), every weight, and its graph ([`graph41`]).

pub mod engram;
pub mod graph;
pub mod graph41;
pub mod hparams;
pub mod layers;
pub mod state;
pub mod synth;
pub mod synth41;
pub mod v41;
pub mod weights;

use abi_stable::std_types::{RResult, RVec};
use bloomery_plugin_api::graph::{BatchShape, Graph, GraphKind};
use bloomery_plugin_api::meta::ModelFileView;
use bloomery_plugin_api::model::{ModelCaps, ModelInstance, ModelSpec, StateDecl};
use bloomery_plugin_api::weights::WeightTable;
use bloomery_plugin_api::PluginError;

use hparams::{HParams, ARCH, ARCH41};
use state::LayerState;
use weights::Weights;

/// A loaded DeepSeek-V4-Flash or V4.1-Flash file.
pub struct Deepseek4 {
    hp: HParams,
    weights: Weights,
    state: Vec<StateDecl>,
    layer_state: Vec<LayerState>,
}

impl Deepseek4 {
    /// Reads hyperparameters and weights from the file view.
    pub fn load(view: &ModelFileView) -> Result<Self, PluginError> {
        if view.architecture()? != ARCH41 {
            view.expect_architecture(ARCH)?;
        }
        let hp = HParams::from_view(view)?;
        let weights = weights::declare(&mut WeightTable::new(view), &hp)?;
        let (state, layer_state) = state::declare(&hp);
        Ok(Deepseek4 {
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

    /// Where layer `il`'s state is.
    pub fn layer_state(&self, il: u32) -> Option<LayerState> {
        self.layer_state.get(il as usize).copied()
    }
}

impl ModelInstance for Deepseek4 {
    fn spec(&self) -> ModelSpec {
        ModelSpec {
            architecture: self.hp.arch().into(),
            hparams: self.hp.summary(),
            weights: self.weights.decls.clone().into(),
            state: RVec::from(self.state.clone()),
            caps: ModelCaps {
                recurrent: false,
                n_mtp_layers: 0,
                max_context: u64::from(self.hp.lm.n_ctx_train),
            },
            ngram: match &self.hp.v41 {
                Some(v) => abi_stable::std_types::ROption::RSome(v.engram.spec()),
                None => abi_stable::std_types::ROption::RNone,
            },
        }
    }

    fn build_graph(&self, shape: BatchShape) -> RResult<Graph, PluginError> {
        if shape.kind != GraphKind::Main {
            return RResult::RErr(PluginError::unsupported(
                format!(
                    "the {} {:?} graph (no MTP or draft layers are run)",
                    self.hp.arch(),
                    shape.kind
                ),
                &["Main"],
            ));
        }
        let m = graph::Model {
            hp: &self.hp,
            w: &self.weights,
            state: &self.layer_state,
        };
        match &self.hp.v41 {
            Some(v) => graph41::build(&m, v, shape).into(),
            None => graph::build(&m, shape).into(),
        }
    }
}

bloomery_plugin_api::export_model_plugin! {
    name: ARCH,
    architectures: [ARCH, ARCH41],
    synth_presets: synth::presets,
    load: Deepseek4::load,
}

/// The test binary refuses any one allocation over 1 GiB, so that the hostile-file test fails
/// on a table sized by a hostile count.
#[cfg(test)]
#[global_allocator]
static ALLOC: bloomery_plugin_api::hostile::CappedAlloc =
    bloomery_plugin_api::hostile::CappedAlloc::new(1 << 30);

#[cfg(test)]
mod tests;

#[cfg(test)]
mod tests41;
