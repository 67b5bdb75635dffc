//! The graph of the manifold hyper-connections (mHC) of GLM-5.3 and DeepSeek-V4, in llama.cpp
//! b11434's order (`glm5-next.cpp` and `deepseek4.cpp` `build_hc_pre`, `build_hc_post`,
//! `build_hc_mean`; DeepSeek-V4's trained head, [`Hc::collapse`]). The residual is `n` streams `[n_embd, n,
//! rows]`; around each mixer and FFN:
//!
//! ```text
//! mixes = hc_fn · rms_norm(streams as one [n·n_embd] row)         (no weight)   [(2+n)·n, rows]
//! pre   = σ(mixes[0..n]·scale[0] + base[0..n]) + ε
//! post  = 2·σ(mixes[n..2n]·scale[1] + base[n..2n])
//! comb  = Sinkhorn(mixes[2n..]·scale[2] + base[2n..])                 [n (dst), n (src), rows]
//! x     = Σ_j pre[j]·streams[j]                                       the block's input
//! out_i = post[i]·block(x) + Σ_j comb[i, j]·streams[j]                the new streams
//! ```
//!
//! The op set has no constant tensors, so the `ε` added to `pre` and the `1/n` of the final mean
//! come from one `[n, rows]` tensor of ones per graph (`exp(0·x)` of the embeddings' first `n`
//! values per row, which are finite).

use crate::builders::unary;
use crate::graph::{GraphBuilder, TensorId};
use crate::mhc::HyperConnections;
use crate::op::{Op, UnaryFn};
use crate::weights::WeightRef;
use crate::{DType, PluginError};

/// One hyper-connection mixer (`hc_attn_*`, `hc_ffn_*`), or DeepSeek-V4's head (`output_hc_*`).
pub struct HcWeights {
    /// Mixing projection `[n_stream·n_embd, n_mix]` (`n_mix` = `(2 + n)·n` for a layer's mixer,
    /// `n` for the head).
    pub proj: WeightRef,
    /// Bias of the mixes `[n_mix]`: pre, post, then comb.
    pub base: WeightRef,
    /// Scales `[3]` of the pre, post and comb mixes (`[1]` for the head).
    pub scale: WeightRef,
}

/// Bytes of an f32.
const F: u64 = 4;

/// The per-graph constants the mixers read, `[n, rows]` each.
#[derive(Clone, Copy, Debug)]
pub struct HcRows {
    /// Every value ε (added to the pre weights).
    pub eps: TensorId,
    /// Every value `1/n` (the weights of the final mean).
    pub mean: TensorId,
}

/// One block's mixing coefficients.
#[derive(Clone, Copy, Debug)]
pub struct HcMix {
    /// Weights of the block's input, `[n, rows]`.
    pub pre: TensorId,
    /// Weights of the block's output in each stream, `[n, rows]`.
    pub post: TensorId,
    /// Stream-to-stream weights, `[n, n, rows]`.
    pub comb: TensorId,
}

/// The hyper-connections of one graph: their sizes, ε of the flat RMS norm, the constants.
pub struct Hc {
    /// Streams, Sinkhorn steps, ε.
    pub shape: HyperConnections,
    /// ε of the RMS norm of the flat streams (the model's RMS ε).
    pub rms_eps: f32,
    /// The constants.
    pub rows: HcRows,
}

impl Hc {
    /// The streams of the embeddings `x` `[n_embd, rows]`: `n` copies of each row (`hc_init`),
    /// and the constants, made from `x` (`n_embd` ≥ `n`, checked at load).
    pub fn init(
        g: &mut GraphBuilder,
        shape: HyperConnections,
        rms_eps: f32,
        x: TensorId,
    ) -> Result<(Hc, TensorId), PluginError> {
        let [e, rows, _, _] = g.ne(x);
        let n = u64::from(shape.n_stream);
        let head = g.view(
            x,
            "hc_ones_src",
            [n, rows, 1, 1],
            [F, e * F, e * rows * F, e * rows * F],
            0,
        );
        let head = g.op(
            "hc_ones_src",
            Op::Copy,
            &[head],
            DType::F32,
            [n, rows, 1, 1],
        )?;
        let zero = g.scale("hc_zeros", head, 0.0)?;
        let ones = unary(g, "hc_ones", zero, UnaryFn::Exp)?;
        let rows_c = HcRows {
            eps: g.scale("hc_eps", ones, shape.eps)?,
            mean: g.scale("hc_mean_w", ones, 1.0 / shape.n_stream as f32)?,
        };
        // n = 4 (checked at load): two doublings.
        let x2 = g.op(
            "hc_init",
            Op::Concat,
            &[x, x],
            DType::F32,
            [2 * e, rows, 1, 1],
        )?;
        let x4 = g.op(
            "hc_init",
            Op::Concat,
            &[x2, x2],
            DType::F32,
            [4 * e, rows, 1, 1],
        )?;
        let streams = g.reshape(x4, [e, n, rows, 1])?;
        let hc = Hc {
            shape,
            rms_eps,
            rows: rows_c,
        };
        Ok((hc, streams))
    }

