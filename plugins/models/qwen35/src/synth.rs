//! Shapes for `bloomery synth`: Qwen3.6-35B-A3B, and tiny `qwen35moe` and `qwen35` models for
//! tests (real head sizes: attention heads of 256 with 64 rotated dims, DeltaNet heads of 128).

use abi_stable::std_types::RVec;
use bloomery_plugin_api::meta::{MetaEntry as E, MetaValue};
use bloomery_plugin_api::model::{SynthPreset, SynthTensor as T, WeightClass as C};

use crate::hparams::{ARCH_DENSE, ARCH_MOE};

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
}

const SHAPES: [Shape; 3] = [
    Shape {
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
    },
    Shape {
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
    },
    Shape {
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
    },
];

const TAPS: u32 = 4;
const INTERVAL: u32 = 4;

fn preset(s: &Shape) -> SynthPreset {
    let k = |x: &str| format!("{}.{x}", s.arch);
    let mut metadata = vec![
        E::new("general.architecture", MetaValue::String(s.arch.into())),
        E::new(
            "general.name",
            MetaValue::String(format!("synthetic {} {}", s.arch, s.name).into()),
        ),
        E::new(&k("block_count"), MetaValue::U32(s.n_layer)),
        E::new(&k("context_length"), MetaValue::U32(s.n_ctx)),
        E::new(&k("embedding_length"), MetaValue::U32(s.n_embd)),
        E::new(&k("attention.head_count"), MetaValue::U32(s.n_head)),
        E::new(&k("attention.head_count_kv"), MetaValue::U32(s.n_head_kv)),
        E::new(&k("attention.key_length"), MetaValue::U32(s.head_dim)),
        E::new(&k("attention.value_length"), MetaValue::U32(s.head_dim)),
        E::new(&k("rope.freq_base"), MetaValue::F32(10_000_000.0)),
        E::new(&k("rope.dimension_count"), MetaValue::U32(s.head_dim / 4)),
        E::new(
            &k("rope.dimension_sections"),
            MetaValue::Array([11u32, 11, 10, 0].map(MetaValue::U32).into_iter().collect()),
        ),
        E::new(&k("attention.layer_norm_rms_epsilon"), MetaValue::F32(1e-6)),
        E::new(&k("full_attention_interval"), MetaValue::U32(INTERVAL)),
        E::new(&k("ssm.conv_kernel"), MetaValue::U32(TAPS)),
        E::new(&k("ssm.state_size"), MetaValue::U32(s.d_state)),
        E::new(&k("ssm.group_count"), MetaValue::U32(s.n_head_k)),
        E::new(&k("ssm.time_step_rank"), MetaValue::U32(s.n_head_v)),
        E::new(&k("ssm.inner_size"), MetaValue::U32(s.n_head_v * s.d_state)),
    ];
    if s.n_expert > 0 {
        metadata.extend([
            E::new(&k("expert_count"), MetaValue::U32(s.n_expert)),
            E::new(&k("expert_used_count"), MetaValue::U32(s.n_used)),
            E::new(&k("expert_feed_forward_length"), MetaValue::U32(s.n_ff)),
            E::new(
                &k("expert_shared_feed_forward_length"),
                MetaValue::U32(s.n_ff_shexp),
            ),
        ]);
    } else {
        metadata.push(E::new(&k("feed_forward_length"), MetaValue::U32(s.n_ff)));
    }
    let (e, v) = (u64::from(s.n_embd), u64::from(s.n_vocab));
    let q = u64::from(s.head_dim * s.n_head);
    let kvw = u64::from(s.head_dim * s.n_head_kv);
    let hd = u64::from(s.head_dim);
    let dk = u64::from(s.d_state);
    let (hk, hv) = (u64::from(s.n_head_k), u64::from(s.n_head_v));
    let ch = 2 * hk * dk + hv * dk;
    let (ff, ne, sh) = (
        u64::from(s.n_ff),
        u64::from(s.n_expert),
        u64::from(s.n_ff_shexp),
    );
    let mut tensors = vec![
        T::new("token_embd.weight".into(), C::Embedding, &[e, v]),
        T::new("output_norm.weight".into(), C::Norm, &[e]),
        T::new("output.weight".into(), C::Output, &[e, v]),
    ];
    for il in 0..s.n_layer {
        let n = |x: &str| format!("blk.{il}.{x}.weight");
        tensors.extend([
            T::new(n("attn_norm"), C::Norm, &[e]),
            T::new(n("post_attention_norm"), C::Norm, &[e]),
        ]);
        if (il + 1) % INTERVAL != 0 {
            tensors.extend([
                T::new(n("attn_qkv"), C::Attention, &[e, ch]),
                T::new(n("attn_gate"), C::Attention, &[e, hv * dk]),
                T::new(n("ssm_conv1d"), C::Recurrent, &[u64::from(TAPS), ch]).with_range(-0.5, 0.5),
                T::new(format!("blk.{il}.ssm_dt.bias"), C::Recurrent, &[hv]).with_range(0.5, 1.5),
                T::new(format!("blk.{il}.ssm_a"), C::Recurrent, &[hv]).with_range(-1.0, -0.1),
                T::new(n("ssm_beta"), C::Recurrent, &[e, hv]).with_range(-0.2, 0.2),
                T::new(n("ssm_alpha"), C::Recurrent, &[e, hv]).with_range(-0.2, 0.2),
                T::new(n("ssm_norm"), C::Norm, &[dk]),
                T::new(n("ssm_out"), C::Attention, &[hv * dk, e]),
            ]);
        } else {
            tensors.extend([
                T::new(n("attn_q"), C::Attention, &[e, 2 * q]),
                T::new(n("attn_k"), C::Attention, &[e, kvw]),
                T::new(n("attn_v"), C::Attention, &[e, kvw]),
                T::new(n("attn_output"), C::Attention, &[q, e]),
                T::new(n("attn_q_norm"), C::Norm, &[hd]),
                T::new(n("attn_k_norm"), C::Norm, &[hd]),
            ]);
        }
        if s.n_expert > 0 {
            tensors.extend([
                T::new(n("ffn_gate_inp"), C::Router, &[e, ne]),
                T::new(n("ffn_gate_exps"), C::Experts, &[e, ff, ne]),
                T::new(n("ffn_up_exps"), C::Experts, &[e, ff, ne]),
                T::new(n("ffn_down_exps"), C::Experts, &[ff, e, ne]),
                T::new(n("ffn_gate_inp_shexp"), C::Router, &[e]).with_range(-0.5, 0.5),
                T::new(n("ffn_gate_shexp"), C::SharedExpert, &[e, sh]),
                T::new(n("ffn_up_shexp"), C::SharedExpert, &[e, sh]),
                T::new(n("ffn_down_shexp"), C::SharedExpert, &[sh, e]),
            ]);
        } else {
            tensors.extend([
                T::new(n("ffn_gate"), C::Ffn, &[e, ff]),
                T::new(n("ffn_up"), C::Ffn, &[e, ff]),
                T::new(n("ffn_down"), C::Ffn, &[ff, e]),
            ]);
        }
    }
    SynthPreset {
        name: s.name.into(),
        description: s.description.into(),
        metadata: metadata.into(),
        tensors: tensors.into(),
    }
}

/// Every preset (each names its architecture in `general.architecture`).
pub fn presets() -> RVec<SynthPreset> {
    SHAPES.iter().map(preset).collect()
}
