//! Cases of MoE routing: RouterTopK and RouterWeights by each gating function, with and without a
//! selection bias, over 8 to 160 experts; and TopK, the likeliest ids of logits rows (the draft
//! passes' readout) up to a 248,320-token vocabulary.

use bloomery_plugin_api::op::{Gating, Op, OpKind, RouterParams};
use bloomery_plugin_api::DType;

use super::{case, ids, spec};
use crate::opcheck::{Case, Fill};

/// Routing of `k` of `n_expert` experts by `gating`, renormalised.
fn router_of(n_expert: u32, gating: Gating, k: u32, bias: bool) -> RouterParams {
    RouterParams {
        gating,
        n_expert,
        k,
        n_group: 1,
        topk_group: 1,
        bias,
        norm: true,
        norm_min: 6.103_515_6e-5,
        scale: 1.0,
    }
}

/// [`router_of`] over 8 experts.
fn router(gating: Gating, k: u32, bias: bool) -> RouterParams {
    router_of(8, gating, k, bias)
}

/// The cases of this family for `(op, dtype)`; none for pairs of other families.
pub(super) fn cases(op: OpKind, dtype: DType) -> Vec<Case> {
    match (op, dtype) {
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
        (OpKind::TopK, DType::F32) => [
            ("top 3 of 20", 3, 20, 5),
            ("top 10 of 4,096", 10, 4096, 3),
            ("top 10 of a 248,320-token vocabulary", 10, 248_320, 2),
            ("top 16 of 151,936", 16, 151_936, 1),
        ]
        .into_iter()
        .map(|(name, k, n, rows)| Case {
            dst_dtype: DType::I32,
            ..case(
                name,
                Op::TopK { k },
                vec![spec(DType::F32, [n, rows, 1, 1], Fill::Random(4.0))],
                [u64::from(k), rows, 1, 1],
                0.0,
            )
        })
        .collect(),
        _ => Vec::new(),
    }
}
