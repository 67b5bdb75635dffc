//! The Qwen3.5 hybrid forward graph, for a batch of rows from any number of sequences.
//!
//! Each layer: RMS norm → Gated DeltaNet (three layers in four) or gated attention → residual →
//! RMS norm → routed experts plus a sigmoid-gated shared expert (`qwen35moe`) or a SwiGLU FFN
//! (`qwen35`) → residual. Node names follow llama.cpp's graph.

use bloomery_plugin_api::builders::{causal_lm_with, LmInputs, LmOutputs};
use bloomery_plugin_api::graph::{BatchShape, Graph, GraphBuilder, TensorId};
use bloomery_plugin_api::op::{DeltaRuleParams, GluKind, Op, RopeParams, RouterParams, UnaryFn};
use bloomery_plugin_api::weights::AttentionWeights;
use bloomery_plugin_api::{DType, PluginError};

use crate::hparams::{Ffn, HParams, ARCH_DENSE};
use crate::state::LayerState;
use crate::weights::{DeltaNet, FfnWeights, Mixer, Weights};

/// What the graph needs besides the weights.
pub struct Model<'a> {
    /// Hyperparameters.
    pub hp: &'a HParams,
    /// Weights.
    pub w: &'a Weights,
    /// Each layer's state indices.
    pub state: &'a [LayerState],
    /// Rotary parameters of the attention layers (IMROPE, partial).
    pub rope: RopeParams,
    /// A verify pass (`GraphKind::Verify`): the conv and the delta rule also write every row's
    /// state into their state's row states.
    pub verify: bool,
}

const F32: usize = 4;

fn unary(
    g: &mut GraphBuilder,
    name: &str,
    x: TensorId,
    f: UnaryFn,
) -> Result<TensorId, PluginError> {
    let ne = g.ne(x);
    g.op(name, Op::Unary { f }, &[x], DType::F32, ne)
}

/// A contiguous copy of `[ne0, heads, rows]` f32 elements of `base`, heads `head_stride` and
/// rows `row_stride` elements apart, starting `offset` elements in (splits interleaved
/// projections).
fn slice(
    g: &mut GraphBuilder,
    name: &str,
    base: TensorId,
    ne: [u64; 4],
    (head_stride, row_stride): (u64, u64),
    offset: u64,
) -> Result<TensorId, PluginError> {
    let f = F32 as u64;
    let nb = [f, head_stride * f, row_stride * f, row_stride * f * ne[2]];
    let v = g.view(base, name, ne, nb, offset * f);
    g.op(name, Op::Copy, &[v], DType::F32, ne)
}

