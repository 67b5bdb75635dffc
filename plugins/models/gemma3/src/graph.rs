//! The `gemma3` forward graph: scaled embedding; per layer pre-norm GQA with QK-norm and NEOX
//! rope (sliding-window layers with the local rope base, global layers with the global one),
//! post-attention norm, pre-norm GeGLU FFN, post-FFN norm; final norm and tied head.

use bloomery_plugin_api::builders::LmInputs;
use bloomery_plugin_api::graph::{BatchShape, Graph, GraphBuilder, TensorId};
use bloomery_plugin_api::op::{AttentionParams, GluKind, Op, RopeParams, UnaryFn};
use bloomery_plugin_api::{DType, PluginError};

use crate::hparams::HParams;
use crate::state::window;
use crate::weights::{Layer, Weights};

/// Rope parameters of the global and the sliding-window layers.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Ropes {
    /// Global (full-attention) layers.
    pub global: RopeParams,
    /// Sliding-window layers.
    pub local: RopeParams,
}

/// Builds the graph for `shape`.
pub fn build(
    hp: &HParams,
    w: &Weights,
    ropes: Ropes,
    shape: BatchShape,
) -> Result<Graph, PluginError> {
    let mut g = GraphBuilder::new();
    let inp = g.lm_inputs(shape.n_rows, shape.n_outputs)?;
    let x = g.embed(&w.globals, &inp)?;
    let mut x = g.scale("inp_scaled", x, (hp.lm.n_embd as f32).sqrt())?;
    for (il, l) in w.layers.iter().enumerate() {
        g.set_layer(il as i32);
        let an = g.w(&l.attn_norm)?;
        let cur = g.rms_norm("attn_norm", x, Some(an), hp.lm.eps)?;
        let mut cur = attention(&mut g, hp, l, ropes, il as u32, cur, &inp)?;
        if il + 1 == w.layers.len() {
            cur = g.select_outputs(cur, &inp)?;
            x = g.select_outputs(x, &inp)?;
        }
        let pn = g.w(&l.attn_post_norm)?;
        let cur = g.rms_norm("attn_post_norm", cur, Some(pn), hp.lm.eps)?;
        let sa_out = g.add("sa_out", cur, x)?;
        let fnorm = g.w(&l.ffn_norm)?;
        let cur = g.rms_norm("ffn_norm", sa_out, Some(fnorm), hp.lm.eps)?;
        let cur = geglu_ffn(&mut g, l, cur)?;
        let pn = g.w(&l.ffn_post_norm)?;
        let cur = g.rms_norm("ffn_post_norm", cur, Some(pn), hp.lm.eps)?;
        x = g.add("l_out", cur, sa_out)?;
    }
    let mut logits = g.lm_head(&w.globals, x, hp.lm.eps)?;
    if hp.final_softcap > 0.0 {
        logits = softcap(&mut g, logits, hp.final_softcap)?;
    }
    g.output("logits", logits);
    Ok(g.finish())
}

/// Self-attention of layer `il` on the normed input: its window and rope base depend on whether
/// the layer slides. The query scale goes into the attention op's logit scale.
fn attention(
    g: &mut GraphBuilder,
    hp: &HParams,
    l: &Layer,
    ropes: Ropes,
    il: u32,
    x: TensorId,
    inp: &LmInputs,
) -> Result<TensorId, PluginError> {
    let win = window(hp, il);
    let params = AttentionParams {
        scale: hp.attn_scale,
        window: win,
        ..hp.lm.attn.gqa()
    };
    let rope = if win > 0 { ropes.local } else { ropes.global };
    let blk = l.attn.block(il, params, Some(rope), hp.lm.eps);
    g.attention_block(&blk, x, inp)
}

/// `down · (gelu_tanh(gate · x) ⊙ (up · x))`.
fn geglu_ffn(g: &mut GraphBuilder, l: &Layer, x: TensorId) -> Result<TensorId, PluginError> {
    let gate = g.w(&l.ffn.gate)?;
    let up = g.w(&l.ffn.up)?;
    let down = g.w(&l.ffn.down)?;
    let gx = g.matmul("ffn_gate", gate, x)?;
    let ux = g.matmul("ffn_up", up, x)?;
    let h = g.glu("ffn_geglu", gx, ux, GluKind::GeGlu, 0.0)?;
    g.matmul("ffn_out", down, h)
}

/// `c · tanh(x / c)`.
fn softcap(g: &mut GraphBuilder, x: TensorId, c: f32) -> Result<TensorId, PluginError> {
    let ne = g.ne(x);
    let s = g.scale("result_softcap_in", x, 1.0 / c)?;
    let t = g.op(
        "result_softcap_tanh",
        Op::Unary { f: UnaryFn::Tanh },
        &[s],
        DType::F32,
        ne,
    )?;
    g.scale("result_output", t, c)
}
