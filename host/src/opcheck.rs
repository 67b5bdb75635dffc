//! Op-by-op checks of a kernel plugin against a reference plugin (cpu-scalar): every `(op, dtype)`
//! pair the plugin claims is run on fresh random inputs on both devices, the destination poisoned
//! before each run, and the results compared by ‖out − ref‖ / ‖ref‖ against a tolerance per case.
//! A claimed pair with no case here is itself a failure, so a new kernel cannot skip its check.
//! [`check_host_memory`] checks the device's calls using host memory in place.

mod host_memory;

use std::sync::Arc;

use bloomery_plugin_api::op::{
    AttentionParams, DeltaRuleParams, Gating, GluKind, MoeParams, Op, OpKind, RopeMode, RopeParams,
    RouterParams, UnaryFn,
};
use bloomery_plugin_api::tensor::{OpCall, TensorRef, MAX_SRCS};
use bloomery_plugin_api::{DType, PluginError};
use half::f16;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use bloomery_devices::{Buffer, Device};

mod blocks;

/// How a source tensor is filled.
#[derive(Clone, Copy, Debug)]
pub enum Fill {
    /// Uniform in `[-scale, scale]` (quantized types: valid random blocks).
    Random(f32),
    /// I32 ids uniform in `[0, n)`.
    Ids(i32),
    /// Distinct I32 ids from `[0, n)` (a random permutation's prefix).
    Distinct(i32),
    /// F32 multiples of 1/127 in `[-1, 1]` with ±1 in every 32-block: quantization to 8 bits is
    /// exact, so a product's check isolates the dot from activation rounding.
    Steps,
    /// F32 uniform in `[lo, hi)` (log decays, write strengths).
    Range(f32, f32),
    /// I32 in two runs, as a batch of two sequences: element `r` is `first[0] + step·r` before
    /// `split`, then `first[1] + step·(r − split)` (slots with step 0, positions with step 1).
    Runs {
        /// Elements in the first run.
        split: u64,
        /// Each run's first value.
        first: [i32; 2],
        /// Increment along a run.
        step: i32,
    },
}

/// One tensor of a case.
#[derive(Clone, Copy, Debug)]
pub struct Spec {
    /// Element type.
    pub dtype: DType,
    /// Shape.
    pub ne: [u64; 4],
    /// Contents.
    pub fill: Fill,
}

/// A source the op sees through a view of its filled buffer (a strided source).
#[derive(Clone, Copy, Debug)]
pub struct View {
    /// Which source.
    pub src: usize,
    /// Extents.
    pub ne: [u64; 4],
    /// Byte strides.
    pub nb: [u64; 4],
    /// Byte offset of element 0.
    pub offset: u64,
}

/// One check: an op on given sources.
#[derive(Clone, Debug)]
pub struct Case {
    /// What it shows.
    pub name: String,
    /// The op.
    pub op: Op,
    /// Sources.
    pub srcs: Vec<Spec>,
    /// Destination shape (F32), unless `dst_is_src` names a source the op writes in place.
    pub dst: [u64; 4],
    /// The op writes source `i` (a cache): that source is the destination.
    pub dst_is_src: Option<usize>,
    /// A source seen through a strided view.
    pub view: Option<View>,
    /// The op also updates source `i` in place (a recurrent state): it is compared after the run
    /// as a second outcome.
    pub also_src: Option<usize>,
    /// Destination type when not a source (F32, or I32 for ids).
    pub dst_dtype: DType,
    /// Largest accepted relative error.
    pub tol: f64,
}

fn spec(dtype: DType, ne: [u64; 4], fill: Fill) -> Spec {
    Spec { dtype, ne, fill }
}

fn f32s(ne: [u64; 4]) -> Spec {
    spec(DType::F32, ne, Fill::Random(1.0))
}