/// A gated attention layer over `x` (already normed), its K/V in `(k_cache, v_cache)`.
pub(crate) fn attention(
    m: &Model<'_>,
    g: &mut GraphBuilder,
    a: &AttentionWeights,
    (k_cache, v_cache): (u32, u32),
    x: TensorId,
    inp: &LmInputs,
) -> Result<TensorId, PluginError> {
    let hp = m.hp;
    let rows = g.ne(x)[1];
    let (hd, nh, nkv) = (
        u64::from(hp.lm.attn.head_dim),
        u64::from(hp.lm.attn.n_head),
        u64::from(hp.lm.attn.n_head_kv),
    );
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
    let rope = Op::Rope(m.rope);
    let qn = g.w(&a.q_norm)?;
    let q = g.rms_norm("Qcur_normed", q, Some(qn), hp.lm.eps)?;
    let q = g.op(
        "Qcur_rope",
        rope,
        &[q, inp.positions],
        DType::F32,
        [hd, nh, rows, 1],
    )?;
    let kn = g.w(&a.k_norm)?;
    let k = g.rms_norm("Kcur_normed", k, Some(kn), hp.lm.eps)?;
    let k = g.op(
        "Kcur_rope",
        rope,
        &[k, inp.positions],
        DType::F32,
        [hd, nkv, rows, 1],
    )?;
    let k = g.reshape(k, [hd * nkv, rows, 1, 1])?;
    let kc = g.state(k_cache, "cache_k");
    let vc = g.state(v_cache, "cache_v");
    let params = hp.lm.attn.gqa();
    let (kst, vst) = (
        Op::CacheStore { rot: params.rot_k },
        Op::CacheStore { rot: params.rot_v },
    );
    g.op_into(kst, &[k, kc, inp.slots, inp.positions], kc)?;
    g.op_into(vst, &[v, vc, inp.slots, inp.positions], vc)?;
    let o = g.op(
        "attn_pregate",
        Op::Attention(params),
        &[q, kc, vc, inp.slots, inp.positions],
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

fn delta_net(
    m: &Model<'_>,
    g: &mut GraphBuilder,
    d: &DeltaNet,
    (conv_state, ssm_state): (u32, u32),
    x: TensorId,
    inp: &LmInputs,
) -> Result<TensorId, PluginError> {
    let hp = m.hp;
    let s = hp.gdn;
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
    if m.verify {
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
    let q = slice(g, "q_conv", conv, [dk, hk, rows, 1], (dk, ch), 0)?;
    let q = g.op(
        "q_conv_norm",
        Op::L2Norm { eps: hp.lm.eps },
        &[q],
        DType::F32,
        [dk, hk, rows, 1],
    )?;
    let k = slice(g, "k_conv", conv, [dk, hk, rows, 1], (dk, ch), dk * hk)?;
    let k = g.op(
        "k_conv_norm",
        Op::L2Norm { eps: hp.lm.eps },
        &[k],
        DType::F32,
        [dk, hk, rows, 1],
    )?;
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
    if m.verify {
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
    let o = g.rms_norm("attn_out_norm", o, Some(nw), hp.lm.eps)?;
    let z = g.reshape(z, [dv, hv, rows, 1])?;
    let z = unary(g, "z_silu", z, UnaryFn::Silu)?;
    let o = g.mul("attn_out_gated", o, z)?;
    let o = g.reshape(o, [dv * hv, rows, 1, 1])?;
    let wout = g.w(&d.out)?;
    g.matmul("linear_attn_out", wout, o)
}

/// The FFN half over `x` (already normed): experts plus the gated shared expert, or SwiGLU.
pub(crate) fn ffn(
    m: &Model<'_>,
    g: &mut GraphBuilder,
    f: &FfnWeights,
    x: TensorId,
) -> Result<TensorId, PluginError> {
    match f {
        FfnWeights::Dense(d) => g.glu_ffn("ffn_", d, GluKind::SwiGlu, x),
        FfnWeights::Moe(e) => {
            let Ffn::Moe { experts, .. } = m.hp.ffn else {
                return Err(PluginError::invalid("expert weights on a dense model"));
            };
            let route = RouterParams::softmax_renorm(
                experts.n_expert,
                experts.n_expert_used,
                experts.weights_scale,
            );
            let blk = e.experts.block(route, GluKind::SwiGlu);
            // The shared expert between the routing and the routed experts: with those on the
            // host it runs on the card meanwhile.
            let route = g.moe_route(&blk, x)?;
            let sh = g.glu_ffn("ffn_shexp_", &e.shared, GluKind::SwiGlu, x)?;
            let moe = g.moe_experts(&blk, x, route)?;
            let sgw = g.w(&e.shared_gate)?;
            let sg = g.matmul("shared_expert_gate", sgw, x)?;
            let sg = unary(g, "shared_expert_gate_sigmoid", sg, UnaryFn::Sigmoid)?;
            let sh = g.mul("ffn_shexp_gated", sh, sg)?;
            g.add("ffn_out", moe, sh)
        }
    }
}

/// Builds the graph for `shape`.
pub fn build(m: &Model<'_>, shape: BatchShape) -> Result<Graph, PluginError> {
    let eps = m.hp.lm.eps;
    // A decision model's graph ends in the rows its head reads; a dense one may serve a head
    // file (`--decision-head`) too.
    let outputs = match (m.w.head.is_some(), m.hp.arch) {
        (true, _) => LmOutputs::Hidden,
        (false, ARCH_DENSE) => LmOutputs::LogitsAndHidden,
        (false, _) => LmOutputs::Logits,
    };
    causal_lm_with(
        shape,
        &m.w.lm.globals,
        eps,
        &m.w.lm.layers,
        outputs,
        |g, at, l, x| {
            let il = at.index;
            let an = g.w(&l.attn_norm)?;
            let cur = g.rms_norm("attn_norm", x, Some(an), eps)?;
            let state = m.state.get(il as usize).copied();
            let mut cur = match (&l.mixer, state) {
                (Mixer::Attention(a), Some(LayerState::Attention { k, v })) => {
                    attention(m, g, a, (k, v), cur, at.inp)?
                }
                (Mixer::DeltaNet(d), Some(LayerState::Recurrent { conv, ssm })) => {
                    delta_net(m, g, d, (conv, ssm), cur, at.inp)?
                }
                _ => {
                    return Err(PluginError::invalid(format!(
                        "layer {il}: weights and state disagree"
                    )))
                }
            };
            let mut x = x;
            if at.last {
                cur = g.select_outputs(cur, at.inp)?;
                x = g.select_outputs(x, at.inp)?;
            }
            let res = g.add("attn_residual", cur, x)?;
            let pn = g.w(&l.post_norm)?;
            let cur = g.rms_norm("attn_post_norm", res, Some(pn), eps)?;
            let cur = ffn(m, g, &l.ffn, cur)?;
            g.add("l_out", cur, res)
        },
    )
}
