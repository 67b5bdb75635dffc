//! Shapes for `bloomery synth`: the real gemma-3-270m sizes and a tiny one for tests.

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
    let k = |x: &str| format!("{ARCH}.{x}");
    let metadata = vec![
        E::new("general.architecture", MetaValue::String(ARCH.into())),
        E::new(
            "general.name",
            MetaValue::String(format!("synthetic gemma3 {}", s.name).into()),
        ),
        E::new(&k("block_count"), MetaValue::U32(s.n_layer)),
        E::new(&k("context_length"), MetaValue::U32(s.n_ctx)),
        E::new(&k("embedding_length"), MetaValue::U32(s.n_embd)),
        E::new(&k("feed_forward_length"), MetaValue::U32(s.n_ff)),
        E::new(&k("attention.head_count"), MetaValue::U32(s.n_head)),
        E::new(&k("attention.head_count_kv"), MetaValue::U32(s.n_head_kv)),
        E::new(&k("attention.key_length"), MetaValue::U32(s.head_dim)),
        E::new(&k("attention.value_length"), MetaValue::U32(s.head_dim)),
        E::new(&k("attention.sliding_window"), MetaValue::U32(s.window)),
        E::new(&k("rope.freq_base"), MetaValue::F32(1_000_000.0)),
        E::new(&k("attention.layer_norm_rms_epsilon"), MetaValue::F32(1e-6)),
    ];
    let (e, v) = (u64::from(s.n_embd), u64::from(s.n_vocab));
    let q = u64::from(s.head_dim * s.n_head);
    let kvw = u64::from(s.head_dim * s.n_head_kv);
    let (hd, ff) = (u64::from(s.head_dim), u64::from(s.n_ff));
    let mut tensors = vec![
        T::new("token_embd.weight".into(), C::Embedding, &[e, v]),
        T::new("output_norm.weight".into(), C::Norm, &[e]),
    ];
    for il in 0..s.n_layer {
        let n = |x: &str| format!("blk.{il}.{x}.weight");
        tensors.extend([
            T::new(n("attn_norm"), C::Norm, &[e]),
            T::new(n("attn_q"), C::Attention, &[e, q]),
            T::new(n("attn_k"), C::Attention, &[e, kvw]),
            T::new(n("attn_v"), C::Attention, &[e, kvw]),
            T::new(n("attn_output"), C::Attention, &[q, e]),
            T::new(n("attn_q_norm"), C::Norm, &[hd]),
            T::new(n("attn_k_norm"), C::Norm, &[hd]),
            T::new(n("post_attention_norm"), C::Norm, &[e]),
            T::new(n("ffn_norm"), C::Norm, &[e]),
            T::new(n("ffn_gate"), C::Ffn, &[e, ff]),
            T::new(n("ffn_up"), C::Ffn, &[e, ff]),
            T::new(n("ffn_down"), C::Ffn, &[ff, e]),
            T::new(n("post_ffw_norm"), C::Norm, &[e]),
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
