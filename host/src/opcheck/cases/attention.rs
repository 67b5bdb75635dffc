//! Cases of attention over f32 and f16 caches: GQA, windows, softcap and sinks, batches of one and
//! two sequences, decode over short and long caches.

use bloomery_plugin_api::op::{AttentionParams, Op, OpKind};
use bloomery_plugin_api::DType;

use super::{case, f32s, ids, runs, spec};
use crate::opcheck::{Case, Fill, Spec};

/// Attention parameters of `n_head` heads over `n_head_kv` KV heads of `d` values.
fn attn_params(n_head: u32, n_head_kv: u32, d: u32, window: u32, softcap: f32) -> AttentionParams {
    AttentionParams {
        n_head,
        n_head_kv,
        dk: d,
        dv: d,
        scale: 1.0 / (d as f32).sqrt(),
        softcap,
        window,
        v_from_k: false,
        sinks: false,
        selected: false,
        // Unrotated (the rotated cases set these).
        rot_k: 0,
        rot_v: 0,
    }
}

/// The Attention op of [`attn_params`].
fn attn(n_head: u32, n_head_kv: u32, d: u32, window: u32, softcap: f32) -> Op {
    Op::Attention(attn_params(n_head, n_head_kv, d, window, softcap))
}

/// The cases of this family for `(op, dtype)`; none for pairs of other families.
pub(super) fn cases(op: OpKind, dtype: DType) -> Vec<Case> {
    match (op, dtype) {
        (OpKind::Attention, t)
            if super::cache_store::QUANTIZED.contains(&t)
                || matches!(t, DType::F32 | DType::F16) =>
        {
            // Quantized caches: the CPU scores q quantized to Q8_0/Q8_1 against the keys (as
            // llama.cpp's CPU does), the card the dequantized keys in f32 or f16 parts.
            let tol = if t.is_quantized() { 3e-2 } else { 1e-5 };
            let cache = || spec(t, [2 * 64, 40, 3, 1], Fill::Random(1.0));
            // A case of `slots.rows()` rows of q over K and V caches of [len, n_slots] (sinks
            // random when the op has them).
            let flash = |name: &str,
                         p: AttentionParams,
                         [len, n_slots]: [u64; 2],
                         slots: Spec,
                         pos: Spec| {
                let rows = slots.ne[0];
                let (q, kv) = (u64::from(p.dk * p.n_head), u64::from(p.dk * p.n_head_kv));
                let mut srcs = vec![
                    f32s([q, rows, 1, 1]),
                    spec(t, [kv, len, n_slots, 1], Fill::Random(1.0)),
                    spec(t, [kv, len, n_slots, 1], Fill::Random(1.0)),
                    slots,
                    pos,
                ];
                if p.sinks {
                    srcs.push(spec(
                        DType::F32,
                        [u64::from(p.n_head), 1, 1, 1],
                        Fill::Random(2.0),
                    ));
                }
                case(name, Op::Attention(p), srcs, [q, rows, 1, 1], tol)
            };
            let srcs = || {
                vec![
                    f32s([64 * 8, 5, 1, 1]),
                    cache(),
                    cache(),
                    ids(5, 3),
                    ids(5, 40),
                ]
            };
            let mut all = vec![
                case(
                    "gqa 8/2 heads, full",
                    attn(8, 2, 64, 0, 0.0),
                    srcs(),
                    [64 * 8, 5, 1, 1],
                    tol,
                ),
                case(
                    "window 7, softcap 30",
                    attn(8, 2, 64, 7, 30.0),
                    srcs(),
                    [64 * 8, 5, 1, 1],
                    tol,
                ),
                // Batches of 16 rows and more take a GPU plugin's flash form: rows of two
                // sequences (a block's rows then span both slots), head sizes 64 to 256, rows in
                // random slots and positions, a window, softcap and sinks.
                flash(
                    "batch of two sequences, gqa 16/2, d 128",
                    attn_params(16, 2, 128, 0, 0.0),
                    [150, 3],
                    runs(100, 37, [2, 0], 0),
                    runs(100, 37, [20, 0], 1),
                ),
                flash(
                    "batch of 40 random rows, window 20, softcap 30, d 64",
                    attn_params(8, 2, 64, 20, 30.0),
                    [40, 3],
                    ids(40, 3),
                    ids(40, 40),
                ),
                // Few rows (decode): a GPU plugin's flash form split along the positions (f16;
                // the last block merges the splits), over long caches and over three slots with
                // sinks, or its scores form (f32, with more shared memory past 48 KB of scores).
                flash(
                    "decode of 7 rows in three slots, softcap 30, sinks, d 256",
                    AttentionParams {
                        sinks: true,
                        ..attn_params(8, 2, 256, 0, 30.0)
                    },
                    [1_000, 3],
                    ids(7, 3),
                    ids(7, 1_000),
                ),
                // Eight heads per KV head (the Qwen3-MoE and Qwen3.6 shapes): a GPU plugin's
                // decode form, one run for short contexts and split runs for longer ones.
                flash(
                    "decode of 3 rows, gqa 32/4, d 128",
                    attn_params(32, 4, 128, 0, 0.0),
                    [300, 2],
                    ids(3, 2),
                    ids(3, 300),
                ),
                flash(
                    "decode of 2 rows, gqa 16/2, window 300, sinks, d 256",
                    AttentionParams {
                        sinks: true,
                        ..attn_params(16, 2, 256, 300, 0.0)
                    },
                    [1_000, 1],
                    ids(2, 1),
                    ids(2, 1_000),
                ),
                flash(
                    "decode over a long cache, gqa 8/2, d 128",
                    attn_params(8, 2, 128, 0, 0.0),
                    [12_500, 2],
                    ids(3, 2),
                    ids(3, 12_500),
                ),
                flash(
                    "decode over a long cache, window 700, sinks, d 64",
                    AttentionParams {
                        sinks: true,
                        ..attn_params(8, 2, 64, 700, 0.0)
                    },
                    [12_400, 1],
                    ids(2, 1),
                    ids(2, 12_400),
                ),
                flash(
                    "batch with sinks, mha 4/4, d 256",
                    AttentionParams {
                        sinks: true,
                        ..attn_params(4, 4, 256, 0, 0.0)
                    },
                    [70, 2],
                    runs(24, 24, [1, 0], 0),
                    runs(24, 24, [45, 0], 1),
                ),
            ];
            if t.is_quantized() {
                // K and V of different types: the card's run-time-typed scores form.
                let srcs = vec![
                    f32s([64 * 8, 5, 1, 1]),
                    cache(),
                    spec(DType::F16, [2 * 64, 40, 3, 1], Fill::Random(1.0)),
                    ids(5, 3),
                    ids(5, 40),
                ];
                all.push(case(
                    "an f16 V beside this K, gqa 8/2",
                    attn(8, 2, 64, 0, 0.0),
                    srcs,
                    [64 * 8, 5, 1, 1],
                    tol,
                ));
                // llama.cpp's Walsh-Hadamard rotation: q rotated as the keys were stored, each
                // head's output rotated back (a decode and a batch).
                all.push(flash(
                    "rotated K (128) and V (64), decode of 3 rows, gqa 8/2, d 128",
                    AttentionParams {
                        rot_k: 128,
                        rot_v: 64,
                        ..attn_params(8, 2, 128, 0, 0.0)
                    },
                    [300, 2],
                    ids(3, 2),
                    ids(3, 300),
                ));
                all.push(flash(
                    "rotated K and V (64), batch of two sequences, gqa 16/2, d 64",
                    AttentionParams {
                        rot_k: 64,
                        rot_v: 64,
                        ..attn_params(16, 2, 64, 0, 0.0)
                    },
                    [70, 2],
                    runs(24, 24, [1, 0], 0),
                    runs(24, 24, [45, 0], 1),
                ));
            }
            all
        }
        _ => Vec::new(),
    }
}
