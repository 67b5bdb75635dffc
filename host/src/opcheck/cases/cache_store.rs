//! Cases of the K/V cache store: f32 and f16 caches exactly, quantized ones (Q8_0, Q4_0, Q4_1,
//! Q5_0, Q5_1, IQ4_NL) block by block (`opcheck/cache_blocks.rs`): every block's bytes equal,
//! but for a value one step apart where llama.cpp's CPU and CUDA stores round differently (ties,
//! fused multiply-adds) and IQ4_NL's scale in its last f16 bit; no block may differ more.

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
            // 6 rows of width 256 into a [256, 32 positions, 3 slots] cache; a quantized cache
            // also rotated in chunks of 64 and of 128 (llama.cpp's Walsh-Hadamard rotation).
            let rots: &[u32] = if t.is_quantized() {
                &[0, 64, 128]
            } else {
                &[0]
            };
            rots.iter()
                .map(|&rot| Case {
                    dst_is_src: Some(1),
                    cache_blocks: t.is_quantized(),
                    ..case(
                        &match rot {
                            0 => "6 rows into 3 slots".to_owned(),
                            r => format!("6 rows into 3 slots, rotated by {r}"),
                        },
                        Op::CacheStore { rot },
                        vec![
                            f32s([256, 6, 1, 1]),
                            spec(t, [256, 32, 3, 1], Fill::Random(1.0)),
                            ids(6, 3),
                            // Distinct positions: two rows never name one cell, whose final
                            // value would depend on which write lands last.
                            spec(DType::I32, [6, 1, 1, 1], Fill::Distinct(32)),
                        ],
                        [256, 32, 3, 1],
                        0.0,
                    )
                })
                .collect()
        }
        _ => Vec::new(),
    }
}
