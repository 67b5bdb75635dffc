//! Shapes for `bloomery synth`: the real Qwen3-MoE sizes and a tiny one for tests.

use abi_stable::std_types::RVec;
use bloomery_plugin_api::kv_model::KvModel;
use bloomery_plugin_api::model::SynthPreset;
use bloomery_plugin_api::synth::PresetBuilder;

use crate::graph::Qwen3Moe;
use crate::hparams::ARCH;

struct Shape {
    name: &'static str,
    description: &'static str,
    n_layer: u32,
    n_embd: u32,
    n_head: u32,
    n_head_kv: u32,
    head_dim: u32,
    n_expert: u32,
    n_used: u32,
    n_ff_exp: u32,
    n_vocab: u32,
    n_ctx: u32,
    rope_base: f32,
}

const SHAPES: [Shape; 3] = [
    Shape {
        name: "tiny",
        description: "4 layers, hidden 256, 4/2 heads x 64, 8 experts top-2 (ff 256), vocab 512",
        n_layer: 4,
        n_embd: 256,
        n_head: 4,
        n_head_kv: 2,
        head_dim: 64,
        n_expert: 8,
        n_used: 2,
        n_ff_exp: 256,
        n_vocab: 512,
        n_ctx: 4096,
        rope_base: 1_000_000.0,
    },
    Shape {
        name: "30b-a3b",
        description:
            "Qwen3-30B-A3B: 48 layers, hidden 2048, 32/4 heads x 128, 128 experts top-8 (ff 768)",
        n_layer: 48,
        n_embd: 2048,
        n_head: 32,
        n_head_kv: 4,
        head_dim: 128,
        n_expert: 128,
        n_used: 8,
        n_ff_exp: 768,
        n_vocab: 151_936,
        n_ctx: 40_960,
        rope_base: 1_000_000.0,
    },
    Shape {
        name: "235b-a22b",
        description:
            "Qwen3-235B-A22B: 94 layers, hidden 4096, 64/4 heads x 128, 128 experts top-8 (ff 1536)",
        n_layer: 94,
        n_embd: 4096,
        n_head: 64,
        n_head_kv: 4,
        head_dim: 128,
        n_expert: 128,
        n_used: 8,
        n_ff_exp: 1536,
        n_vocab: 151_936,
        n_ctx: 40_960,
        rope_base: 1_000_000.0,
    },
];

fn preset(s: &Shape) -> SynthPreset {
    PresetBuilder::new(ARCH, s.name, s.description, s.n_vocab)
        .model(s.n_layer, s.n_ctx, s.n_embd)
        .u32("feed_forward_length", s.n_ff_exp * s.n_used)
        .attention(s.n_head, s.n_head_kv, s.head_dim)
        .f32("rope.freq_base", s.rope_base)
        .f32("attention.layer_norm_rms_epsilon", 1e-6)
        .experts(s.n_expert, s.n_used, s.n_ff_exp)
        .with_tensor("output.weight")
        .build(KvModel::<Qwen3Moe>::declare)
}

/// Every preset.
pub fn presets() -> RVec<SynthPreset> {
    SHAPES.iter().map(preset).collect()
}
