//! The `deepseek41` preset for `bloomery synth --arch deepseek41`: `tiny`, the seed's 9-layer
//! map of V4.1 (its layers 0, 1, 2, 3, 14, 20, 21, 24, 25, one per kind of layer, renumbered 0–8)
//! at tiny widths, with small primes for the Engram tables (`docs/deepseek41-plan.md`, item 4):
//!
//! | layer | seed's | ratio | kind |
//! |---|---|---|---|
//! | 0 | 0 | 0 | window only |
//! | 1 | 1 | 0 | window, Engram |
//! | 2 | 2 | 2 | compressor source, indexer |
//! | 3 | 3 | 2 | reads 2's rows and picks |
//! | 4 | 14 | 2 | compressor source, indexer, Engram |
//! | 5 | 20 | 1 | compressor source, indexer |
//! | 6 | 21 | 1 | reads 5's rows and picks |
//! | 7 | 24 | 1 | indexer only, reads 5's rows |
//! | 8 | 25 | 1 | reads 5's rows and 7's picks |
//!
//! The sources are given by the tensors they carry ([`crate::v41`]): the preset names them to the
//! declaring loader as stand-ins.

use bloomery_plugin_api::meta::MetaValue;
use bloomery_plugin_api::model::SynthPreset;
use bloomery_plugin_api::synth::PresetBuilder;

use crate::hparams::{HParams, ARCH41};
use crate::weights;

const N_LAYER: u32 = 9;
const N_EMBD: u32 = 64;
const N_VOCAB: u32 = 320;
const HEAD_DIM: u32 = 128;
const INDEXER_DIM: u32 = 32;
const RATIOS: [u32; N_LAYER as usize] = [0, 0, 2, 2, 2, 1, 1, 1, 1];
/// Engram heads per n-gram size, n-gram sizes 2 to 4, row width.
const ENGRAM_HEADS: u32 = 2;
const ENGRAM_NGRAM: u32 = 4;
const ENGRAM_WIDTH: u32 = 16;
/// Each site's heads' row counts (primes; 6 heads a site).
const PRIMES: [[u64; 6]; 2] = [[31, 37, 41, 43, 47, 53], [59, 61, 67, 71, 73, 79]];
/// Each site's multipliers, odd and small enough that no product with a compressed id passes
/// int64 (the Engram reference's bound).
const MULTIPLIERS: [[u64; 4]; 2] = [
    [
        2_175_817_888_646_129,
        31_215_934_654_987_533,
        4_449_929_463_106_639,
        17_592_186_044_423,
    ],
    [
        9_007_199_254_740_881,
        12_345_678_901_234_567,
        36_028_797_018_963_913,
        281_474_976_710_597,
    ],
];
/// Compressed vocabulary of the token map: token `t` maps to `(t·37) mod 211`.
const COMPRESSED: u64 = 211;
/// The pad id (a compressed id).
const PAD: u32 = 7;

fn u64s(v: impl IntoIterator<Item = u64>) -> MetaValue {
    MetaValue::Array(v.into_iter().map(MetaValue::U64).collect())
}

/// Each site's offsets: its heads' rows one after the other in its own table.
fn offsets(primes: &[u64; 6]) -> impl Iterator<Item = u64> + '_ {
    primes.iter().scan(0, |o, &p| {
        let at = *o;
        *o += p;
        Some(at)
    })
}

