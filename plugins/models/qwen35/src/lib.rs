//! Model plugin for the Qwen3.5 hybrid family: GGUF architectures `qwen35moe` (Qwen3.5/3.6-MoE,
//! e.g. Qwen3.6-35B-A3B), `qwen35` (dense; Clef's backbone) and `clef` (that backbone with a
//! decision head in the file, whose weights it declares for the host to run; its graph ends in
//! the final-norm rows). Three Gated DeltaNet layers to one
//! gated attention layer: the DeltaNet layers keep a convolution history and a recurrent matrix
//! per sequence, the attention layers a K/V cache; attention uses QK-norm, IMROPE over a quarter
//! of each head and a sigmoid output gate. MoE layers route 256 experts top-8 (softmax,
//! renormalised) next to a sigmoid-gated shared expert. A file may carry an MTP (nextn) block
//! after the trunk, declared and built apart as the draft graph ([`mtp::build`]).
#![allow(non_local_definitions)]

pub mod graph;
pub mod hparams;
pub mod mtp;
pub mod state;
pub mod synth;
pub mod weights;

use abi_stable::std_types::{RResult, RVec};
use bloomery_plugin_api::graph::{BatchShape, Graph, GraphKind};
use bloomery_plugin_api::hparams::{ArchKeys, RopeConfig};
use bloomery_plugin_api::meta::ModelFileView;
use bloomery_plugin_api::model::{ModelCaps, ModelInstance, ModelSpec, StateDecl};
use bloomery_plugin_api::op::{RopeMode, RopeParams};
use bloomery_plugin_api::weights::WeightTable;
use bloomery_plugin_api::PluginError;

use hparams::{HParams, ARCH_CLEF, ARCH_DENSE, ARCH_MOE};
use state::LayerState;
use weights::Weights;

/// A loaded Qwen3.5 hybrid.
pub struct Qwen35 {
    hp: HParams,
    weights: Weights,
    state: RVec<StateDecl>,
    layer_state: Vec<LayerState>,
    rope: RopeParams,
}

impl Qwen35 {
    /// Reads hyperparameters and weights from the file view.
    pub fn load(view: &ModelFileView) -> Result<Self, PluginError> {
        let arch = match view.architecture()? {
            ARCH_MOE => ARCH_MOE,
            ARCH_DENSE => ARCH_DENSE,
            ARCH_CLEF => ARCH_CLEF,
            other => {
                return Err(PluginError::unsupported(
                    format!("architecture `{other}`"),
                    &[ARCH_MOE, ARCH_DENSE, ARCH_CLEF],
                ))
            }
        };
        let hp = HParams::from_view(view, arch)?;
        let weights = weights::declare(&mut WeightTable::new(view), &hp)?;
        let (state, layer_state) = state::declare(&hp, weights.mtp.is_some());
        let keys = ArchKeys::new(view, arch);
        let mut rope = RopeConfig::read(&keys, RopeMode::Imrope, hp.lm.attn.head_dim)?.params;
        let sections = keys.u32_array_or_empty("rope.dimension_sections")?;
        let rotated: u64 = sections.iter().map(|&s| 2 * u64::from(s)).sum();
        keys.check(
            sections.len() <= 4 && rotated <= u64::from(rope.n_dims),
            "rope.dimension_sections",
            || format!("{sections:?} does not fit {} rotated dims", rope.n_dims),
        )?;
        for (i, s) in sections.iter().enumerate() {
            rope.sections[i] = *s;
        }
        if sections.iter().all(|&s| s == 0) {
            rope.mode = RopeMode::Neox;
        }
        Ok(Qwen35 {
            hp,
            weights,
            state,
            layer_state,
            rope,
        })
    }
}

