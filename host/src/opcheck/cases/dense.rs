//! Cases of the ops over whole graph tensors that decision heads use: LayerNorm with and without
//! its weight and bias, Softmax with and without a mask shared by rows, Concat, span means over a
//! prompt's rows, and dense attention (cross-attention over 600 rows, grouped and causal heads).

use bloomery_plugin_api::op::{Op, OpKind};
use bloomery_plugin_api::DType;

use super::{case, f32s, spec};
use crate::opcheck::{Case, Fill};

/// An I32 `[2, n]` source of spans inside `rows` rows ([`Fill::Spans`]).
fn spans(n: u64, rows: i32) -> crate::opcheck::Spec {
    spec(DType::I32, [2, n, 1, 1], Fill::Spans(rows))
}

/// Dense attention of `n_q` queries over `n_k` keys, `dk`-wide heads.
fn attention(name: &str, [dk, nh, nkv, n_q, n_k]: [u64; 5], causal: bool) -> Case {
    case(
        name,
        Op::AttentionDense {
            scale: 1.0 / (dk as f32).sqrt(),
            causal,
        },
        vec![
            spec(DType::F32, [dk, nh, n_q, 1], Fill::Random(2.0)),
            spec(DType::F32, [dk, nkv, n_k, 1], Fill::Random(2.0)),
            f32s([dk, nkv, n_k, 1]),
        ],
        [dk, nh, n_q, 1],
        1e-5,
    )
}

/// The cases of this family for `(op, dtype)`; none for pairs of other families.
pub(super) fn cases(op: OpKind, dtype: DType) -> Vec<Case> {
    match (op, dtype) {
        (OpKind::LayerNorm, DType::F32) => vec![
            case(
                "backbone rows, weight and bias",
                Op::LayerNorm { eps: 1e-5 },
                vec![
                    spec(DType::F32, [4096, 40, 1, 1], Fill::Range(-1.0, 3.0)),
                    f32s([4096, 1, 1, 1]),
                    f32s([4096, 1, 1, 1]),
                ],
                [4096, 40, 1, 1],
                1e-5,
            ),
            case(
                "no weight or bias",
                Op::LayerNorm { eps: 1e-5 },
                vec![f32s([100, 7, 1, 1])],
                [100, 7, 1, 1],
                1e-5,
            ),
        ],
        (OpKind::Softmax, DType::F32) => vec![
            case(
                "scaled, a mask shared by rows",
                Op::Softmax { scale: 0.125 },
                vec![
                    spec(DType::F32, [12, 6, 1, 1], Fill::Random(20.0)),
                    f32s([12, 3, 1, 1]),
                ],
                [12, 6, 1, 1],
                1e-5,
            ),
            case(
                "no mask",
                Op::Softmax { scale: 1.0 },
                vec![spec(DType::F32, [600, 8, 1, 1], Fill::Random(8.0))],
                [600, 8, 1, 1],
                1e-5,
            ),
        ],
        (OpKind::Concat, DType::F32) => vec![case(
            "rows of two widths",
            Op::Concat,
            vec![f32s([192, 12, 1, 1]), f32s([64, 12, 1, 1])],
            [256, 12, 1, 1],
            0.0,
        )],
        (OpKind::SpanMean, DType::F32) => vec![case(
            "option spans of a prompt",
            Op::SpanMean,
            vec![f32s([4096, 600, 1, 1]), spans(12, 600)],
            [4096, 12, 1, 1],
            1e-6,
        )],
        (OpKind::AttentionDense, DType::F32) => vec![
            attention("options over 600 prompt rows", [64, 16, 16, 12, 600], false),
            attention("questions over each other", [64, 16, 16, 3, 3], false),
            attention("grouped heads, causal", [128, 8, 2, 20, 20], true),
        ],
        _ => Vec::new(),
    }
}
