//! The Qwen3.5 hybrid forward graph, for a batch of rows from any number of sequences.
//!
//! Each layer: RMS norm → Gated DeltaNet (three layers in four) or gated attention → residual →
//! RMS norm → routed experts plus a sigmoid-gated shared expert (`qwen35moe`) or a SwiGLU FFN
//! (`qwen35`) → residual. Node names follow llama.cpp's graph.

use bloomery_plugin_api::builders::{causal_lm_with, LmInputs, LmOutputs};
use bloomery_plugin_api::graph::{BatchShape, Graph, GraphBuilder, TensorId};
use bloomery_plugin_api::op::{GluKind, RopeParams, RouterParams, UnaryFn};
use bloomery_plugin_api::qwen_blocks::{
    gated_attention, gated_delta_net, shared_gated_moe, GatedAttentionCall, GatedDeltaNet, GdnCall,
};
use bloomery_plugin_api::weights::AttentionWeights;
use bloomery_plugin_api::PluginError;

use crate::hparams::{Ffn, HParams, ARCH_DENSE};
use crate::state::LayerState;
use crate::weights::{FfnWeights, Mixer, Weights};

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

/// A gated attention layer over `x` (already normed), its K/V in `(k_cache, v_cache)`.
pub(crate) fn attention(
    m: &Model<'_>,
    g: &mut GraphBuilder,
    a: &AttentionWeights,
    caches: (u32, u32),
    x: TensorId,
    inp: &LmInputs,
) -> Result<TensorId, PluginError> {
    let call = GatedAttentionCall {
        params: m.hp.lm.attn.gqa(),
        rope: m.rope,
        eps: m.hp.lm.eps,
        caches,
    };
    gated_attention(g, a, &call, x, (inp, None))
}

fn delta_net(
    m: &Model<'_>,
    g: &mut GraphBuilder,
    d: &GatedDeltaNet,
    states: (u32, u32),
    x: TensorId,
    inp: &LmInputs,
) -> Result<TensorId, PluginError> {
    let call = GdnCall {
        dims: m.hp.gdn,
        eps: m.hp.lm.eps,
        z_gate: UnaryFn::Silu,
        verify: m.verify,
        states,
    };
    gated_delta_net(g, d, &call, x, inp)
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
            shared_gated_moe(g, (&e.experts, &e.shared, &e.shared_gate), route, x)
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
