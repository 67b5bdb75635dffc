//! Shapes for `bloomery synth`: the real Qwen3-MoE sizes and a tiny one for tests.

use abi_stable::std_types::RVec;
use bloomery_plugin_api::meta::{MetaEntry as E, MetaValue};
use bloomery_plugin_api::model::{SynthPreset, SynthTensor as T, WeightClass as C};

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
    let k = |x: &str| format!("{ARCH}.{x}");
    let metadata = vec![
        E::new("general.architecture", MetaValue::String(ARCH.into())),
        E::new(
            "general.name",
            MetaValue::String(format!("synthetic qwen3moe {}", s.name).into()),
        ),
        E::new(&k("block_count"), MetaValue::U32(s.n_layer)),
        E::new(&k("context_length"), MetaValue::U32(s.n_ctx)),
        E::new(&k("embedding_length"), MetaValue::U32(s.n_embd)),
        E::new(
            &k("feed_forward_length"),
            MetaValue::U32(s.n_ff_exp * s.n_used),
        ),
        E::new(&k("attention.head_count"), MetaValue::U32(s.n_head)),
        E::new(&k("attention.head_count_kv"), MetaValue::U32(s.n_head_kv)),
        E::new(&k("attention.key_length"), MetaValue::U32(s.head_dim)),
        E::new(&k("attention.value_length"), MetaValue::U32(s.head_dim)),
        E::new(&k("rope.freq_base"), MetaValue::F32(s.rope_base)),
        E::new(&k("attention.layer_norm_rms_epsilon"), MetaValue::F32(1e-6)),
        E::new(&k("expert_count"), MetaValue::U32(s.n_expert)),
        E::new(&k("expert_used_count"), MetaValue::U32(s.n_used)),
        E::new(&k("expert_feed_forward_length"), MetaValue::U32(s.n_ff_exp)),
    ];
    let (e, v) = (u64::from(s.n_embd), u64::from(s.n_vocab));
    let q = u64::from(s.head_dim * s.n_head);
    let kvw = u64::from(s.head_dim * s.n_head_kv);
    let (ff, ne) = (u64::from(s.n_ff_exp), u64::from(s.n_expert));
    let mut tensors = vec![
        T::new("token_embd.weight".into(), C::Embedding, &[e, v]),
        T::new("output_norm.weight".into(), C::Norm, &[e]),
        T::new("output.weight".into(), C::Output, &[e, v]),
    ];
    for il in 0..s.n_layer {
        let n = |x: &str| format!("blk.{il}.{x}.weight");
        tensors.extend([
            T::new(n("attn_norm"), C::Norm, &[e]),
            T::new(n("attn_q"), C::Attention, &[e, q]),
            T::new(n("attn_k"), C::Attention, &[e, kvw]),
            T::new(n("attn_v"), C::Attention, &[e, kvw]),
            T::new(n("attn_output"), C::Attention, &[q, e]),
            T::new(n("attn_q_norm"), C::Norm, &[u64::from(s.head_dim)]),
            T::new(n("attn_k_norm"), C::Norm, &[u64::from(s.head_dim)]),
            T::new(n("ffn_norm"), C::Norm, &[e]),
            T::new(n("ffn_gate_inp"), C::Router, &[e, ne]),
            T::new(n("ffn_gate_exps"), C::Experts, &[e, ff, ne]),
            T::new(n("ffn_up_exps"), C::Experts, &[e, ff, ne]),
            T::new(n("ffn_down_exps"), C::Experts, &[ff, e, ne]),
        ]);
    }
    SynthPreset {
        name: s.name.into(),
        description: s.description.into(),
        metadata: metadata.into(),
        tensors: tensors.into(),
    }
}

/// Every preset.
pub fn presets() -> RVec<SynthPreset> {
    SHAPES.iter().map(preset).collect()
}