/// The cases for one `(op, dtype)` pair; empty when none is written yet.
pub fn cases(op: OpKind, dtype: DType) -> Vec<Case> {
    let case = |name: &str, op: Op, srcs: Vec<Spec>, dst: [u64; 4], tol: f64| Case {
        name: name.to_owned(),
        op,
        srcs,
        dst,
        dst_is_src: None,
        view: None,
        also_src: None,
        dst_dtype: DType::F32,
        tol,
    };
    let router_of = |n_expert: u32, gating: Gating, k: u32, bias: bool| RouterParams {
        gating,
        n_expert,
        k,
        n_group: 1,
        topk_group: 1,
        bias,
        norm: true,
        norm_min: 6.103_515_6e-5,
        scale: 1.0,
    };
    let router = |gating: Gating, k: u32, bias: bool| router_of(8, gating, k, bias);
    let moe = |fused: bool, glu: GluKind| {
        Op::MoeExperts(MoeParams {
            n_expert: 4,
            k: 2,
            n_ff: 32,
            glu,
            limit: 0.0,
            fused_gate_up: fused,
            expert_map: false,
        })
    };
    let ids = |n: u64, max: i32| spec(DType::I32, [n, 1, 1, 1], Fill::Ids(max));
    let rope = |mode: RopeMode, n_dims: u32, ext: f32| {
        Op::Rope(RopeParams {
            mode,
            n_dims,
            sections: [0; 4],
            freq_base: 10000.0,
            freq_scale: if ext > 0.0 { 0.25 } else { 1.0 },
            ext_factor: ext,
            attn_factor: 1.0,
            beta_fast: 32.0,
            beta_slow: 1.0,
            n_ctx_orig: 4096,
            inverse: false,
        })
    };
    let attn_params =
        |n_head: u32, n_head_kv: u32, d: u32, window: u32, softcap: f32| AttentionParams {
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
        };
    let attn = |n_head: u32, n_head_kv: u32, d: u32, window: u32, softcap: f32| {
        Op::Attention(attn_params(n_head, n_head_kv, d, window, softcap))
    };
    match (op, dtype) {
        (OpKind::Add | OpKind::Mul, DType::F32) => {
            let o = if op == OpKind::Add { Op::Add } else { Op::Mul };
            vec![
                case(
                    "same shape",
                    o,
                    vec![f32s([4096, 3, 1, 1]), f32s([4096, 3, 1, 1])],
                    [4096, 3, 1, 1],
                    1e-6,
                ),
                case(
                    "row broadcast",
                    o,
                    vec![f32s([640, 7, 1, 1]), f32s([640, 1, 1, 1])],
                    [640, 7, 1, 1],
                    1e-6,
                ),
                case(
                    "one value per row",
                    o,
                    vec![f32s([640, 7, 1, 1]), f32s([1, 7, 1, 1])],
                    [640, 7, 1, 1],
                    1e-6,
                ),
            ]
        }
        (OpKind::Scale, DType::F32) => vec![case(
            "scale",
            Op::Scale { s: 0.37 },
            vec![f32s([1000, 7, 1, 1])],
            [1000, 7, 1, 1],
            1e-6,
        )],
        (OpKind::RmsNorm, DType::F32) => vec![
            case(
                "with weight",
                Op::RmsNorm { eps: 1e-6 },
                vec![f32s([4096, 5, 1, 1]), f32s([4096, 1, 1, 1])],
                [4096, 5, 1, 1],
                1e-5,
            ),
            case(
                "no weight",
                Op::RmsNorm { eps: 1e-5 },
                vec![f32s([640, 3, 1, 1])],
                [640, 3, 1, 1],
                1e-5,
            ),
        ],
        (OpKind::GetRows, t) if t.is_quantized() || matches!(t, DType::F32 | DType::F16) => {
            vec![case(
                "gather 9 of 100",
                Op::GetRows,
                vec![
                    spec(t, [256, 100, 1, 1], Fill::Random(1.0)),
                    spec(DType::I32, [9, 1, 1, 1], Fill::Ids(100)),
                ],
                [256, 9, 1, 1],
                1e-6,
            )]
        }
        (OpKind::MatMul, t) if t.is_quantized() || t == DType::F32 => {
            // The 256-value types (Q4_K, Q5_K, Q6_K, Q3_K, IQ4_XS, IQ3_XXS): the CPU takes Q8_K
            // activations (one scale per 256), the card Q8_1 (one per 32), as llama.cpp's two
            // backends do: the products differ by that rounding (simulated on the CPU: at most 7e-3
            // over 12 seeds).
            // The 32-value types take Q8_0 or Q8_1 activations rounded alike on both.
            let superblocks = t.layout().is_some_and(|l| l.block > 32);
            let tol = if superblocks { 2e-2 } else { 1e-5 };
            let tiled_k = if superblocks { 512 } else { 352 };
            vec![
                case(
                    "one block, 4 rows",
                    Op::MatMul,
                    vec![
                        spec(t, [256, 4, 1, 1], Fill::Random(0.1)),
                        f32s([256, 1, 1, 1]),
                    ],
                    [4, 1, 1, 1],
                    tol,
                ),
                case(
                    "exact activations",
                    Op::MatMul,
                    vec![
                        spec(t, [256, 4, 1, 1], Fill::Random(0.1)),
                        spec(DType::F32, [256, 1, 1, 1], Fill::Steps),
                    ],
                    [4, 1, 1, 1],
                    tol,
                ),
                case(
                    "decode: 1 column",
                    Op::MatMul,
                    vec![
                        spec(t, [2048, 1000, 1, 1], Fill::Random(0.1)),
                        f32s([2048, 1, 1, 1]),
                    ],
                    [1000, 1, 1, 1],
                    tol,
                ),
                case(
                    "prompt: 5 columns",
                    Op::MatMul,
                    vec![
                        spec(t, [512, 300, 1, 1], Fill::Random(0.1)),
                        f32s([512, 5, 1, 1]),
                    ],
                    [300, 5, 1, 1],
                    tol,
                ),
                // 2 to 15 columns (decode with several streams) take a few-column product on the
                // CUDA bundles, 2, 4 or 8 columns per pass: one pass (2, 8; 136 blocks of 32
                // values, not a multiple of the warp), two passes (15, the second partial); Q8_0
                // and Q4_K rows go 1, 2 or 4 to a warp by their count (3 columns over 2,051 rows
                // and 4 over 1,030 leave the last warp's rows partial).
                case(
                    "decode: 2 columns",
                    Op::MatMul,
                    vec![
                        spec(t, [4352, 200, 1, 1], Fill::Random(0.1)),
                        f32s([4352, 2, 1, 1]),
                    ],
                    [200, 2, 1, 1],
                    tol,
                ),
                case(
                    "decode: 3 columns, 2051 rows",
                    Op::MatMul,
                    vec![
                        spec(t, [512, 2051, 1, 1], Fill::Random(0.1)),
                        f32s([512, 3, 1, 1]),
                    ],
                    [2051, 3, 1, 1],
                    tol,
                ),
                case(
                    "decode: 4 columns, 1030 rows",
                    Op::MatMul,
                    vec![
                        spec(t, [512, 1030, 1, 1], Fill::Random(0.1)),
                        f32s([512, 4, 1, 1]),
                    ],
                    [1030, 4, 1, 1],
                    tol,
                ),
                case(
                    "decode: 8 columns",
                    Op::MatMul,
                    vec![
                        spec(t, [2048, 257, 1, 1], Fill::Random(0.1)),
                        f32s([2048, 8, 1, 1]),
                    ],
                    [257, 8, 1, 1],
                    tol,
                ),
                case(
                    "decode: 15 columns",
                    Op::MatMul,
                    vec![
                        spec(t, [512, 300, 1, 1], Fill::Random(0.1)),
                        f32s([512, 15, 1, 1]),
                    ],
                    [300, 15, 1, 1],
                    tol,
                ),
                // Batches of 16 rows or more take the tiled products on the CUDA bundles: 70
                // columns and 200 rows leave partial tiles, 352 values a partial k step.
                case(
                    "prompt: 70 columns (tiled)",
                    Op::MatMul,
                    vec![
                        spec(t, [tiled_k, 200, 1, 1], Fill::Random(0.1)),
                        f32s([tiled_k, 70, 1, 1]),
                    ],
                    [200, 70, 1, 1],
                    tol,
                ),
            ]
        }
        (OpKind::Glu, DType::F32) => {
            let x = || {
                vec![
                    spec(DType::F32, [2048, 3, 1, 1], Fill::Random(8.0)),
                    f32s([2048, 3, 1, 1]),
                ]
            };
            vec![
                case(
                    "swiglu",
                    Op::Glu {
                        kind: GluKind::SwiGlu,
                        limit: 0.0,
                    },
                    x(),
                    [2048, 3, 1, 1],
                    1e-6,
                ),
                case(
                    "swiglu, limit 7",
                    Op::Glu {
                        kind: GluKind::SwiGlu,
                        limit: 7.0,
                    },
                    x(),
                    [2048, 3, 1, 1],
                    1e-6,
                ),
                case(
                    "geglu",
                    Op::Glu {
                        kind: GluKind::GeGlu,
                        limit: 0.0,
                    },
                    x(),
                    [2048, 3, 1, 1],
                    1e-3,
                ),
            ]
        }
        (OpKind::Unary, DType::F32) => [
            (UnaryFn::Silu, 1e-6),
            (UnaryFn::Sigmoid, 1e-6),
            (UnaryFn::Gelu, 1e-3),
            (UnaryFn::GeluErf, 1e-6),
            (UnaryFn::Softplus, 1e-6),
            (UnaryFn::Tanh, 1e-6),
            (UnaryFn::Exp, 1e-6),
            (UnaryFn::Relu, 0.0),
        ]
        .into_iter()
        .map(|(f, tol)| {
            case(
                &format!("{f:?}"),
                Op::Unary { f },
                vec![spec(DType::F32, [1000, 3, 1, 1], Fill::Random(12.0))],
                [1000, 3, 1, 1],
                tol,
            )
        })
        .collect(),
        (OpKind::Rope, DType::F32) => {
            let x = || vec![f32s([128, 4, 5, 1]), ids(5, 4096)];
            vec![
                case(
                    "neox",
                    rope(RopeMode::Neox, 128, 0.0),
                    x(),
                    [128, 4, 5, 1],
                    1e-6,
                ),
                case(
                    "norm",
                    rope(RopeMode::Norm, 128, 0.0),
                    x(),
                    [128, 4, 5, 1],
                    1e-6,
                ),
                case(
                    "neox, partial 64 of 128",
                    rope(RopeMode::Neox, 64, 0.0),
                    x(),
                    [128, 4, 5, 1],
                    1e-6,
                ),
                case(
                    "neox, yarn",
                    rope(RopeMode::Neox, 128, 1.0),
                    x(),
                    [128, 4, 5, 1],
                    1e-6,
                ),
                // Qwen3.5's partial IMROPE; one position per row (text) is NEOX on every section.
                case(
                    "imrope, text positions, partial 64 of 128",
                    match rope(RopeMode::Imrope, 64, 0.0) {
                        Op::Rope(p) => Op::Rope(RopeParams {
                            sections: [11, 11, 10, 0],
                            ..p
                        }),
                        other => other,
                    },
                    x(),
                    [128, 4, 5, 1],
                    1e-6,
                ),
            ]
        }
        (OpKind::L2Norm, DType::F32) => vec![
            case(
                "128-wide heads",
                Op::L2Norm { eps: 1e-6 },
                vec![f32s([128, 16, 5, 1])],
                [128, 16, 5, 1],
                1e-6,
            ),
            // Σx² about 5e-4: eps (added to it) moves every value.
            case(
                "small rows, eps 1e-4",
                Op::L2Norm { eps: 1e-4 },
                vec![spec(DType::F32, [16, 40, 1, 1], Fill::Random(1e-2))],
                [16, 40, 1, 1],
                1e-6,
            ),
        ],
        (OpKind::Copy, t @ (DType::F32 | DType::F16)) => {
            // The query and gate halves of an interleaved projection (Qwen3.5's gated attention:
            // 2·64 values per head, 4 heads, 6 rows) through strided views; conversions round to
            // nearest even on both devices, so copies are exact.
            let (hd, nh, rows) = (64, 4, 6);
            let es = if t == DType::F16 { 2 } else { 4 };
            let half = |name: &str, first: u64, dst_dtype: DType| Case {
                view: Some(View {
                    src: 0,
                    ne: [hd, nh, rows, 1],
                    nb: [es, 2 * hd * es, 2 * hd * nh * es, 2 * hd * nh * rows * es],
                    offset: first * es,
                }),
                dst_dtype,
                ..case(
                    name,
                    Op::Copy,
                    vec![spec(t, [2 * hd * nh, rows, 1, 1], Fill::Random(1.0))],
                    [hd, nh, rows, 1],
                    0.0,
                )
            };
            let other = if t == DType::F32 {
                DType::F16
            } else {
                DType::F32
            };
            vec![
                half("query half, strided", 0, DType::F32),
                half("gate half, strided, converted", hd, other),
                Case {
                    dst_dtype: t,
                    ..case(
                        "contiguous",
                        Op::Copy,
                        vec![spec(t, [1000, 3, 1, 1], Fill::Random(1.0))],
                        [1000, 3, 1, 1],
                        0.0,
                    )
                },
            ]
        }
        // Expert ids packed for the host's read (the tiered executor): bits kept, values that
        // are denormal as f32 included.
        (OpKind::Copy, DType::I32) => vec![Case {
            dst_dtype: DType::I32,
            ..case(
                "i32 ids, contiguous",
                Op::Copy,
                vec![spec(DType::I32, [8, 3, 1, 1], Fill::Ids(1 << 20))],
                [8, 3, 1, 1],
                0.0,
            )
        }],
        (OpKind::CacheStore, t @ (DType::F32 | DType::F16)) => {
            // 6 rows of width 256 into a [256, 32 positions, 3 slots] cache.
            vec![Case {
                dst_is_src: Some(1),
                ..case(
                    "6 rows into 3 slots",
                    Op::CacheStore,
                    vec![
                        f32s([256, 6, 1, 1]),
                        spec(t, [256, 32, 3, 1], Fill::Random(1.0)),
                        ids(6, 3),
                        // Distinct positions: two rows never name one cell, whose final value
                        // would depend on which write lands last.
                        spec(DType::I32, [6, 1, 1, 1], Fill::Distinct(32)),
                    ],
                    [256, 32, 3, 1],
                    0.0,
                )
            }]
        }
        (OpKind::Attention, t @ (DType::F32 | DType::F16)) => {
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
                case(name, Op::Attention(p), srcs, [q, rows, 1, 1], 1e-5)
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
            vec![
                case(
                    "gqa 8/2 heads, full",
                    attn(8, 2, 64, 0, 0.0),
                    srcs(),
                    [64 * 8, 5, 1, 1],
                    1e-5,
                ),
                case(
                    "window 7, softcap 30",
                    attn(8, 2, 64, 7, 30.0),
                    srcs(),
                    [64 * 8, 5, 1, 1],
                    1e-5,
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
            ]
        }
        (OpKind::RouterTopK, DType::F32) => {
            let logits = || spec(DType::F32, [8, 5, 1, 1], Fill::Random(4.0));
            vec![
                Case {
                    dst_dtype: DType::I32,
                    ..case(
                        "softmax, top 2",
                        Op::RouterTopK(router(Gating::Softmax, 2, false)),
                        vec![logits()],
                        [2, 5, 1, 1],
                        0.0,
                    )
                },
                Case {
                    dst_dtype: DType::I32,
                    ..case(
                        "sigmoid + bias, top 3",
                        Op::RouterTopK(router(Gating::Sigmoid, 3, true)),
                        vec![logits(), spec(DType::F32, [8, 1, 1, 1], Fill::Random(0.5))],
                        [3, 5, 1, 1],
                        0.0,
                    )
                },
                Case {
                    dst_dtype: DType::I32,
                    ..case(
                        "softmax, top 8 of 128",
                        Op::RouterTopK(router_of(128, Gating::Softmax, 8, false)),
                        vec![spec(DType::F32, [128, 9, 1, 1], Fill::Random(4.0))],
                        [8, 9, 1, 1],
                        0.0,
                    )
                },
                Case {
                    dst_dtype: DType::I32,
                    ..case(
                        "sigmoid + bias, top 6 of 160",
                        Op::RouterTopK(router_of(160, Gating::Sigmoid, 6, true)),
                        vec![
                            spec(DType::F32, [160, 3, 1, 1], Fill::Random(4.0)),
                            spec(DType::F32, [160, 1, 1, 1], Fill::Random(0.5)),
                        ],
                        [6, 3, 1, 1],
                        0.0,
                    )
                },
            ]
        }
        (OpKind::RouterWeights, DType::F32) => {
            let srcs = || {
                vec![
                    spec(DType::F32, [8, 5, 1, 1], Fill::Random(4.0)),
                    ids(2 * 5, 8),
                ]
            };
            vec![
                case(
                    "softmax, renormalised",
                    Op::RouterWeights(router(Gating::Softmax, 2, false)),
                    srcs(),
                    [2, 5, 1, 1],
                    1e-6,
                ),
                case(
                    "softmax over the selected",
                    Op::RouterWeights(router(Gating::SoftmaxSelected, 2, false)),
                    srcs(),
                    [2, 5, 1, 1],
                    1e-6,
                ),
                case(
                    "sigmoid",
                    Op::RouterWeights(router(Gating::Sigmoid, 2, false)),
                    srcs(),
                    [2, 5, 1, 1],
                    1e-6,
                ),
                case(
                    "softmax, renormalised, 8 of 128",
                    Op::RouterWeights(router_of(128, Gating::Softmax, 8, false)),
                    vec![
                        spec(DType::F32, [128, 9, 1, 1], Fill::Random(4.0)),
                        ids(8 * 9, 128),
                    ],
                    [8, 9, 1, 1],
                    1e-6,
                ),
            ]
        }
        (OpKind::MoeExperts, t) if t.is_quantized() || t == DType::F32 => {
            // The 256-value types need rows of 256: n_embd = n_ff = 256 there.
            let superblocks = t.layout().is_some_and(|l| l.block > 32);
            let (e, f) = if superblocks { (256, 256) } else { (64, 32) };
            // 256-value types: as for MatMul, Q8_K against Q8_1 activations, twice (x, then the
            // GLU rows); Q4_K seeds 1-3 gave 0.8e-2 to 2.1e-2 on the H200, and a CPU simulation
            // of both roundings 1.9e-2 to 2.3e-2 worst over 12 seeds for each of these types.
            // The 32-value types: the GLU rows differ from the CPU's in the last bits, which can
            // move one of their 8-bit activations by a step (up to about 2.5e-3 of the output in
            // the 3-row cases, 7e-4 in the 40-row ones); a wrong layout gives errors near 1. F32
            // and Q8_0 keep the bounds they were measured with.
            let tol = match t {
                DType::F32 | DType::Q8_0 => 1e-5,
                _ if superblocks => 3e-2,
                _ => 5e-3,
            };
            let stack = |ne: [u64; 4]| spec(t, ne, Fill::Random(0.1));
            let head = || vec![f32s([e, 3, 1, 1]), ids(2 * 3, 4), f32s([2, 3, 1, 1])];
            let mut split = head();
            split.extend([
                stack([e, f, 4, 1]),
                stack([e, f, 4, 1]),
                stack([f, e, 4, 1]),
            ]);
            let mut fused = head();
            fused.extend([stack([e, 2 * f, 4, 1]), stack([f, e, 4, 1])]);
            // 40 rows take the routed tiled path on the CUDA bundles.
            let mut batch = vec![f32s([e, 40, 1, 1]), ids(2 * 40, 4), f32s([2, 40, 1, 1])];
            batch.extend([
                stack([e, f, 4, 1]),
                stack([e, f, 4, 1]),
                stack([f, e, 4, 1]),
            ]);
            let mut batch_fused = vec![f32s([e, 40, 1, 1]), ids(2 * 40, 4), f32s([2, 40, 1, 1])];
            batch_fused.extend([stack([e, 2 * f, 4, 1]), stack([f, e, 4, 1])]);
            // Few rows (decode with several streams) take the row kernels on the CUDA bundles.
            let few = |rows: u64, fused: bool| {
                let mut s = vec![
                    f32s([e, rows, 1, 1]),
                    ids(2 * rows, 4),
                    f32s([2, rows, 1, 1]),
                ];
                if fused {
                    s.extend([stack([e, 2 * f, 4, 1]), stack([f, e, 4, 1])]);
                } else {
                    s.extend([
                        stack([e, f, 4, 1]),
                        stack([e, f, 4, 1]),
                        stack([f, e, 4, 1]),
                    ]);
                }
                s
            };
            let params = |fused: bool, glu: GluKind| match moe(fused, glu) {
                Op::MoeExperts(p) => Op::MoeExperts(MoeParams {
                    n_ff: f as u32,
                    ..p
                }),
                other => other,
            };
            vec![
                case(
                    "swiglu, separate gate and up",
                    params(false, GluKind::SwiGlu),
                    split,
                    [e, 3, 1, 1],
                    tol,
                ),
                case(
                    "geglu, fused gate_up",
                    params(true, GluKind::GeGlu),
                    fused,
                    [e, 3, 1, 1],
                    tol.max(1e-3),
                ),
                case(
                    "swiglu, 2 rows",
                    params(false, GluKind::SwiGlu),
                    few(2, false),
                    [e, 2, 1, 1],
                    tol,
                ),
                case(
                    "swiglu, fused gate_up, 15 rows",
                    params(true, GluKind::SwiGlu),
                    few(15, true),
                    [e, 15, 1, 1],
                    tol,
                ),
                case(
                    "swiglu, 40 rows",
                    params(false, GluKind::SwiGlu),
                    batch,
                    [e, 40, 1, 1],
                    tol,
                ),
                case(
                    "swiglu, fused gate_up, 40 rows",
                    params(true, GluKind::SwiGlu),
                    batch_fused,
                    [e, 40, 1, 1],
                    tol,
                ),
            ]
        }
        (OpKind::ConvCausal, DType::F32) => {
            // Two sequences: slot 2 continues from position 9 (its state is read), slot 0 starts
            // at position 0 (its random state must be ignored); slot 1 is not in the batch.
            let (ch, taps) = (8192, 4);
            let srcs = |rows: u64, split: u64| {
                vec![
                    f32s([ch, rows, 1, 1]),
                    f32s([taps, ch, 1, 1]),
                    f32s([ch * (taps - 1), 1, 3, 1]),
                    runs(rows, split, [2, 0], 0),
                    runs(rows, split, [9, 0], 1),
                ]
            };
            let conv = Op::ConvCausal { taps: taps as u32 };
            [("decode: 1 row", 1, 1), ("70 rows, 2 sequences", 70, 30)]
                .into_iter()
                .map(|(name, rows, split)| Case {
                    also_src: Some(2),
                    ..case(name, conv, srcs(rows, split), [ch, rows, 1, 1], 1e-6)
                })
                .collect()
        }
        (OpKind::DeltaRule, DType::F32) => {
            // Qwen3.5's shape. Keys and queries of norm about 1 (as after L2Norm), log decays in
            // [-1, -0.05), β in [0, 1): the state stays bounded over 130 rows. Slot 2 continues
            // from position 37, slot 0 starts at 0 (its random state must be ignored), slot 1 is
            // not in the batch. The CPU's step-wise and chunked forms agree to 3e-7 here; a dropped
            // decay, a wrong key head or a missed reset gives errors from 0.1 to 4.
            let (dk, dv, hk, hv) = (128, 128, 16, 32);
            let srcs = |rows: u64, split: u64| {
                vec![
                    spec(DType::F32, [dk, hk, rows, 1], Fill::Random(0.15)),
                    spec(DType::F32, [dk, hk, rows, 1], Fill::Random(0.15)),
                    f32s([dv, hv, rows, 1]),
                    spec(DType::F32, [hv, rows, 1, 1], Fill::Range(-1.0, -0.05)),
                    spec(DType::F32, [hv, rows, 1, 1], Fill::Range(0.0, 1.0)),
                    spec(DType::F32, [dk * dv * hv, 1, 3, 1], Fill::Random(0.1)),
                    runs(rows, split, [2, 0], 0),
                    runs(rows, split, [37, 0], 1),
                ]
            };
            let op = Op::DeltaRule(DeltaRuleParams {
                n_head_k: hk as u32,
                n_head_v: hv as u32,
                dk: dk as u32,
                dv: dv as u32,
                scale: 1.0 / (dk as f32).sqrt(),
                per_dim_gate: false,
                beta_scale: 1.0,
            });
            [
                ("decode: 1 row", 1, 1),
                ("7 rows, 2 sequences", 7, 3),
                ("130 rows, 2 sequences", 130, 50),
            ]
            .into_iter()
            .map(|(name, rows, split)| Case {
                also_src: Some(5),
                ..case(name, op, srcs(rows, split), [dv, hv, rows, 1], 1e-4)
            })
            .collect()
        }
        _ => Vec::new(),
    }
}

/// An I32 `[rows]` source of two runs ([`Fill::Runs`]).
fn runs(rows: u64, split: u64, first: [i32; 2], step: i32) -> Spec {
    spec(
        DType::I32,
        [rows, 1, 1, 1],
        Fill::Runs { split, first, step },
    )
}

/// Random bytes for a tensor.
fn fill_bytes(s: &Spec, rng: &mut StdRng) -> Result<Vec<u8>, PluginError> {
    let n = s.ne.iter().product::<u64>() as usize;
    let bytes = s
        .dtype
        .row_bytes(s.ne[0])
        .ok_or_else(|| PluginError::invalid(format!("{} rows of {}", s.dtype, s.ne[0])))?
        as usize
        * (n / s.ne[0] as usize);
    let mut out = vec![0u8; bytes];
    match (s.dtype, s.fill) {
        (DType::I32, Fill::Distinct(max)) => {
            let mut all: Vec<i32> = (0..max).collect();
            for (i, c) in out.chunks_exact_mut(4).enumerate() {
                let j = rng.gen_range(i..all.len());
                all.swap(i, j);
                c.copy_from_slice(&all[i].to_le_bytes());
            }
        }
        (DType::I32, Fill::Ids(max)) => {
            for c in out.chunks_exact_mut(4) {
                c.copy_from_slice(&rng.gen_range(0..max).to_le_bytes());
            }
        }
        (DType::F32, Fill::Random(a)) => {
            for c in out.chunks_exact_mut(4) {
                c.copy_from_slice(&rng.gen_range(-a..a).to_le_bytes());
            }
        }
        (DType::F32, Fill::Range(lo, hi)) => {
            for c in out.chunks_exact_mut(4) {
                c.copy_from_slice(&rng.gen_range(lo..hi).to_le_bytes());
            }
        }
        (DType::I32, Fill::Runs { split, first, step }) => {
            for (r, c) in out.chunks_exact_mut(4).enumerate() {
                let r = r as i32;
                let split = split as i32;
                let v = if r < split {
                    first[0] + step * r
                } else {
                    first[1] + step * (r - split)
                };
                c.copy_from_slice(&v.to_le_bytes());
            }
        }
        (DType::F32, Fill::Steps) => {
            for (i, c) in out.chunks_exact_mut(4).enumerate() {
                let v = if i % 32 == 0 {
                    1.0
                } else {
                    rng.gen_range(-127i32..=127) as f32 / 127.0
                };
                c.copy_from_slice(&v.to_le_bytes());
            }
        }
        (DType::Q4_K, Fill::Random(a)) => {
            // d·scale·q − dmin·min with 6-bit scales and 4-bit q: d ≈ a/(63·15) keeps |w| ≲ a.
            for b in out.chunks_exact_mut(144) {
                rng.fill(&mut b[4..]);
                let d = f16::from_f32(a / (63.0 * 15.0) * rng.gen_range(0.5..1.0));
                let dmin = f16::from_f32(a / 63.0 * rng.gen_range(0.0..0.5));
                b[..2].copy_from_slice(&d.to_le_bytes());
                b[2..4].copy_from_slice(&dmin.to_le_bytes());
            }
        }
        (DType::F16, Fill::Random(a)) => {
            for c in out.chunks_exact_mut(2) {
                c.copy_from_slice(&f16::from_f32(rng.gen_range(-a..a)).to_le_bytes());
            }
        }
        (DType::Q8_0, Fill::Random(a)) => {
            for b in out.chunks_exact_mut(34) {
                rng.fill(&mut b[2..]);
                // Quantizers never write -128 (ggml's SIMD dot products rely on that).
                b[2..]
                    .iter_mut()
                    .filter(|q| **q == 0x80)
                    .for_each(|q| *q = 0x81);
                let d = f16::from_f32(a / 127.0 * rng.gen_range(0.5..1.0));
                b[..2].copy_from_slice(&d.to_le_bytes());
            }
        }
        (t, Fill::Random(a)) if blocks::covers(t) => blocks::fill(t, a, rng, &mut out),
        (t, f) => {
            return Err(PluginError::unsupported(
                format!("opcheck cannot fill {t} with {f:?} yet"),
                &[],
            ))
        }
    }
    Ok(out)
}

/// A case's tensors on one device.
struct Placed {
    bufs: Vec<Buffer>,
    call: OpCall,
}

fn place(dev: &Arc<Device>, case: &Case, data: &[Vec<u8>]) -> Result<Placed, PluginError> {
    let mut bufs = Vec::new();
    let mut srcs = [TensorRef::default(); MAX_SRCS];
    for (i, (s, bytes)) in case.srcs.iter().zip(data).enumerate() {
        let b = dev.alloc(bytes.len() as u64)?;
        dev.write(&b, 0, bytes)?;
        let nb = TensorRef::contiguous_strides(s.dtype, s.ne)
            .ok_or_else(|| PluginError::invalid("no layout"))?;
        srcs[i] = TensorRef {
            buffer: b.handle,
            offset: 0,
            dtype: s.dtype,
            ne: s.ne,
            nb,
        };
        if let Some(v) = case.view.filter(|v| v.src == i) {
            (srcs[i].ne, srcs[i].nb, srcs[i].offset) = (v.ne, v.nb, v.offset);
        }
        bufs.push(b);
    }
    let dst = match case.dst_is_src {
        Some(i) => srcs[i],
        None => {
            let dst_bytes = case
                .dst_dtype
                .row_bytes(case.dst[0])
                .ok_or_else(|| PluginError::invalid("no layout"))?
                * case.dst[1..].iter().product::<u64>();
            let d = dev.alloc(dst_bytes)?;
            // Poison: all-ones bytes are NaN in f32, so an unwritten element cannot pass.
            dev.write(&d, 0, &vec![0xFF; dst_bytes as usize])?;
            let nb = TensorRef::contiguous_strides(case.dst_dtype, case.dst)
                .ok_or_else(|| PluginError::invalid("no layout"))?;
            let t = TensorRef {
                buffer: d.handle,
                offset: 0,
                dtype: case.dst_dtype,
                ne: case.dst,
                nb,
            };
            bufs.push(d);
            t
        }
    };
    Ok(Placed {
        bufs,
        call: OpCall {
            op: case.op,
            n_srcs: case.srcs.len() as u32,
            srcs,
            dst,
        },
    })
}

/// Runs a case: the destination's values, then those of the source it also updates, if any.
fn run_on(dev: &Arc<Device>, case: &Case, data: &[Vec<u8>]) -> Result<Vec<Vec<f32>>, PluginError> {
    let p = place(dev, case, data)?;
    dev.run(std::slice::from_ref(&p.call))?;
    dev.sync()?;
    let d = match case.dst_is_src {
        Some(i) => &p.bufs[i],
        None => p
            .bufs
            .last()
            .ok_or_else(|| PluginError::invalid("no destination"))?,
    };
    let mut results = vec![read_values(dev, d, p.call.dst.dtype)?];
    if let Some(i) = case.also_src {
        results.push(read_values(dev, &p.bufs[i], p.call.srcs[i].dtype)?);
    }
    Ok(results)
}

fn read_values(dev: &Arc<Device>, d: &Buffer, dtype: DType) -> Result<Vec<f32>, PluginError> {
    let mut out = vec![0u8; d.bytes as usize];
    dev.read(d.handle, 0, &mut out)?;
    Ok(match dtype {
        DType::F16 => out
            .chunks_exact(2)
            .map(|c| f16::from_le_bytes([c[0], c[1]]).to_f32())
            .collect(),
        DType::I32 => out
            .chunks_exact(4)
            .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]) as f32)
            .collect(),
        _ => out
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect(),
    })
}