impl ModelInstance for Qwen35 {
    fn spec(&self) -> ModelSpec {
        ModelSpec {
            architecture: self.hp.arch.into(),
            hparams: self.hp.summary(),
            weights: self.weights.lm.decls.clone(),
            state: self.state.clone(),
            caps: ModelCaps {
                recurrent: true,
                n_mtp_layers: u32::from(self.weights.mtp.is_some()),
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
            rope: self.rope,
            verify: shape.kind == GraphKind::Verify,
        };
        match shape.kind {
            GraphKind::Main | GraphKind::Verify => graph::build(&m, shape),
            GraphKind::Mtp => mtp::build(&m, shape),
        }
        .into()
    }
}

bloomery_plugin_api::export_model_plugin! {
    name: "qwen35",
    architectures: [ARCH_MOE, ARCH_DENSE, ARCH_CLEF],
    synth_presets: synth::presets,
    load: Qwen35::load,
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
    use bloomery_plugin_api::graph::{BatchInput, TensorSource};
    use bloomery_plugin_api::hostile::check_hostile;
    use bloomery_plugin_api::meta::{MetaValue, TensorInfo};
    use bloomery_plugin_api::synth::check_presets;
    use bloomery_plugin_api::DType;

    #[test]
    fn every_preset_loads_with_its_declared_weights() {
        check_presets(&synth::presets(), Qwen35::load).unwrap();
    }

    #[test]
    fn a_clef_head_tensor_missing_extra_or_misshaped_is_refused_by_name() {
        let presets = synth::presets();
        let clef = presets
            .iter()
            .find(|p| p.file_view(DType::F32).architecture() == Ok(ARCH_CLEF))
            .unwrap();
        let base = clef.file_view(DType::F32);
        let head = Qwen35::load(&base).unwrap();
        assert!(head.weights.head.is_some());
        assert!(head
            .spec()
            .weights
            .iter()
            .any(|w| w.name.as_str() == "dec.blk.3.ffn_down.bias"));
        let refused = |edit: &dyn Fn(&mut Vec<TensorInfo>), name: &str| {
            let mut view = base.clone();
            let mut tensors: Vec<TensorInfo> = view.tensors.into_iter().collect();
            edit(&mut tensors);
            view.tensors = tensors.into();
            let e = Qwen35::load(&view).err().expect("refused").to_string();
            assert!(e.contains(name), "`{e}` does not name {name}");
        };
        refused(
            &|t| t.retain(|x| x.name.as_str() != "decision.scales"),
            "decision.scales",
        );
        refused(
            &|t| {
                let mut x = t
                    .iter()
                    .find(|x| x.name.as_str() == "dec.blk.3.ffn_up.bias")
                    .unwrap()
                    .clone();
                x.name = "dec.blk.4.ffn_up.bias".into();
                t.push(x);
            },
            "dec.blk.4.ffn_up.bias",
        );
        refused(
            &|t| {
                let x = t
                    .iter_mut()
                    .find(|x| x.name.as_str() == "dec.blk.2.attn_q.weight")
                    .unwrap();
                x.ne = [64, 32, 1, 1];
            },
            "dec.blk.2.attn_q.weight",
        );
        refused(
            &|t| {
                let x = t
                    .iter_mut()
                    .find(|x| x.name.as_str() == "decision.proj_memory.weight")
                    .unwrap();
                x.ne = [256, 66, 1, 1];
            },
            "decision.head_count",
        );
    }

    /// The tiny file of `arch` with its MTP block.
    fn tiny_mtp(arch: &str) -> ModelFileView {
        let presets = synth::presets();
        let p = presets
            .iter()
            .find(|p| {
                p.name.as_str() == "tiny-mtp" && p.file_view(DType::F32).architecture() == Ok(arch)
            })
            .unwrap();
        p.file_view(DType::F32)
    }

    fn draft_shape() -> BatchShape {
        BatchShape {
            n_rows: 3,
            n_outputs: 3,
            kind: GraphKind::Mtp,
        }
    }

    #[test]
    fn the_mtp_block_loads_with_its_caches_and_builds_the_draft_graph() {
        for arch in [ARCH_MOE, ARCH_DENSE] {
            let m = Qwen35::load(&tiny_mtp(arch)).unwrap();
            let spec = m.spec();
            assert_eq!(spec.caps.n_mtp_layers, 1, "{arch}");
            assert_eq!(m.hp.lm.n_layer, 4, "{arch}: trunk layers");
            let names: Vec<&str> = spec.state.iter().map(|s| s.name.as_str()).collect();
            assert!(names.ends_with(&["cache_k_l4", "cache_v_l4"]), "{names:?}");
            assert!(spec
                .weights
                .iter()
                .any(|w| w.name.as_str() == "blk.4.nextn.eh_proj.weight"));
            let reads_hidden = |g: &Graph| {
                let hidden = TensorSource::Input {
                    input: BatchInput::Hidden,
                };
                g.tensors.iter().filter(|t| t.source == hidden).count()
            };
            let g = m.build_graph(draft_shape()).into_result().unwrap();
            assert_eq!(
                reads_hidden(&g),
                1,
                "{arch}: the draft graph reads the hidden rows"
            );
            let main = BatchShape {
                kind: GraphKind::Main,
                ..draft_shape()
            };
            let main = m.build_graph(main).into_result().unwrap();
            assert_eq!(reads_hidden(&main), 0, "{arch}: the trunk's does not");
        }
    }

    #[test]
    fn a_file_without_the_block_refuses_a_draft_graph_by_name() {
        let presets = synth::presets();
        let tiny = presets
            .iter()
            .find(|p| p.name.as_str() == "tiny")
            .unwrap()
            .file_view(DType::F32);
        let m = Qwen35::load(&tiny).unwrap();
        assert_eq!(m.spec().caps.n_mtp_layers, 0);
        let e = m.build_graph(draft_shape()).into_result().err().unwrap();
        assert!(e.to_string().contains("MTP (nextn) block"), "{e}");
    }

    #[test]
    fn a_wrong_mtp_key_or_tensor_is_refused_by_name() {
        let base = tiny_mtp(ARCH_MOE);
        let refused = |view: ModelFileView, name: &str| {
            let e = Qwen35::load(&view).err().expect("refused").to_string();
            assert!(e.contains(name), "`{e}` does not name {name}");
        };
        let mut two = base.clone();
        for e in two.metadata.iter_mut() {
            if e.key.as_str() == "qwen35moe.nextn_predict_layers" {
                e.value = MetaValue::U32(2);
            }
        }
        refused(two, "nextn_predict_layers");
        // The key says 1 but the file holds none of the block's tensors, or not all of them.
        let without = |keep: &dyn Fn(&str) -> bool| {
            let mut view = base.clone();
            let tensors: Vec<TensorInfo> = view.tensors.into_iter().collect();
            let kept: Vec<TensorInfo> = tensors
                .into_iter()
                .filter(|t| keep(t.name.as_str()))
                .collect();
            view.tensors = kept.into();
            view
        };
        refused(without(&|n| !n.starts_with("blk.4.")), "block_count");
        let eh = "blk.4.nextn.eh_proj.weight";
        refused(without(&|n| n != eh), eh);
        let edit = |name: &str, f: &dyn Fn(&mut TensorInfo)| {
            let mut view = base.clone();
            let mut tensors: Vec<TensorInfo> = view.tensors.into_iter().collect();
            f(tensors
                .iter_mut()
                .find(|t| t.name.as_str() == name)
                .unwrap());
            view.tensors = tensors.into();
            view
        };
        refused(edit(eh, &|t| t.ne = [256, 256, 1, 1]), eh);
        let norm = "blk.4.nextn.shared_head_norm.weight";
        refused(edit(norm, &|t| t.ne = [255, 1, 1, 1]), norm);
        let q = "blk.4.attn_q.weight";
        refused(edit(q, &|t| t.name = "blk.4.attn_qq.weight".into()), q);
    }

    #[test]
    fn hostile_keys_and_shapes_end_in_named_errors_never_in_a_panic() {
        let presets = synth::presets();
        for arch in [ARCH_MOE, ARCH_DENSE, ARCH_CLEF] {
            let tiny = presets
                .iter()
                .find(|p| {
                    p.name.as_str() == "tiny" && p.file_view(DType::F32).architecture() == Ok(arch)
                })
                .unwrap();
            let r = check_hostile(tiny, arch, Qwen35::load, 300, 0x5eed).unwrap();
            println!("{arch}: {r:?}");
            assert!(r.loaded > 0 && r.refused > 0, "{r:?}");
        }
        for arch in [ARCH_MOE, ARCH_DENSE] {
            let tiny = presets
                .iter()
                .find(|p| {
                    p.name.as_str() == "tiny-mtp"
                        && p.file_view(DType::F32).architecture() == Ok(arch)
                })
                .unwrap();
            let r = check_hostile(tiny, arch, Qwen35::load, 300, 0x5eed).unwrap();
            println!("{arch}: {r:?}");
            assert!(r.loaded > 0 && r.refused > 0, "{r:?}");
        }
    }
}
