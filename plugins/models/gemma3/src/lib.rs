//! Model plugin for dense Gemma 3 (GGUF architecture `gemma3`): gemma-3-270m, 1b, 4b, 12b, 27b.
//! GQA with QK-norm and NEOX rope; five sliding-window layers (local rope base) per global layer;
//! post-attention and post-FFN norms; GeGLU FFN; embedding scaled by `sqrt(n_embd)`; tied head.
#![allow(non_local_definitions)]

pub mod graph;
pub mod hparams;
pub mod state;
pub mod synth;
pub mod weights;

use abi_stable::sabi_trait::TD_Opaque;
use abi_stable::std_types::{RResult, RString, RVec};
use bloomery_plugin_api::builders::RopeConfig;
use bloomery_plugin_api::graph::{BatchShape, Graph};
use bloomery_plugin_api::meta::ModelFileView;
use bloomery_plugin_api::model::{
    ModelCaps, ModelInstance, ModelInstanceBox, ModelInstance_TO, ModelPlugin, ModelSpec,
    SynthPreset,
};
use bloomery_plugin_api::op::RopeMode;
use bloomery_plugin_api::{PluginError, ABI_VERSION};

use graph::Ropes;
use hparams::{HParams, ARCH};
use weights::Weights;

/// A loaded `gemma3` model.
pub struct Gemma3 {
    hp: HParams,
    weights: Weights,
    ropes: Ropes,
}

impl Gemma3 {
    /// Reads hyperparameters and weights from the file view.
    pub fn load(view: &ModelFileView) -> Result<Self, PluginError> {
        let arch = view.architecture()?;
        if arch != ARCH {
            return Err(PluginError::unsupported(
                format!("architecture `{arch}`"),
                &[ARCH],
            ));
        }
        let hp = HParams::from_view(view)?;
        let weights = Weights::from_view(view, &hp)?;
        let global = RopeConfig::from_view(view, ARCH, RopeMode::Neox, hp.head_dim)?.params;
        // The sliding layers keep the file's scaling settings but use their own base, unscaled
        // (llama.cpp: `rope_freq_scale_train_swa` stays 1).
        let mut local = global;
        local.freq_base = hp.freq_base_swa;
        local.freq_scale = 1.0;
        local.ext_factor = 0.0;
        Ok(Gemma3 {
            hp,
            weights,
            ropes: Ropes { global, local },
        })
    }
}

impl ModelInstance for Gemma3 {
    fn spec(&self) -> ModelSpec {
        ModelSpec {
            architecture: ARCH.into(),
            hparams: self.hp.summary(),
            weights: self.weights.decls.clone(),
            state: state::declare(&self.hp),
            caps: ModelCaps {
                recurrent: false,
                n_mtp_layers: 0,
                max_context: u64::from(self.hp.n_ctx_train),
            },
        }
    }

    fn build_graph(&self, shape: BatchShape) -> RResult<Graph, PluginError> {
        graph::build(&self.hp, &self.weights, self.ropes, shape).into()
    }
}

extern "C" fn abi_version() -> u32 {
    ABI_VERSION
}

extern "C" fn name() -> RString {
    ARCH.into()
}

extern "C" fn architectures() -> RVec<RString> {
    vec![RString::from(ARCH)].into()
}

extern "C" fn synth_presets() -> RVec<SynthPreset> {
    synth::presets()
}

extern "C" fn load(view: &ModelFileView) -> RResult<ModelInstanceBox, PluginError> {
    Gemma3::load(view)
        .map(|m| ModelInstance_TO::from_value(m, TD_Opaque))
        .into()
}

bloomery_plugin_api::export_model_plugin!(ModelPlugin {
    abi_version,
    name,
    architectures,
    synth_presets,
    load,
});
