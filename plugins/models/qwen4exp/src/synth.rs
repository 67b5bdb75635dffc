//! Shapes for `bloomery synth --arch qwen4exp`: `tiny`, the shape of the reference's random
//! checkpoint (`tests/oracle/make_qwen4exp_tiny.py`) with the b11434 converter's keys, key types
//! and tensors; `tiny-mtp`, the MTP-only file the converter's `--mtp` writes for it; `flash`,
//! Qwen3.8-Flash-Next at its real widths with the full n-gram table, and `flash-mtp`, its MTP file.
//!
//! The PLE hash constants are the converter's layout: each head's row count is the next prime
//! after the previous head's (the first at least `ngram_vocab_base`), the offsets their running
//! sums; the multipliers are those of the reference's tiny checkpoint, folded for a larger
//! vocabulary to odd numbers below `2^63 / vocab` as transformers draws them.

use abi_stable::std_types::RVec;
use bloomery_plugin_api::meta::MetaValue;
use bloomery_plugin_api::model::SynthPreset;
use bloomery_plugin_api::synth::PresetBuilder;

use crate::hparams::{HParams, ARCH};
use crate::weights;

/// The reference's tiny checkpoint's n-gram multipliers (one per context token).
const MULTIPLIERS: [u64; 3] = [
    2_175_817_888_646_129,
    31_215_934_654_987_533,
    4_449_929_463_106_639,
];

struct Shape {
    name: &'static str,
    description: &'static str,
    /// Trunk layers.
    n_layer: u32,
    /// Whether the file is the MTP-only file (the MTP block after `n_layer` absent layers).
    mtp_only: bool,
    n_embd: u32,
    n_head: u32,
    n_head_kv: u32,
    head_dim: u32,
    gdn_k_heads: u32,
    gdn_v_heads: u32,
    low_rank: u32,
    indexer_heads: u32,
    top_k: u32,
    n_expert: u32,
    n_used: u32,
    n_ff_exp: u32,
    n_vocab: u32,
    n_ctx: u32,
    ple_eos: u32,
    /// The first head's row count is the smallest prime at least this.
    ngram_vocab_base: u64,
}

const TINY: Shape = Shape {
    name: "tiny",
    description: "the reference's tiny checkpoint as the b11434 converter writes it: 8 layers (GDN, QSA at 3 and 7), hidden 128, 4 hyper-connection streams (rank 32), GQA 4/2 x 256, GDN 2/4 x 128, QSA 4 x 128 budget 16 ratio 4, PLE on layer 1 (16 heads x 8, 16,896 rows), 8 experts top-2 (ff 32) + shared, vocab 272",
    n_layer: 8,
    mtp_only: false,
    n_embd: 128,
    n_head: 4,
    n_head_kv: 2,
    head_dim: 256,
    gdn_k_heads: 2,
    gdn_v_heads: 4,
    low_rank: 32,
    indexer_heads: 4,
    top_k: 16,
    n_expert: 8,
    n_used: 2,
    n_ff_exp: 32,
    n_vocab: 272,
    n_ctx: 4096,
    ple_eos: 270,
    ngram_vocab_base: 1009,
};

const FLASH: Shape = Shape {
    name: "flash",
    description: "Qwen3.8-Flash-Next at its real widths: 48 layers (QSA at 3, 7, ..., 47, the rest GDN), hidden 2560, 4 streams (rank 320), GQA 24/2 x 256, GDN 16/48 x 128, QSA 4 x 128 budget 2048 ratio 4, PLE on layer 1 (16 heads x 160, 320,001,536 rows: 51 G values), 512 experts top-10 (ff 640) + shared, vocab 248,320",
    n_layer: 48,
    mtp_only: false,
    n_embd: 2560,
    n_head: 24,
    n_head_kv: 2,
    head_dim: 256,
    gdn_k_heads: 16,
    gdn_v_heads: 48,
    low_rank: 320,
    indexer_heads: 4,
    top_k: 2048,
    n_expert: 512,
    n_used: 10,
    n_ff_exp: 640,
    n_vocab: 248_320,
    n_ctx: 262_144,
    ple_eos: 248_044,
    ngram_vocab_base: 20_000_000,
};

const SHAPES: &[Shape] = &[
    TINY,
    Shape {
        name: "tiny-mtp",
        description: "the MTP-only file of `tiny` (the converter's --mtp): embeddings, head and the QSA MTP block 8, no trunk, no PLE",
        mtp_only: true,
        ..TINY
    },
    FLASH,
    Shape {
        name: "flash-mtp",
        description: "the MTP-only file of `flash` (the converter's --mtp): embeddings, head and the QSA MTP block 48 with its 512 experts, no trunk, no PLE",
        mtp_only: true,
        ..FLASH
    },
];

/// PLE heads: (3 − 1) n-gram sizes × 8.
const PLE_HEADS: usize = 16;

fn is_prime(n: u64) -> bool {
    n >= 2
        && (2..)
            .take_while(|d| d * d <= n)
            .all(|d| !n.is_multiple_of(d))
}

