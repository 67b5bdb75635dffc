//! Shapes for `bloomery synth`: Solar-Open2-250B (`250b`: every fourth layer gated GQA, from layer
//! 0; `--layers N` writes its first N layers at the real widths), tiny `solar-open2` and
//! `kimi-linear` models for tests.

use abi_stable::std_types::RVec;
use bloomery_plugin_api::meta::MetaValue;
use bloomery_plugin_api::model::SynthPreset;
use bloomery_plugin_api::synth::PresetBuilder;

use crate::hparams::{HParams, ARCH_KIMI, ARCH_SOLAR};
use crate::weights;

struct Shape {
    arch: &'static str,
    name: String,
    description: String,
    n_layer: u32,
    n_embd: u32,
    /// Attention and KDA heads.
    n_head: u32,
    /// KV heads of an attention layer (0: every layer KDA).
    n_head_kv: u32,
    head_dim: u32,
    n_expert: u32,
    n_used: u32,
    n_ff_exp: u32,
    /// Leading dense layers and their FFN width.
    n_dense_lead: u32,
    n_ff: u32,
    n_vocab: u32,
    n_ctx: u32,
}

/// Solar-Open2-250B: 48 layers, 12 of them gated NoPE GQA (layers 0, 4, …). `synth --layers N`
/// cuts it to any depth up to 48 (N = 12 gives 3 GQA and 9 KDA layers).
fn solar_250b() -> Shape {
    Shape {
        arch: ARCH_SOLAR,
        name: "250b".to_owned(),
        description: "Solar-Open2-250B, 48 layers (12 gated NoPE GQA, layers 0, 4, …, + 36 KDA; --layers N for the first N), hidden 4096, 64 heads x 128 (8 KV), 320 experts top-8 (ff 1280) + shared, vocab 196,608".to_owned(),
        n_layer: 48,
        n_embd: 4096,
        n_head: 64,
        n_head_kv: 8,
        head_dim: 128,
        n_expert: 320,
        n_used: 8,
        n_ff_exp: 1280,
        n_dense_lead: 0,
        n_ff: 10_240,
        n_vocab: 196_608,
        n_ctx: 1_048_576,
    }
}

fn shapes() -> Vec<Shape> {
    vec![
        Shape {
            arch: ARCH_SOLAR,
            name: "tiny".into(),
            description: "8 layers (2 gated NoPE GQA + 6 KDA), hidden 128, 4 heads x 32 (2 KV), 8 experts top-2 (ff 64) + shared, vocab 512".into(),
            n_layer: 8,
            n_embd: 128,
            n_head: 4,
            n_head_kv: 2,
            head_dim: 32,
            n_expert: 8,
            n_used: 2,
            n_ff_exp: 64,
            n_dense_lead: 0,
            n_ff: 256,
            n_vocab: 512,
            n_ctx: 4096,
        },
        Shape {
            arch: ARCH_KIMI,
            name: "tiny".into(),
            description: "3 KDA layers (the first with a dense FFN), hidden 128, 4 heads x 32, 8 experts top-2 (ff 64) + shared, vocab 512".into(),
            n_layer: 3,
            n_embd: 128,
            n_head: 4,
            n_head_kv: 0,
            head_dim: 32,
            n_expert: 8,
            n_used: 2,
            n_ff_exp: 64,
            n_dense_lead: 1,
            n_ff: 192,
            n_vocab: 512,
            n_ctx: 4096,
        },
        solar_250b(),
    ]
}

fn preset(s: &Shape) -> SynthPreset {
    let kv: Vec<u32> = (0..s.n_layer)
        .map(|il| if il % 4 == 0 { s.n_head_kv } else { 0 })
        .collect();
    let mut b = PresetBuilder::new(s.arch, &s.name, &s.description, s.n_vocab)
        .model(s.n_layer, s.n_ctx, s.n_embd)
        .u32("vocab_size", s.n_vocab)
        .u32("feed_forward_length", s.n_ff)
        .u32("attention.head_count", s.n_head)
        .u32s("attention.head_count_kv", &kv)
        .u32("attention.key_length", s.head_dim)
        .u32("attention.value_length", s.head_dim)
        .experts(s.n_expert, s.n_used, s.n_ff_exp)
        .u32("expert_shared_count", 1)
        .u32("leading_dense_block_count", s.n_dense_lead)
        .u32("ssm.conv_kernel", 4)
        .u32("kda.head_dim", s.head_dim)
        .u32("expert_gating_func", 2)
        .f32("attention.layer_norm_rms_epsilon", 1e-5)
        .f32(
            "expert_weights_scale",
            if s.arch == ARCH_KIMI { 2.446 } else { 1.0 },
        )
        .value("expert_weights_norm", MetaValue::Bool(true))
        .f32("rope.freq_base", 1_000_000.0)
        .with_tensor("output.weight");
    if s.arch == ARCH_SOLAR && s.name == "tiny" {
        // Optional output-gate biases on both attention layers of the tiny file.
        b = b
            .with_tensor("blk.0.attn_gate.bias")
            .with_tensor("blk.4.attn_gate.bias");
    }
    // Noisy norms, a selection bias that matters, decay rates negative and forget-gate biases
    // around zero (so that decays range from slow to fast), q and k convolution taps near zero;
    // the v taps wide enough that the KDA output is well above the output norm's ε (else the
    // logits hang on ε and every rounding is magnified).
    b.range("attn_norm.weight", 0.6, 1.4)
        .range("ffn_norm.weight", 0.6, 1.4)
        .range("ssm_norm.weight", 0.6, 1.4)
        .range("exp_probs_b.bias", -0.3, 0.3)
        .range("attn_gate.bias", -0.5, 0.5)
        .range("ssm_a", -4.0, -0.5)
        .range("ssm_dt.bias", -1.5, 0.5)
        .range("ssm_conv1d_q.weight", -0.5, 0.5)
        .range("ssm_conv1d_k.weight", -0.5, 0.5)
        .range("ssm_conv1d_v.weight", -2.0, 2.0)
        .build(|view, t| weights::declare(t, &HParams::from_view(view, s.arch)?).map(drop))
}

/// Every preset (each names its architecture in `general.architecture`).
pub fn presets() -> RVec<SynthPreset> {
    shapes().iter().map(preset).collect()
}
