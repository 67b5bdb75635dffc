//! Shapes for `bloomery synth --arch qwen3`: a tiny model for tests and Qwen3-0.6B's sizes.

use abi_stable::std_types::RVec;
use bloomery_plugin_api::kv_model::KvModel;
use bloomery_plugin_api::model::SynthPreset;
use bloomery_plugin_api::synth::PresetBuilder;

use crate::graph::Qwen3;
use crate::hparams::ARCH;

struct Shape {
    name: &'static str,
    description: &'static str,
    n_layer: u32,
    n_embd: u32,
    n_head: u32,
    n_head_kv: u32,
    head_dim: u32,
    n_ff: u32,
    n_vocab: u32,
    n_ctx: u32,
}

const SHAPES: [Shape; 2] = [
    Shape {
        name: "tiny",
        description: "4 layers, hidden 256, 4/2 heads x 64, SwiGLU ff 512, vocab 512, tied head",
        n_layer: 4,
        n_embd: 256,
        n_head: 4,
        n_head_kv: 2,
        head_dim: 64,
        n_ff: 512,
        n_vocab: 512,
        n_ctx: 4096,
    },
    Shape {
        name: "0.6b",
        description: "Qwen3-0.6B: 28 layers, hidden 1024, 16/8 heads x 128, ff 3072, tied head",
        n_layer: 28,
        n_embd: 1024,
        n_head: 16,
        n_head_kv: 8,
        head_dim: 128,
        n_ff: 3072,
        n_vocab: 151_936,
        n_ctx: 40_960,
    },
];

fn preset(s: &Shape) -> SynthPreset {
    PresetBuilder::new(ARCH, s.name, s.description, s.n_vocab)
        .model(s.n_layer, s.n_ctx, s.n_embd)
        .u32("feed_forward_length", s.n_ff)
        .attention(s.n_head, s.n_head_kv, s.head_dim)
        .f32("rope.freq_base", 1_000_000.0)
        .f32("attention.layer_norm_rms_epsilon", 1e-6)
        .build(KvModel::<Qwen3>::declare)
}

/// Every preset.
pub fn presets() -> RVec<SynthPreset> {
    SHAPES.iter().map(preset).collect()
}
