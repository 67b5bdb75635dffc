//! Rotary position embedding in place, with ggml's modes (NORM, NEOX, IMROPE), partial rotation,
//! frequency base/scale and YaRN, following the semantics of ggml's `ggml_rope_ext` /
//! `ggml_rope_multi` (forward direction).
//!
//! For pair `i` of the `n_dims / 2` rotated pairs, at position `p`:
//! `theta_extrap = p * freq_base^(-2i / n_dims)`, `theta_interp = freq_scale * theta_extrap`. Without
//! YaRN (`ext_factor == 0`) the angle is `theta_interp` and the magnitude `attn_factor`. With YaRN the
//! angle is `theta_interp * (1 - m) + theta_extrap * m` where `m = ext_factor * ramp(i)`,
//! `ramp(i) = 1 - clamp((i - low) / max(0.001, high - low), 0, 1)` with `[low, high]` from
//! [`yarn_corr_dims`], and the magnitude is `attn_factor * (1 + 0.1 * ln(1 / freq_scale))`. Both the
//! cosine and the sine are multiplied by the magnitude. Only dims `offset..offset + n_dims` rotate
//! (pair `i` counted from `offset`); the others are left as they are. The inverse rope rotates by
//! the negative angle (the sine negated, the magnitude kept). Angles are computed in f64.

use super::{mul_dims, positive, whole_rows, OpError};

/// Which dims form the rotated pairs, and where their positions come from.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum RopeMode {
    /// GPT-J style: pair `i` is dims `(2i, 2i + 1)` (`GGML_ROPE_TYPE_NORMAL`).
    Norm,
    /// GPT-NeoX style: pair `i` is dims `(i, i + n_dims / 2)` (`GGML_ROPE_TYPE_NEOX`).
    Neox,
    /// Interleaved multi-section rope (`GGML_ROPE_TYPE_IMROPE`, Qwen3-VL / Qwen3.5): NEOX pairs, and
    /// pair `i` takes its position from plane t, h, w or e by `sector = i % (s0 + s1 + s2 + s3)`:
    /// h when `sector % 3 == 1 && sector < 3 * s1`, w when `sector % 3 == 2 && sector < 3 * s2`,
    /// t when `sector % 3 == 0 && sector < 3 * s0`, else e. With one position per row (text) every
    /// plane has that position, which makes this equal to [`RopeMode::Neox`].
    Imrope {
        /// Section sizes `[s0, s1, s2, s3]` in pairs (GGUF `rope.dimension_sections`).
        sections: [u32; 4],
    },
}

/// The parameters of one rope op, in ggml's terms.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RopeParams {
    /// Pairing and position source.
    pub mode: RopeMode,
    /// Number of dims that rotate from `offset` (even, `offset + n_dims` at most `head_dim`); the
    /// rest pass through.
    pub n_dims: usize,
    /// The first rotated dim (0 but for DeepSeek-V4, which rotates the last dims of a head).
    pub offset: usize,
    /// Rotate by the negative angle (DeepSeek-V4's inverse rope on the attention output).
    pub inverse: bool,
    /// Base of the frequencies (`rope.freq_base`, θ).
    pub freq_base: f32,
    /// Position interpolation factor (1 / `rope.scaling.factor` for linear and YaRN scaling).
    pub freq_scale: f32,
    /// YaRN extrapolation mix (0 turns YaRN off; 1 for YaRN models).
    pub ext_factor: f32,
    /// Magnitude factor on cos and sin (1 for most models).
    pub attn_factor: f32,
    /// YaRN fast correction boundary in rotations (ggml default 32).
    pub beta_fast: f32,
    /// YaRN slow correction boundary in rotations (ggml default 1).
    pub beta_slow: f32,
    /// Context length the model was trained with (`rope.scaling.original_context_length`).
    pub n_ctx_orig: u32,
}

