//! The blocks the Qwen3.5/3.6 (`qwen35`) and Qwen3.8 (`qwen4exp`) graphs share, in llama.cpp
//! b11434's node order: the Gated DeltaNet layer, gated attention (each head's query followed by
//! its output gate in `attn_q`) and the routed experts plus a sigmoid-gated shared expert.

use crate::builders::{slice, unary, LmInputs};
use crate::graph::{GraphBuilder, TensorId};
use crate::model::WeightClass as C;
use crate::op::{AttentionParams, DeltaRuleParams, GluKind, Op, RopeParams, RouterParams, UnaryFn};
use crate::weights::{AttentionWeights, ExpertWeights, GluFfnWeights, LayerWeights, WeightRef};
use crate::{DType, PluginError};

/// The widths of a Gated DeltaNet layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GdnDims {
    /// Convolution taps.
    pub taps: u32,
    /// Key heads.
    pub n_head_k: u32,
    /// Value heads (a multiple of the key heads).
    pub n_head_v: u32,
    /// Key dim per head.
    pub dk: u32,
    /// Value dim per head.
    pub dv: u32,
}

impl GdnDims {
    /// Channels of the convolution: queries, keys and values side by side (at most three times
    /// `ssm.inner_size`, a `u32`, so it cannot overflow).
    pub fn conv_channels(&self) -> u64 {
        2 * u64::from(self.n_head_k) * u64::from(self.dk) + self.value_width()
    }

    /// Width of the value (and output gate) projection.
    pub fn value_width(&self) -> u64 {
        u64::from(self.n_head_v) * u64::from(self.dv)
    }
}

/// A Gated DeltaNet layer's weights.
pub struct GatedDeltaNet {
    /// Queries, keys and values in one projection `[n_embd, conv channels]`.
    pub wqkv: WeightRef,
    /// Output gate projection `[n_embd, value width]`.
    pub wgate: WeightRef,
    /// Depthwise convolution `[taps, conv channels]`.
    pub conv: WeightRef,
    /// Decay bias per value head.
    pub dt_bias: WeightRef,
    /// Decay rate per value head (`-exp(A_log)`, negative).
    pub a: WeightRef,
    /// β projection `[n_embd, value heads]`.
    pub beta: WeightRef,
    /// Decay projection `[n_embd, value heads]`.
    pub alpha: WeightRef,
    /// Output RMS norm per value head `[dv]`.
    pub norm: WeightRef,
    /// Output projection `[value width, n_embd]`.
    pub out: WeightRef,
}

impl GatedDeltaNet {
    /// Reads layer `l`'s weights (`attn_qkv`, `attn_gate`, `ssm_*`) for a hidden width `n_embd`.
    pub fn load(
        l: &mut LayerWeights<'_, '_>,
        n_embd: u32,
        d: GdnDims,
    ) -> Result<Self, PluginError> {
        let e = u64::from(n_embd);
        let (ch, vw, hv) = (d.conv_channels(), d.value_width(), u64::from(d.n_head_v));
        Ok(GatedDeltaNet {
            wqkv: l.weight("attn_qkv", C::Attention, &[e, ch])?,
            wgate: l.weight("attn_gate", C::Attention, &[e, vw])?,
            conv: l.weight("ssm_conv1d", C::Recurrent, &[u64::from(d.taps), ch])?,
            dt_bias: l.tensor("ssm_dt.bias", C::Recurrent, &[hv])?,
            a: l.tensor("ssm_a", C::Recurrent, &[hv])?,
            beta: l.weight("ssm_beta", C::Recurrent, &[e, hv])?,
            alpha: l.weight("ssm_alpha", C::Recurrent, &[e, hv])?,
            norm: l.norm("ssm_norm", u64::from(d.dv))?,
            out: l.weight("ssm_out", C::Attention, &[vw, e])?,
        })
    }
}

/// How a Gated DeltaNet layer is called besides its weights.
#[derive(Clone, Copy, Debug)]
pub struct GdnCall {
    /// The widths.
    pub dims: GdnDims,
    /// RMS norm ε (also the L2 norms').
    pub eps: f32,
    /// The output gate's function on `z`: SiLU (Qwen3.5) or sigmoid (Qwen3.8).
    pub z_gate: UnaryFn,
    /// A verify pass: the conv and the delta rule also write every row's state into their
    /// state's row states.
    pub verify: bool,
    /// The layer's conv and recurrent state indices.
    pub states: (u32, u32),
}

