//! Shapes for `bloomery synth --arch deepseek4`: `tiny` (the keys, tensors and shapes of
//! `tests/oracle/make_deepseek4_tiny.py`, the references' test file: 6 layers with ratios
//! [0, 0, 4, 128, 4, 128], 3 hash layers) and `flash` (DeepSeek-V4-Flash at its real widths:
//! 43 layers, hidden 4096; `--layers N` keeps the first N), without the MTP block, which the
//! loader refuses for now.

use abi_stable::std_types::RVec;
use bloomery_plugin_api::meta::MetaValue;
use bloomery_plugin_api::model::SynthPreset;
use bloomery_plugin_api::synth::PresetBuilder;

use crate::hparams::{HParams, ARCH};
use crate::weights;

struct Shape {
    name: &'static str,
    description: &'static str,
    /// Layers; their ratios are 0, 0, then 4 and 128 alternating.
    n_layer: u32,
    n_embd: u32,
    n_head: u32,
    head_dim: u32,
    n_rot: u32,
    q_lora: u32,
    out_groups: u32,
    out_rank: u32,
    indexer_heads: u32,
    indexer_dim: u32,
    top_k: u32,
    n_expert: u32,
    n_used: u32,
    n_ff_exp: u32,
    /// SwiGLU clamp of every layer, experts and shared expert alike.
    clamp: f32,
    n_vocab: u32,
}

const SHAPES: &[Shape] = &[
    Shape {
        name: "tiny",
        description: "6 layers (ratios 0, 0, 4, 128, 4, 128; layers 0-2 hash-routed), hidden 64, 8 heads x 128 (rope tail 16, q_lora 32, output 4 groups x 16), indexer 16 x 64 top 8, 16 experts top-6 (ff 32) + shared, clamp 2, vocab 320: tests/oracle/make_deepseek4_tiny.py's file",
        n_layer: 6,
        n_embd: 64,
        n_head: 8,
        head_dim: 128,
        n_rot: 16,
        q_lora: 32,
        out_groups: 4,
        out_rank: 16,
        indexer_heads: 16,
        indexer_dim: 64,
        top_k: 8,
        n_expert: 16,
        n_used: 6,
        n_ff_exp: 32,
        clamp: 2.0,
        n_vocab: 320,
    },
    Shape {
        name: "flash",
        description: "DeepSeek-V4-Flash, 43 layers (ratios 0, 0, then 4 and 128 alternating; layers 0-2 hash-routed; --layers N for the first N; no MTP block), hidden 4096, 64 heads x 512 (rope tail 64, q_lora 1024, output 8 groups x 1024), indexer 64 x 128 top 512, 256 experts top-6 (ff 2048) + shared, clamp 10, vocab 129,280",
        n_layer: 43,
        n_embd: 4096,
        n_head: 64,
        head_dim: 512,
        n_rot: 64,
        q_lora: 1024,
        out_groups: 8,
        out_rank: 1024,
        indexer_heads: 64,
        indexer_dim: 128,
        top_k: 512,
        n_expert: 256,
        n_used: 6,
        n_ff_exp: 2048,
        clamp: 10.0,
        n_vocab: 129_280,
    },
];

/// V4-Flash's ratio pattern over `n_layer` layers: 0, 0, then 4 and 128 alternating.
fn ratios(n_layer: u32) -> MetaValue {
    let r = (0..n_layer).map(|il| match il {
        0 | 1 => 0,
        il if il % 2 == 0 => 4,
        _ => 128,
    });
    MetaValue::Array(r.map(MetaValue::I32).collect())
}

fn preset(s: &Shape) -> SynthPreset {
    let clamps = MetaValue::Array(vec![MetaValue::F32(s.clamp); s.n_layer as usize].into());
    PresetBuilder::new(ARCH, s.name, s.description, s.n_vocab)
        .model(s.n_layer, 1_048_576, s.n_embd)
        .u32("embedding_length_out", 4 * s.n_embd)
        .attention(s.n_head, 1, s.head_dim)
        .u32("rope.dimension_count", s.n_rot)
        .f32("rope.freq_base", 1e4)
        .value("rope.scaling.type", MetaValue::String("yarn".into()))
        .f32("rope.scaling.factor", 16.0)
        .u32("rope.scaling.original_context_length", 65_536)
        .experts(s.n_expert, s.n_used, s.n_ff_exp)
        .f32("attention.layer_norm_rms_epsilon", 1e-6)
        .u32("attention.q_lora_rank", s.q_lora)
        .u32("attention.sliding_window", 128)
        .u32("expert_shared_count", 1)
        .f32("expert_weights_scale", 1.5)
        .value("expert_weights_norm", MetaValue::Bool(true))
        .value("swiglu_clamp_exp", clamps.clone())
        .value("swiglu_clamp_shexp", clamps)
        .u32("attention.indexer.head_count", s.indexer_heads)
        .u32("attention.indexer.key_length", s.indexer_dim)
        .u32("attention.indexer.top_k", s.top_k)
        .u32("attention.output_group_count", s.out_groups)
        .u32("attention.output_lora_rank", s.out_rank)
        .f32("attention.compress_rope_freq_base", 160_000.0)
        .u32("hyper_connection.count", 4)
        .u32("hyper_connection.sinkhorn_iterations", 20)
        .f32("hyper_connection.epsilon", 1e-6)
        .u32("hash_layer_count", 3)
        .value("attention.compress_ratios", ratios(s.n_layer))
        .u32("expert_gating_func", 4)
        .u32("vocab_size", s.n_vocab)
        // Hash rows of distinct experts; a selection bias, sinks and compressor position biases
        // that matter; hyper-connection scales near 1 and bases around 0.
        .range("ffn_gate_tid2eid.weight", 0.0, s.n_expert as f32)
        .range("exp_probs_b.bias", -0.3, 0.3)
        .range("attn_sinks.weight", -0.5, 0.5)
        .range("attn_compressor_ape.weight", -0.5, 0.5)
        .range("indexer_compressor_ape.weight", -0.5, 0.5)
        .range("hc_attn_scale.weight", 0.8, 1.2)
        .range("hc_ffn_scale.weight", 0.8, 1.2)
        .range("hc_attn_base.weight", -0.5, 0.5)
        .range("hc_ffn_base.weight", -0.5, 0.5)
        .range("output_hc_scale.weight", 0.8, 1.2)
        .range("output_hc_base.weight", -0.5, 0.5)
        .build(|view, t| weights::declare(t, &HParams::from_view(view)?).map(drop))
}

/// Every preset: `deepseek4`'s, then `deepseek41`'s ([`crate::synth41`]).
pub fn presets() -> RVec<SynthPreset> {
    SHAPES
        .iter()
        .map(preset)
        .chain([crate::synth41::tiny()])
        .collect()
}
