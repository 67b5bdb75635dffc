//! Cases of attention over f32 and f16 caches: GQA, windows, softcap and sinks, batches of one and
//! two sequences, decode over short and long caches; over f32 and f16 caches also latent
//! attention (values from the keys, GLM-5.3's 512-wide rows), sparse selection, wide heads and
//! DeepSeek-V4's two-source attention (the window ring and the compressed rows).

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
        comp: 0,
        comp_selected: false,
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
            if !t.is_quantized() {
                all.extend(latent_and_sparse(t));
                all.extend(two_source(t));
            }
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

/// Latent (values from the keys), sparse and wide-headed cases over `t` (f32 or f16) caches:
/// GLM-5.3's latent layer in small (query heads of 512 over one KV head, scale 1/16), dense and
/// with lists of random positions (repeats, and positions after the row's, among them), decode
/// rows and a prompt's rows, a list beside a window, and a 320-wide head.
fn latent_and_sparse(t: DType) -> Vec<Case> {
    let latent = |n_head: u32, selected: bool, window: u32| AttentionParams {
        v_from_k: true,
        selected,
        window,
        scale: 1.0 / 16.0,
        ..attn_params(n_head, 1, 512, 0, 0.0)
    };
    // Rows of q (in the given slots, at the given positions) over caches of [len, n_slots], then
    // lists of n_sel positions per row; with values from the keys, the V source is the K cache
    // passed again.
    let call = |name: &str,
                p: AttentionParams,
                [len, n_slots]: [u64; 2],
                [slots, pos]: [Spec; 2],
                n_sel: u64| {
        let rows = slots.ne[0];
        let q = u64::from(p.dk * p.n_head);
        let kv = |d: u32| {
            spec(
                t,
                [u64::from(d * p.n_head_kv), len, n_slots, 1],
                Fill::Random(1.0),
            )
        };
        let v = if p.v_from_k { kv(p.dk) } else { kv(p.dv) };
        let mut srcs = vec![f32s([q, rows, 1, 1]), kv(p.dk), v, slots, pos];
        if p.sinks {
            srcs.push(spec(
                DType::F32,
                [u64::from(p.n_head), 1, 1, 1],
                Fill::Random(2.0),
            ));
        }
        if p.selected {
            srcs.push(spec(DType::I32, [n_sel, rows, 1, 1], Fill::Ids(len as i32)));
        }
        let out = u64::from(p.dv * p.n_head);
        Case {
            alias: p.v_from_k.then_some((1, 2)),
            ..case(name, Op::Attention(p), srcs, [out, rows, 1, 1], 1e-5)
        }
    };
    // `rows` decode rows of one slot at the last positions of a cache of `len`.
    let last = |rows: u64, len: u64| {
        [
            runs(rows, rows, [0, 0], 0),
            runs(rows, rows, [(len - rows) as i32, 0], 1),
        ]
    };
    let random =
        |rows: u64, [len, n_slots]: [u64; 2]| [ids(rows, n_slots as i32), ids(rows, len as i32)];
    vec![
        call(
            "latent d 512, 64/1 heads, decode of 2 random rows",
            latent(64, false, 0),
            [300, 2],
            random(2, [300, 2]),
            0,
        ),
        call(
            "latent d 512, 8/1 heads, dense decode at 8191",
            latent(8, false, 0),
            [8192, 1],
            last(1, 8192),
            0,
        ),
        call(
            "latent d 512, sparse 64 of 500, decode of 3 random rows",
            latent(16, true, 0),
            [500, 2],
            random(3, [500, 2]),
            64,
        ),
        call(
            "latent d 512, sparse 2100 of 4000, decode at 3999",
            latent(8, true, 0),
            [4000, 1],
            last(1, 4000),
            2100,
        ),
        call(
            "latent d 512, sparse 40, 20 prompt rows at 280..300",
            latent(8, true, 0),
            [300, 2],
            last(20, 300),
            40,
        ),
        call(
            "latent d 512, sparse 40 + window 16, 3 random rows",
            latent(8, true, 16),
            [300, 2],
            random(3, [300, 2]),
            40,
        ),
        call(
            "sparse 24, gqa 8/2, d 64, sinks",
            AttentionParams {
                selected: true,
                sinks: true,
                ..attn_params(8, 2, 64, 0, 0.0)
            },
            [200, 2],
            random(4, [200, 2]),
            24,
        ),
        call(
            "values from the keys, dk 128 dv 64, gqa 4/2",
            AttentionParams {
                v_from_k: true,
                dv: 64,
                ..attn_params(4, 2, 128, 0, 0.0)
            },
            [100, 2],
            random(3, [100, 2]),
            0,
        ),
        call(
            "wide heads, d 320, gqa 4/2, window 50",
            attn_params(4, 2, 320, 50, 0.0),
            [100, 2],
            random(3, [100, 2]),
            0,
        ),
        // GLM-5.3's decode and prompt shapes: all 64 heads (four blocks of 16 sharing each
        // latent row), a decode row over the indexer's longest list in merged runs, and prompt
        // rows in one run each.
        call(
            "latent d 512, 64/1 heads, sparse 2051 of 8192, decode at 8191",
            latent(64, true, 0),
            [8192, 1],
            last(1, 8192),
            2051,
        ),
        call(
            "latent d 512, 64/1 heads, sparse 300, 96 prompt rows at 904..1000",
            latent(64, true, 0),
            [1000, 1],
            last(96, 1000),
            300,
        ),
        // A group of 24 heads (blocks of 16 and 8) over separate V, dims no multiple of 8.
        call(
            "sparse 20 + window 6, gqa 48/2, dk 100 dv 36, sinks, softcap",
            AttentionParams {
                selected: true,
                sinks: true,
                dv: 36,
                ..attn_params(48, 2, 100, 6, 0.5)
            },
            [90, 2],
            random(3, [90, 2]),
            20,
        ),
    ]
}