/// Each head's row count (successive primes from the first at least `base`) and offset.
fn ple_heads(base: u64) -> (Vec<u64>, Vec<u64>) {
    let mut sizes = Vec::with_capacity(PLE_HEADS);
    let mut p = base;
    while sizes.len() < PLE_HEADS {
        if is_prime(p) {
            sizes.push(p);
        }
        p += 1;
    }
    let offsets = sizes
        .iter()
        .scan(0, |acc, &s| {
            let o = *acc;
            *acc += s;
            Some(o)
        })
        .collect();
    (sizes, offsets)
}

/// [`MULTIPLIERS`] kept where they fit `n_vocab` (products with every id below 2^63), else
/// folded to odd numbers below `2^63 / n_vocab`.
fn multipliers(n_vocab: u32) -> Vec<u64> {
    let bound = i64::MAX as u64 / u64::from(n_vocab);
    MULTIPLIERS
        .iter()
        .map(|&m| {
            if m < bound {
                m
            } else {
                2 * (m % (bound / 2)) + 1
            }
        })
        .collect()
}

fn array(v: impl IntoIterator<Item = MetaValue>) -> MetaValue {
    MetaValue::Array(v.into_iter().collect())
}

fn i32s(v: impl IntoIterator<Item = u32>) -> MetaValue {
    array(v.into_iter().map(|x| MetaValue::I32(x as i32)))
}

fn preset(s: &Shape) -> SynthPreset {
    let n_all = s.n_layer + u32::from(s.mtp_only);
    let attention = |il: u32| (il + 1).is_multiple_of(4) || il >= s.n_layer;
    let b = PresetBuilder::new(ARCH, s.name, s.description, s.n_vocab)
        .model(n_all, s.n_ctx, s.n_embd)
        .attention(s.n_head, s.n_head_kv, s.head_dim)
        .value("rope.dimension_sections", i32s([11, 11, 10, 0]))
        .f32("rope.freq_base", 1e7)
        .f32("attention.layer_norm_rms_epsilon", 1e-6)
        .experts(s.n_expert, s.n_used, s.n_ff_exp)
        .u32("expert_shared_feed_forward_length", s.n_ff_exp);
    let b = match s.mtp_only {
        true => b.u32("nextn_predict_layers", 1),
        false => b,
    };
    let b = b
        .u32("ssm.conv_kernel", 4)
        .u32("ssm.state_size", 128)
        .u32("ssm.group_count", s.gdn_k_heads)
        .u32("ssm.time_step_rank", s.gdn_v_heads)
        .u32("ssm.inner_size", s.gdn_v_heads * 128)
        .value(
            "attention.recurrent_layers",
            array((0..n_all).map(|il| MetaValue::Bool(!attention(il)))),
        )
        .u32("full_attention_interval", 4)
        .u32("rope.dimension_count", 64)
        .u32("hyper_connection.count", 4)
        .u32("hyper_connection.low_rank", s.low_rank)
        .u32("attention.indexer.head_count", s.indexer_heads)
        .u32("attention.indexer.key_length", 128)
        .u32("attention.indexer.top_k", s.top_k)
        .value(
            "attention.compress_ratios",
            i32s((0..n_all).map(|il| if attention(il) { 4 } else { 0 })),
        );
    let b = match s.mtp_only {
        true => b,
        false => {
            let (sizes, offsets) = ple_heads(s.ngram_vocab_base);
            let u64s = |v: &[u64]| array(v.iter().map(|&x| MetaValue::U64(x)));
            b.value("ple.layers", i32s([1]))
                .u32("ple.ngram_size", 3)
                .u32("ple.heads_per_ngram", 8)
                .u32("ple.conv_kernel", 4)
                .u32("ple.eos_token_id", s.ple_eos)
                .u32(
                    "embedding_length_per_layer_input",
                    s.n_embd / PLE_HEADS as u32,
                )
                .value("ple.layer_multipliers", u64s(&multipliers(s.n_vocab)))
                .value("ple.head_offsets", u64s(&offsets))
                .value("ple.head_vocab_sizes", u64s(&sizes))
        }
    };
    b.with_tensor("output.weight")
        // Decay rates negative, decay biases around zero (as qwen35's presets).
        .range("ssm_a", -4.0, -0.5)
        .range("ssm_dt.bias", -1.5, 0.5)
        // Away from the goldens' tie bands (tests/oracle/hf_qwen4exp.py refuses a router or QSA
        // choice within 1e-4): router logits spread wider than the default ±0.05 gives; every
        // embedding and the indexer's projections offset alike, so that the indexer's queries and
        // pooled keys share a direction and few block scores are exactly 0 (every head's dot
        // product negative), which would tie.
        .range("ffn_gate_inp.weight", -0.8, 0.8)
        .range("token_embd.weight", 0.0, 0.1)
        .range("indexer.q_proj.weight", -0.05, 0.1)
        .range("indexer.k_proj.weight", -0.05, 0.1)
        .build(|view, t| weights::declare(t, &HParams::from_view(view)?).map(drop))
}

/// Every preset.
pub fn presets() -> RVec<SynthPreset> {
    SHAPES.iter().map(preset).collect()
}
