//! Model plugin for GGUF architecture `glm4moe`: GLM-4.5/4.6/4.7 (GQA with Q/K/V biases and
//! QK-norm, half of each head rotated, dense leading layers, routed-expert weights ×2.5) and
//! Solar-Open-100B (the same blocks without biases or QK-norm, every layer MoE). Sigmoid router
//! with a selection-only bias, top-k, renormalised, plus a shared expert; NEOX rope over the
//! file's `rope.dimension_count`; the MTP layers a GLM file carries after the main ones are
//! skipped, as llama.cpp skips them.
#![allow(non_local_definitions)]

pub mod graph;
pub mod hparams;
pub mod synth;
pub mod weights;

use bloomery_plugin_api::kv_model::KvModel;

use graph::Glm4Moe;
use hparams::ARCH;

bloomery_plugin_api::export_model_plugin! {
    name: ARCH,
    architectures: [ARCH],
    synth_presets: synth::presets,
    load: KvModel::<Glm4Moe>::load,
}

/// The test binary refuses any one allocation over 1 GiB, so that the hostile-file test fails
/// on a table sized by a hostile count.
#[cfg(test)]
#[global_allocator]
static ALLOC: bloomery_plugin_api::hostile::CappedAlloc =
    bloomery_plugin_api::hostile::CappedAlloc::new(1 << 30);

#[cfg(test)]
mod tests;