/// A Gated DeltaNet layer over `x` `[n_embd, rows]` (already normed): the output `[n_embd,
/// rows]`, gated by `RmsNorm(o)·ssm_norm·z_gate(z)`.
pub fn gated_delta_net(
    g: &mut GraphBuilder,
    d: &GatedDeltaNet,
    c: &GdnCall,
    x: TensorId,
    inp: &LmInputs,
) -> Result<TensorId, PluginError> {
    let s = c.dims;
    let (conv_state, ssm_state) = c.states;
    let rows = g.ne(x)[1];
    let (dk, dv) = (u64::from(s.dk), u64::from(s.dv));
    let (hk, hv) = (u64::from(s.n_head_k), u64::from(s.n_head_v));
    let ch = s.conv_channels();
    let wqkv = g.w(&d.wqkv)?;
    let qkv = g.matmul("linear_attn_qkv_mixed", wqkv, x)?;
    let wgate = g.w(&d.wgate)?;
    let z = g.matmul("z", wgate, x)?;
    let wbeta = g.w(&d.beta)?;
    let beta = g.matmul("beta", wbeta, x)?;
    let walpha = g.w(&d.alpha)?;
    let alpha = g.matmul("alpha", walpha, x)?;
    // From here to the gated output the calls run in this order, which the CUDA bundles launch
    // as one decode step (kernels/cuda/src/ops/fused/gdn.rs).
    let beta = unary(g, "beta_sigmoid", beta, UnaryFn::Sigmoid)?;
    let dt = g.w(&d.dt_bias)?;
    let alpha = g.add("alpha_biased", alpha, dt)?;
    let alpha = unary(g, "a_softplus", alpha, UnaryFn::Softplus)?;
    let a = g.w(&d.a)?;
    let gate = g.mul("gate", alpha, a)?;
    let wconv = g.w(&d.conv)?;
    let cs = g.state(conv_state, "conv_state");
    let mut srcs = vec![qkv, wconv, cs, inp.slots, inp.positions];
    if c.verify {
        let width = ch * u64::from(s.taps - 1);
        srcs.push(g.row_states(conv_state, "conv_state_rows", width, rows)?);
    }
    let conv = g.op(
        "conv_output_raw",
        Op::ConvCausal {
            taps: s.taps,
            dilation: 1,
        },
        &srcs,
        DType::F32,
        [ch, rows, 1, 1],
    )?;
    let conv = unary(g, "conv_output_silu", conv, UnaryFn::Silu)?;
    // Each of q and k split out and normed at once (a strided copy and its L2 norm, which kernel
    // plugins may fuse), then v.
    let l2 = Op::L2Norm { eps: c.eps };
    let q = slice(g, "q_conv", conv, [dk, hk, rows, 1], (dk, ch), 0)?;
    let q = g.op("q_conv_norm", l2, &[q], DType::F32, [dk, hk, rows, 1])?;
    let k = slice(g, "k_conv", conv, [dk, hk, rows, 1], (dk, ch), dk * hk)?;
    let k = g.op("k_conv_norm", l2, &[k], DType::F32, [dk, hk, rows, 1])?;
    let v = slice(g, "v_conv", conv, [dv, hv, rows, 1], (dv, ch), 2 * dk * hk)?;
    let ss = g.state(ssm_state, "ssm_state");
    let params = DeltaRuleParams {
        n_head_k: s.n_head_k,
        n_head_v: s.n_head_v,
        dk: s.dk,
        dv: s.dv,
        scale: 1.0 / (s.dk as f32).sqrt(),
        per_dim_gate: false,
        beta_scale: 1.0,
    };
    let mut srcs = vec![q, k, v, gate, beta, ss, inp.slots, inp.positions];
    if c.verify {
        let width = dk * dv * hv;
        srcs.push(g.row_states(ssm_state, "ssm_state_rows", width, rows)?);
    }
    let o = g.op(
        "delta_out",
        Op::DeltaRule(params),
        &srcs,
        DType::F32,
        [dv, hv, rows, 1],
    )?;
    let nw = g.w(&d.norm)?;
    let o = g.rms_norm("attn_out_norm", o, Some(nw), c.eps)?;
    let z = g.reshape(z, [dv, hv, rows, 1])?;
    let zname = match c.z_gate {
        UnaryFn::Sigmoid => "z_sigmoid",
        _ => "z_silu",
    };
    let z = unary(g, zname, z, c.z_gate)?;
    let o = g.mul("attn_out_gated", o, z)?;
    let o = g.reshape(o, [dv * hv, rows, 1, 1])?;
    let wout = g.w(&d.out)?;
    g.matmul("linear_attn_out", wout, o)
}

/// How a gated attention layer is called besides its weights.
#[derive(Clone, Copy, Debug)]
pub struct GatedAttentionCall {
    /// The attention op's parameters (`selected` when `sel` is given).
    pub params: AttentionParams,
    /// Rotary parameters of the queries and keys.
    pub rope: RopeParams,
    /// RMS norm ε of the QK norms.
    pub eps: f32,
    /// The layer's K and V cache state indices.
    pub caches: (u32, u32),
}

