//! Cases of the hyper-connection ops of GLM-5.3's residual streams: Sinkhorn of its 4 streams (20
//! iterations over a prompt's rows, 1 iteration, and 8 streams), and the streams' weighted sum and
//! update at its width (4 streams of 4096) for a decode row and a prompt's rows; and
//! Qwen3.8-Flash-Next's forms at its width (4 streams of 2560): the sum by per-element weights,
//! the update by the identity comb, and the n-gram table layer's group gate; DeepSeek-V4.1's
//! Engram gate at its width (4 streams of 5120).

use bloomery_plugin_api::op::{Op, OpKind};
use bloomery_plugin_api::DType;

use super::{case, f32s, spec};
use crate::opcheck::{Case, Fill};

/// Sinkhorn of `mats` matrices of `n` streams.
fn sinkhorn(name: &str, n: u64, mats: u64, iters: u32) -> Case {
    case(
        name,
        Op::Sinkhorn { iters, eps: 1e-6 },
        vec![spec(DType::F32, [n, n, mats, 1], Fill::Random(6.0))],
        [n, n, mats, 1],
        1e-6,
    )
}

/// The cases of this family for `(op, dtype)`; none for pairs of other families.
pub(super) fn cases(op: OpKind, dtype: DType) -> Vec<Case> {
    let n = 4096;
    let rows_name = |rows: u64| match rows {
        1 => "a decode row".to_owned(),
        _ => format!("{rows} prompt rows"),
    };
    let q4 = 2560;
    match (op, dtype) {
        (OpKind::Sinkhorn, DType::F32) => vec![
            sinkhorn("4 streams, 20 iterations, 300 rows", 4, 300, 20),
            sinkhorn("4 streams, 1 iteration", 4, 7, 1),
            sinkhorn("8 streams, 20 iterations", 8, 5, 20),
        ],
        (OpKind::StreamMix, DType::F32) => [1, 40]
            .into_iter()
            .flat_map(|rows| {
                [
                    case(
                        &format!("4 streams of {n}, {}", rows_name(rows)),
                        Op::StreamMix,
                        vec![f32s([n, 4, rows, 1]), f32s([4, rows, 1, 1])],
                        [n, rows, 1, 1],
                        1e-6,
                    ),
                    case(
                        &format!("4 streams of {q4} by element, {}", rows_name(rows)),
                        Op::StreamMix,
                        vec![f32s([q4, 4, rows, 1]), f32s([q4, 4, rows, 1])],
                        [q4, rows, 1, 1],
                        1e-6,
                    ),
                ]
            })
            .collect(),
        (OpKind::StreamUpdate, DType::F32) => [1, 40]
            .into_iter()
            .flat_map(|rows| {
                [
                    case(
                        &format!("4 streams of {n}, {}", rows_name(rows)),
                        Op::StreamUpdate,
                        vec![
                            f32s([n, 4, rows, 1]),
                            spec(DType::F32, [4, 4, rows, 1], Fill::Range(0.0, 1.0)),
                            spec(DType::F32, [4, rows, 1, 1], Fill::Range(0.0, 2.0)),
                            f32s([n, rows, 1, 1]),
                        ],
                        [n, 4, rows, 1],
                        1e-6,
                    ),
                    case(
                        &format!("4 streams of {q4} by the identity, {}", rows_name(rows)),
                        Op::StreamUpdate,
                        vec![
                            f32s([q4, 4, rows, 1]),
                            spec(DType::F32, [4, rows, 1, 1], Fill::Range(0.0, 2.0)),
                            f32s([q4, rows, 1, 1]),
                        ],
                        [q4, 4, rows, 1],
                        1e-6,
                    ),
                ]
            })
            .collect(),
        (OpKind::GroupDotGate, DType::F32) => [1, 40]
            .map(|rows| {
                case(
                    &format!("4 groups of {q4}, {}", rows_name(rows)),
                    Op::GroupDotGate {
                        scale: 1.0 / (q4 as f32).sqrt(),
                        floor: 1e-6,
                    },
                    vec![f32s([q4, 4, rows, 1]), f32s([q4, 4, rows, 1])],
                    [4, rows, 1, 1],
                    1e-6,
                )
            })
            .to_vec(),
        (OpKind::EngramGate, DType::F32) => [1, 40]
            .map(|rows| {
                let ds = 5120;
                case(
                    &format!("4 streams of {ds}, {}", rows_name(rows)),
                    Op::EngramGate {
                        eps: 1e-20,
                        scale: 1.0 / (ds as f32).sqrt(),
                        floor: 1e-6,
                    },
                    vec![
                        f32s([ds, 4, rows, 1]),
                        f32s([5 * ds, rows, 1, 1]),
                        spec(DType::F32, [ds, 4, 1, 1], Fill::Random(2.0)),
                        spec(DType::F32, [ds, 4, 1, 1], Fill::Random(2.0)),
                    ],
                    [ds, 4, rows, 1],
                    1e-6,
                )
            })
            .to_vec(),
        _ => Vec::new(),
    }
}