/// The outcome of one case.
#[derive(Debug)]
pub struct Outcome {
    /// `(op, dtype)` and case name.
    pub what: String,
    /// ‖out − ref‖ / ‖ref‖ (infinite when an element is not finite where the reference is).
    pub rel: f64,
    /// The case's tolerance.
    pub tol: f64,
    /// An error instead of a result.
    pub error: Option<String>,
    /// The element furthest from the reference: (index, value, reference).
    pub worst: Option<(usize, f32, f32)>,
}

impl Outcome {
    /// Whether the case passed.
    pub fn ok(&self) -> bool {
        self.error.is_none() && self.rel <= self.tol
    }
}

fn worst(out: &[f32], reference: &[f32]) -> Option<(usize, f32, f32)> {
    out.iter()
        .zip(reference)
        .enumerate()
        .map(|(i, (&o, &r))| {
            (
                i,
                o,
                r,
                if o.is_finite() {
                    (o - r).abs()
                } else {
                    f32::INFINITY
                },
            )
        })
        .max_by(|a, b| a.3.total_cmp(&b.3))
        .map(|(i, o, r, _)| (i, o, r))
}

fn relative(out: &[f32], reference: &[f32]) -> f64 {
    let (mut num, mut den) = (0f64, 0f64);
    for (&o, &r) in out.iter().zip(reference) {
        if r.is_finite() && !o.is_finite() {
            return f64::INFINITY;
        }
        num += (f64::from(o) - f64::from(r)).powi(2);
        den += f64::from(r).powi(2);
    }
    if out.len() != reference.len() {
        return f64::INFINITY;
    }
    (num / den.max(f64::MIN_POSITIVE)).sqrt()
}

