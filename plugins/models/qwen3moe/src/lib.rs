//! Model plugin for the Qwen3-MoE family (GGUF architecture `qwen3moe`): Qwen3-30B-A3B and
//! Qwen3-235B-A22B. GQA with QK-norm and NEOX rope; 128 routed experts, softmax router, top-8,
//! renormalised; separate or fused gate/up expert stacks.
#![allow(non_local_definitions)]

pub mod graph;
pub mod hparams;
pub mod synth;
pub mod weights;

use bloomery_plugin_api::kv_model::KvModel;

use graph::Qwen3Moe;
use hparams::ARCH;

bloomery_plugin_api::export_model_plugin! {
    name: ARCH,
    architectures: [ARCH],
    synth_presets: synth::presets,
    load: KvModel::<Qwen3Moe>::load,
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
    use bloomery_plugin_api::hostile::check_hostile;
    use bloomery_plugin_api::synth::check_presets;

    #[test]
    fn every_preset_loads_with_its_declared_weights() {
        check_presets(&synth::presets(), KvModel::<Qwen3Moe>::load).unwrap();
    }

    #[test]
    fn hostile_keys_and_shapes_end_in_named_errors_never_in_a_panic() {
        let presets = synth::presets();
        let tiny = presets.iter().find(|p| p.name.as_str() == "tiny").unwrap();
        let r = check_hostile(tiny, ARCH, KvModel::<Qwen3Moe>::load, 300, 0x5eed).unwrap();
        println!("{ARCH}: {r:?}");
        assert!(r.loaded > 0 && r.refused > 0, "{r:?}");
    }
}
