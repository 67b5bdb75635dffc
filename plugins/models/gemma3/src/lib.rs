//! Model plugin for dense Gemma 3 (GGUF architecture `gemma3`): gemma-3-270m, 1b, 4b, 12b, 27b.
//! GQA with QK-norm and NEOX rope; five sliding-window layers (local rope base) per global layer;
//! post-attention and post-FFN norms; GeGLU FFN; embedding scaled by `sqrt(n_embd)`; tied head.
#![allow(non_local_definitions)]

pub mod graph;
pub mod hparams;
pub mod state;
pub mod synth;
pub mod weights;

use abi_stable::std_types::RResult;
use bloomery_plugin_api::graph::{BatchShape, Graph};
use bloomery_plugin_api::hparams::{ArchKeys, RopeConfig};
use bloomery_plugin_api::meta::ModelFileView;
use bloomery_plugin_api::model::{ModelCaps, ModelInstance, ModelSpec};
use bloomery_plugin_api::op::RopeMode;
use bloomery_plugin_api::weights::WeightTable;
use bloomery_plugin_api::PluginError;

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
        view.expect_architecture(ARCH)?;
        let hp = HParams::from_view(view)?;
        let weights = weights::declare(&mut WeightTable::new(view), &hp)?;
        let keys = ArchKeys::new(view, ARCH);
        let global = RopeConfig::read(&keys, RopeMode::Neox, hp.lm.attn.head_dim)?.params;
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
            caps: ModelCaps::kv_only(u64::from(self.hp.lm.n_ctx_train)),
            ngram: abi_stable::std_types::ROption::RNone,
        }
    }

    fn build_graph(&self, shape: BatchShape) -> RResult<Graph, PluginError> {
        graph::build(&self.hp, &self.weights, self.ropes, shape).into()
    }
}

bloomery_plugin_api::export_model_plugin! {
    name: ARCH,
    architectures: [ARCH],
    synth_presets: synth::presets,
    load: Gemma3::load,
}

/// The test binary refuses any one allocation over 1 GiB, so that the hostile-file test fails
/// on a table sized by a hostile count.
#[cfg(test)]
#[global_allocator]
static ALLOC: bloomery_plugin_api::hostile::CappedAlloc =
    bloomery_plugin_api::hostile::CappedAlloc::new(1 << 30);

#[cfg(test)]
mod tests {
    use super::*;
    use bloomery_plugin_api::graph::GraphKind;
    use bloomery_plugin_api::hostile::check_hostile;
    use bloomery_plugin_api::meta::{MetaEntry, MetaValue};
    use bloomery_plugin_api::op::Op;
    use bloomery_plugin_api::synth::check_presets;
    use bloomery_plugin_api::DType;

    /// A file view made from a synth preset, every tensor f32.
    fn view(preset: &str) -> ModelFileView {
        let presets = synth::presets();
        let p = presets.iter().find(|p| p.name.as_str() == preset).unwrap();
        p.file_view(DType::F32)
    }

    #[test]
    fn every_preset_loads_with_its_declared_weights() {
        check_presets(&synth::presets(), Gemma3::load).unwrap();
    }

    #[test]
    fn hostile_keys_and_shapes_end_in_named_errors_never_in_a_panic() {
        let presets = synth::presets();
        let tiny = presets.iter().find(|p| p.name.as_str() == "tiny").unwrap();
        let r = check_hostile(tiny, ARCH, Gemma3::load, 300, 0x5eed).unwrap();
        println!("{ARCH}: {r:?}");
        assert!(r.loaded > 0 && r.refused > 0, "{r:?}");
    }

    #[test]
    fn the_270m_shape_has_llama_cpp_layer_pattern_and_scales() {
        let m = Gemma3::load(&view("270m")).unwrap();
        let global: Vec<usize> = (0..18).filter(|&il| !m.hp.is_swa[il]).collect();
        assert_eq!(global, [5, 11, 17]);
        assert_eq!(m.hp.sliding_window, 512);
        assert_eq!(m.hp.attn_scale, 1.0 / 16.0);
        assert_eq!(m.hp.final_softcap, 0.0);
        assert_eq!(m.ropes.global.freq_base, 1_000_000.0);
        assert_eq!(m.ropes.local.freq_base, 10_000.0);
        let spec = m.spec();
        assert_eq!(spec.state.len(), 36);
        assert_eq!(spec.state[2 * 5].window, 0);
        assert_eq!(spec.state[2 * 4 + 1].window, 512);
        // Tied head: no `output.weight`, so the embedding is declared once.
        assert_eq!(spec.weights.len(), 2 + 18 * 13);
    }

    #[test]
    fn an_explicit_pattern_array_overrides_the_period() {
        let mut v = view("tiny");
        let flags = (0..6).map(|il| MetaValue::Bool(il % 2 == 0)).collect();
        v.metadata.push(MetaEntry {
            key: "gemma3.attention.sliding_window_pattern".into(),
            value: MetaValue::Array(flags),
        });
        let hp = HParams::from_view(&v).unwrap();
        assert_eq!(hp.is_swa, [true, false, true, false, true, false]);
    }

    #[test]
    fn the_graph_gives_each_layer_its_window_and_rope_base() {
        let m = Gemma3::load(&view("tiny")).unwrap();
        let shape = BatchShape {
            n_rows: 3,
            n_outputs: 1,
            kind: GraphKind::Main,
        };
        let g = graph::build(&m.hp, &m.weights, m.ropes, shape).unwrap();
        let windows: Vec<u32> = g
            .nodes
            .iter()
            .filter_map(|n| match n.op {
                Op::Attention(p) => Some(p.window),
                _ => None,
            })
            .collect();
        assert_eq!(windows, [4, 4, 4, 4, 4, 0]);
        let bases: Vec<f32> = g
            .nodes
            .iter()
            .filter_map(|n| match n.op {
                Op::Rope(r) => Some(r.freq_base),
                _ => None,
            })
            .step_by(2)
            .collect();
        assert_eq!(bases, [1e4, 1e4, 1e4, 1e4, 1e4, 1e6]);
        let names: Vec<&str> = g.tensors.iter().map(|t| t.name.as_str()).collect();
        for want in [
            "inp_scaled",
            "attn_post_norm",
            "ffn_geglu",
            "ffn_post_norm",
            "l_out",
        ] {
            assert!(names.contains(&want), "no node `{want}`");
        }
        let logits = g
            .outputs
            .iter()
            .find(|o| o.name.as_str() == "logits")
            .unwrap();
        assert_eq!(g.tensors[logits.tensor.0 as usize].ne, [512, 1, 1, 1]);
    }
}