impl RopeParams {
    /// The parameters of an ABI `Rope` op.
    pub fn from_abi(p: &bloomery_plugin_api::op::RopeParams) -> Self {
        use bloomery_plugin_api::op::RopeMode as Abi;
        RopeParams {
            mode: match p.mode {
                Abi::Norm => RopeMode::Norm,
                Abi::Neox => RopeMode::Neox,
                Abi::Imrope => RopeMode::Imrope {
                    sections: p.sections,
                },
            },
            n_dims: p.n_dims as usize,
            offset: p.offset as usize,
            inverse: p.inverse,
            freq_base: p.freq_base,
            freq_scale: p.freq_scale,
            ext_factor: p.ext_factor,
            attn_factor: p.attn_factor,
            beta_fast: p.beta_fast,
            beta_slow: p.beta_slow,
            n_ctx_orig: p.n_ctx_orig,
        }
    }

    /// YaRN's correction range ([`yarn_corr_dims`]) and the magnitude
    /// `attn_factor * (1 + 0.1 * ln(1 / freq_scale))` (the factor only when YaRN is on): what
    /// every backend's rope kernel needs besides the positions.
    pub fn yarn_terms(&self) -> ([f32; 2], f64) {
        let corr = yarn_corr_dims(
            self.n_dims,
            self.n_ctx_orig,
            self.freq_base,
            self.beta_fast,
            self.beta_slow,
        );
        let mut mscale = f64::from(self.attn_factor);
        if self.ext_factor != 0.0 {
            mscale *= 1.0 + 0.1 * (1.0 / f64::from(self.freq_scale)).ln();
        }
        (corr, mscale)
    }

    /// Plain rope without scaling: `freq_scale` 1, YaRN off, `attn_factor` 1, betas 32 and 1,
    /// from dim 0, forward.
    pub fn plain(mode: RopeMode, n_dims: usize, freq_base: f32) -> Self {
        Self {
            mode,
            n_dims,
            offset: 0,
            inverse: false,
            freq_base,
            freq_scale: 1.0,
            ext_factor: 0.0,
            attn_factor: 1.0,
            beta_fast: 32.0,
            beta_slow: 1.0,
            n_ctx_orig: 0,
        }
    }
}

/// YaRN's correction range `[low, high]` in pair indices, as ggml's `ggml_rope_yarn_corr_dims`:
/// `dim(b) = n_dims * ln(n_ctx_orig / (2π b)) / (2 ln freq_base)`,
/// `low = max(0, floor(dim(beta_fast)))`, `high = min(n_dims - 1, ceil(dim(beta_slow)))`. f32, as ggml.
pub fn yarn_corr_dims(
    n_dims: usize,
    n_ctx_orig: u32,
    freq_base: f32,
    beta_fast: f32,
    beta_slow: f32,
) -> [f32; 2] {
    let dim = |n_rot: f32| {
        n_dims as f32 * (n_ctx_orig as f32 / (n_rot * 2.0 * std::f32::consts::PI)).ln()
            / (2.0 * freq_base.ln())
    };
    let low = dim(beta_fast).floor().max(0.0);
    let high = dim(beta_slow).ceil().min(n_dims as f32 - 1.0);
    [low, high]
}

