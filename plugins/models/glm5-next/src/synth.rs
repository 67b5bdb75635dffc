//! Shapes for `bloomery synth --arch glm5-next`: `tiny` (the references' test shape,
//! /work/notes/g5-tiny-shape.md: 8 trunk layers, layer 0 dense, MLA at 3 and 7, a NextN layer)
//! and `flash` (GLM-5.3-Flash at its real widths: 45 trunk layers and the NextN layer;
//! `--layers N` keeps the first N trunk layers and the NextN layer).

use abi_stable::std_types::RVec;
use bloomery_plugin_api::meta::MetaValue;
use bloomery_plugin_api::model::SynthPreset;
use bloomery_plugin_api::synth::PresetBuilder;

use crate::hparams::{HParams, ARCH};
use crate::weights;

struct Shape {
    name: &'static str,
    description: &'static str,
    /// Trunk layers (the NextN layer comes after them).
    n_layer: u32,
    n_embd: u32,
    /// KDA and MLA heads alike.
    n_head: u32,
    kda_head_dim: u32,
    q_lora: u32,
    kv_lora: u32,
    /// `key_length_mla` = `value_length_mla`.
    mla_head_dim: u32,
    indexer_heads: u32,
    indexer_dim: u32,
    top_k: u32,
    kpool: u32,
    n_dense_lead: u32,
    n_ff: u32,
    n_expert: u32,
    n_used: u32,
    n_ff_exp: u32,
    /// SwiGLU clamp of every layer, experts and shared expert alike.
    clamp: f32,
    n_vocab: u32,
    n_ctx: u32,
}

const SHAPES: &[Shape] = &[
    Shape {
        name: "tiny",
        description: "8 layers (layer 0 dense; KDA, MLA at 3 and 7) + NextN, hidden 128, 4 heads (KDA x 32, MLA q_lora 64, latent 512, x 64), indexer 4 x 128 top 8 kpool 4, 8 experts top-2 (ff 64) + shared, vocab 272",
        n_layer: 8,
        n_embd: 128,
        n_head: 4,
        kda_head_dim: 32,
        q_lora: 64,
        kv_lora: 512,
        mla_head_dim: 64,
        indexer_heads: 4,
        indexer_dim: 128,
        top_k: 8,
        kpool: 4,
        n_dense_lead: 1,
        n_ff: 256,
        n_expert: 8,
        n_used: 2,
        n_ff_exp: 64,
        clamp: 0.5,
        n_vocab: 272,
        n_ctx: 4096,
    },
    Shape {
        name: "flash",
        description: "GLM-5.3-Flash, 45 layers (3 dense; MLA at 3, 7, ..., 43, the rest KDA; --layers N for the first N) + NextN, hidden 4096, 64 heads (KDA x 128, MLA q_lora 1536, latent 512, x 256), indexer 32 x 128 top 2048 kpool 4, 288 experts top-8 (ff 2048) + shared, vocab 154,880",
        n_layer: 45,
        n_embd: 4096,
        n_head: 64,
        kda_head_dim: 128,
        q_lora: 1536,
        kv_lora: 512,
        mla_head_dim: 256,
        indexer_heads: 32,
        indexer_dim: 128,
        top_k: 2048,
        kpool: 4,
        n_dense_lead: 3,
        n_ff: 12_288,
        n_expert: 288,
        n_used: 8,
        n_ff_exp: 2048,
        clamp: 10.0,
        n_vocab: 154_880,
        n_ctx: 1_048_576,
    },
];

fn preset(s: &Shape) -> SynthPreset {
    let n_all = s.n_layer + 1;
    let kv: Vec<u32> = (0..n_all)
        .map(|il| u32::from(il % 4 == 3 || il == s.n_layer))
        .collect();
    let clamps = MetaValue::Array(vec![MetaValue::F32(s.clamp); n_all as usize].into());
    PresetBuilder::new(ARCH, s.name, s.description, s.n_vocab)
        .model(n_all, s.n_ctx, s.n_embd)
        .u32("nextn_predict_layers", 1)
        .u32("vocab_size", s.n_vocab)
        .u32("feed_forward_length", s.n_ff)
        .u32("attention.head_count", s.n_head)
        .u32s("attention.head_count_kv", &kv)
        .u32("attention.key_length", s.kv_lora)
        .u32("attention.value_length", s.kv_lora)
        .u32("attention.key_length_mla", s.mla_head_dim)
        .u32("attention.value_length_mla", s.mla_head_dim)
        .u32("attention.q_lora_rank", s.q_lora)
        .u32("attention.kv_lora_rank", s.kv_lora)
        .u32("rope.dimension_count", 0)
        .f32("attention.layer_norm_rms_epsilon", 1e-5)
        .f32("attention.layer_norm_epsilon", 1e-6)
        .u32("ssm.conv_kernel", 4)
        .u32("kda.head_dim", s.kda_head_dim)
        .f32("kda.gate_lower_bound", -5.0)
        .u32("attention.indexer.head_count", s.indexer_heads)
        .u32("attention.indexer.key_length", s.indexer_dim)
        .u32("attention.indexer.top_k", s.top_k)
        .u32("attention.indexer.kpool", s.kpool)
        .value("attention.indexer.kpool_select_tail", MetaValue::Bool(true))
        .u32("hyper_connection.count", 4)
        .u32("hyper_connection.sinkhorn_iterations", 20)
        .f32("hyper_connection.epsilon", 1e-6)
        .u32("leading_dense_block_count", s.n_dense_lead)
        .experts(s.n_expert, s.n_used, s.n_ff_exp)
        .u32("expert_shared_count", 1)
        .f32("expert_weights_scale", 2.5)
        .value("expert_weights_norm", MetaValue::Bool(true))
        .u32("expert_gating_func", 2)
        .value("swiglu_clamp_exp", clamps.clone())
        .value("swiglu_clamp_shexp", clamps)
        .with_tensor("output.weight")
        .with_tensor("blk.*.nextn.shared_head_norm.weight")
        .with_tensor("blk.*.nextn.shared_head_head.weight")
        // A selection bias that matters; hyper-connection scales near 1 and bases around 0;
        // decay rates negative, forget-gate biases around zero; q and k convolution taps near
        // zero, v taps wide (as solar-open2's tiny file, for the same reasons); a pool position
        // bias and a key-norm bias that matter.
        .range("exp_probs_b.bias", -0.3, 0.3)
        .range("hc_attn_scale.weight", 0.8, 1.2)
        .range("hc_ffn_scale.weight", 0.8, 1.2)
        .range("hc_attn_base.weight", -0.5, 0.5)
        .range("hc_ffn_base.weight", -0.5, 0.5)
        .range("ssm_a", -4.0, -0.5)
        .range("ssm_dt.bias", -1.5, 0.5)
        .range("ssm_conv1d_q.weight", -0.5, 0.5)
        .range("ssm_conv1d_k.weight", -0.5, 0.5)
        .range("ssm_conv1d_v.weight", -2.0, 2.0)
        .range("indexer_compressor_ape.weight", -1.0, 1.0)
        .range("indexer.k_norm.bias", -0.2, 0.2)
        .build(|view, t| weights::declare(t, &HParams::from_view(view, ARCH)?).map(drop))
}

/// Every preset.
pub fn presets() -> RVec<SynthPreset> {
    SHAPES.iter().map(preset).collect()
}
