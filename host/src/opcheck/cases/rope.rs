//! Cases of RoPE: NORM, NEOX (whole and partial), YaRN, IMROPE with text positions, and
//! DeepSeek-V4's forms: NORM pairs on the last 64 dims of 512-wide heads (a dimension offset),
//! forward and inverse, with the window layers' θ and the compressed layers' YaRN.

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

/// DeepSeek-V4's rope of the last 64 dims of 512-wide heads: θ 1e4 plain, or (`yarn`) θ 1.6e5
/// with YaRN ×16 over an original 65,536 as its compressed layers use; `inverse` for the output.
fn tail_rope(yarn: bool, inverse: bool) -> Op {
    let plain = RopeParams {
        mode: RopeMode::Norm,
        n_dims: 64,
        offset: 448,
        sections: [0; 4],
        freq_base: 10000.0,
        freq_scale: 1.0,
        ext_factor: 0.0,
        attn_factor: 1.0,
        beta_fast: 32.0,
        beta_slow: 1.0,
        n_ctx_orig: 0,
        inverse,
    };
    Op::Rope(if yarn {
        RopeParams {
            freq_base: 160000.0,
            freq_scale: 1.0 / 16.0,
            ext_factor: 1.0,
            attn_factor: 1.0 / (1.0 + 0.1 * 16f32.ln()),
            n_ctx_orig: 65536,
            ..plain
        }
    } else {
        plain
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
                case(
                    "deepseek4 tail 64 of 512",
                    tail_rope(false, false),
                    vec![f32s([512, 4, 5, 1]), ids(5, 4096)],
                    [512, 4, 5, 1],
                    1e-6,
                ),
                case(
                    "deepseek4 tail 64 of 512, inverse",
                    tail_rope(false, true),
                    vec![f32s([512, 4, 5, 1]), ids(5, 4096)],
                    [512, 4, 5, 1],
                    1e-6,
                ),
                case(
                    "deepseek4 tail 64 of 512, compressed yarn, inverse",
                    tail_rope(true, true),
                    vec![f32s([512, 4, 5, 1]), ids(5, 4096)],
                    [512, 4, 5, 1],
                    1e-6,
                ),
            ]
        }
        _ => Vec::new(),
    }
}
