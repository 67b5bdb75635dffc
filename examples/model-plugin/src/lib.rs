//! Example model plugin for dense Qwen3 (GGUF architecture `qwen3`: Qwen3-0.6B, 1.7B, 4B, 8B, 14B,
//! 32B), built outside the bloomery workspace against `bloomery-plugin-api` alone. GQA with
//! QK-norm and NEOX rope; SwiGLU FFN; head tied to the embedding in the small models.
//! `docs/new-architecture.md` walks through it.
#![allow(non_local_definitions)]

pub mod graph;
pub mod hparams;
pub mod synth;
pub mod weights;

use bloomery_plugin_api::kv_model::KvModel;

use graph::Qwen3;
use hparams::ARCH;

bloomery_plugin_api::export_model_plugin! {
    name: ARCH,
    architectures: [ARCH],
    synth_presets: synth::presets,
    load: KvModel::<Qwen3>::load,
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
    use bloomery_plugin_api::graph::{BatchShape, GraphKind};
    use bloomery_plugin_api::hostile::check_hostile;
    use bloomery_plugin_api::op::OpKind;
    use bloomery_plugin_api::synth::check_presets;
    use bloomery_plugin_api::DType;

    #[test]
    fn every_preset_loads_with_its_declared_weights() {
        check_presets(&synth::presets(), KvModel::<Qwen3>::load).unwrap();
    }

    #[test]
    fn hostile_keys_and_shapes_end_in_named_errors_never_in_a_panic() {
        let presets = synth::presets();
        let tiny = presets.iter().find(|p| p.name.as_str() == "tiny").unwrap();
        let r = check_hostile(tiny, ARCH, KvModel::<Qwen3>::load, 300, 0x5eed).unwrap();
        println!("{ARCH}: {r:?}");
        assert!(r.loaded > 0 && r.refused > 0, "{r:?}");
    }

    #[test]
    fn the_tiny_graph_has_a_gated_ffn_per_layer_and_a_tied_head() {
        let presets = synth::presets();
        let tiny = presets.iter().find(|p| p.name.as_str() == "tiny").unwrap();
        let m = KvModel::<Qwen3>::load(&tiny.file_view(DType::F32)).unwrap();
        let shape = BatchShape {
            n_rows: 3,
            n_outputs: 1,
            kind: GraphKind::Main,
        };
        let g = graph::build(&m, shape).unwrap();
        let count = |kind: OpKind| g.nodes.iter().filter(|n| n.op.kind() == kind).count();
        assert_eq!(count(OpKind::Glu), 4);
        assert_eq!(count(OpKind::Attention), 4);
        assert_eq!(m.weights.globals.output, m.weights.globals.tok_embd);
        let logits = g
            .outputs
            .iter()
            .find(|o| o.name.as_str() == "logits")
            .unwrap();
        assert_eq!(g.tensors[logits.tensor.0 as usize].ne, [512, 1, 1, 1]);
    }
}
