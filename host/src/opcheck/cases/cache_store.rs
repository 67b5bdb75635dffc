//! Cases of the K/V cache store.

use bloomery_plugin_api::op::{Op, OpKind};
use bloomery_plugin_api::DType;

use super::{case, f32s, ids, spec};
use crate::opcheck::{Case, Fill};

/// The cases of this family for `(op, dtype)`; none for pairs of other families.
pub(super) fn cases(op: OpKind, dtype: DType) -> Vec<Case> {
    match (op, dtype) {
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
        _ => Vec::new(),
    }
}
