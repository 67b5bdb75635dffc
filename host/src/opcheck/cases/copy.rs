//! Cases of the row copies: strided and converting Copy (f32, f16, i32 bit for bit) and GetRows of
//! every table type (an I32 table bit for bit: DeepSeek-V4's hash-routing table).

use bloomery_plugin_api::op::{Op, OpKind};
use bloomery_plugin_api::DType;

use super::{case, spec};
use crate::opcheck::{Case, Fill, View};

/// The cases of this family for `(op, dtype)`; none for pairs of other families.
pub(super) fn cases(op: OpKind, dtype: DType) -> Vec<Case> {
    match (op, dtype) {
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
        // DeepSeek-V4's hash routing: token ids gather rows of 6 expert ids from an I32 table.
        (OpKind::GetRows, DType::I32) => vec![Case {
            dst_dtype: DType::I32,
            ..case(
                "i32 table, gather 9 of 320",
                Op::GetRows,
                vec![
                    spec(DType::I32, [6, 320, 1, 1], Fill::Ids(1 << 20)),
                    spec(DType::I32, [9, 1, 1, 1], Fill::Ids(320)),
                ],
                [6, 9, 1, 1],
                0.0,
            )
        }],
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
        _ => Vec::new(),
    }
}