pub use host_memory::check as check_host_memory;

/// Runs every case of every pair `dev` claims, against `reference`.
pub fn check(dev: &Arc<Device>, reference: &Arc<Device>, seed: u64) -> Vec<Outcome> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut outcomes = Vec::new();
    for support in &dev.capabilities {
        for &dtype in support.dtypes.iter() {
            let what = format!("{} {dtype}", support.op);
            let cases = cases(support.op, dtype);
            if cases.is_empty() {
                outcomes.push(Outcome {
                    what,
                    rel: f64::NAN,
                    tol: 0.0,
                    error: Some("no check written for this pair".into()),
                    worst: None,
                });
                continue;
            }
            for case in cases {
                let what = format!("{what}: {}", case.name);
                let result = case
                    .srcs
                    .iter()
                    .map(|s| fill_bytes(s, &mut rng))
                    .collect::<Result<Vec<_>, _>>()
                    .and_then(|data| {
                        Ok((run_on(dev, &case, &data)?, run_on(reference, &case, &data)?))
                    });
                match result {
                    Ok((outs, refs)) => {
                        for (i, (out, reference)) in outs.iter().zip(&refs).enumerate() {
                            outcomes.push(Outcome {
                                what: match i {
                                    0 => what.clone(),
                                    _ => format!("{what}, state after the run"),
                                },
                                rel: relative(out, reference),
                                tol: case.tol,
                                error: None,
                                worst: worst(out, reference),
                            });
                        }
                    }
                    Err(e) => outcomes.push(Outcome {
                        what,
                        rel: f64::NAN,
                        tol: case.tol,
                        error: Some(e.to_string()),
                        worst: None,
                    }),
                }
            }
        }
    }
    outcomes
}