    /// Coefficients `[width, rows]` number `c0..c0 + width` of `mixes` `[n_mix, rows]`, times
    /// `scale[j]`, plus `base[c0..c0 + width]`.
    fn affine(
        g: &mut GraphBuilder,
        w: &HcWeights,
        mixes: TensorId,
        (j, c0, width): (u64, u64, u64),
        name: &str,
    ) -> Result<TensorId, PluginError> {
        let [n_mix, rows, _, _] = g.ne(mixes);
        let nb = [F, n_mix * F, n_mix * rows * F, n_mix * rows * F];
        let part = g.view(mixes, name, [width, rows, 1, 1], nb, c0 * F);
        let part = g.op(name, Op::Copy, &[part], DType::F32, [width, rows, 1, 1])?;
        // One row of all the values, times one scale value per row.
        let flat = g.reshape(part, [width * rows, 1, 1, 1])?;
        let scale = g.w(&w.scale)?;
        let s = g.view(scale, &w.scale.name, [1, 1, 1, 1], [F; 4], j * F);
        let scaled = g.mul(&format!("{name}_scaled"), flat, s)?;
        let scaled = g.reshape(scaled, [width, rows, 1, 1])?;
        let base = g.w(&w.base)?;
        let b = g.view(
            base,
            &w.base.name,
            [width, 1, 1, 1],
            [F, width * F, width * F, width * F],
            c0 * F,
        );
        g.add(&format!("{name}_biased"), scaled, b)
    }

    /// The mixing coefficients of one block from the streams `[n_embd, n, rows]`
    /// (`hc_mixes`, `hc_pre`, `hc_post`, `hc_comb`), and the block's input `[n_embd, rows]`
    /// (`{name}_pre`).
    pub fn pre(
        &self,
        g: &mut GraphBuilder,
        w: &HcWeights,
        streams: TensorId,
        name: &str,
    ) -> Result<(TensorId, HcMix), PluginError> {
        let [e, _, rows, _] = g.ne(streams);
        let mix = self.mixes(g, w, streams)?;
        let x = g.op(
            &format!("{name}_pre"),
            Op::StreamMix,
            &[streams, mix.pre],
            DType::F32,
            [e, rows, 1, 1],
        )?;
        Ok((x, mix))
    }

    /// The mixing coefficients of one block from the streams `[n_embd, n, rows]` (`hc_mixes`,
    /// `hc_pre`, `hc_post`, `hc_comb`), without the block's input ([`Hc::pre`] mixes it;
    /// DeepSeek-V4.1 mixes a block's input by an earlier block's `pre`).
    pub fn mixes(
        &self,
        g: &mut GraphBuilder,
        w: &HcWeights,
        streams: TensorId,
    ) -> Result<HcMix, PluginError> {
        let [e, n, rows, _] = g.ne(streams);
        let flat = g.reshape(streams, [e * n, rows, 1, 1])?;
        let normed = g.rms_norm("hc_flat_norm", flat, None, self.rms_eps)?;
        let proj = g.w(&w.proj)?;
        let mixes = g.matmul("hc_mixes", proj, normed)?;
        let pre = Self::affine(g, w, mixes, (0, 0, n), "hc_pre")?;
        let pre = unary(g, "hc_pre_sigmoid", pre, UnaryFn::Sigmoid)?;
        let pre = g.add("hc_pre", pre, self.rows.eps)?;
        let post = Self::affine(g, w, mixes, (1, n, n), "hc_post")?;
        let post = unary(g, "hc_post_sigmoid", post, UnaryFn::Sigmoid)?;
        let post = g.scale("hc_post", post, 2.0)?;
        let comb = Self::affine(g, w, mixes, (2, 2 * n, n * n), "hc_comb")?;
        let comb = g.reshape(comb, [n, n, rows, 1])?;
        let sinkhorn = Op::Sinkhorn {
            iters: self.shape.iters,
            eps: self.shape.eps,
        };
        let comb = g.op("hc_comb", sinkhorn, &[comb], DType::F32, [n, n, rows, 1])?;
        Ok(HcMix { pre, post, comb })
    }

    /// The new streams after a block whose output is `y` `[n_embd, rows]` (`{name}_post`).
    pub fn post(
        &self,
        g: &mut GraphBuilder,
        mix: &HcMix,
        streams: TensorId,
        y: TensorId,
        name: &str,
    ) -> Result<TensorId, PluginError> {
        let ne = g.ne(streams);
        g.op(
            &format!("{name}_post"),
            Op::StreamUpdate,
            &[streams, mix.comb, mix.post, y],
            DType::F32,
            ne,
        )
    }

    /// DeepSeek-V4's trained collapse of the streams `[n_embd, n, rows]` into `[n_embd, rows]`
    /// (`hc_head`): `pre = σ(proj · rms_norm(streams)·scale + base) + ε`, `Σ_j pre_j·stream_j`
    /// (transformers 5.24 `DeepseekV4HyperHead`).
    pub fn collapse(
        &self,
        g: &mut GraphBuilder,
        w: &HcWeights,
        streams: TensorId,
    ) -> Result<TensorId, PluginError> {
        let [e, n, rows, _] = g.ne(streams);
        let flat = g.reshape(streams, [e * n, rows, 1, 1])?;
        let normed = g.rms_norm("hc_head_flat_norm", flat, None, self.rms_eps)?;
        let proj = g.w(&w.proj)?;
        let mixes = g.matmul("hc_head_mixes", proj, normed)?;
        let pre = Self::affine(g, w, mixes, (0, 0, n), "hc_head_pre")?;
        let pre = unary(g, "hc_head_sigmoid", pre, UnaryFn::Sigmoid)?;
        let pre = g.add("hc_head_pre", pre, self.rows.eps)?;
        g.op(
            "hc_head",
            Op::StreamMix,
            &[streams, pre],
            DType::F32,
            [e, rows, 1, 1],
        )
    }

    /// The unweighted mean of the streams, `[n_embd, rows]` (`hc_head`).
    pub fn mean(&self, g: &mut GraphBuilder, streams: TensorId) -> Result<TensorId, PluginError> {
        let [e, _, rows, _] = g.ne(streams);
        g.op(
            "hc_head",
            Op::StreamMix,
            &[streams, self.rows.mean],
            DType::F32,
            [e, rows, 1, 1],
        )
    }
}
