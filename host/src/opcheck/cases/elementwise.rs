//! Cases of the elementwise ops: Add and Mul (same shape and both broadcasts), Scale, the GLUs
//! (with a clamp) and every unary function.

use bloomery_plugin_api::op::{GluKind, Op, OpKind, UnaryFn};
use bloomery_plugin_api::DType;

use super::{case, f32s, spec};
use crate::opcheck::{Case, Fill};

/// The cases of this family for `(op, dtype)`; none for pairs of other families.
pub(super) fn cases(op: OpKind, dtype: DType) -> Vec<Case> {
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
                    "swiglu, limit 3 on gate and up",
                    Op::Glu {
                        kind: GluKind::SwiGlu,
                        limit: 3.0,
                    },
                    vec![
                        spec(DType::F32, [2048, 3, 1, 1], Fill::Random(8.0)),
                        spec(DType::F32, [2048, 3, 1, 1], Fill::Random(8.0)),
                    ],
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
        _ => Vec::new(),
    }
}
