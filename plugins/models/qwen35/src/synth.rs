//! Shapes for `bloomery synth`: Qwen3.6-35B-A3B, Clef-Flash (a `clef` file: the 9B `qwen35`
//! backbone and its joint schema head), and tiny `qwen35moe`, `qwen35` and `clef` models for tests
//! (real head sizes: attention heads of 256 with 64 rotated dims, DeltaNet heads of 128), the
//! first two also as `tiny-mtp`, with an MTP block after the trunk.

use abi_stable::std_types::RVec;
use bloomery_plugin_api::decision::{
    DECISION_TYPE_CLEF, FFN_TENSOR, SYSTEMONE_TEMPLATE, TORCH_LAYER_NORM_EPS, WIDTH_TENSOR,
};
use bloomery_plugin_api::meta::MetaValue;
use bloomery_plugin_api::model::SynthPreset;
use bloomery_plugin_api::synth::PresetBuilder;

use crate::hparams::{HParams, ARCH_CLEF, ARCH_DENSE, ARCH_MOE};
use crate::weights;

struct Shape {
    arch: &'static str,
    name: &'static str,
    description: &'static str,
    n_layer: u32,
    n_embd: u32,
    n_head: u32,
    n_head_kv: u32,
    head_dim: u32,
    n_head_k: u32,
    n_head_v: u32,
    d_state: u32,
    /// Routed experts (0 = dense).
    n_expert: u32,
    n_used: u32,
    /// Expert FFN width, or the dense FFN width.
    n_ff: u32,
    n_ff_shexp: u32,
    n_vocab: u32,
    n_ctx: u32,
    /// A `clef` file's decision head.
    head: Option<Head>,
    /// MTP (nextn) blocks after the trunk (0 or 1).
    n_mtp: u32,
}

/// A decision head's sizes: width, attention heads, routing and decoder blocks, FFN width.
#[derive(Clone, Copy)]
struct Head {
    width: u32,
    heads: u32,
    routing: u32,
    joint: u32,
    ff: u32,
}

const SHAPES: [Shape; 8] = [
    TINY_MOE,
    Q36_35B,
    Shape {
        name: "35b-a3b-mtp",
        description: "Qwen3.6-35B-A3B with its MTP block (layer 40: gated attention, 256 experts top-8 + shared; nextn.shared_head_norm, the model's embedding and head)",
        n_mtp: 1,
        ..Q36_35B
    },
    TINY_DENSE,
    Shape {
        arch: ARCH_CLEF,
        name: "tiny",
        description: "the tiny qwen35 backbone with a decision head: width 64, 4 heads, 2 routing + 2 decoder blocks, ff 128, vocab 512",
        head: Some(TINY_HEAD),
        ..TINY_DENSE
    },
    // Clef-Flash: Qwen3.5-9B's backbone (32 layers, hidden 4096, models.md §1) and a head of
    // width 1,024 with 2 routing + 4 decoder blocks and FFN 4,096, which makes the ~122 M
    // parameters reported for it (seed-repo.md §2). The FFN width 12,288 and the attention and
    // DeltaNet head counts are Qwen3.5-9B's published config (not in the references here); with
    // them a Q8_0 backbone is about 9.5 GB, as the published Q8_0 file. The head's 16 attention
    // heads are a guess (no source gives them; the cost barely depends on them).
    Shape {
        arch: ARCH_CLEF,
        name: "flash",
        description: "Clef-Flash: 32 layers (24 DeltaNet + 8 attention), hidden 4096, attention 16/4 x 256, DeltaNet 16 k / 32 v heads x 128, SwiGLU ff 12288, vocab 248320; head width 1024, 16 heads, 2 routing + 4 decoder blocks, ff 4096 (f32)",
        n_layer: 32,
        n_embd: 4096,
        n_head: 16,
        n_head_kv: 4,
        head_dim: 256,
        n_head_k: 16,
        n_head_v: 32,
        d_state: 128,
        n_expert: 0,
        n_used: 0,
        n_ff: 12_288,
        n_ff_shexp: 0,
        n_vocab: 248_320,
        n_ctx: 262_144,
        head: Some(Head {
            width: 1024,
            heads: 16,
            routing: 2,
            joint: 4,
            ff: 4096,
        }),
        n_mtp: 0,
    },
    Shape {
        name: "tiny-mtp",
        description: "the tiny qwen35moe model with an MTP block (layer 4: gated attention, 8 experts top-2 + shared; nextn.shared_head_norm, the model's embedding and head)",
        n_mtp: 1,
        ..TINY_MOE
    },
    Shape {
        name: "tiny-mtp",
        description: "the tiny qwen35 model with an MTP block (layer 4: gated attention, SwiGLU ff 512; nextn.shared_head_norm, the model's embedding and head)",
        n_mtp: 1,
        ..TINY_DENSE
    },
];

/// Qwen3.6-35B-A3B.
const Q36_35B: Shape = Shape {
    arch: ARCH_MOE,
    name: "35b-a3b",
    description: "Qwen3.6-35B-A3B: 40 layers (30 DeltaNet + 10 attention), hidden 2048, attention 16/2 x 256, DeltaNet 16 k / 32 v heads x 128, 256 experts top-8 (ff 512) + shared",
    n_layer: 40,
    n_embd: 2048,
    n_head: 16,
    n_head_kv: 2,
    head_dim: 256,
    n_head_k: 16,
    n_head_v: 32,
    d_state: 128,
    n_expert: 256,
    n_used: 8,
    n_ff: 512,
    n_ff_shexp: 512,
    n_vocab: 248_320,
    n_ctx: 262_144,
    head: None,
    n_mtp: 0,
};