/// Gated attention over `x` (already normed): each head's query and output gate from `attn_q`,
/// QK-norm, rope, the K/V cache stores, attention (over the cache positions `sel` lists, when
/// given), `σ(gate)` on the output, `attn_output`.
pub fn gated_attention(
    g: &mut GraphBuilder,
    a: &AttentionWeights,
    c: &GatedAttentionCall,
    x: TensorId,
    (inp, sel): (&LmInputs, Option<TensorId>),
) -> Result<TensorId, PluginError> {
    let rows = g.ne(x)[1];
    let p = c.params;
    let (hd, nh, nkv) = (u64::from(p.dk), u64::from(p.n_head), u64::from(p.n_head_kv));
    let wq = g.w(&a.wq)?;
    let q_full = g.matmul("Qcur_full", wq, x)?;
    // Each head's query is followed by its output gate.
    let strides = (2 * hd, 2 * hd * nh);
    let q = slice(g, "Qcur", q_full, [hd, nh, rows, 1], strides, 0)?;
    let gate = slice(g, "gate", q_full, [hd, nh, rows, 1], strides, hd)?;
    let wk = g.w(&a.wk)?;
    let k = g.matmul("Kcur", wk, x)?;
    let k = g.reshape(k, [hd, nkv, rows, 1])?;
    let wv = g.w(&a.wv)?;
    let v = g.matmul("Vcur", wv, x)?;
    // Each of q and k normed, then rotated (adjacent calls a kernel plugin may fuse).
    let rope = Op::Rope(c.rope);
    let qn = g.w(&a.q_norm)?;
    let q = g.rms_norm("Qcur_normed", q, Some(qn), c.eps)?;
    let q = g.op(
        "Qcur_rope",
        rope,
        &[q, inp.positions],
        DType::F32,
        [hd, nh, rows, 1],
    )?;
    let kn = g.w(&a.k_norm)?;
    let k = g.rms_norm("Kcur_normed", k, Some(kn), c.eps)?;
    let k = g.op(
        "Kcur_rope",
        rope,
        &[k, inp.positions],
        DType::F32,
        [hd, nkv, rows, 1],
    )?;
    let k = g.reshape(k, [hd * nkv, rows, 1, 1])?;
    let kc = g.state(c.caches.0, "cache_k");
    let vc = g.state(c.caches.1, "cache_v");
    let (kst, vst) = (
        Op::CacheStore { rot: p.rot_k },
        Op::CacheStore { rot: p.rot_v },
    );
    g.op_into(kst, &[k, kc, inp.slots, inp.positions], kc)?;
    g.op_into(vst, &[v, vc, inp.slots, inp.positions], vc)?;
    let mut srcs = vec![q, kc, vc, inp.slots, inp.positions];
    let mut params = p;
    if let Some(sel) = sel {
        params.selected = true;
        srcs.push(sel);
    }
    let o = g.op(
        "attn_pregate",
        Op::Attention(params),
        &srcs,
        DType::F32,
        [hd, nh, rows, 1],
    )?;
    let o = g.reshape(o, [hd * nh, rows, 1, 1])?;
    let gate = g.reshape(gate, [hd * nh, rows, 1, 1])?;
    let gate = unary(g, "gate_sigmoid", gate, UnaryFn::Sigmoid)?;
    let o = g.mul("attn_gated", o, gate)?;
    let wo = g.w(&a.wo)?;
    g.matmul("attn_output", wo, o)
}

/// Routed experts plus a shared expert gated by `σ(ffn_gate_inp_shexp · x)`, of `x` (already
/// normed); `route` picks the experts.
pub fn shared_gated_moe(
    g: &mut GraphBuilder,
    (experts, shared, shared_gate): (&ExpertWeights, &GluFfnWeights, &WeightRef),
    route: RouterParams,
    x: TensorId,
) -> Result<TensorId, PluginError> {
    let blk = experts.block(route, GluKind::SwiGlu);
    // The shared expert between the routing and the routed experts: with those on the host it
    // runs on the card meanwhile.
    let routed = g.moe_route(&blk, x)?;
    let sh = g.glu_ffn("ffn_shexp_", shared, GluKind::SwiGlu, x)?;
    let out = g.moe_experts(&blk, x, routed)?;
    let sgw = g.w(shared_gate)?;
    let sg = g.matmul("shared_expert_gate", sgw, x)?;
    let sg = unary(g, "shared_expert_gate_sigmoid", sg, UnaryFn::Sigmoid)?;
    let sh = g.mul("ffn_shexp_gated", sh, sg)?;
    g.add("ffn_out", out, sh)
}
