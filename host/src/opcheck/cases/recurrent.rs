//! Cases of the sequence-state ops of linear-attention layers: the causal conv (dilation 1, and the
//! n-gram table layer's dilation 3) and the delta rule (a decay per head, or per head and key
//! dim), one row and batches of two sequences, with the state each updates.

use bloomery_plugin_api::op::{DeltaRuleParams, Op, OpKind};
use bloomery_plugin_api::DType;

use super::{case, f32s, runs, spec};
use crate::opcheck::{Case, Fill};

/// The cases of this family for `(op, dtype)`; none for pairs of other families.
pub(super) fn cases(op: OpKind, dtype: DType) -> Vec<Case> {
    match (op, dtype) {
        (OpKind::ConvCausal, DType::F32) => {
            let mut all = conv_cases(8192, 4, 1);
            // Qwen3.8-Flash-Next's n-gram table conv: 4 taps 3 rows apart over 2,560 channels.
            all.extend(conv_cases(2560, 4, 3));
            all
        }
        (OpKind::DeltaRule, DType::F32) => {
            let mut all = delta_rule_cases(false);
            all.extend(delta_rule_cases(true));
            all
        }
        _ => Vec::new(),
    }
}

/// The causal conv's cases over `ch` channels, `taps` taps `dilation` rows apart: one decode
/// row, and 70 rows of two sequences. Slot 2 continues from position 9 (its state is read), slot
/// 0 starts at position 0 (its random state must be ignored); slot 1 is not in the batch.
fn conv_cases(ch: u64, taps: u64, dilation: u32) -> Vec<Case> {
    let hist = (taps - 1) * u64::from(dilation);
    let srcs = |rows: u64, split: u64| {
        vec![
            f32s([ch, rows, 1, 1]),
            f32s([taps, ch, 1, 1]),
            f32s([ch * hist, 1, 3, 1]),
            runs(rows, split, [2, 0], 0),
            runs(rows, split, [9, 0], 1),
        ]
    };
    let conv = Op::ConvCausal {
        taps: taps as u32,
        dilation,
    };
    let at = if dilation == 1 {
        String::new()
    } else {
        format!(", dilation {dilation}")
    };
    [("decode: 1 row", 1, 1), ("70 rows, 2 sequences", 70, 30)]
        .into_iter()
        .map(|(name, rows, split)| Case {
            also_src: Some(2),
            ..case(
                &format!("{name}{at}"),
                conv,
                srcs(rows, split),
                [ch, rows, 1, 1],
                1e-6,
            )
        })
        .collect()
}

/// The delta rule's cases with a decay per head (Qwen3.5's GDN shape) or per (head, key dim)
/// (KDA, Solar-Open2's shape: 64 heads of 128, β doubled). Keys and queries of norm about 1 (as
/// after L2Norm), β in [0, 1): the state stays bounded over 130 rows. Slot 2 continues from
/// position 37, slot 0 starts at 0 (its random state must be ignored), slot 1 is not in the
/// batch. Log decays in [-1, -0.05), and for KDA also in [-30, 0) (an unbounded gate that forgets
/// some dimensions within a row: decays underflow to zero). The CPU's step-wise and chunked forms
/// agree to 3e-7 here; a dropped decay, a wrong key head or a missed reset gives errors from 0.1
/// to 4.
fn delta_rule_cases(per_dim: bool) -> Vec<Case> {
    let (dk, dv, hk, hv) = if per_dim {
        (128, 128, 64, 64)
    } else {
        (128, 128, 16, 32)
    };
    let gates = if per_dim { dk * hv } else { hv };
    let srcs = |rows: u64, split: u64, strongest: f32| {
        vec![
            spec(DType::F32, [dk, hk, rows, 1], Fill::Random(0.15)),
            spec(DType::F32, [dk, hk, rows, 1], Fill::Random(0.15)),
            f32s([dv, hv, rows, 1]),
            spec(
                DType::F32,
                [gates, rows, 1, 1],
                Fill::Range(strongest, -0.05),
            ),
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
        per_dim_gate: per_dim,
        beta_scale: if per_dim { 2.0 } else { 1.0 },
    });
    let mut shapes = vec![
        ("decode: 1 row", 1, 1, -1.0),
        ("7 rows, 2 sequences", 7, 3, -1.0),
        ("130 rows, 2 sequences", 130, 50, -1.0),
    ];
    if per_dim {
        shapes.push(("130 rows, 2 sequences, strong decay", 130, 50, -30.0));
    }
    let form = if per_dim { "per dim, " } else { "" };
    shapes
        .into_iter()
        .map(|(name, rows, split, strongest)| Case {
            also_src: Some(5),
            ..case(
                &format!("{form}{name}"),
                op,
                srcs(rows, split, strongest),
                [dv, hv, rows, 1],
                1e-4,
            )
        })
        .collect()
}
