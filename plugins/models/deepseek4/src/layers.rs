//! Per-layer structure of a `deepseek4` or `deepseek41` file: each layer's compress ratio
//! (`attention.compress_ratios`) and the two rotary embeddings the ratio picks.

use bloomery_plugin_api::hparams::{ArchKeys, RopeConfig};
use bloomery_plugin_api::op::{RopeMode, RopeParams};
use bloomery_plugin_api::PluginError;

/// A layer's compress ratio: what its attention reads besides the window ring.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ratio {
    /// Ratio 0: the window ring only, roped with θ `rope.freq_base` and no scaling.
    Window,
    /// Ratio 4: two overlapping compressor series, and the indexer that picks the compressed
    /// rows each position reads.
    Four,
    /// Ratio 128: one compressor series; every visible compressed row is read.
    OneTwentyEight,
    /// Ratio 2 (V4.1, layers 2–19): one series, no overlap (`docs/deepseek41-plan.md`).
    Two,
    /// Ratio 1 (V4.1, layers 20–39): one series, a compressed row per position.
    One,
}

impl Ratio {
    /// Positions per compressed row (0 for a window-only layer).
    pub fn positions(self) -> u32 {
        match self {
            Ratio::Window => 0,
            Ratio::Four => 4,
            Ratio::OneTwentyEight => 128,
            Ratio::Two => 2,
            Ratio::One => 1,
        }
    }

    /// Compressor series (`c`): the compressor projections are `c·head_dim` wide.
    pub fn series(self) -> u32 {
        match self {
            Ratio::Window => 0,
            Ratio::Four => 2,
            Ratio::OneTwentyEight | Ratio::Two | Ratio::One => 1,
        }
    }
}

/// The ratio of each of `n_layer` layers: `attention.compress_ratios` holds at least one value
/// per layer (llama.cpp reads the first `block_count` and refuses a shorter array). A `deepseek4`
/// file's are 0, 4 or 128 (the only ones llama.cpp b11434's loader accepts); a `deepseek41`
/// file's (`v41`) are 0, 2 or 1 (issue 49, `docs/deepseek41-plan.md`).
pub fn ratios(keys: &ArchKeys<'_>, n_layer: u32, v41: bool) -> Result<Vec<Ratio>, PluginError> {
    const NAME: &str = "attention.compress_ratios";
    let values = keys.u32_array_or_empty(NAME)?;
    keys.check(values.len() >= n_layer as usize, NAME, || {
        format!("{} values for {n_layer} layers", values.len())
    })?;
    values[..n_layer as usize]
        .iter()
        .enumerate()
        .map(|(il, &r)| match (v41, r) {
            (_, 0) => Ok(Ratio::Window),
            (false, 4) => Ok(Ratio::Four),
            (false, 128) => Ok(Ratio::OneTwentyEight),
            (true, 2) => Ok(Ratio::Two),
            (true, 1) => Ok(Ratio::One),
            (false, _) => Err(keys.bad(
                NAME,
                format!("layer {il}: ratio {r} (llama.cpp b11434 accepts 0, 4 and 128 only)"),
            )),
            (true, _) => Err(keys.bad(
                NAME,
                format!("layer {il}: ratio {r} (DeepSeek-V4.1 compresses at 0, 2 and 1 only)"),
            )),
        })
        .collect()
}

/// The rotary embeddings: GPT-J pairs (`RopeMode::Norm`) on the LAST `n_dims` dims of each
/// head (ggml's `rope_set_offset(head_dim − n_dims)`), of the attention heads and of the
/// indexer heads alike.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Ropes {
    /// Window-only layers: θ `rope.freq_base`, no scaling.
    pub window: RopeParams,
    /// Compressed layers, their compressed rows and the indexer: θ
    /// `attention.compress_rope_freq_base` with the file's scaling (YaRN ×16 in V4-Flash), the
    /// magnitude `1 / (1 + 0.1·ln(1 / freq_scale))` when YaRN is on, which cancels ggml's YaRN
    /// magnitude factor (llama.cpp's `dsv4_rope_attn_factor`).
    pub compressed: RopeParams,
    /// Unrotated dims before the rotated tail of an attention head (`head_dim − n_dims`).
    pub offset: u32,
    /// The same for an indexer head.
    pub indexer_offset: u32,
}

/// Reads `rope.dimension_count` (even, positive, at most both head widths), `rope.freq_base`,
/// `attention.compress_rope_freq_base` and the scaling keys ([`RopeConfig::read`]).
pub fn ropes(keys: &ArchKeys<'_>, head_dim: u32, indexer_dim: u32) -> Result<Ropes, PluginError> {
    let base = RopeConfig::read(keys, RopeMode::Norm, head_dim)?.params;
    let n_dims = base.n_dims;
    keys.check(
        n_dims > 0 && n_dims <= indexer_dim,
        "rope.dimension_count",
        || format!("{n_dims} rotated dims: positive, at most the indexer head {indexer_dim}"),
    )?;
    let theta = |name: &str, v: f32| {
        keys.check(v.is_finite() && v > 1.0, name, || format!("θ {v} (θ > 1)"))
    };
    theta("rope.freq_base", base.freq_base)?;
    let compress_base = keys.f32("attention.compress_rope_freq_base")?;
    theta("attention.compress_rope_freq_base", compress_base)?;
    keys.check(
        base.freq_scale.is_finite() && base.freq_scale > 0.0 && base.freq_scale <= 1.0,
        "rope.scaling.factor",
        || format!("scale 1/{} (a factor of at least 1)", 1.0 / base.freq_scale),
    )?;
    let window = RopeParams {
        freq_scale: 1.0,
        ext_factor: 0.0,
        attn_factor: 1.0,
        n_ctx_orig: 0,
        ..base
    };
    let attn_factor = match base.ext_factor {
        0.0 => 1.0,
        _ => 1.0 / (1.0 + 0.1 * (1.0 / base.freq_scale).ln()),
    };
    let compressed = RopeParams {
        freq_base: compress_base,
        attn_factor,
        ..base
    };
    Ok(Ropes {
        window,
        compressed,
        offset: head_dim - n_dims,
        indexer_offset: indexer_dim - n_dims,
    })
}