/// What an f16 K/V cache adds to a model check's tolerance: a summation-order difference in K or V
/// can flip an f16 rounding (measured 2e-5 between the two CPU plugins), so 1e-4 in all at the
/// default 1e-5. Added rather than multiplied, so that the looser tolerance of a file with
/// quantized weights (their activations' rounding, e.g. 1e-1) does not grow tenfold with it.
const F16_CACHE_ALLOWANCE: f64 = 9e-5;

/// The tolerance of a model check with a `kv` cache, `tol` being the f32 cache's.
fn cache_tol(kv: DType, tol: f64) -> f64 {
    if kv == DType::F16 {
        tol + F16_CACHE_ALLOWANCE
    } else {
        tol
    }
}

/// End to end: the logits of a model file on `kernel` against the best CPU plugin, for a
/// 20-token prompt (a batch long enough for a GPU plugin's batched kernels) in one batch (every
/// row an output) in slot 0, the same prompt in slot 1 alongside one decode step of slot 0, then
/// four decode steps of both slots (two rows each). `tol` bounds ‖Δ‖/‖ref‖ per
/// pass with an f32 cache; an f16 cache gets `F16_CACHE_ALLOWANCE` more (`cache_tol`).
pub fn check_model(
    reg: &bloomery_devices::Registry,
    path: &std::path::Path,
    kernel: &bloomery_devices::KernelPluginFile,
    tol: f64,
) -> Vec<Outcome> {
    use bloomery_exec::BatchInputs;
    use bloomery_exec::{LoadOptions, LoadedModel};
    let prompt: Vec<i32> = vec![
        5, 77, 300, 12, 509, 256, 1, 40, 41, 42, 7, 9, 100, 200, 301, 88, 17, 63, 150, 222,
    ];
    let n = prompt.len() as i32;
    let passes: Vec<(String, BatchInputs)> = {
        let mut v = vec![(
            "prompt, every row".to_owned(),
            BatchInputs {
                tokens: prompt.clone(),
                positions: (0..n).collect(),
                slots: vec![0; prompt.len()],
                output_rows: (0..n).collect(),
                history: vec![],
            },
        )];
        let mut mixed = BatchInputs {
            tokens: vec![3],
            positions: vec![n],
            slots: vec![0],
            output_rows: vec![0],
            history: vec![],
        };
        mixed.tokens.extend(&prompt);
        mixed.positions.extend(0..n);
        mixed.slots.extend(std::iter::repeat_n(1, prompt.len()));
        mixed.output_rows.push(n);
        v.push(("decode slot 0 + prompt slot 1".to_owned(), mixed));
        for s in 0..4 {
            v.push((
                format!("decode step {}", s + 2),
                BatchInputs {
                    tokens: vec![11 + s, 13 + s],
                    positions: vec![n + 1 + s, n + s],
                    slots: vec![0, 1],
                    output_rows: vec![0, 1],
                    history: vec![],
                },
            ));
        }
        v
    };
    let mut outcomes = Vec::new();
    for kv in [DType::F32, DType::F16] {
        let tol = cache_tol(kv, tol);
        let opts = LoadOptions {
            n_slots: 2,
            ctx_per_slot: 64,
            kv_type: kv,
            threads: 0,
            graphs: true,
            mlock: false,
        };
        let what = |p: &str| format!("model {} ({kv} cache): {p}", path.display());
        let eager_opts = LoadOptions {
            graphs: false,
            ..opts
        };
        let loaded = LoadedModel::load(reg, path, opts).and_then(|cpu| {
            Ok((
                cpu,
                LoadedModel::load_on(reg, path, opts, kernel)?,
                LoadedModel::load_on(reg, path, eager_opts, kernel)?,
            ))
        });
        let (mut cpu, mut dev, mut eager) = match loaded {
            Ok(pair) => pair,
            Err(e) => {
                outcomes.push(Outcome {
                    what: what("load"),
                    rel: f64::NAN,
                    tol,
                    error: Some(e.to_string()),
                    worst: None,
                });
                continue;
            }
        };
        for (name, batch) in &passes {
            let r = cpu
                .forward(batch)
                .and_then(|want| Ok((dev.forward(batch)?, want)));
            // A shape's second pass is captured into a device graph and later ones replay it:
            // the same pass launched op by op must give the same bits.
            let replayed = match (&r, eager.forward(batch)) {
                (Ok((got, _)), Ok(by_op)) => Outcome {
                    what: what(&format!("{name}: graph replay vs op by op, bit for bit")),
                    rel: if got
                        .iter()
                        .map(|v| v.to_bits())
                        .eq(by_op.iter().map(|v| v.to_bits()))
                    {
                        0.0
                    } else {
                        relative(got, &by_op).max(f64::MIN_POSITIVE)
                    },
                    tol: 0.0,
                    error: None,
                    worst: worst(got, &by_op),
                },
                (_, Err(e)) => Outcome {
                    what: what(&format!("{name}: op by op")),
                    rel: f64::NAN,
                    tol: 0.0,
                    error: Some(e.to_string()),
                    worst: None,
                },
                (Err(_), _) => Outcome {
                    what: what(&format!("{name}: op by op")),
                    rel: 0.0,
                    tol: 0.0,
                    error: Some("the graph pass failed".into()),
                    worst: None,
                },
            };
            outcomes.push(match r {
                Ok((got, want)) => Outcome {
                    what: what(name),
                    rel: relative(&got, &want),
                    tol,
                    error: None,
                    worst: worst(&got, &want),
                },
                Err(e) => Outcome {
                    what: what(name),
                    rel: f64::NAN,
                    tol,
                    error: Some(e.to_string()),
                    worst: None,
                },
            });
            outcomes.push(replayed);
        }
        outcomes.push(streamed_prompt(reg, path, opts, kernel, &mut dev, &what));
    }
    outcomes
}

