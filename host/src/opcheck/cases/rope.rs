//! Cases of RoPE: NORM, NEOX (whole and partial), YaRN, and IMROPE with text positions.

use bloomery_plugin_api::op::{Op, OpKind, RopeMode, RopeParams};
use bloomery_plugin_api::DType;

use super::{case, f32s, ids};
use crate::opcheck::Case;

/// A Rope op of `mode` over the first `n_dims` of 128-wide heads, YaRN when `ext` > 0.
fn rope(mode: RopeMode, n_dims: u32, ext: f32) -> Op {
    Op::Rope(RopeParams {
        mode,
        n_dims,
        offset: 0,
        sections: [0; 4],
        freq_base: 10000.0,
        freq_scale: if ext > 0.0 { 0.25 } else { 1.0 },
        ext_factor: ext,
        attn_factor: 1.0,
        beta_fast: 32.0,
        beta_slow: 1.0,
        n_ctx_orig: 4096,
        inverse: false,
    })
}

/// The cases of this family for `(op, dtype)`; none for pairs of other families.
pub(super) fn cases(op: OpKind, dtype: DType) -> Vec<Case> {
    match (op, dtype) {
        (OpKind::Rope, DType::F32) => {
            let x = || vec![f32s([128, 4, 5, 1]), ids(5, 4096)];
            vec![
                case(
                    "neox",
                    rope(RopeMode::Neox, 128, 0.0),
                    x(),
                    [128, 4, 5, 1],
                    1e-6,
                ),
                case(
                    "norm",
                    rope(RopeMode::Norm, 128, 0.0),
                    x(),
                    [128, 4, 5, 1],
                    1e-6,
                ),
                case(
                    "neox, partial 64 of 128",
                    rope(RopeMode::Neox, 64, 0.0),
                    x(),
                    [128, 4, 5, 1],
                    1e-6,
                ),
                case(
                    "neox, yarn",
                    rope(RopeMode::Neox, 128, 1.0),
                    x(),
                    [128, 4, 5, 1],
                    1e-6,
                ),
                // Qwen3.5's partial IMROPE; one position per row (text) is NEOX on every section.
                case(
                    "imrope, text positions, partial 64 of 128",
                    match rope(RopeMode::Imrope, 64, 0.0) {
                        Op::Rope(p) => Op::Rope(RopeParams {
                            sections: [11, 11, 10, 0],
                            ..p
                        }),
                        other => other,
                    },
                    x(),
                    [128, 4, 5, 1],
                    1e-6,
                ),
            ]
        }
        _ => Vec::new(),
    }
}
