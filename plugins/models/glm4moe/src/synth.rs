//! Shapes for `bloomery synth`: Solar-Open-100B, GLM-4.5-Air and GLM-4.7 at their real sizes,
//! and tiny files for tests in both dialects (Solar: no biases, no QK-norm, full rotary, every
//! layer MoE; GLM: biases, QK-norm, half the head rotated, a dense lead layer, scale 2.5).

use abi_stable::std_types::RVec;
use bloomery_plugin_api::kv_model::KvModel;
use bloomery_plugin_api::model::SynthPreset;
use bloomery_plugin_api::synth::PresetBuilder;

use crate::graph::Glm4Moe;
use crate::hparams::ARCH;

/// The GLM-4.x attention extras a shape carries.
#[derive(Clone, Copy)]
struct Glm {
    /// Q/K/V biases.
    bias: bool,
    /// Per-head QK-norm.
    qk_norm: bool,
}

struct Shape {
    name: &'static str,
    description: &'static str,
    n_layer: u32,
    /// MTP layers counted in `block_count` (their weights are not written: a trunk-only file,
    /// which llama.cpp loads as well).
    n_mtp: u32,
    n_embd: u32,
    n_head: u32,
    n_head_kv: u32,
    head_dim: u32,
    n_rot: u32,
    n_expert: u32,
    n_used: u32,
    n_ff_exp: u32,
    n_shared: u32,
    n_dense_lead: u32,
    n_ff: u32,
    scale: f32,
    glm: Glm,
    n_vocab: u32,
    n_ctx: u32,
    eps: f32,
}

const SOLAR: Glm = Glm {
    bias: false,
    qk_norm: false,
};

const SHAPES: [Shape; 5] = [
    Shape {
        name: "tiny",
        description: "GLM-4.x dialect: 4 layers (1 dense, ff 512) + 1 MTP, hidden 256, 4/2 heads x 64 (32 rotated), Q/K/V bias, QK-norm, 8 experts top-2 (ff 128) + 1 shared, scale 2.5, vocab 512",
        n_layer: 4,
        n_mtp: 1,
        n_embd: 256,
        n_head: 4,
        n_head_kv: 2,
        head_dim: 64,
        n_rot: 32,
        n_expert: 8,
        n_used: 2,
        n_ff_exp: 128,
        n_shared: 1,
        n_dense_lead: 1,
        n_ff: 512,
        scale: 2.5,
        glm: Glm {
            bias: true,
            qk_norm: true,
        },
        n_vocab: 512,
        n_ctx: 4096,
        eps: 1e-5,
    },
    Shape {
        name: "tiny-solar",
        description: "Solar-Open dialect: 4 layers, hidden 256, 4/2 heads x 64 (all rotated), 8 experts top-2 (ff 128) + 1 shared, scale 1, vocab 512",
        n_layer: 4,
        n_mtp: 0,
        n_embd: 256,
        n_head: 4,
        n_head_kv: 2,
        head_dim: 64,
        n_rot: 64,
        n_expert: 8,
        n_used: 2,
        n_ff_exp: 128,
        n_shared: 1,
        n_dense_lead: 0,
        n_ff: 0,
        scale: 1.0,
        glm: SOLAR,
        n_vocab: 512,
        n_ctx: 4096,
        eps: 1e-5,
    },
    Shape {
        name: "solar-open-100b",
        description: "Solar-Open-100B: 48 layers, hidden 4096, 64/8 heads x 128 (all rotated), 128 experts top-8 (ff 1280) + 1 shared, every layer MoE, vocab 196,608",
        n_layer: 48,
        n_mtp: 0,
        n_embd: 4096,
        n_head: 64,
        n_head_kv: 8,
        head_dim: 128,
        n_rot: 128,
        n_expert: 128,
        n_used: 8,
        n_ff_exp: 1280,
        n_shared: 1,
        n_dense_lead: 0,
        n_ff: 0,
        scale: 1.0,
        glm: SOLAR,
        n_vocab: 196_608,
        n_ctx: 131_072,
        eps: 1e-5,
    },
    Shape {
        name: "glm-4.5-air",
        description: "GLM-4.5-Air: 46 layers (1 dense, ff 10,944) + 1 MTP, hidden 4096, 96/8 heads x 128 (64 rotated), Q/K/V bias, 128 experts top-8 (ff 1408) + 1 shared, vocab 151,552",
        n_layer: 46,
        n_mtp: 1,
        n_embd: 4096,
        n_head: 96,
        n_head_kv: 8,
        head_dim: 128,
        n_rot: 64,
        n_expert: 128,
        n_used: 8,
        n_ff_exp: 1408,
        n_shared: 1,
        n_dense_lead: 1,
        n_ff: 10_944,
        scale: 1.0,
        glm: Glm {
            bias: true,
            qk_norm: false,
        },
        n_vocab: 151_552,
        n_ctx: 131_072,
        eps: 1e-5,
    },
    Shape {
        name: "glm-4.7",
        description: "GLM-4.7 (355B): 92 layers (3 dense, ff 12,288) + 1 MTP, hidden 5120, 96/8 heads x 128 (64 rotated), Q/K/V bias, QK-norm, 160 experts top-8 (ff 1536) + 1 shared, scale 2.5, vocab 151,552",
        n_layer: 92,
        n_mtp: 1,
        n_embd: 5120,
        n_head: 96,
        n_head_kv: 8,
        head_dim: 128,
        n_rot: 64,
        n_expert: 160,
        n_used: 8,
        n_ff_exp: 1536,
        n_shared: 1,
        n_dense_lead: 3,
        n_ff: 12_288,
        scale: 2.5,
        glm: Glm {
            bias: true,
            qk_norm: true,
        },
        n_vocab: 151_552,
        n_ctx: 202_752,
        eps: 1e-5,
    },
];

fn preset(s: &Shape) -> SynthPreset {
    let mut b = PresetBuilder::new(ARCH, s.name, s.description, s.n_vocab)
        .model(s.n_layer + s.n_mtp, s.n_ctx, s.n_embd)
        .attention(s.n_head, s.n_head_kv, s.head_dim)
        .u32("rope.dimension_count", s.n_rot)
        .f32("rope.freq_base", 1_000_000.0)
        .f32("attention.layer_norm_rms_epsilon", s.eps)
        .experts(s.n_expert, s.n_used, s.n_ff_exp)
        .u32("expert_shared_count", s.n_shared)
        .u32("leading_dense_block_count", s.n_dense_lead)
        .f32("expert_weights_scale", s.scale)
        .value(
            "expert_weights_norm",
            bloomery_plugin_api::meta::MetaValue::Bool(true),
        )
        .u32("expert_gating_func", 2)
        .with_tensor("output.weight");
    if s.n_mtp > 0 {
        b = b.u32("nextn_predict_layers", s.n_mtp);
    }
    if s.n_dense_lead > 0 {
        b = b.u32("feed_forward_length", s.n_ff);
    }
    if s.glm.bias {
        b = b
            .with_tensor("blk.*.attn_q.bias")
            .with_tensor("blk.*.attn_k.bias")
            .with_tensor("blk.*.attn_v.bias");
    }
    if s.glm.qk_norm {
        b = b
            .with_tensor("blk.*.attn_q_norm.weight")
            .with_tensor("blk.*.attn_k_norm.weight");
    }
    b.build(KvModel::<Glm4Moe>::declare)
}

/// Every preset.
pub fn presets() -> RVec<SynthPreset> {
    SHAPES.iter().map(preset).collect()
}