/// DeepSeek-V4's two-source attention over a `t` (f32 or f16) window ring: 64 query heads of 512
/// over one latent row, window 128 over a ring of 128, sinks, and f32 compressed rows; the
/// ratio-128 layer (every visible row) and the ratio-4 layer (the rows CompSelect lists, ids
/// uniform over the cache, so repeats and rows not yet visible among them), decode rows of two
/// slots and deep, and prompt rows of two sequences from position 0 and 300.
fn two_source(t: DType) -> Vec<Case> {
    let (d, n_head, window) = (512u64, 64u32, 128u64);
    // `rows` rows (slots, positions) over a ring of two slots and compressed rows [comp_len, 2]
    // of `ratio` positions, with lists of `n_list` a row when n_list > 0.
    let call = |name: &str, ratio: u32, comp_len: u64, [slots, pos]: [Spec; 2], n_list: u64| {
        let rows = slots.ne[0];
        let p = AttentionParams {
            v_from_k: true,
            sinks: true,
            comp: ratio,
            comp_selected: n_list > 0,
            ..attn_params(n_head, 1, d as u32, window as u32, 0.0)
        };
        let ring = || spec(t, [d, window, 2, 1], Fill::Random(1.0));
        let mut srcs = vec![
            f32s([d * u64::from(n_head), rows, 1, 1]),
            ring(),
            ring(),
            slots,
            pos,
            spec(DType::F32, [u64::from(n_head), 1, 1, 1], Fill::Random(2.0)),
            f32s([d, comp_len, 2, 1]),
        ];
        if n_list > 0 {
            srcs.push(spec(
                DType::I32,
                [n_list, rows, 1, 1],
                Fill::Ids(comp_len as i32),
            ));
        }
        Case {
            alias: Some((1, 2)),
            ..case(
                name,
                Op::Attention(p),
                srcs,
                [d * u64::from(n_head), rows, 1, 1],
                1e-5,
            )
        }
    };
    vec![
        call(
            "two-source ratio 128, 64/1 heads d 512, window 128, sinks, decode of 2 rows to 4,000",
            128,
            32,
            [ids(2, 2), ids(2, 4000)],
            0,
        ),
        call(
            "two-source ratio 4, lists of 512 of 2,048 rows, decode at 8,191 and 5,000",
            4,
            2048,
            [runs(2, 1, [0, 1], 0), runs(2, 1, [8191, 5000], 0)],
            512,
        ),
        call(
            "two-source ratio 4, lists of 64, 40 prompt rows from 0 and 300",
            4,
            128,
            [runs(40, 20, [0, 1], 0), runs(40, 20, [0, 300], 1)],
            64,
        ),
        call(
            "two-source ratio 128, 40 prompt rows from 0 and 300",
            128,
            4,
            [runs(40, 20, [0, 1], 0), runs(40, 20, [0, 300], 1)],
            0,
        ),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_source_cases_pass_f32_compressed_rows_beside_each_ring() {
        for t in [DType::F32, DType::F16] {
            let mut found = [0; 2];
            for c in cases(OpKind::Attention, t) {
                let Op::Attention(p) = c.op else { continue };
                if p.comp == 0 {
                    continue;
                }
                // q, the ring twice, slots, positions, sinks, the compressed rows, the lists.
                assert_eq!(c.srcs.len(), 7 + usize::from(p.comp_selected), "{}", c.name);
                assert!(
                    p.v_from_k && p.sinks && c.alias == Some((1, 2)),
                    "{}",
                    c.name
                );
                let (ring, comp) = (c.srcs[1], c.srcs[6]);
                assert_eq!(ring.dtype, t, "{}", c.name);
                assert_eq!(comp.dtype, DType::F32, "{}", c.name);
                assert_eq!(
                    (comp.ne[0], comp.ne[2]),
                    (ring.ne[0], ring.ne[2]),
                    "{}",
                    c.name
                );
                // Every row's compressed rows fit the cache: positions below len · ratio.
                let most = match c.srcs[4].fill {
                    Fill::Ids(n) => n as u64 - 1,
                    Fill::Runs { split, first, step } => {
                        let (rows, step) = (c.srcs[4].ne[0], step as u64);
                        let last = |f: i32, n: u64| f as u64 + step * n.saturating_sub(1);
                        last(first[0], split).max(last(first[1], rows - split))
                    }
                    _ => panic!("{}: positions", c.name),
                };
                assert!((most + 1) / u64::from(p.comp) <= comp.ne[1], "{}", c.name);
                if p.comp_selected {
                    assert_eq!(c.srcs[7].dtype, DType::I32, "{}", c.name);
                }
                found[usize::from(p.comp_selected)] += 1;
            }
            assert!(found[0] >= 2 && found[1] >= 2, "{t}: {found:?}");
        }
    }
}