/// The tiny preset.
pub fn tiny() -> SynthPreset {
    let clamps = MetaValue::Array(vec![MetaValue::F32(2.0); N_LAYER as usize].into());
    let ratios = MetaValue::Array(RATIOS.iter().map(|&r| MetaValue::U32(r)).collect());
    let rows = |s: usize| PRIMES[s].iter().sum::<u64>();
    let table = |s: usize| [u64::from(ENGRAM_WIDTH), rows(s), 1, 1];
    let comp = [u64::from(N_EMBD), u64::from(HEAD_DIM), 1, 1];
    let q_b = [32, 4 * u64::from(INDEXER_DIM), 1, 1];
    PresetBuilder::new(
        ARCH41,
        "tiny",
        "the seed's 9-layer map of V4.1 (its layers 0, 1, 2, 3, 14, 20, 21, 24, 25; ratios 0, 0, 2, 2, 2, 1, 1, 1, 1; compressor sources 2, 4, 5; indexers on 2, 4, 5, 7; Engram on 1 and 4), hidden 64, 8 heads x 128 (rope tail 16, q_lora 32, output 4 groups x 16), indexer 4 x 32 top 8, 16 experts top-6 (ff 32) + shared, clamp 2, Engram 2-4-grams x 2 heads of 16-wide rows with small primes, vocab 320",
        N_VOCAB,
    )
    .model(N_LAYER, 1_048_576, N_EMBD)
    .attention(8, 1, HEAD_DIM)
    .u32("rope.dimension_count", 16)
    .f32("rope.freq_base", 1e4)
    .value("rope.scaling.type", MetaValue::String("yarn".into()))
    .f32("rope.scaling.factor", 16.0)
    .u32("rope.scaling.original_context_length", 65_536)
    .experts(16, 6, 32)
    .f32("attention.layer_norm_rms_epsilon", 1e-20)
    .u32("attention.q_lora_rank", 32)
    .u32("attention.sliding_window", 128)
    .u32("expert_shared_count", 1)
    .f32("expert_weights_scale", 1.5)
    .value("expert_weights_norm", MetaValue::Bool(true))
    .value("swiglu_clamp_exp", clamps.clone())
    .value("swiglu_clamp_shexp", clamps)
    .u32("attention.indexer.head_count", 4)
    .u32("attention.indexer.key_length", INDEXER_DIM)
    .u32("attention.indexer.top_k", 8)
    .u32("attention.output_group_count", 4)
    .u32("attention.output_lora_rank", 16)
    .f32("attention.compress_rope_freq_base", 160_000.0)
    .u32("hyper_connection.count", 4)
    .u32("hyper_connection.sinkhorn_iterations", 20)
    .f32("hyper_connection.epsilon", 1e-6)
    .u32("hash_layer_count", 0)
    .value("attention.compress_ratios", ratios)
    .u32("expert_gating_func", 4)
    .u32("vocab_size", N_VOCAB)
    .u32("engram.head_count", ENGRAM_HEADS)
    .u32("engram.max_ngram_size", ENGRAM_NGRAM)
    .u32("engram.key_length", ENGRAM_WIDTH)
    .u32s("engram.layer_ids", &[1, 4])
    .value("engram.multipliers", u64s(MULTIPLIERS.iter().flatten().copied()))
    .value("engram.primes", u64s(PRIMES.iter().flatten().copied()))
    .value(
        "engram.offsets",
        u64s(PRIMES.iter().flat_map(offsets).collect::<Vec<_>>()),
    )
    .value(
        "engram.token_map",
        u64s((0..u64::from(N_VOCAB)).map(|t| (t * 37) % COMPRESSED)),
    )
    .u32("engram.pad_id", PAD)
    .stand_in("blk.1.engram_embd.weight", table(0))
    .stand_in("blk.4.engram_embd.weight", table(1))
    .stand_in("blk.2.attn_compressor_kv.weight", comp)
    .stand_in("blk.4.attn_compressor_kv.weight", comp)
    .stand_in("blk.5.attn_compressor_kv.weight", comp)
    .stand_in("blk.2.indexer.attn_q_b.weight", q_b)
    .stand_in("blk.4.indexer.attn_q_b.weight", q_b)
    .stand_in("blk.5.indexer.attn_q_b.weight", q_b)
    .stand_in("blk.7.indexer.attn_q_b.weight", q_b)
    // A selection bias and sinks that matter; hyper-connection scales near 1 and bases around
    // 0.
    .range("exp_probs_b.bias", -0.3, 0.3)
    .range("attn_sinks.weight", -0.5, 0.5)
    .range("hc_attn_scale.weight", 0.8, 1.2)
    .range("hc_ffn_scale.weight", 0.8, 1.2)
    .range("hc_attn_base.weight", -0.5, 0.5)
    .range("hc_ffn_base.weight", -0.5, 0.5)
    .build(|view, t| weights::declare(t, &HParams::from_view(view)?).map(drop))
}
