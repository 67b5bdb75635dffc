//! Shapes for `bloomery synth`: the real gemma-3-270m sizes and a tiny one for tests.

use abi_stable::std_types::RVec;
use bloomery_plugin_api::model::SynthPreset;
use bloomery_plugin_api::synth::PresetBuilder;

use crate::hparams::{HParams, ARCH};
use crate::weights;

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
    window: u32,
}

const SHAPES: [Shape; 2] = [
    Shape {
        name: "tiny",
        description: "6 layers (5 sliding, window 4; 1 global), hidden 128, 4/2 heads x 32, ff 256, vocab 512",
        n_layer: 6,
        n_embd: 128,
        n_head: 4,
        n_head_kv: 2,
        head_dim: 32,
        n_ff: 256,
        n_vocab: 512,
        n_ctx: 4096,
        window: 4,
    },
    Shape {
        name: "270m",
        description: "gemma-3-270m: 18 layers, hidden 640, 4/1 heads x 256, ff 2048, window 512",
        n_layer: 18,
        n_embd: 640,
        n_head: 4,
        n_head_kv: 1,
        head_dim: 256,
        n_ff: 2048,
        n_vocab: 262_144,
        n_ctx: 32_768,
        window: 512,
    },
];

fn preset(s: &Shape) -> SynthPreset {
    PresetBuilder::new(ARCH, s.name, s.description, s.n_vocab)
        .model(s.n_layer, s.n_ctx, s.n_embd)
        .u32("feed_forward_length", s.n_ff)
        .attention(s.n_head, s.n_head_kv, s.head_dim)
        .u32("attention.sliding_window", s.window)
        .f32("rope.freq_base", 1_000_000.0)
        .f32("attention.layer_norm_rms_epsilon", 1e-6)
        .build(|view, t| weights::declare(t, &HParams::from_view(view)?).map(drop))
}

/// Every preset.
pub fn presets() -> RVec<SynthPreset> {
    SHAPES.iter().map(preset).collect()
}
