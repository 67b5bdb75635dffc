//! The forward graph of a KDA hybrid, for a batch of rows from any number of sequences.
//!
//! Each layer: RMS norm → KDA or gated NoPE GQA → residual → RMS norm → routed experts (sigmoid
//! scores, selection bias) plus the shared expert, or a dense lead layer's SwiGLU → residual.
//! Node names follow llama.cpp's graph.

use bloomery_plugin_api::builders::{causal_lm, LmInputs};
use bloomery_plugin_api::graph::{BatchShape, Graph, GraphBuilder, GraphKind, TensorId};
use bloomery_plugin_api::kda::{kda_layer, KdaInputs};
use bloomery_plugin_api::op::{AttentionParams, GluKind, Op, UnaryFn};
use bloomery_plugin_api::{DType, PluginError};

use crate::hparams::HParams;
use crate::state::LayerState;
use crate::weights::{FfnWeights, Gqa, Mixer, Weights};

/// What the graph needs besides the batch shape.
pub struct Model<'a> {
    /// Hyperparameters.
    pub hp: &'a HParams,
    /// Weights.
    pub w: &'a Weights,
    /// Each layer's state indices.
    pub state: &'a [LayerState],
}

/// Gated NoPE GQA: `attn_output·(attention(q, k, v) ⊙ σ(attn_gate·x + bias))`.
fn gqa(
    m: &Model<'_>,
    g: &mut GraphBuilder,
    a: &Gqa,
    (n_kv, k_cache, v_cache): (u32, u32, u32),
    x: TensorId,
    inp: &LmInputs,
) -> Result<TensorId, PluginError> {
    let rows = g.ne(x)[1];
    let s = m.hp.lm.attn;
    let (hd, nh) = (u64::from(s.head_dim), u64::from(s.n_head));
    let wq = g.w(&a.wq)?;
    let q = g.matmul("Qcur", wq, x)?;
    let q = g.reshape(q, [hd, nh, rows, 1])?;
    let wk = g.w(&a.wk)?;
    let k = g.matmul("Kcur", wk, x)?;
    let wv = g.w(&a.wv)?;
    let v = g.matmul("Vcur", wv, x)?;
    let kc = g.state(k_cache, "cache_k");
    let vc = g.state(v_cache, "cache_v");
    let params = AttentionParams::gqa(s.n_head, n_kv, s.head_dim);
    g.op_into(
        Op::CacheStore { rot: params.rot_k },
        &[k, kc, inp.slots, inp.positions],
        kc,
    )?;
    g.op_into(
        Op::CacheStore { rot: params.rot_v },
        &[v, vc, inp.slots, inp.positions],
        vc,
    )?;
    let o = g.op(
        "attn_pregate",
        Op::Attention(params),
        &[q, kc, vc, inp.slots, inp.positions],
        DType::F32,
        [hd, nh, rows, 1],
    )?;
    let o = g.reshape(o, [hd * nh, rows, 1, 1])?;
    let wg = g.w(&a.gate)?;
    let mut gate = g.matmul("attn_gate", wg, x)?;
    if let Some(b) = &a.gate_bias {
        let b = g.w(b)?;
        gate = g.add("attn_gate_biased", gate, b)?;
    }
    let ne = g.ne(gate);
    let gate = g.op(
        "attn_gate_sigmoid",
        Op::Unary {
            f: UnaryFn::Sigmoid,
        },
        &[gate],
        DType::F32,
        ne,
    )?;
    let o = g.mul("attn_gated", o, gate)?;
    let wo = g.w(&a.wo)?;
    g.matmul("attn_output", wo, o)
}

fn ffn(
    m: &Model<'_>,
    g: &mut GraphBuilder,
    f: &FfnWeights,
    x: TensorId,
) -> Result<TensorId, PluginError> {
    match f {
        FfnWeights::Dense(d) => g.glu_ffn("ffn_", d, GluKind::SwiGlu, x),
        FfnWeights::Moe(e) => {
            let mut blk = e.experts.block(m.hp.route, GluKind::SwiGlu);
            blk.router_bias = Some(&e.bias);
            // The shared expert between the routing and the routed experts: with those on the
            // host it runs on the card meanwhile.
            let route = g.moe_route(&blk, x)?;
            let sh = match &e.shared {
                Some(s) => Some(g.glu_ffn("ffn_shexp_", s, GluKind::SwiGlu, x)?),
                None => None,
            };
            let moe = g.moe_experts(&blk, x, route)?;
            match sh {
                Some(sh) => g.add("ffn_out", moe, sh),
                None => Ok(moe),
            }
        }
    }
}

/// Builds the graph for `shape`.
pub fn build(m: &Model<'_>, shape: BatchShape) -> Result<Graph, PluginError> {
    let eps = m.hp.lm.eps;
    causal_lm(shape, &m.w.globals, eps, &m.w.layers, |g, at, l, x| {
        let il = at.index;
        let an = g.w(&l.attn_norm)?;
        let cur = g.rms_norm("attn_norm", x, Some(an), eps)?;
        let state = m.state.get(il as usize).copied();
        let mut cur = match (&l.mixer, state) {
            (Mixer::Gqa(a), Some(LayerState::Attention { k, v })) => {
                let n_kv = m.hp.n_head_kv[il as usize];
                gqa(m, g, a, (n_kv, k, v), cur, at.inp)?
            }
            (Mixer::Kda(w), Some(LayerState::Kda(s))) => {
                let inp = KdaInputs {
                    slots: at.inp.slots,
                    positions: at.inp.positions,
                    verify: shape.kind == GraphKind::Verify,
                };
                kda_layer(g, &m.hp.kda, w, &s, cur, &inp)?
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
        let res = g.add("ffn_inp", cur, x)?;
        let fn_ = g.w(&l.ffn_norm)?;
        let cur = g.rms_norm("ffn_norm", res, Some(fn_), eps)?;
        let cur = ffn(m, g, &l.ffn, cur)?;
        g.add("l_out", cur, res)
    })
}
