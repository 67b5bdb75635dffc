//! Cases of the sequence-state ops of linear-attention layers: the causal conv and the gated delta
//! rule, one row and batches of two sequences, with the state each updates.

use bloomery_plugin_api::op::{DeltaRuleParams, Op, OpKind};
use bloomery_plugin_api::DType;

use super::{case, f32s, runs, spec};
use crate::opcheck::{Case, Fill};

/// The cases of this family for `(op, dtype)`; none for pairs of other families.
pub(super) fn cases(op: OpKind, dtype: DType) -> Vec<Case> {
    match (op, dtype) {
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
