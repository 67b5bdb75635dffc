//! Cases of the row norms: RMSNorm with and without a weight, L2 norm.

use bloomery_plugin_api::op::{Op, OpKind};
use bloomery_plugin_api::DType;

use super::{case, f32s, spec};
use crate::opcheck::{Case, Fill};

/// The cases of this family for `(op, dtype)`; none for pairs of other families.
pub(super) fn cases(op: OpKind, dtype: DType) -> Vec<Case> {
    match (op, dtype) {
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
        _ => Vec::new(),
    }
}
