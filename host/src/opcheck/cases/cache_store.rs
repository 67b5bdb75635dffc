//! Cases of the K/V cache store: f32 and f16 caches exactly, quantized ones (Q8_0, Q4_0, Q4_1,
//! Q5_0, Q5_1, IQ4_NL) compared dequantized: the CPU quantizes Q8_0 as llama.cpp's x86 store
//! (ties to even), the card as llama.cpp's CUDA store (ties away), and IQ4_NL's scale sums in
//! another order, so a tie or a last f16 bit may differ now and then.

use bloomery_plugin_api::op::{Op, OpKind};
use bloomery_plugin_api::DType;

use super::{case, f32s, ids, spec};
use crate::opcheck::{Case, Fill};

/// The quantized cache types (llama.cpp's `-ctk`/`-ctv` set).
pub(super) const QUANTIZED: [DType; 6] = [
    DType::Q8_0,
    DType::Q4_0,
    DType::Q4_1,
    DType::Q5_0,
    DType::Q5_1,
    DType::IQ4_NL,
];

/// The cases of this family for `(op, dtype)`; none for pairs of other families.
pub(super) fn cases(op: OpKind, dtype: DType) -> Vec<Case> {
    match (op, dtype) {
        (OpKind::CacheStore, t)
            if QUANTIZED.contains(&t) || matches!(t, DType::F32 | DType::F16) =>
        {
            let tol = if t.is_quantized() { 1e-3 } else { 0.0 };
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
                    tol,
                )
            }]
        }
        _ => Vec::new(),
    }
}