/// The tiny `qwen35moe` model.
const TINY_MOE: Shape = Shape {
    arch: ARCH_MOE,
    name: "tiny",
    description: "4 layers (3 DeltaNet + 1 attention), hidden 256, attention 4/2 x 256, DeltaNet 2 k / 4 v heads x 128, 8 experts top-2 (ff 256) + shared, vocab 512",
    n_layer: 4,
    n_embd: 256,
    n_head: 4,
    n_head_kv: 2,
    head_dim: 256,
    n_head_k: 2,
    n_head_v: 4,
    d_state: 128,
    n_expert: 8,
    n_used: 2,
    n_ff: 256,
    n_ff_shexp: 256,
    n_vocab: 512,
    n_ctx: 4096,
    head: None,
    n_mtp: 0,
};

/// The tiny `qwen35` model.
const TINY_DENSE: Shape = Shape {
    arch: ARCH_DENSE,
    name: "tiny",
    description: "4 layers (3 DeltaNet + 1 attention), hidden 256, attention 4/2 x 256, DeltaNet 2 k / 4 v heads x 128, SwiGLU ff 512, vocab 512",
    n_layer: 4,
    n_embd: 256,
    n_head: 4,
    n_head_kv: 2,
    head_dim: 256,
    n_head_k: 2,
    n_head_v: 4,
    d_state: 128,
    n_expert: 0,
    n_used: 0,
    n_ff: 512,
    n_ff_shexp: 0,
    n_vocab: 512,
    n_ctx: 4096,
    head: None,
    n_mtp: 0,
};

/// The tiny decision head.
const TINY_HEAD: Head = Head {
    width: 64,
    heads: 4,
    routing: 2,
    joint: 2,
    ff: 128,
};

const TAPS: u32 = 4;
const INTERVAL: u32 = 4;

fn preset(s: &Shape) -> SynthPreset {
    let b = PresetBuilder::new(s.arch, s.name, s.description, s.n_vocab)
        .model(s.n_layer + s.n_mtp, s.n_ctx, s.n_embd)
        .attention(s.n_head, s.n_head_kv, s.head_dim)
        .f32("rope.freq_base", 10_000_000.0)
        .u32("rope.dimension_count", s.head_dim / 4)
        .u32s("rope.dimension_sections", &[11, 11, 10, 0])
        .f32("attention.layer_norm_rms_epsilon", 1e-6)
        .u32("full_attention_interval", INTERVAL)
        .u32("ssm.conv_kernel", TAPS)
        .u32("ssm.state_size", s.d_state)
        .u32("ssm.group_count", s.n_head_k)
        .u32("ssm.time_step_rank", s.n_head_v)
        .u32("ssm.inner_size", s.n_head_v * s.d_state);
    let b = if s.n_expert > 0 {
        b.experts(s.n_expert, s.n_used, s.n_ff)
            .u32("expert_shared_feed_forward_length", s.n_ff_shexp)
    } else {
        b.u32("feed_forward_length", s.n_ff)
    };
    let b = if let Some(Head {
        width,
        heads,
        routing,
        joint,
        ff,
    }) = s.head
    {
        b.value(
            "decision.type",
            MetaValue::String(DECISION_TYPE_CLEF.into()),
        )
        .u32("decision.routing_block_count", routing)
        .u32("decision.block_count", joint)
        .u32("decision.head_count", heads)
        .f32("attention.layer_norm_epsilon", TORCH_LAYER_NORM_EPS)
        .global(
            "tokenizer.chat_template.systemone",
            MetaValue::String(SYSTEMONE_TEMPLATE.into()),
        )
        .stand_in(WIDTH_TENSOR, [u64::from(s.n_embd), u64::from(width), 1, 1])
        .stand_in(FFN_TENSOR, [u64::from(width), u64::from(ff), 1, 1])
        // The transformed scalars: logit scales exp(s) > 0, the gate a sigmoid.
        .range("decision.scales", 0.3, 0.9)
    } else {
        b
    };
    // The MTP block as Qwen3.5's converted files have it: its own head norm (`mtp.norm`), the
    // model's embedding and head.
    let b = match s.n_mtp {
        0 => b,
        n => b
            .u32("nextn_predict_layers", n)
            .with_tensor("blk.*.nextn.shared_head_norm.weight"),
    };
    b.with_tensor("output.weight")
        // Convolution taps and gate projections near zero, decay biases positive and decay
        // rates negative, as trained models have them.
        .range("ssm_conv1d.weight", -0.5, 0.5)
        .range("ssm_dt.bias", 0.5, 1.5)
        .range("ssm_a", -1.0, -0.1)
        .range("ssm_beta.weight", -0.2, 0.2)
        .range("ssm_alpha.weight", -0.2, 0.2)
        .range("ffn_gate_inp_shexp.weight", -0.5, 0.5)
        .build(|view, t| weights::declare(t, &HParams::from_view(view, s.arch)?).map(drop))
}

/// Every preset (each names its architecture in `general.architecture`).
pub fn presets() -> RVec<SynthPreset> {
    SHAPES.iter().map(preset).collect()
}