/// Applies rope in place to `x`, `[head_dim, n_head, n_rows]` f32.
///
/// `positions` holds one i32 position per row (`n_rows` values), or for [`RopeMode::Imrope`]
/// optionally four planes `[n_rows]` t, h, w, e one after another (`4 * n_rows` values, ggml's
/// `ggml_rope_multi` layout). The row count is taken from `positions`. Each (row, pair) angle is
/// computed once and applied to every head. No allocation.
pub fn rope(
    x: &mut [f32],
    head_dim: usize,
    n_head: usize,
    positions: &[i32],
    p: &RopeParams,
) -> Result<(), OpError> {
    const OP: &str = "rope";
    let row = mul_dims(OP, head_dim, n_head)?;
    let n_rows = whole_rows(OP, "x", x.len(), row)?;
    let planes = match (p.mode, positions.len()) {
        (_, n) if n == n_rows => 1,
        (RopeMode::Imrope { .. }, n) if Some(n) == n_rows.checked_mul(4) => 4,
        _ => {
            return Err(OpError::Length {
                op: OP,
                what: "positions",
                found: positions.len(),
                expected: n_rows,
            })
        }
    };
    if !p.n_dims.is_multiple_of(2) || p.offset.saturating_add(p.n_dims) > head_dim {
        let what = format!(
            "n_dims {} must be even and offset {} + n_dims at most head_dim {head_dim}",
            p.n_dims, p.offset
        );
        return Err(OpError::Parameter { op: OP, what });
    }
    if !positive(p.freq_base) || !positive(p.freq_scale) {
        let what = format!(
            "freq_base {} and freq_scale {} must be positive",
            p.freq_base, p.freq_scale
        );
        return Err(OpError::Parameter { op: OP, what });
    }
    if let RopeMode::Imrope { sections } = p.mode {
        if sections.iter().map(|&s| u64::from(s)).sum::<u64>() == 0 {
            return Err(OpError::Parameter {
                op: OP,
                what: "imrope sections are all zero".into(),
            });
        }
    }
    let half = p.n_dims / 2;
    let (corr, mscale) = p.yarn_terms();
    for (r, xr) in x.chunks_exact_mut(row).enumerate() {
        for i in 0..half {
            let pos = match (p.mode, planes) {
                (RopeMode::Imrope { sections }, 4) => {
                    positions[imrope_plane(sections, i) * n_rows + r]
                }
                _ => positions[r],
            };
            let (cos, sin) = angle(f64::from(pos), i, p, corr, mscale);
            let sin = if p.inverse { -sin } else { sin };
            let (a, b) = match p.mode {
                RopeMode::Norm => (p.offset + 2 * i, p.offset + 2 * i + 1),
                RopeMode::Neox | RopeMode::Imrope { .. } => (p.offset + i, p.offset + i + half),
            };
            for xh in xr.chunks_exact_mut(head_dim) {
                let (x0, x1) = (xh[a], xh[b]);
                xh[a] = x0 * cos - x1 * sin;
                xh[b] = x0 * sin + x1 * cos;
            }
        }
    }
    Ok(())
}

/// The position plane (0 t, 1 h, 2 w, 3 e) of pair `i` in interleaved multi-section rope.
fn imrope_plane(sections: [u32; 4], i: usize) -> usize {
    let total: usize = sections.iter().map(|&s| s as usize).sum();
    let sector = i % total.max(1);
    let within = |s: u32| sector < 3 * s as usize;
    match sector % 3 {
        1 if within(sections[1]) => 1,
        2 if within(sections[2]) => 2,
        0 if within(sections[0]) => 0,
        _ => 3,
    }
}

/// `(cos, sin)` of pair `i` at position `pos`, both times the magnitude, as f32.
fn angle(pos: f64, i: usize, p: &RopeParams, corr: [f32; 2], mscale: f64) -> (f32, f32) {
    let exponent = -2.0 * i as f64 / p.n_dims as f64;
    let theta_extrap = pos * f64::from(p.freq_base).powf(exponent);
    let theta_interp = f64::from(p.freq_scale) * theta_extrap;
    let theta = if p.ext_factor != 0.0 {
        let y = (i as f32 - corr[0]) / (corr[1] - corr[0]).max(0.001);
        let ramp = 1.0 - y.clamp(0.0, 1.0);
        let mix = f64::from(ramp * p.ext_factor);
        theta_interp * (1.0 - mix) + theta_extrap * mix
    } else {
        theta_interp
    };
    ((theta.cos() * mscale) as f32, (theta.sin() * mscale) as f32)
}

#[cfg(test)]
#[path = "rope_tests.rs"]
mod tests;