/// Every routed expert on the host (`-cmoe`): a prompt long enough to stream each layer's stacks
/// through the card's staging sets runs the card's own products on the copies, so its logits
/// must equal the unsplit card's bit for bit, op by op and replayed from device graphs; a copy
/// that overwrote a set still in use, or a call that ran before its copy, would show.
fn streamed_prompt(
    reg: &bloomery_devices::Registry,
    path: &std::path::Path,
    opts: bloomery_exec::LoadOptions,
    kernel: &bloomery_devices::KernelPluginFile,
    dev: &mut bloomery_exec::LoadedModel,
    what: &dyn Fn(&str) -> String,
) -> Outcome {
    use bloomery_exec::BatchInputs;
    use bloomery_tiering::plan::TierRequest;
    let rows = 2 * bloomery_tiering::STREAM_MIN_ROWS as i32;
    let batch = BatchInputs {
        tokens: (0..rows).map(|i| (i * 37 + 11) % 500).collect(),
        positions: (0..rows).collect(),
        slots: vec![0; rows as usize],
        output_rows: (0..rows).collect(),
        history: vec![],
    };
    let name = what(&format!(
        "{rows}-row prompt with every expert on the host (streamed) vs on the card, bit for bit"
    ));
    let cmoe = TierRequest {
        cpu_moe: true,
        ..Default::default()
    };
    let r = bloomery_exec::LoadedModel::load_placed(reg, path, opts, kernel, &cmoe)
        .map_err(|e| e.to_string())
        .and_then(|mut split| {
            // Three passes: eager, captured and replayed (each segment's device graph is taken
            // on its second pass); all must give the unsplit card's logits.
            let mut got = Vec::new();
            for _ in 0..3 {
                got.extend(split.forward(&batch).map_err(|e| e.to_string())?);
            }
            let want = dev.forward(&batch).map_err(|e| e.to_string())?.repeat(3);
            Ok((got, want))
        });
    match r {
        Ok((got, want)) => Outcome {
            rel: if got
                .iter()
                .map(|v| v.to_bits())
                .eq(want.iter().map(|v| v.to_bits()))
            {
                0.0
            } else {
                relative(&got, &want).max(f64::MIN_POSITIVE)
            },
            worst: worst(&got, &want),
            what: name,
            tol: 0.0,
            error: None,
        },
        Err(e) => Outcome {
            what: name,
            rel: f64::NAN,
            tol: 0.0,
            error: Some(e),
            worst: None,
        },
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn an_f16_cache_adds_to_the_model_tolerance_without_scaling_it() {
        use super::{cache_tol, DType};
        assert_eq!(cache_tol(DType::F32, 1e-5), 1e-5);
        assert!((cache_tol(DType::F16, 1e-5) - 1e-4).abs() < 1e-12);
        // A quantized file's 1e-1 stays near 1e-1 (it was 1.0: a check that could hardly fail).
        assert!(cache_tol(DType::F16, 1e-1) < 0.101);
    }

    use super::*;

    #[test]
    fn relative_error_catches_unwritten_and_wrong_values() {
        assert_eq!(relative(&[1.0, 2.0], &[1.0, 2.0]), 0.0);
        assert!(relative(&[f32::NAN, 2.0], &[1.0, 2.0]).is_infinite());
        assert!((relative(&[1.1, 2.0], &[1.0, 2.0]) - 0.1 / 5f64.sqrt()).abs() < 1e-7);
    }

    #[test]
    fn every_case_fills_its_sources() {
        let mut rng = StdRng::seed_from_u64(1);
        for (op, t) in [
            (OpKind::Add, DType::F32),
            (OpKind::RmsNorm, DType::F32),
            (OpKind::GetRows, DType::Q8_0),
            (OpKind::GetRows, DType::F16),
            (OpKind::MatMul, DType::Q8_0),
            (OpKind::GetRows, DType::Q6_K),
            (OpKind::MatMul, DType::Q5_K),
            (OpKind::MatMul, DType::Q5_0),
            (OpKind::MatMul, DType::Q4_0),
            (OpKind::MatMul, DType::Q5_1),
            (OpKind::MatMul, DType::IQ4_XS),
            (OpKind::MatMul, DType::IQ4_NL),
            (OpKind::MatMul, DType::MXFP4),
            (OpKind::MatMul, DType::IQ3_XXS),
            (OpKind::MoeExperts, DType::IQ3_XXS),
            (OpKind::MoeExperts, DType::Q3_K),
            (OpKind::MoeExperts, DType::Q6_K),
            (OpKind::MoeExperts, DType::Q5_0),
            (OpKind::ConvCausal, DType::F32),
            (OpKind::DeltaRule, DType::F32),
            (OpKind::Copy, DType::F16),
            (OpKind::L2Norm, DType::F32),
        ] {
            let cs = cases(op, t);
            assert!(!cs.is_empty(), "{op:?} {t}");
            for c in cs {
                for s in &c.srcs {
                    let b = fill_bytes(s, &mut rng).unwrap();
                    assert_eq!(
                        b.len() as u64,
                        s.dtype.row_bytes(s.ne[0]).unwrap() * s.ne[1] * s.ne[2] * s.ne[3]
                    );
                }
            }
        }
    }
}
